//! Prometheus metrics named like controller-runtime's: `banlieue-provider-runtime`'s
//! [`Metrics`] registry, re-exported under its former path (the controllers' contexts hold one;
//! the binary shares a single registry between them).

pub use banlieue_provider_runtime::metrics::Metrics;
