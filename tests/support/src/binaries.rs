//! Locating the control-plane binaries built by `tests/controlplane/build.sh`.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Environment variable: directory holding `etcd`, `kube-apiserver` and `kube-controller-manager`
/// (default: `<workspace>/tests/controlplane/bin`).
pub const BIN_DIR_ENV_VAR: &str = "BANLIEUE_CONTROLPLANE_BIN";

/// The directory the control-plane binaries are taken from.
pub fn bin_dir() -> PathBuf {
    match std::env::var_os(BIN_DIR_ENV_VAR) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../controlplane/bin"),
    }
}

/// Paths of the binaries one environment runs.
#[derive(Debug)]
pub(crate) struct Binaries {
    pub(crate) etcd: PathBuf,
    pub(crate) kube_apiserver: PathBuf,
    pub(crate) kube_controller_manager: Option<PathBuf>,
}

impl Binaries {
    /// Finds the binaries, failing with a hint to run the build script if one is missing.
    pub(crate) fn locate(controller_manager: bool) -> Result<Self> {
        let dir = bin_dir();
        let find = |name: &str| -> Result<PathBuf> {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path.canonicalize().unwrap_or(path))
            } else {
                Err(Error::MissingBinary {
                    name: name.to_owned(),
                    path,
                })
            }
        };
        Ok(Self {
            etcd: find("etcd")?,
            kube_apiserver: find("kube-apiserver")?,
            kube_controller_manager: if controller_manager {
                Some(find("kube-controller-manager")?)
            } else {
                None
            },
        })
    }
}
