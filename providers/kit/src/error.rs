//! The kit's error, and the trait a backend's errors implement so that the kit decides retry,
//! logs and metrics in one place.

/// An error a backend returns from a reconcile step.
pub trait ReconcileError: std::error::Error + Send + Sync + 'static {
    /// A short, stable label for the `controller_runtime_reconcile_errors_total`-style metrics
    /// and logs (`kube`, `timeout`, `auth`, …).
    fn metric_label(&self) -> &'static str;
}

/// Errors of the kit's reconcilers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("Kubernetes API: {context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The backend failed (its own error, and its metric label).
    #[error("{source}")]
    Backend {
        /// [`ReconcileError::metric_label`] of the error.
        label: &'static str,
        /// The backend's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl Error {
    /// A [`Error::Kube`] with what was being done.
    pub fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            context: context.into(),
            source,
        }
    }

    /// A backend's error.
    pub fn backend(error: impl ReconcileError) -> Self {
        Self::Backend {
            label: error.metric_label(),
            source: Box::new(error),
        }
    }

    /// The metric label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "kube",
            Self::Backend { label, .. } => label,
        }
    }
}

/// `Result` with the kit's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
