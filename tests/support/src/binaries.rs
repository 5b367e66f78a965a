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
        Self::locate_in(&bin_dir(), controller_manager)
    }

    fn locate_in(dir: &Path, controller_manager: bool) -> Result<Self> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binaries_are_reported_with_their_path() {
        let dir = std::env::temp_dir().join(format!("banlieue-testenv-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = Binaries::locate_in(&dir, true).unwrap_err();
        assert!(
            matches!(&err, Error::MissingBinary { name, path } if name == "etcd" && path == &dir.join("etcd"))
        );
        for name in ["etcd", "kube-apiserver"] {
            std::fs::write(dir.join(name), "").unwrap();
        }
        let err = Binaries::locate_in(&dir, true).unwrap_err();
        assert!(err.to_string().contains("kube-controller-manager"), "{err}");
        let found = Binaries::locate_in(&dir, false).unwrap();
        assert!(found.kube_controller_manager.is_none());
        assert!(found.kube_apiserver.ends_with("kube-apiserver"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn default_directory_is_in_the_workspace() {
        if std::env::var_os(BIN_DIR_ENV_VAR).is_none() {
            assert!(
                bin_dir().ends_with("tests/support/../controlplane/bin"),
                "{}",
                bin_dir().display()
            );
        }
    }
}
