//! The real `clusterctl init` (built by `tests/controlplane/build.sh`) over banlieue's local
//! repository (written by the `banlieue-clusterctl` binary beside this one), offline, as a user
//! of an air-gapped management cluster runs it.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use banlieue_testenv::TestEnv;

/// How long `clusterctl init` gets.
const INIT_TIMEOUT: Duration = Duration::from_secs(300);

/// Writes the local repository into `dir/repository` (`banlieue-clusterctl repository`, with
/// `repository_args`, e.g. `--capi-components DIR`) and runs `clusterctl init --infrastructure
/// <infrastructure>` with its offline configuration against `env`, with `variables` (the
/// provider's credentials, feature gates) in clusterctl's environment and a private HOME in
/// `dir/home`. CAPI's core, kubeadm bootstrap and control-plane providers come with it.
pub fn init(
    env: &TestEnv,
    dir: &Path,
    infrastructure: &str,
    variables: &[(&str, String)],
    repository_args: &[&OsStr],
) -> anyhow::Result<()> {
    let repository = dir.join("repository");
    let banlieue_clusterctl = crate::binary_dir()?.join("banlieue-clusterctl");
    let output = Command::new(&banlieue_clusterctl)
        .arg("repository")
        .arg(&repository)
        .args(repository_args)
        .output()
        .with_context(|| {
            format!(
                "running {} (cargo build -p banlieue-clusterctl)",
                banlieue_clusterctl.display()
            )
        })?;
    ensure!(
        output.status.success(),
        "banlieue-clusterctl repository: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let home = dir.join("home");
    std::fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
    let mut init = Command::new(banlieue_testenv::bin_dir().join("clusterctl"));
    init.arg("init")
        .arg(format!(
            "--config={}",
            repository.join("clusterctl-offline.yaml").display()
        ))
        .arg(format!("--kubeconfig={}", env.admin().path().display()))
        .args(["--infrastructure", infrastructure])
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .envs(variables.iter().map(|(k, v)| (*k, v.as_str())));
    let output = banlieue_testenv::run_with_timeout(&mut init, INIT_TIMEOUT)
        .context("running clusterctl (tests/controlplane/build.sh builds it)")?;
    ensure!(
        output.status.success(),
        "clusterctl init: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}
