//! The error type of the test environment.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while starting, using or stopping a [`crate::TestEnv`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A control-plane binary is missing: the Go build has not been run.
    #[error(
        "control-plane binary `{name}` not found at {path}: run `tests/controlplane/build.sh` \
         (or point BANLIEUE_CONTROLPLANE_BIN at a directory holding etcd, kube-apiserver and \
         kube-controller-manager)"
    )]
    MissingBinary {
        /// The binary's file name.
        name: String,
        /// Where it was looked for.
        path: PathBuf,
    },

    /// A helper program from the machine (e.g. `setpriv`, `kubectl`) is not installed.
    #[error("program `{name}` not found on PATH ({hint})")]
    MissingProgram {
        /// The program's name.
        name: &'static str,
        /// Which package provides it.
        hint: &'static str,
    },

    /// A file-system operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A child process could not be started.
    #[error("could not start {name}: {source}")]
    Spawn {
        /// The component name.
        name: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A control-plane process exited while it should be running.
    #[error("{name} exited unexpectedly ({status}); last lines of {log}:\n{tail}")]
    ProcessExited {
        /// The component name.
        name: String,
        /// Its exit status.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The end of its log file.
        tail: String,
    },

    /// Something did not become ready in time.
    #[error("timed out after {timeout:?} waiting for {what}{detail}")]
    Timeout {
        /// What was being waited for.
        what: String,
        /// How long was waited.
        timeout: Duration,
        /// Extra context (last error seen, log tail), may be empty.
        detail: String,
    },

    /// A certificate or key could not be generated.
    #[error("generating {what}: {source}")]
    Pki {
        /// Which certificate or key.
        what: String,
        /// The underlying error.
        #[source]
        source: rcgen::Error,
    },

    /// A kubeconfig could not be built or loaded.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },

    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The underlying error.
        #[source]
        source: kube::Error,
    },

    /// A manifest could not be parsed.
    #[error("parsing {what}: {message}")]
    Manifest {
        /// The file or value being parsed.
        what: String,
        /// What was wrong.
        message: String,
    },

    /// The operation needs a control plane this crate started (it holds the cluster CA key),
    /// but the environment targets an existing cluster via `BANLIEUE_TEST_KUBECONFIG`.
    #[error("{operation} is not possible against an existing cluster (BANLIEUE_TEST_KUBECONFIG)")]
    Unsupported {
        /// What was attempted.
        operation: &'static str,
    },

    /// The shared environment failed to start earlier in this test binary.
    #[error("the shared test environment failed to start: {0}")]
    SharedStartFailed(String),

    /// This machine lacks what a real node needs (programs, CNI plugins, binaries, cgroups).
    #[error("a real node needs: {0}")]
    MissingNodePrerequisites(String),

    /// Setting up or starting a real node failed.
    #[error("real node: {0}")]
    NodeSetup(String),

    /// An environment variable holds an unusable value.
    #[error("environment variable {name}={value:?}: {message}")]
    BadEnvVar {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        message: String,
    },
}

impl Error {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            action: action.into(),
            source,
        }
    }

    pub(crate) fn pki(what: impl Into<String>, source: rcgen::Error) -> Self {
        Self::Pki {
            what: what.into(),
            source,
        }
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
