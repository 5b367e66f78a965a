//! The crate's errors: the reconcilers' error, and a step's (the kit's `StepError` over
//! Proxmox's errors) with the one classification of Proxmox errors into step failures.

use banlieue_pve_client::ErrorClass;

use crate::hypervisor::PveError;

/// Why a step failed (the kit's, with Proxmox's errors).
pub type StepError = banlieue_provider_kit::machine::StepError<PveError>;

/// Classifies a Proxmox error raised during a step whose failures carry `reason`: network, 5xx,
/// locks and a guest agent not running yet pass; refused credentials are the connection's
/// reason; anything else needs a change.
pub fn pve_error(reason: &'static str, err: PveError) -> StepError {
    match err.class() {
        ErrorClass::Transient | ErrorClass::Locked | ErrorClass::AgentNotRunning => {
            StepError::Transient { reason, source: err }
        }
        ErrorClass::Auth => StepError::permanent(
            connection_reason(&err).unwrap_or("AuthenticationFailed"),
            describe(&err),
        ),
        _ => StepError::permanent(
            reason,
            err.message()
                .map_or_else(|| err.to_string(), |m| m.trim().to_owned()),
        ),
    }
}

/// Errors of the reconcilers (the kit's, or a step's).
pub type Error = banlieue_provider_kit::machine::ProviderError<PveError>;

/// The condition reason for a Proxmox error that means this provider cannot use the endpoint at
/// all, `None` for other errors. One stable word per cause (the banlieue controller copies the
/// infra cluster's reason to the VirtualMachine): `TLSVerificationFailed` (unknown CA,
/// fingerprint or host name mismatch), `AuthenticationFailed` (HTTP 401), `PermissionDenied`
/// (HTTP 403), `ProviderUnreachable` (connection refused, timeout, broken connection). The
/// error's `Display` is the matching message: it names the cause (both fingerprints, the
/// address, PVE's text) and never a credential.
pub fn connection_reason(err: &banlieue_pve_client::Error) -> Option<&'static str> {
    use banlieue_pve_client::Error as Pve;
    match err {
        Pve::Tls { .. } => Some("TLSVerificationFailed"),
        Pve::Api { status: 401, .. } => Some("AuthenticationFailed"),
        Pve::Api { status: 403, .. } => Some("PermissionDenied"),
        Pve::Connect { .. } | Pve::Timeout { .. } | Pve::Transport { .. } => Some("ProviderUnreachable"),
        _ => None,
    }
}

/// The missing privilege and its path in a 403 of Proxmox VE (`Permission check failed
/// (/vms/100, VM.Clone)`), if it names them.
pub fn missing_privilege(err: &banlieue_pve_client::Error) -> Option<(&str, &str)> {
    let banlieue_pve_client::Error::Api {
        status: 403, message, ..
    } = err
    else {
        return None;
    };
    let inside = message.split_once('(')?.1.rsplit_once(')')?.0;
    let (path, privilege) = inside.split_once(',')?;
    let (path, privilege) = (path.trim(), privilege.trim());
    (path.starts_with('/') && !privilege.is_empty()).then_some((path, privilege))
}

/// The error as a condition message: for a 403 that names what is missing, the privilege, the
/// path and how to grant it first (Proxmox's own text follows).
pub fn describe(err: &banlieue_pve_client::Error) -> String {
    match missing_privilege(err) {
        Some((path, privilege)) => format!(
            "the API token lacks the privilege {privilege} on {path}: grant a role with it on that path \
             (pveum acl modify {path} --tokens <user@realm!token> --roles <role>); {err}"
        ),
        None => err.to_string(),
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::api_error;
    use rstest::rstest;

    fn transport(tls: bool) -> banlieue_pve_client::Error {
        let source: banlieue_pve_client::BoxError = "refused".into();
        let (method, path) = (http::Method::GET, "/version".to_owned());
        if tls {
            banlieue_pve_client::Error::Tls { method, path, source }
        } else {
            banlieue_pve_client::Error::Connect { method, path, source }
        }
    }

    #[rstest]
    #[case::tls(transport(true), Some("TLSVerificationFailed"))]
    #[case::unreachable(transport(false), Some("ProviderUnreachable"))]
    #[case::unauthenticated(api_error(401, "authentication failure"), Some("AuthenticationFailed"))]
    #[case::forbidden(api_error(403, "Permission check failed"), Some("PermissionDenied"))]
    #[case::other(api_error(500, "internal error"), None)]
    fn each_connection_failure_has_its_own_reason(
        #[case] err: banlieue_pve_client::Error,
        #[case] want: Option<&str>,
    ) {
        assert_eq!(connection_reason(&err), want);
    }

    #[rstest]
    #[case("Permission check failed (/vms/100, VM.Clone)", Some(("/vms/100", "VM.Clone")))]
    #[case("Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)\n", Some(("/storage/local-lvm", "Datastore.AllocateSpace")))]
    #[case("Permission check failed (user != root@pam)", None)]
    #[case("Permission check failed", None)]
    fn a_403_names_the_missing_privilege_and_its_path(
        #[case] message: &str,
        #[case] want: Option<(&str, &str)>,
    ) {
        let err = api_error(403, message);
        assert_eq!(missing_privilege(&err), want);
        let StepError::Permanent {
            reason,
            message: text,
        } = pve_error("CloningFailed", err)
        else {
            panic!("a 403 is permanent");
        };
        assert_eq!(reason, "PermissionDenied");
        match want {
            Some((path, privilege)) => assert!(
                text.starts_with(&format!(
                    "the API token lacks the privilege {privilege} on {path}"
                )),
                "{text}"
            ),
            None => assert!(!text.contains("lacks"), "{text}"),
        }
    }
}
