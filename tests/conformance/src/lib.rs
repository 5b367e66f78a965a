//! banlieue's CAPI conformance checks.
//!
//! - [`contract`]: the CAPI v1beta2 provider contract as data, checked statically against the
//!   generated infrastructure CRDs (`tests/static_contract.rs`).
//! - [`report`]: the human-readable report both test binaries write under `target/conformance/`.
//!
//! The run of the real Cluster API controllers against `banlieue-proxmox` and the Proxmox VE
//! simulator is `tests/capi.rs` (see this crate's README).

pub mod contract;
pub mod report;
pub mod schema;
