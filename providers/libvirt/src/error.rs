//! The crate's errors: the reconcilers' error, and a step's (the kit's `StepError` over
//! libvirt's errors) with the one classification of libvirt errors into step failures.

use crate::hypervisor::{ErrorKind, HvError};

/// Why a step failed (the kit's, with libvirt's errors).
pub type StepError = banlieue_provider_kit::machine::StepError<HvError>;

/// A libvirt error as a step failure with `reason`: retried with backoff unless libvirt refuses
/// the call itself (invalid input, unsupported).
pub fn step_error(reason: &'static str, e: HvError) -> StepError {
    match e.kind {
        ErrorKind::Transient | ErrorKind::NotFound | ErrorKind::Exists => {
            StepError::Transient { reason, source: e }
        }
        ErrorKind::Other | ErrorKind::Unsupported => StepError::permanent(reason, e.to_string()),
    }
}

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
