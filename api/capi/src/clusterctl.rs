//! clusterctl's provider `metadata.yaml` (`clusterctl.cluster.x-k8s.io/v1alpha3` `Metadata`).
//!
//! Hand-written because the kind keeps its fields at the top level (no `spec`), which kopium
//! cannot turn into a `kube::CustomResource`; `tests/generated.rs` checks the field names
//! against CAPI's CRD for the kind.
//!
//! clusterctl requires the release's `major.minor` to match one series, and that series'
//! `contract` to agree with the provider's CRD contract labels.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// `apiVersion` of the metadata file.
pub const METADATA_API_VERSION: &str = "clusterctl.cluster.x-k8s.io/v1alpha3";
/// `kind` of the metadata file.
pub const METADATA_KIND: &str = "Metadata";

/// The content of a provider's `metadata.yaml`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// Always [`METADATA_API_VERSION`].
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// Always [`METADATA_KIND`].
    pub kind: String,
    /// The provider's release series and the contract each implements.
    #[serde(rename = "releaseSeries", default)]
    pub release_series: Vec<ReleaseSeries>,
}

/// One provider release series (`major.minor`) and the CAPI contract it implements.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ReleaseSeries {
    /// Major version of the release series.
    pub major: i32,
    /// Minor version of the release series.
    pub minor: i32,
    /// The CAPI contract the series implements, e.g. `v1beta2`.
    pub contract: String,
}

impl Metadata {
    /// Metadata with the given series.
    pub fn new(release_series: Vec<ReleaseSeries>) -> Self {
        Self {
            api_version: METADATA_API_VERSION.to_owned(),
            kind: METADATA_KIND.to_owned(),
            release_series,
        }
    }

    /// The series for a release version such as `v0.3.1` or `0.3.1` (pre-release and build
    /// suffixes ignored), as clusterctl matches it.
    pub fn series_for(&self, release: &str) -> Result<&ReleaseSeries> {
        let (major, minor) = major_minor(release)?;
        self.release_series
            .iter()
            .find(|s| s.major == major && s.minor == minor)
            .ok_or_else(|| Error::NoReleaseSeries {
                release: release.to_owned(),
            })
    }
}

/// `major` and `minor` of a `v`-prefixed or plain semantic version.
fn major_minor(release: &str) -> Result<(i32, i32)> {
    let invalid = || Error::InvalidReleaseVersion {
        release: release.to_owned(),
    };
    let core = release.strip_prefix('v').unwrap_or(release);
    let core = core.split(['-', '+']).next().unwrap_or_default();
    let mut parts = core.split('.');
    let mut next = || -> Result<i32> { parts.next().and_then(|p| p.parse().ok()).ok_or_else(invalid) };
    let (major, minor, _patch) = (next()?, next()?, next()?);
    if parts.next().is_some() {
        return Err(invalid());
    }
    Ok((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata() -> Metadata {
        Metadata::new(vec![
            ReleaseSeries {
                major: 0,
                minor: 1,
                contract: "v1beta2".into(),
            },
            ReleaseSeries {
                major: 0,
                minor: 2,
                contract: "v1beta2".into(),
            },
        ])
    }

    #[test]
    fn parses_a_metadata_file() {
        let text = "apiVersion: clusterctl.cluster.x-k8s.io/v1alpha3\nkind: Metadata\nreleaseSeries:\n  - major: 0\n    minor: 1\n    contract: v1beta2\n";
        let parsed: Metadata = serde_yaml::from_str(text).unwrap();
        assert_eq!(
            parsed,
            Metadata::new(vec![ReleaseSeries {
                major: 0,
                minor: 1,
                contract: "v1beta2".into()
            }])
        );
        let back: serde_json::Value = serde_json::to_value(&parsed).unwrap();
        assert_eq!(back["releaseSeries"][0]["contract"], "v1beta2");
        assert_eq!(back["apiVersion"], METADATA_API_VERSION);
    }

    #[test]
    fn finds_the_series_of_a_release() {
        let m = metadata();
        for (release, minor) in [
            ("v0.1.0", 1),
            ("0.2.7", 2),
            ("v0.2.0-rc.1", 2),
            ("v0.1.3+build.5", 1),
        ] {
            assert_eq!(m.series_for(release).unwrap().minor, minor, "{release}");
        }
    }

    #[test]
    fn rejects_unknown_series_and_bad_versions() {
        let m = metadata();
        match m.series_for("v0.3.0") {
            Err(Error::NoReleaseSeries { release }) => assert_eq!(release, "v0.3.0"),
            other => panic!("expected NoReleaseSeries, got {other:?}"),
        }
        for bad in ["", "v1", "v1.2", "v1.2.x", "1.2.3.4", "va.b.c"] {
            let err = m.series_for(bad).unwrap_err();
            assert!(
                matches!(err, Error::InvalidReleaseVersion { .. }),
                "{bad:?}: {err}"
            );
            assert_eq!(err.metric_label(), "invalid_release_version");
        }
    }
}
