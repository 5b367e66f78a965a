//! The client's error type and its classification.

use std::time::Duration;

use banlieue_provider_runtime::tls::ErrorChain;

/// A boxed transport-level error (hyper, rustls, I/O).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong talking to vCenter.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The client configuration is unusable (bad URL, bad CA bundle or thumbprint).
    #[error("configuration: {0}")]
    Config(String),
    /// TCP connect failed or timed out; the request was not sent.
    #[error("{method}: connection failed: {}", ErrorChain(source.as_ref()))]
    Connect {
        /// SOAP method.
        method: String,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// The TLS handshake failed: certificate not trusted or thumbprint mismatch.
    #[error("{method}: {}", ErrorChain(source.as_ref()))]
    Tls {
        /// SOAP method.
        method: String,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// The connection broke while the request was in flight.
    #[error("{method}: transport error: {}", ErrorChain(source.as_ref()))]
    Transport {
        /// SOAP method.
        method: String,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// No response within the request timeout.
    #[error("{method}: no response within {timeout:?}")]
    Timeout {
        /// SOAP method.
        method: String,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// vCenter answered with a SOAP fault.
    #[error("{method}: {fault}: {message}")]
    Fault {
        /// SOAP method.
        method: String,
        /// vim25 fault type, e.g. `NotAuthenticated`, `InvalidLogin`, `ManagedObjectNotFound`.
        fault: String,
        /// The fault string.
        message: String,
    },
    /// A non-200 answer that is not a SOAP fault.
    #[error("{method}: HTTP {status}: {body}")]
    Http {
        /// SOAP method.
        method: String,
        /// HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The response did not have the expected shape.
    #[error("{method}: unexpected response: {message}")]
    Decode {
        /// SOAP method.
        method: String,
        /// What was wrong.
        message: String,
    },
    /// A task ended in error.
    #[error("task {task} failed: {fault}: {message}")]
    TaskFailed {
        /// Task managed object id.
        task: String,
        /// vim25 fault type.
        fault: String,
        /// The localized message.
        message: String,
    },
}

/// What a caller should do about an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// Credentials rejected: fix the Secret.
    Auth,
    /// Certificate not trusted: fix the TLS settings.
    Tls,
    /// The object does not exist (any more).
    NotFound,
    /// May pass: network, timeout, server error, busy.
    Transient,
    /// Will not pass without a change (bad input, task error).
    Permanent,
}

impl Error {
    /// The vim25 fault type of a SOAP fault or failed task.
    pub fn fault(&self) -> Option<&str> {
        match self {
            Self::Fault { fault, .. } | Self::TaskFailed { fault, .. } => Some(fault),
            _ => None,
        }
    }

    /// Classifies the error.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Config(_) => ErrorClass::Permanent,
            Self::Tls { .. } => ErrorClass::Tls,
            Self::Connect { .. } | Self::Transport { .. } | Self::Timeout { .. } => ErrorClass::Transient,
            Self::Http { status, .. } if *status >= 500 || *status == 429 => ErrorClass::Transient,
            Self::Http { .. } | Self::Decode { .. } => ErrorClass::Permanent,
            Self::Fault { fault, .. } | Self::TaskFailed { fault, .. } => match fault.as_str() {
                "InvalidLogin" | "NotAuthenticated" | "NoPermission" | "InvalidLocale" => ErrorClass::Auth,
                "ManagedObjectNotFound" | "NotFound" => ErrorClass::NotFound,
                "TaskInProgress" | "HostCommunication" | "RequestCanceled" | "SystemError"
                | "ConcurrentAccess" => ErrorClass::Transient,
                _ => ErrorClass::Permanent,
            },
        }
    }

    /// A short stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self.class() {
            ErrorClass::Auth => "auth",
            ErrorClass::Tls => "tls",
            ErrorClass::NotFound => "not_found",
            ErrorClass::Transient => "transient",
            ErrorClass::Permanent => "permanent",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(f: &str) -> Error {
        Error::Fault {
            method: "X".into(),
            fault: f.into(),
            message: String::new(),
        }
    }

    #[test]
    fn classifies_faults() {
        assert_eq!(fault("InvalidLogin").class(), ErrorClass::Auth);
        assert_eq!(fault("ManagedObjectNotFound").class(), ErrorClass::NotFound);
        assert_eq!(fault("TaskInProgress").class(), ErrorClass::Transient);
        assert_eq!(fault("InvalidArgument").class(), ErrorClass::Permanent);
        let timeout = Error::Timeout {
            method: "X".into(),
            timeout: Duration::from_secs(1),
        };
        assert_eq!(timeout.class(), ErrorClass::Transient);
        assert_eq!(timeout.metric_label(), "transient");
    }
}
