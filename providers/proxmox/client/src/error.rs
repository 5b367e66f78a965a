//! The client's error type and its classification for controllers.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use banlieue_provider_runtime::tls::ErrorChain;

/// A boxed transport-level error (hyper, rustls, I/O).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong talking to Proxmox VE.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// PVE answered with a non-success status.
    #[error("{method} {path}: HTTP {status}: {message}{}", FmtErrors(errors))]
    Api {
        /// HTTP method of the request.
        method: http::Method,
        /// API path below `/api2/json`.
        path: String,
        /// HTTP status code.
        status: u16,
        /// PVE's message: the body `message` (PVE ≥ 8.3) or else the status line's reason phrase.
        message: String,
        /// The per-parameter `errors` map of a `400 Parameter verification failed.`.
        errors: BTreeMap<String, String>,
    },
    /// No complete response arrived within the request timeout.
    #[error("{method} {path}: no response within {timeout:?}")]
    Timeout {
        /// HTTP method of the request.
        method: http::Method,
        /// API path below `/api2/json`.
        path: String,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The connection (TCP or TLS handshake) could not be established; the request was not sent.
    #[error("{method} {path}: connection failed: {}", ErrorChain(source.as_ref()))]
    Connect {
        /// HTTP method of the request.
        method: http::Method,
        /// API path below `/api2/json`.
        path: String,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// The TLS handshake failed: the server certificate was rejected (wrong fingerprint, unknown
    /// CA, wrong host name) or no common protocol. Not retried.
    #[error("{method} {path}: {}", ErrorChain(source.as_ref()))]
    Tls {
        /// HTTP method of the request.
        method: http::Method,
        /// API path below `/api2/json`.
        path: String,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// The connection broke while the request was in flight (reset, closed, protocol error).
    #[error("{method} {path}: transport error: {}", ErrorChain(source.as_ref()))]
    Transport {
        /// HTTP method of the request.
        method: http::Method,
        /// API path below `/api2/json`.
        path: String,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// The response body did not have the expected shape.
    #[error("{method} {path}: unexpected response: {source}")]
    Decode {
        /// HTTP method of the request.
        method: http::Method,
        /// API path below `/api2/json`.
        path: String,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// A task (UPID) finished with an exit status other than `OK` or `WARNINGS: N`.
    #[error("task {upid} failed: {exitstatus}")]
    TaskFailed {
        /// The task's UPID.
        upid: String,
        /// The task's exit status text, e.g. `can't lock file …` or `VM 9000 is a template`.
        exitstatus: String,
    },
    /// [`crate::Client::wait_task`] gave up before the task stopped.
    #[error("task {upid} still running after {waited:?}")]
    TaskDeadline {
        /// The task's UPID.
        upid: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The client was configured wrongly (bad URL, unreadable CA bundle, bad fingerprint, …).
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// A value (UPID, config property string, size, tag, …) could not be parsed.
    #[error("invalid {what} {value:?}: {reason}")]
    Parse {
        /// What was being parsed.
        what: &'static str,
        /// The offending input.
        value: String,
        /// Why it was rejected.
        reason: String,
    },
}

struct FmtErrors<'a>(&'a BTreeMap<String, String>);

impl fmt::Display for FmtErrors<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (param, msg)) in self.0.iter().enumerate() {
            let sep = if i == 0 { " (" } else { "; " };
            write!(f, "{sep}{param}: {}", msg.trim_end())?;
        }
        if !self.0.is_empty() {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// What a caller should make of an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The object (VM, node, storage, volume, task, pool) does not exist.
    NotFound,
    /// The object already exists (e.g. `VM 100 already exists`).
    AlreadyExists,
    /// The VM is locked by another operation (e.g. `lock: clone`); try again later.
    Locked,
    /// The guest agent does not answer yet; try again later.
    AgentNotRunning,
    /// A server or network fault (5xx, timeout, reset); retrying the same request may succeed.
    Transient,
    /// Authentication or permission failure (401, 403), or the server's certificate was rejected.
    Auth,
    /// The request was rejected as invalid (400, 501, or a value this client could not parse).
    Invalid,
    /// A task failed for another reason than the ones above.
    TaskFailed,
    /// Anything else (e.g. a response this client could not decode).
    Other,
}

impl ErrorClass {
    /// True when waiting (requeue with backoff) may resolve it without a change of the request:
    /// `Transient`, `Locked`, `AgentNotRunning`. Controllers wait for a spec change otherwise.
    pub fn is_temporary(self) -> bool {
        matches!(self, Self::Transient | Self::Locked | Self::AgentNotRunning)
    }

    /// A short stable label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::AlreadyExists => "already_exists",
            Self::Locked => "locked",
            Self::AgentNotRunning => "agent_not_running",
            Self::Transient => "transient",
            Self::Auth => "auth",
            Self::Invalid => "invalid",
            Self::TaskFailed => "task_failed",
            Self::Other => "other",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Texts of plain `500` errors (PVE answers every `die` with 500) that no retry can fix.
const PERMANENT: &[&str] = &[
    "not supported",
    "is running",
    "is a template",
    "not allowed",
    "unable to parse",
    "invalid format",
    "not implemented",
    // Qemu.pm clone_vm: `can't clone VM to node 'X' (VM uses local storage)`, `can't clone to
    // non-shared storage 'S'`: the placement or the template's storage must change.
    "can't clone",
    // REAL-PVE.md R11: plain 500s that no retry fixes.
    "no qemu guest agent configured",
    "can't upload to storage type",
    "does not support",
    "value too large",
];

/// Classifies by PVE's message text, as clients in the wild do (see `WIRE.md`).
fn class_from_text(text: &str) -> Option<ErrorClass> {
    let lower = text.to_ascii_lowercase();
    if lower.contains("does not exist") || lower.contains("no such ") {
        Some(ErrorClass::NotFound)
    } else if lower.contains("already exists") {
        Some(ErrorClass::AlreadyExists)
    } else if lower.contains("guest agent is not running")
        // The agent's socket is there but nothing answers yet (the guest still boots).
        || (lower.contains("qmp command 'guest-") && lower.contains("got timeout"))
    {
        Some(ErrorClass::AgentNotRunning)
    } else if lower.contains("is locked") || lower.contains("can't lock file") {
        Some(ErrorClass::Locked)
    } else {
        None
    }
}

impl Error {
    /// Classifies the error so that controllers can decide (wait for a change, back off, adopt, …).
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Api {
                status,
                message,
                errors,
                ..
            } => {
                if matches!(status, 401 | 403) {
                    return ErrorClass::Auth;
                }
                let by_text = std::iter::once(message.as_str())
                    .chain(errors.values().map(String::as_str))
                    .find_map(class_from_text);
                if let Some(class) = by_text {
                    return class;
                }
                let lower = message.to_ascii_lowercase();
                if PERMANENT.iter().any(|p| lower.contains(p)) {
                    return ErrorClass::Invalid;
                }
                match status {
                    404 => ErrorClass::NotFound,
                    // Too Many Requests: the server (or a proxy before it) asks to come back later.
                    429 => ErrorClass::Transient,
                    501 => ErrorClass::Invalid,
                    500..=599 => ErrorClass::Transient,
                    400..=499 => ErrorClass::Invalid,
                    _ => ErrorClass::Other,
                }
            }
            Self::Timeout { .. } | Self::Connect { .. } | Self::Transport { .. } => ErrorClass::Transient,
            Self::TaskDeadline { .. } => ErrorClass::Transient,
            Self::Tls { .. } => ErrorClass::Auth,
            Self::TaskFailed { exitstatus, .. } => {
                class_from_text(exitstatus).unwrap_or(ErrorClass::TaskFailed)
            }
            Self::Config(_) | Self::Parse { .. } => ErrorClass::Invalid,
            Self::Decode { .. } => ErrorClass::Other,
        }
    }

    /// True when the same request may succeed if repeated later.
    pub fn is_transient(&self) -> bool {
        self.class() == ErrorClass::Transient
    }

    /// Shorthand for `class() == ErrorClass::NotFound`.
    pub fn is_not_found(&self) -> bool {
        self.class() == ErrorClass::NotFound
    }

    /// A short stable label for metrics (the class).
    pub fn metric_label(&self) -> &'static str {
        self.class().as_str()
    }

    /// Why the server certificate was refused, for [`Error::Tls`].
    pub fn tls_failure(&self) -> Option<&crate::TlsHandshakeError> {
        let Self::Tls { source, .. } = self else {
            return None;
        };
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
        while let Some(e) = cur {
            if let Some(tls) = e.downcast_ref::<crate::TlsHandshakeError>() {
                return Some(tls);
            }
            cur = e.source();
        }
        None
    }

    /// The HTTP status, when PVE answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// PVE's message (or the task exit status), when there is one.
    pub fn message(&self) -> Option<&str> {
        match self {
            Self::Api { message, .. } => Some(message),
            Self::TaskFailed { exitstatus, .. } => Some(exitstatus),
            _ => None,
        }
    }

    /// The per-parameter `errors` map of a parameter verification failure (empty otherwise).
    pub fn param_errors(&self) -> Option<&BTreeMap<String, String>> {
        match self {
            Self::Api { errors, .. } => Some(errors),
            _ => None,
        }
    }

    pub(crate) fn parse(what: &'static str, value: &str, reason: impl Into<String>) -> Self {
        Self::Parse {
            what,
            value: value.to_owned(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn api(status: u16, message: &str, errors: &[(&str, &str)]) -> Error {
        Error::Api {
            method: http::Method::GET,
            path: "/x".into(),
            status,
            message: message.into(),
            errors: errors
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[rstest]
    #[case(
        500,
        "Configuration file 'nodes/pve1/qemu-server/123.conf' does not exist",
        ErrorClass::NotFound
    )]
    #[case(500, "storage 'nfs' does not exist", ErrorClass::NotFound)]
    #[case(400, "no such task", ErrorClass::NotFound)]
    #[case(404, "Not Found", ErrorClass::NotFound)]
    #[case(500, "QEMU guest agent is not running", ErrorClass::AgentNotRunning)]
    #[case(
        500,
        "VM 101 qmp command 'guest-network-get-interfaces' failed - got timeout",
        ErrorClass::AgentNotRunning
    )]
    #[case(500, "VM 101 is locked (clone)", ErrorClass::Locked)]
    #[case(
        500,
        "can't lock file '/var/lock/qemu-server/lock-101.conf' - got timeout",
        ErrorClass::Locked
    )]
    #[case(500, "internal error", ErrorClass::Transient)]
    #[case(
        500,
        "shrinking disks is not supported (request 1073741824 bytes)",
        ErrorClass::Invalid
    )]
    #[case(500, "VM 100 is running - destroy failed", ErrorClass::Invalid)]
    #[case(
        500,
        "can't clone VM to node 'pve3' (VM uses local storage)",
        ErrorClass::Invalid
    )]
    #[case(500, "can't clone to non-shared storage 'local-lvm'", ErrorClass::Invalid)]
    #[case(500, "No QEMU guest agent configured", ErrorClass::Invalid)]
    #[case(500, "can't upload to storage type 'lvmthin'", ErrorClass::Invalid)]
    #[case(
        500,
        "storage 'local-lvm' does not support 'iso' content",
        ErrorClass::Invalid
    )]
    #[case(
        500,
        "balloon value too large (must be smaller than assigned memory)",
        ErrorClass::Invalid
    )]
    #[case(
        500,
        "Linked clone feature is not supported for drive 'scsi0'",
        ErrorClass::Invalid
    )]
    #[case(502, "Bad Gateway", ErrorClass::Transient)]
    #[case(503, "Service Unavailable", ErrorClass::Transient)]
    #[case(429, "Too Many Requests", ErrorClass::Transient)]
    #[case(401, "No ticket", ErrorClass::Auth)]
    #[case(401, "authentication failure", ErrorClass::Auth)]
    #[case(403, "Permission check failed (/vms/100, VM.Audit)", ErrorClass::Auth)]
    #[case(400, "Parameter verification failed.", ErrorClass::Invalid)]
    #[case(501, "Method 'GET /nodes/pve1/nope' not implemented", ErrorClass::Invalid)]
    #[case(302, "Found", ErrorClass::Other)]
    fn classifies_api_errors_by_status_and_text(
        #[case] status: u16,
        #[case] message: &str,
        #[case] expected: ErrorClass,
    ) {
        assert_eq!(api(status, message, &[]).class(), expected);
    }

    #[test]
    fn classifies_by_the_errors_map_too() {
        let err = api(
            400,
            "Parameter verification failed.",
            &[("vmid", "VM 100 already exists")],
        );
        assert_eq!(err.class(), ErrorClass::AlreadyExists);
        let err = api(
            400,
            "Parameter verification failed.",
            &[("net0", "invalid format")],
        );
        assert_eq!(err.class(), ErrorClass::Invalid);
    }

    #[test]
    fn display_keeps_status_message_and_errors() {
        let err = api(
            400,
            "Parameter verification failed.",
            &[("vmid", "VM 100 already exists\n")],
        );
        assert_eq!(
            err.to_string(),
            "GET /x: HTTP 400: Parameter verification failed. (vmid: VM 100 already exists)"
        );
        assert_eq!(err.status(), Some(400));
        assert_eq!(err.param_errors().map(|e| e.len()), Some(1));
    }

    #[rstest]
    #[case("VM 9000 is a template", ErrorClass::TaskFailed)]
    #[case("VM 101 is locked (clone)", ErrorClass::Locked)]
    #[case(
        "unable to find configuration file for VM 101 - no such machine",
        ErrorClass::NotFound
    )]
    fn classifies_task_failures(#[case] exitstatus: &str, #[case] expected: ErrorClass) {
        let err = Error::TaskFailed {
            upid: "UPID:x".into(),
            exitstatus: exitstatus.into(),
        };
        assert_eq!(err.class(), expected);
    }

    #[test]
    fn temporary_classes() {
        let temporary: Vec<_> = [
            ErrorClass::NotFound,
            ErrorClass::AlreadyExists,
            ErrorClass::Locked,
            ErrorClass::AgentNotRunning,
            ErrorClass::Transient,
            ErrorClass::Auth,
            ErrorClass::Invalid,
            ErrorClass::TaskFailed,
            ErrorClass::Other,
        ]
        .into_iter()
        .filter(|c| c.is_temporary())
        .collect();
        assert_eq!(
            temporary,
            vec![
                ErrorClass::Locked,
                ErrorClass::AgentNotRunning,
                ErrorClass::Transient
            ]
        );
    }

    #[test]
    fn network_faults_are_transient() {
        let err = Error::Timeout {
            method: http::Method::GET,
            path: "/x".into(),
            timeout: Duration::ZERO,
        };
        assert!(err.is_transient());
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let err = Error::Transport {
            method: http::Method::GET,
            path: "/x".into(),
            source: Box::new(io),
        };
        assert!(err.is_transient());
        assert_eq!(err.metric_label(), "transient");
    }
}
