//! Where Cluster API's published CRDs are: `api/capi/crds/` in this repository (CAPI v1.14,
//! Apache-2.0, see its README), or the folder named by [`DIR_ENV`].
//!
//! They are what `generate.sh` made [`crate::generated`] from, what the local environment
//! installs and what tests validate CAPI objects against. Nothing outside this repository is
//! read: a clone is self-contained.

use std::path::{Path, PathBuf};

/// Environment variable naming another folder of CAPI CRDs (`*.yaml`).
pub const DIR_ENV: &str = "BANLIEUE_CAPI_CRDS";

/// API group of clusterctl's own CRDs (its inventory and `metadata.yaml` kinds): `clusterctl
/// init` installs them; they are not part of any CAPI provider's components.
pub const CLUSTERCTL_GROUP: &str = "clusterctl.cluster.x-k8s.io";

/// The CAPI release series the CRDs (and the generated types) come from.
pub const SERIES: &str = "v1.14";

/// The folder of CAPI's CRDs: `$BANLIEUE_CAPI_CRDS`, else the repository's `api/capi/crds`.
pub fn dir() -> PathBuf {
    std::env::var_os(DIR_ENV).map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("crds"),
        PathBuf::from,
    )
}

/// One CRD file of [`dir`], e.g. `cluster.x-k8s.io_clusters.yaml`.
pub fn file(name: &str) -> PathBuf {
    dir().join(name)
}

/// The CRD files (`*.yaml`) of `dir`, sorted by name. A folder that is missing or holds no CRD
/// is an error that names the folder and [`DIR_ENV`].
pub fn files_in(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let not_found = |detail: String| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "no CAPI CRDs in {}: {detail} (the repository keeps them in api/capi/crds; \
                 {DIR_ENV} names another folder)",
                dir.display()
            ),
        )
    };
    let entries = std::fs::read_dir(dir).map_err(|e| not_found(e.to_string()))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(not_found("no *.yaml file".to_owned()));
    }
    files.sort();
    Ok(files)
}

/// The CRD files of [`dir`]; see [`files_in`].
pub fn files() -> std::io::Result<Vec<PathBuf>> {
    files_in(&dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_holds_every_crd_capi_managers_watch() {
        let names: Vec<String> = files()
            .expect("api/capi/crds is readable")
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for wanted in [
            "cluster.x-k8s.io_clusters.yaml",
            "cluster.x-k8s.io_machines.yaml",
            "cluster.x-k8s.io_clusterclasses.yaml",
            "cluster.x-k8s.io_machinedrainrules.yaml",
            "runtime.cluster.x-k8s.io_extensionconfigs.yaml",
            "ipam.cluster.x-k8s.io_ipaddressclaims.yaml",
            "bootstrap.cluster.x-k8s.io_kubeadmconfigs.yaml",
            "controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml",
        ] {
            assert!(
                names.iter().any(|n| n == wanted),
                "{wanted} missing from {names:?}"
            );
        }
    }

    #[test]
    fn a_folder_without_crds_is_an_error_naming_it_and_the_variable() {
        let empty = tempfile::tempdir().unwrap();
        let err = files_in(empty.path()).unwrap_err().to_string();
        assert!(err.contains(&empty.path().display().to_string()), "{err}");
        assert!(err.contains(DIR_ENV), "{err}");
        let err = files_in(&empty.path().join("missing")).unwrap_err().to_string();
        assert!(err.contains("missing") && err.contains(DIR_ENV), "{err}");
    }
}
