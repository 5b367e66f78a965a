//! Running a README's shell blocks as written: a fenced `sh` block after a
//! `<!-- readme-test: NAME -->` marker is a bash script a test runs from the repository root with
//! a private HOME (and the machine's Go caches, so `tests/controlplane/build.sh` finds its
//! modules and compiled packages without a download).

use std::path::Path;
use std::process::Command;

use crate::{Error, Result, bin_dir};

/// The `sh` block after `<!-- readme-test: NAME -->` in `root/file`.
pub fn block(root: &Path, file: &str, name: &str) -> Result<String> {
    let path = root.join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io("reading", &path, e))?;
    let bad = |message: String| Error::Manifest {
        what: format!("{file} block {name}"),
        message,
    };
    let marker = format!("<!-- readme-test: {name} -->");
    let after = text
        .split(&marker)
        .nth(1)
        .ok_or_else(|| bad(format!("no {marker}")))?;
    let body = after
        .trim_start()
        .strip_prefix("```sh\n")
        .ok_or_else(|| bad(format!("{marker} is not followed by a ```sh block")))?;
    let end = body
        .find("\n```")
        .ok_or_else(|| bad("unterminated block".to_owned()))?;
    Ok(body[..=end].to_owned())
}

/// `bash -euo pipefail -c script` under coreutils' `timeout` (which ends the whole block and
/// leaves its output to show), from `root`, with nothing of this process's environment but
/// `PATH`: HOME and XDG_CONFIG_HOME are `home`, `BANLIEUE_CONTROLPLANE_BIN` is [`bin_dir`],
/// clusterctl's version check is off and the Go caches are this machine's. With
/// `control_plane_bin_on_path` the control plane's bin folder (clusterctl) leads PATH, as after
/// an earlier block's `eval "$(tests/controlplane/build.sh --clusterctl)"`.
pub fn bash(
    root: &Path,
    script: &str,
    home: &Path,
    timeout_secs: u32,
    control_plane_bin_on_path: bool,
) -> Result<Command> {
    let mut path = std::env::var_os("PATH").unwrap_or_default();
    if control_plane_bin_on_path {
        path = std::env::join_paths(std::iter::once(bin_dir()).chain(std::env::split_paths(&path))).map_err(
            |e| Error::BadEnvVar {
                name: "PATH",
                value: path.to_string_lossy().into_owned(),
                message: e.to_string(),
            },
        )?;
    }
    let mut command = Command::new("timeout");
    command
        .args([
            &timeout_secs.to_string(),
            "bash",
            "-euo",
            "pipefail",
            "-c",
            script,
        ])
        .current_dir(root)
        .env_clear()
        .env("PATH", path)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env(crate::BIN_DIR_ENV_VAR, bin_dir())
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true");
    for (var, value) in go_env()? {
        command.env(var, value);
    }
    Ok(command)
}

/// `GOPATH`, `GOMODCACHE` and `GOCACHE` as `go env` reports them for this process.
fn go_env() -> Result<Vec<(&'static str, String)>> {
    const VARS: [&str; 3] = ["GOPATH", "GOMODCACHE", "GOCACHE"];
    let output = Command::new("go")
        .arg("env")
        .args(VARS)
        .output()
        .map_err(|source| Error::Spawn {
            name: "go env (build.sh needs Go on PATH)".to_owned(),
            source,
        })?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let values: Vec<&str> = text.lines().collect();
    if !output.status.success() || values.len() != VARS.len() {
        return Err(Error::Manifest {
            what: "the output of `go env GOPATH GOMODCACHE GOCACHE`".to_owned(),
            message: format!("{text:?} {}", String::from_utf8_lossy(&output.stderr)),
        });
    }
    Ok(VARS
        .into_iter()
        .zip(values.into_iter().map(str::to_owned))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_the_sh_fence_after_its_marker() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("R.md"),
            "x\n<!-- readme-test: a -->\n```sh\necho a\necho b\n```\n<!-- readme-test: b -->\ntext\n",
        )
        .unwrap();
        assert_eq!(block(dir.path(), "R.md", "a").unwrap(), "echo a\necho b\n");
        let err = block(dir.path(), "R.md", "b").unwrap_err().to_string();
        assert!(err.contains("not followed by a ```sh block"), "{err}");
        let err = block(dir.path(), "R.md", "c").unwrap_err().to_string();
        assert!(err.contains("no <!-- readme-test: c -->"), "{err}");
    }
}
