//! The bootstrap data Secret a bootstrap provider (e.g. CABPK) writes for each Machine and an
//! infrastructure provider hands to the VM.
//!
//! The Secret lives in the Machine's namespace, is named by the Machine's
//! `spec.bootstrap.dataSecretName`, has type [`BOOTSTRAP_SECRET_TYPE`], the raw data under
//! [`BOOTSTRAP_VALUE_KEY`] and optionally the format under [`BOOTSTRAP_FORMAT_KEY`].

use std::fmt;

use k8s_openapi::api::core::v1::Secret;

use crate::error::{Error, Result};

/// Secret data key holding the raw bootstrap bytes (required).
pub const BOOTSTRAP_VALUE_KEY: &str = "value";
/// Secret data key holding the format of [`BOOTSTRAP_VALUE_KEY`] (optional; default `cloud-config`).
pub const BOOTSTRAP_FORMAT_KEY: &str = "format";
/// The `type` of a bootstrap data Secret.
pub const BOOTSTRAP_SECRET_TYPE: &str = "cluster.x-k8s.io/secret";

/// The format of bootstrap data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BootstrapFormat {
    /// cloud-init user data (`#cloud-config …`); the default when the Secret names no format.
    #[default]
    CloudConfig,
    /// An Ignition config (Flatcar, Fedora CoreOS).
    Ignition,
}

impl BootstrapFormat {
    /// The value as stored under [`BOOTSTRAP_FORMAT_KEY`].
    pub fn as_str(self) -> &'static str {
        match self {
            BootstrapFormat::CloudConfig => "cloud-config",
            BootstrapFormat::Ignition => "ignition",
        }
    }

    /// Parses a stored format; `None` for anything but `cloud-config` and `ignition`.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "cloud-config" => Some(BootstrapFormat::CloudConfig),
            "ignition" => Some(BootstrapFormat::Ignition),
            _ => None,
        }
    }
}

impl fmt::Display for BootstrapFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Bootstrap data read from a Secret. It usually contains credentials (join tokens, keys), so its
/// `Debug` output shows only the format and the length.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapData {
    /// How to interpret [`BootstrapData::value`].
    pub format: BootstrapFormat,
    /// The raw bootstrap bytes.
    pub value: Vec<u8>,
}

impl fmt::Debug for BootstrapData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BootstrapData")
            .field("format", &self.format)
            .field("value", &format_args!("<{} bytes redacted>", self.value.len()))
            .finish()
    }
}

impl BootstrapData {
    /// Reads bootstrap data from the Secret's `data`. A missing or empty `format` means
    /// cloud-config; an unknown one is an error (handing Ignition to cloud-init, or the reverse,
    /// silently produces a VM that never joins).
    pub fn from_secret(secret: &Secret) -> Result<Self> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let data = secret.data.as_ref();
        let value =
            data.and_then(|d| d.get(BOOTSTRAP_VALUE_KEY))
                .ok_or_else(|| Error::MissingBootstrapValue {
                    secret: name.clone(),
                    key: BOOTSTRAP_VALUE_KEY,
                })?;
        let format = match data.and_then(|d| d.get(BOOTSTRAP_FORMAT_KEY)) {
            None => BootstrapFormat::default(),
            Some(raw) if raw.0.is_empty() => BootstrapFormat::default(),
            Some(raw) => std::str::from_utf8(&raw.0)
                .ok()
                .and_then(BootstrapFormat::parse)
                .ok_or_else(|| Error::UnknownBootstrapFormat {
                    secret: name,
                    format: String::from_utf8_lossy(&raw.0).into_owned(),
                })?,
        };
        Ok(BootstrapData {
            format,
            value: value.0.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn secret(data: &[(&str, &[u8])]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("m1-bootstrap".into()),
                ..ObjectMeta::default()
            },
            type_: Some(BOOTSTRAP_SECRET_TYPE.into()),
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn reads_value_and_format() {
        let s = secret(&[("value", b"{\"ignition\":{}}"), ("format", b"ignition")]);
        let data = BootstrapData::from_secret(&s).unwrap();
        assert_eq!(data.format, BootstrapFormat::Ignition);
        assert_eq!(data.value, b"{\"ignition\":{}}");
    }

    #[test]
    fn missing_or_empty_format_means_cloud_config() {
        for s in [
            secret(&[("value", b"#cloud-config\n")]),
            secret(&[("value", b"x"), ("format", b"")]),
        ] {
            assert_eq!(
                BootstrapData::from_secret(&s).unwrap().format,
                BootstrapFormat::CloudConfig
            );
        }
    }

    #[test]
    fn missing_value_is_an_error_naming_the_secret() {
        for s in [secret(&[("format", b"cloud-config")]), Secret::default()] {
            let err = BootstrapData::from_secret(&s).unwrap_err();
            assert!(
                matches!(err, Error::MissingBootstrapValue { key: "value", .. }),
                "{err}"
            );
            assert_eq!(err.metric_label(), "missing_bootstrap_value");
        }
        let err = BootstrapData::from_secret(&secret(&[])).unwrap_err();
        assert!(err.to_string().contains("\"m1-bootstrap\""), "{err}");
    }

    #[test]
    fn unknown_format_is_an_error() {
        let err = BootstrapData::from_secret(&secret(&[("value", b"x"), ("format", b"butane")])).unwrap_err();
        match &err {
            Error::UnknownBootstrapFormat { format, secret } => {
                assert_eq!((format.as_str(), secret.as_str()), ("butane", "m1-bootstrap"));
            }
            other => panic!("expected UnknownBootstrapFormat, got {other:?}"),
        }
        assert!(BootstrapData::from_secret(&secret(&[("value", b"x"), ("format", &[0xff, 0xfe])])).is_err());
    }

    #[test]
    fn format_round_trips_through_its_string() {
        for f in [BootstrapFormat::CloudConfig, BootstrapFormat::Ignition] {
            assert_eq!(BootstrapFormat::parse(f.as_str()), Some(f));
            assert_eq!(f.to_string(), f.as_str());
        }
        assert_eq!(BootstrapFormat::parse("Cloud-Config"), None);
    }

    #[test]
    fn debug_output_redacts_the_value() {
        let data = BootstrapData {
            format: BootstrapFormat::CloudConfig,
            value: b"token: s3cr3t".to_vec(),
        };
        let shown = format!("{data:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("13 bytes redacted"), "{shown}");
    }
}
