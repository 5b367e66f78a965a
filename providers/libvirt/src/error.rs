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
    /// A provisioning or deletion step failed transiently.
    #[error(transparent)]
    Step(#[from] StepError),
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
            Self::Step(e) => e.metric_label(),
        }
    }
}

impl banlieue_provider_kit::ReconcileError for Error {
    fn metric_label(&self) -> &'static str {
        Error::metric_label(self)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
