//! Kubeconfig files for the identities a test uses (admin, a client-certificate user, a
//! ServiceAccount), each usable from kube-rs and from the machine's `kubectl`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use kube::config::{KubeConfigOptions, Kubeconfig, NamedCluster};
use serde_json::json;

use crate::error::{Error, Result};
use crate::pki::CertAndKey;

/// Timeouts every kube-rs client built here uses: no API call of a test may hang forever.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// See [`CONNECT_TIMEOUT`]; also bounds a quiet watch, which kube-rs then restarts.
pub const READ_TIMEOUT: Duration = Duration::from_secs(295);
/// See [`CONNECT_TIMEOUT`].
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Environment variable naming the `kubectl` to run (default: `kubectl` on `PATH`).
pub const KUBECTL_ENV_VAR: &str = "BANLIEUE_KUBECTL";

/// How a kubeconfig authenticates.
#[derive(Clone, Debug)]
pub(crate) enum Credential {
    /// A client certificate and key (PEM).
    ClientCert(CertAndKey),
    /// A bearer token.
    Token(String),
}

/// A kubeconfig file on disk for one identity against one control plane.
///
/// Build a fresh [`kube::Client`] with [`KubeconfigFile::client`] in every test: a client is bound
/// to the tokio runtime that created its connections, and `#[tokio::test]` makes one per test.
#[derive(Clone, Debug)]
pub struct KubeconfigFile {
    path: PathBuf,
    identity: String,
    kubeconfig: Kubeconfig,
    kubectl_cache_dir: PathBuf,
}

impl KubeconfigFile {
    /// Renders and writes a kubeconfig whose single context uses `cluster` and `credential`.
    pub(crate) fn write(
        path: PathBuf,
        identity: String,
        cluster: &NamedCluster,
        credential: &Credential,
        namespace: Option<&str>,
        kubectl_cache_dir: PathBuf,
    ) -> Result<Self> {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let user = match credential {
            Credential::ClientCert(pair) => json!({
                "client-certificate-data": b64(&pair.cert_pem),
                "client-key-data": b64(&pair.key_pem),
            }),
            Credential::Token(token) => json!({ "token": token }),
        };
        let mut context = json!({ "cluster": cluster.name, "user": "testenv" });
        if let Some(namespace) = namespace {
            context["namespace"] = json!(namespace);
        }
        let value = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{ "name": "testenv", "user": user }],
            "contexts": [{ "name": "testenv", "context": context }],
            "current-context": "testenv",
        });
        let bad = |message: String| Error::Kubeconfig {
            path: path.clone(),
            message,
        };
        let kubeconfig: Kubeconfig =
            serde_json::from_value(value).map_err(|e| bad(format!("building kubeconfig: {e}")))?;
        let yaml = serde_yaml::to_string(&kubeconfig).map_err(|e| bad(format!("rendering YAML: {e}")))?;
        write_private(&path, &yaml)?;
        Ok(Self {
            path,
            identity,
            kubeconfig,
            kubectl_cache_dir,
        })
    }

    /// Loads an existing kubeconfig file (its current context).
    pub(crate) fn load(path: PathBuf, identity: String, kubectl_cache_dir: PathBuf) -> Result<Self> {
        let kubeconfig = Kubeconfig::read_from(&path).map_err(|e| Error::Kubeconfig {
            path: path.clone(),
            message: e.to_string(),
        })?;
        Ok(Self {
            path,
            identity,
            kubeconfig,
            kubectl_cache_dir,
        })
    }

    /// The kubeconfig file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Who this kubeconfig authenticates as (e.g. `admin`, `user alice`,
    /// `serviceaccount ns/name`), for messages.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The cluster entry of the current context, to mint further kubeconfigs for the same server.
    /// A relative `certificate-authority` path is made absolute.
    pub(crate) fn current_cluster(&self) -> Result<NamedCluster> {
        let bad = |message: String| Error::Kubeconfig {
            path: self.path.clone(),
            message,
        };
        let context_name = self
            .kubeconfig
            .current_context
            .as_deref()
            .ok_or_else(|| bad("no current-context".into()))?;
        let context = self
            .kubeconfig
            .contexts
            .iter()
            .find(|c| c.name == context_name)
            .and_then(|c| c.context.as_ref())
            .ok_or_else(|| bad(format!("context {context_name:?} not found")))?;
        let mut cluster = self
            .kubeconfig
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .cloned()
            .ok_or_else(|| bad(format!("cluster {:?} not found", context.cluster)))?;
        if let Some(inner) = cluster.cluster.as_mut()
            && let Some(ca) = inner.certificate_authority.as_mut()
            && Path::new(ca.as_str()).is_relative()
            && let Some(dir) = self.path.parent()
        {
            *ca = dir.join(&*ca).to_string_lossy().into_owned();
        }
        Ok(cluster)
    }

    /// The kube-rs configuration of this kubeconfig, with this crate's timeouts.
    pub async fn config(&self) -> Result<kube::Config> {
        let mut config =
            kube::Config::from_custom_kubeconfig(self.kubeconfig.clone(), &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Kubeconfig {
                    path: self.path.clone(),
                    message: e.to_string(),
                })?;
        config.connect_timeout = Some(CONNECT_TIMEOUT);
        config.read_timeout = Some(READ_TIMEOUT);
        config.write_timeout = Some(WRITE_TIMEOUT);
        Ok(config)
    }

    /// A new kube-rs client for this identity, bound to the calling tokio runtime.
    pub async fn client(&self) -> Result<kube::Client> {
        let config = self.config().await?;
        kube::Client::try_from(config)
            .map_err(|e| Error::kube(format!("building client for {}", self.identity), e))
    }

    /// A `kubectl` command (the machine's, or [`KUBECTL_ENV_VAR`]) with `--kubeconfig` set to this
    /// file and a `--cache-dir` private to this environment, so that a discovery cache left by
    /// another control plane cannot mislead it. Add the subcommand and its arguments.
    pub fn kubectl(&self) -> Command {
        let program = std::env::var_os(KUBECTL_ENV_VAR).unwrap_or_else(|| "kubectl".into());
        let mut command = Command::new(program);
        command
            .arg("--kubeconfig")
            .arg(&self.path)
            .arg("--cache-dir")
            .arg(&self.kubectl_cache_dir);
        command
    }
}

fn write_private(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(contents.as_bytes()))
        .map_err(|e| Error::io("writing", path, e))
}

/// A cluster entry for a server URL whose certificate is signed by `ca_pem`.
pub(crate) fn cluster_entry(name: &str, server: &str, ca_pem: &str) -> Result<NamedCluster> {
    let value = json!({
        "name": name,
        "cluster": {
            "server": server,
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca_pem),
        },
    });
    serde_json::from_value(value).map_err(|e| Error::Kubeconfig {
        path: PathBuf::from("<memory>"),
        message: format!("building cluster entry: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_kubeconfig_that_reads_back() {
        let dir = std::env::temp_dir().join(format!("banlieue-testenv-kc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cluster = cluster_entry("local", "https://127.0.0.1:6443", "CA").unwrap();
        let file = KubeconfigFile::write(
            dir.join("sa.kubeconfig"),
            "serviceaccount ns/robot".into(),
            &cluster,
            &Credential::Token("tkn".into()),
            Some("ns"),
            dir.join("cache"),
        )
        .unwrap();
        let loaded = KubeconfigFile::load(file.path().to_owned(), "again".into(), dir.join("cache")).unwrap();
        let round = loaded.current_cluster().unwrap();
        let inner = round.cluster.unwrap();
        assert_eq!(inner.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(inner.certificate_authority_data.as_deref(), Some("Q0E="));
        let text = std::fs::read_to_string(file.path()).unwrap();
        assert!(
            text.contains("token: tkn") && text.contains("namespace: ns"),
            "{text}"
        );
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(file.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "kubeconfig must not be group/world readable");

        let kubectl = file.kubectl();
        let args: Vec<_> = kubectl
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(args[0], "--kubeconfig");
        assert_eq!(args[2], "--cache-dir");
        assert!(args[3].ends_with("cache"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn relative_certificate_authority_is_made_absolute() {
        let dir = std::env::temp_dir().join(format!("banlieue-testenv-kc2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n\
             clusters:\n- name: k\n  cluster: {server: 'https://x:1', certificate-authority: ca.crt}\n\
             users:\n- name: u\n  user: {token: t}\n",
        )
        .unwrap();
        let file = KubeconfigFile::load(path, "admin".into(), dir.join("cache")).unwrap();
        let cluster = file.current_cluster().unwrap().cluster.unwrap();
        assert_eq!(
            cluster.certificate_authority.unwrap(),
            dir.join("ca.crt").to_string_lossy()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
