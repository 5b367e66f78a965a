//! The provider's errors: the reconcilers' error, a step's (the kit's `StepError` over the
//! vSphere client's errors), and the one classification of client errors into condition
//! reasons and step failures.

use banlieue_vsphere_client::ErrorClass;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the reconcilers (the kit's, or a step's).
pub type Error = banlieue_provider_kit::machine::ProviderError<banlieue_vsphere_client::Error>;

/// Why a step failed (the kit's, with the vSphere client's errors).
pub type StepError = banlieue_provider_kit::machine::StepError<banlieue_vsphere_client::Error>;

/// A client call's result as a step's: [`client_error`] of its error.
pub trait OrFail<T> {
    /// The value, or the error classified as raised while doing `reason`.
    fn or_fail(self, reason: &'static str) -> Result<T, StepError>;
}

impl<T> OrFail<T> for banlieue_vsphere_client::Result<T> {
    fn or_fail(self, reason: &'static str) -> Result<T, StepError> {
        self.map_err(|e| client_error(reason, e))
    }
}

/// Classifies a client error raised while doing `reason`.
pub fn client_error(reason: &'static str, err: banlieue_vsphere_client::Error) -> StepError {
    match err.class() {
        ErrorClass::Transient => {
            let unreachable = matches!(
                err,
                banlieue_vsphere_client::Error::Connect { .. }
                    | banlieue_vsphere_client::Error::Timeout { .. }
                    | banlieue_vsphere_client::Error::Transport { .. }
            );
            StepError::Transient {
                reason: if unreachable { "VCenterUnreachable" } else { reason },
                source: err,
            }
        }
        ErrorClass::Auth | ErrorClass::Tls => StepError::permanent(reason_of(&err), err.to_string()),
        _ => StepError::permanent(reason, err.to_string()),
    }
}

/// Maps a client error to a condition reason: a distinct word per cause (the banlieue
/// controller copies the infra cluster's reason to the VirtualMachine): `PermissionDenied` (a
/// `NoPermission` fault: logged in, not allowed) apart from `AuthenticationFailed`.
pub fn reason_of(err: &banlieue_vsphere_client::Error) -> &'static str {
    match err.class() {
        ErrorClass::Auth if err.fault() == Some("NoPermission") => "PermissionDenied",
        ErrorClass::Auth => "AuthenticationFailed",
        ErrorClass::Tls => "TLSVerificationFailed",
        ErrorClass::Transient => "VCenterUnreachable",
        ErrorClass::NotFound => "NotFound",
        ErrorClass::Permanent => "VCenterError",
    }
}

#[cfg(test)]
mod reason_tests {
    use super::*;

    fn fault(name: &str) -> banlieue_vsphere_client::Error {
        banlieue_vsphere_client::Error::Fault {
            method: "RetrieveProperties".into(),
            fault: name.into(),
            message: "denied".into(),
        }
    }

    #[test]
    fn permission_denied_is_told_apart_from_a_failed_login() {
        assert_eq!(reason_of(&fault("NoPermission")), "PermissionDenied");
        assert_eq!(reason_of(&fault("InvalidLogin")), "AuthenticationFailed");
        assert_eq!(reason_of(&fault("NotAuthenticated")), "AuthenticationFailed");
    }
}
