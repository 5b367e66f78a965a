//! The crate's error type.

use crate::provision::StepError;

/// Errors of the reconcilers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kit failed (a Kubernetes read while resolving the hosts).
    #[error(transparent)]
    Kit(#[from] banlieue_provider_kit::Error),
    /// A provisioning or deletion step failed transiently.
    #[error(transparent)]
    Step(#[from] StepError),
}

impl Error {
    /// Short stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Kit(e) => e.metric_label(),
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
