//! Shared test support.
#![allow(dead_code)]

pub mod mock;
pub mod scenarios;
pub mod target;
