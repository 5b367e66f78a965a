//! Cluster API v1beta2 types generated from CAPI's published CRDs, plus hand-written contract helpers.
//!
//! - [`generated`]: one module per CAPI kind, made by kopium from `capi/v1.14/crds` (see
//!   `api/capi/generate.sh`). Never edit those files; regenerate them.
//! - [`v1beta1`]: the hand-written v1beta1 condition shape still found under
//!   `status.deprecated.v1beta1`.

pub mod generated;
pub mod v1beta1;
