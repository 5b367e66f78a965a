//! Leader election on a `coordination.k8s.io/v1` Lease, so that only one replica of the
//! controller reconciles at a time: `banlieue-provider-runtime`'s elector, re-exported.

pub use banlieue_provider_runtime::leader::{Decision, LeaderElector, decide};

/// Name of the controller's Lease.
pub const LEASE_NAME: &str = "banlieue-controller";
