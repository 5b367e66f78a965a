//! banlieue-provider-runtime: the operational plumbing every banlieue binary shares, one job per
//! module.
//!
//! - [`cache`]: a controller whose cache of its own kind keeps no `managedFields`.
//! - [`events`]: Kubernetes Events created without being kept in memory.
//! - [`leader`]: leader election on a `coordination.k8s.io/v1` Lease.
//! - [`metrics`]: reconcile counters and durations named like controller-runtime's, kept and
//!   rendered (Prometheus text format 0.0.4) by the `prometheus-client` crate.
//! - [`http`]: the `/healthz`, `/readyz` and `/metrics` endpoint.
//! - [`flags`]: the command-line flags every provider takes (namespace, concurrency, endpoints,
//!   leader election, log format).
//! - [`logging`]: `tracing` initialisation (JSON or text).
//! - [`shutdown`]: SIGTERM/SIGINT as a cloneable future.
//! - [`manager`]: runs controllers behind the endpoints and (optionally) the Lease, releasing it
//!   on a clean shutdown.
//! - [`rbac`]: RBAC rules as data (`Rule`), the shared leader-election rules and the
//!   least-privilege `lint` of every binary's rule tables.
//! - `testing` (feature `testing`): the operations check of a provider binary.
//!
//! Everything above is the default `runtime` feature. The hypervisor clients, which know nothing
//! of Kubernetes, use only `tls` (feature `tls`, without default features): the verifying
//! HTTPS connector (web PKI, CA bundle, SHA-256 pinning, explicit insecure).

#[cfg(feature = "runtime")]
pub mod cache;
#[cfg(feature = "runtime")]
pub mod events;
#[cfg(feature = "runtime")]
pub mod flags;
#[cfg(feature = "runtime")]
pub mod http;
#[cfg(feature = "runtime")]
pub mod leader;
#[cfg(feature = "runtime")]
pub mod logging;
#[cfg(feature = "runtime")]
pub mod manager;
#[cfg(feature = "runtime")]
pub mod metrics;
#[cfg(feature = "runtime")]
pub mod rbac;
#[cfg(feature = "runtime")]
pub mod secret_watch;
#[cfg(feature = "runtime")]
pub mod shutdown;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "tls")]
pub mod tls;

#[cfg(feature = "runtime")]
pub use runtime_error::{Error, Result};

#[cfg(feature = "runtime")]
mod runtime_error {
    /// Errors of the runtime.
    #[derive(Debug, thiserror::Error)]
    pub enum Error {
        /// A Kubernetes API call failed.
        #[error("{context}")]
        Kube {
            /// What the runtime was doing.
            context: String,
            /// The client's error.
            #[source]
            source: kube::Error,
        },
        /// A Kubernetes API call did not answer in time.
        #[error("{0}: no answer in time")]
        Timeout(String),
        /// An endpoint address could not be bound.
        #[error("binding the {what} endpoint {addr}")]
        Bind {
            /// Which endpoint (`metrics`, `health probe`).
            what: &'static str,
            /// The address.
            addr: std::net::SocketAddr,
            /// The socket error.
            #[source]
            source: std::io::Error,
        },
        /// Another candidate took the Lease, or it could not be renewed for a whole lease
        /// duration: the process must stop reconciling (and exits, so it competes afresh).
        #[error("leadership of Lease {0} lost")]
        LostLeadership(String),
    }

    impl Error {
        /// A [`Error::Kube`] with context.
        pub fn kube(context: impl Into<String>, source: kube::Error) -> Self {
            Self::Kube {
                context: context.into(),
                source,
            }
        }

        /// A short, stable label for metrics and logs.
        pub fn metric_label(&self) -> &'static str {
            match self {
                Self::Kube { .. } => "kube",
                Self::Timeout(_) => "timeout",
                Self::Bind { .. } => "bind",
                Self::LostLeadership(_) => "lost_leadership",
            }
        }
    }

    /// Result with this crate's [`Error`].
    pub type Result<T, E = Error> = std::result::Result<T, E>;
}
