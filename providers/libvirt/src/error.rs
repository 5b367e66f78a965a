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

/// Errors of the reconcilers (the kit's, or a step's).
pub type Error = banlieue_provider_kit::machine::ProviderError<HvError>;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
