//! Leader election through a `coordination.k8s.io/v1` Lease: `banlieue-provider-runtime`'s
//! [`LeaderElector`], re-exported under its former path.

pub use banlieue_provider_runtime::leader::{Decision, LeaderElector, decide};
