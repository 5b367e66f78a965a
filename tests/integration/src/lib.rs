//! Tests that span crates and run against the real control plane (`banlieue-testenv`): see
//! `tests/`. This library is intentionally empty.
