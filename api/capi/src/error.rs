//! The crate's error type.

/// Errors from the hand-written contract helpers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A CRD's `cluster.x-k8s.io/<contract>` label value names no version (`""`, `"_"`, …).
    #[error(
        "contract label value {value:?} names no API version (expected e.g. \"v1alpha1\" or \"v1alpha1_v1beta1\")"
    )]
    EmptyContractLabel {
        /// The label value as found.
        value: String,
    },
    /// A `{apiGroup, kind, name}` reference has an empty field.
    #[error("reference to {kind} {name:?} has an empty {field}")]
    IncompleteReference {
        /// Kind named by the reference (may be empty).
        kind: String,
        /// Name named by the reference (may be empty).
        name: String,
        /// Which field is empty (`apiGroup`, `kind` or `name`).
        field: &'static str,
    },
    /// The bootstrap data Secret has no `data.value` key.
    #[error("bootstrap data Secret {secret:?} has no data key {key:?}")]
    MissingBootstrapValue {
        /// Name of the Secret.
        secret: String,
        /// The key that is missing (always `value`).
        key: &'static str,
    },
    /// The bootstrap data Secret's `format` is neither `cloud-config` nor `ignition`.
    #[error(
        "bootstrap data Secret {secret:?} has unsupported format {format:?} (expected \"cloud-config\" or \"ignition\")"
    )]
    UnknownBootstrapFormat {
        /// Name of the Secret.
        secret: String,
        /// The format as found (lossily decoded as UTF-8).
        format: String,
    },
    /// A release version is not `[v]MAJOR.MINOR.PATCH[-pre][+build]`.
    #[error("release version {release:?} is not a semantic version like v0.1.0")]
    InvalidReleaseVersion {
        /// The version as given.
        release: String,
    },
    /// A release version matches no `releaseSeries` entry of the provider's metadata.yaml.
    #[error("no releaseSeries in metadata.yaml matches release {release:?} (clusterctl would refuse it)")]
    NoReleaseSeries {
        /// The version as given.
        release: String,
    },
    /// An `IPAddress` written by an IPAM provider does not hold a usable address.
    #[error("IPAddress {name:?}: {field} {value:?} is {reason}")]
    InvalidIpAddress {
        /// Name of the IPAddress.
        name: String,
        /// The offending field (`spec.address`, `spec.prefix` or `spec.gateway`).
        field: &'static str,
        /// The value as found.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl Error {
    /// A short, stable label for metrics (`reason` dimension).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::EmptyContractLabel { .. } => "empty_contract_label",
            Error::IncompleteReference { .. } => "incomplete_reference",
            Error::MissingBootstrapValue { .. } => "missing_bootstrap_value",
            Error::UnknownBootstrapFormat { .. } => "unknown_bootstrap_format",
            Error::InvalidReleaseVersion { .. } => "invalid_release_version",
            Error::NoReleaseSeries { .. } => "no_release_series",
            Error::InvalidIpAddress { .. } => "invalid_ip_address",
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
