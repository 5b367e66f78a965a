//! A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) for tests.
//!
//! The binaries are built from pinned upstream Go modules by `tests/controlplane/build.sh` (see
//! `tests/controlplane/README.md`). [`TestEnv`] starts them on a random loopback address with
//! fresh certificates, RBAC authorization and a service-account signing key, waits until
//! `/readyz` is ok and the controllers run, installs CRDs, and tears everything down on drop.
//! No process outlives the test binary, even on panic: see [`ManagedProcess`].
//!
//! ```no_run
//! # async fn example() -> banlieue_testenv::Result<()> {
//! use banlieue_testenv::TestEnv;
//! let env = TestEnv::shared().await?; // one control plane per test binary
//! let ns = env.namespace("my-test").await?; // one namespace per test
//! let client = env.client().await?; // a fresh client per test (per tokio runtime)
//! let status = env.kubectl().args(["get", "ns", ns.name()]).status().expect("kubectl runs");
//! assert!(status.success());
//! # Ok(()) }
//! ```
//!
//! Set `BANLIEUE_TEST_KUBECONFIG` to run the same tests against an existing cluster instead.

mod binaries;
mod crds;
mod env;
mod error;
pub mod files;
pub mod guests;
pub mod images;
mod kubeconfig;
pub mod nodes;
mod pki;
mod process;
pub mod readme;
mod setup;
mod workdir;

pub use binaries::{BIN_DIR_ENV_VAR, bin_dir};
pub use crds::{FIELD_MANAGER, cert_manager_stub_crds, crds_from_files, crds_from_yaml, install_crds};
pub use env::{
    EXTERNAL_KUBECONFIG_ENV_VAR, NAMESPACE_LABEL, START_TIMEOUT_ENV_VAR, TestEnv, TestEnvBuilder,
    TestNamespace, free_port,
};
pub use error::{Error, Result};
pub use kubeconfig::{CONNECT_TIMEOUT, KUBECTL_ENV_VAR, KubeconfigFile, READ_TIMEOUT, WRITE_TIMEOUT};
pub use pki::CertAndKey;
pub use process::ManagedProcess;
pub use workdir::KEEP_ENV_VAR;

/// Runs a command to completion, killing it after `timeout`; returns its output. Use it for
/// `kubectl` so that a hung command fails the test instead of hanging it.
pub fn run_with_timeout(
    command: &mut std::process::Command,
    timeout: std::time::Duration,
) -> Result<std::process::Output> {
    use std::io::Read as _;
    use std::process::Stdio;
    let program = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| Error::Spawn {
            name: program.clone(),
            source,
        })?;
    // Drain both pipes on threads so a chatty child cannot block on a full pipe.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Timeout {
                    what: format!("`{program}` to finish"),
                    timeout,
                    detail: String::new(),
                });
            }
            Err(source) => {
                return Err(Error::Spawn {
                    name: program,
                    source,
                });
            }
        }
    };
    Ok(std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn run_with_timeout_captures_output_and_kills_slow_commands() {
        let mut echo = std::process::Command::new("sh");
        echo.args(["-c", "echo out; echo err >&2; exit 4"]);
        let output = run_with_timeout(&mut echo, Duration::from_secs(10)).unwrap();
        assert_eq!(output.status.code(), Some(4));
        assert_eq!(output.stdout, b"out\n");
        assert_eq!(output.stderr, b"err\n");

        let mut slow = std::process::Command::new("sleep");
        slow.arg("30");
        let started = std::time::Instant::now();
        let err = run_with_timeout(&mut slow, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn missing_binaries_point_at_the_build_script() {
        let err = Error::MissingBinary {
            name: "etcd".into(),
            path: "/x/etcd".into(),
        }
        .to_string();
        assert!(err.contains("tests/controlplane/build.sh"), "{err}");
    }
}
