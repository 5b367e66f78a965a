//! The provider's error type.

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in a reconcile outside the provisioning step itself.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The kube error.
        #[source]
        source: kube::Error,
    },
    /// A vCenter call failed.
    #[error("{context}: {source}")]
    Vsphere {
        /// What was being done.
        context: String,
        /// The client error.
        #[source]
        source: banlieue_vsphere_client::Error,
    },
    /// The objects say something that cannot work (wrong Secret keys, bad status).
    #[error("{0}")]
    Invalid(String),
    /// The kit failed (a Kubernetes read while resolving the connection).
    #[error(transparent)]
    Kit(#[from] banlieue_provider_kit::Error),
    /// A provisioning or deletion step failed.
    #[error(transparent)]
    Step(#[from] crate::provision::StepError),
}

impl Error {
    /// Wraps a kube error.
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
            Self::Vsphere { source, .. } => source.metric_label(),
            Self::Invalid(_) => "invalid",
            Self::Kit(e) => e.metric_label(),
            Self::Step(crate::provision::StepError::Transient { source, .. }) => source.metric_label(),
            Self::Step(_) => "step",
        }
    }
}

impl banlieue_provider_kit::ReconcileError for Error {
    fn metric_label(&self) -> &'static str {
        Error::metric_label(self)
    }
}
