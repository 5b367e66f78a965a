//! The crate's error type.

use crate::provision::StepError;

/// Errors of the reconcilers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("Kubernetes API: {context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The credentials or connection settings of the ProxmoxCluster are unusable.
    #[error("Proxmox credentials: {0}")]
    Credentials(String),
    /// The banlieue Provider named by `spec.providerRef` is unusable (missing, wrong backend).
    #[error("Provider: {reason}: {message}")]
    Provider {
        /// Condition reason, e.g. `ProviderBackendMismatch`.
        reason: &'static str,
        /// Actionable message.
        message: String,
    },
    /// A provisioning or deletion step failed transiently.
    #[error(transparent)]
    Step(#[from] StepError),
    /// The bootstrap / user data Secret is unusable (missing key, unknown format).
    #[error("bootstrap data: {0}")]
    Bootstrap(String),
    /// A referenced object does not exist (yet).
    #[error("{kind} {namespace}/{name} not found")]
    Missing {
        /// Kind of the object.
        kind: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

impl Error {
    /// Wraps a kube error with what was being done.
    pub fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            context: context.into(),
            source,
        }
    }

    /// Short stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "kube",
            Self::Credentials(_) => "credentials",
            Self::Step(e) => e.metric_label(),
            Self::Bootstrap(_) => "bootstrap",
            Self::Provider { .. } => "provider",
            Self::Missing { .. } => "missing",
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
