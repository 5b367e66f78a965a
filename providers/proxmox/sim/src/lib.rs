//! A Proxmox VE API simulator speaking the real wire protocol, held to the official schema.

pub mod schema;
