//! Connection settings of a ProxmoxCluster: endpoint, credentials Secret and TLS trust, turned
//! into a Proxmox client. Secrets are read here and never logged (the client's `Secret` type
//! redacts them in `Debug`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use banlieue_api::banlieue::{Backend, Provider};
use banlieue_api::common::{CaBundleKind, SecretReference, TlsTrust};
use banlieue_api::infrastructure::ProxmoxCluster;
use banlieue_pve_client::{Auth, Client, TlsVerification};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, ResourceExt};

use crate::error::{Error, Result};
use crate::hypervisor::Hypervisor;
use banlieue_provider_runtime::secret_watch::SecretKey;

/// Secret key of the API token id (`user@realm!name`).
pub const TOKEN_ID_KEY: &str = "tokenID";
/// Secret key of the API token secret.
pub const TOKEN_SECRET_KEY: &str = "secret";
/// Secret key of a user name (`user@realm`), used with [`PASSWORD_KEY`] when no token is given.
pub const USERNAME_KEY: &str = "username";
/// Secret key of the password.
pub const PASSWORD_KEY: &str = "password";
/// Timeout of one Proxmox API request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything needed to build a client; `Debug` shows no secret.
#[derive(Clone)]
pub struct Connection {
    /// `https://host:8006`.
    pub endpoint: String,
    /// Token or password.
    pub auth: Auth,
    /// Certificate trust.
    pub tls: TlsVerification,
    /// Changes whenever a referenced Secret/ConfigMap or the settings change (cache key).
    pub version: String,
    /// Nodes machines may use: the ProxmoxCluster's `allowedNodes`, else its Provider's
    /// `nodes`; empty = every online node.
    pub allowed_nodes: Vec<String>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("endpoint", &self.endpoint)
            .field("auth", &"<redacted>")
            .finish_non_exhaustive()
    }
}

fn secret_text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| String::from_utf8_lossy(&v.0).trim().to_owned())
        .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(key)).cloned())
        .filter(|v| !v.is_empty())
}

/// Where a ProxmoxCluster's connection settings come from: its own spec, or the banlieue
/// `Provider` its `spec.providerRef` names (standalone mode).
#[derive(Clone, Debug, PartialEq)]
pub struct ConnectionSource {
    /// `https://host:8006`.
    pub endpoint: String,
    /// The credentials Secret, with its namespace resolved.
    pub credentials: SecretReference,
    /// TLS trust, CA bundle namespace resolved.
    pub tls: Option<TlsTrust>,
    /// Nodes machines may use (each a failure domain); empty = every online node.
    pub allowed_nodes: Vec<String>,
}

/// The connection source of `cluster` given the Provider its `spec.providerRef` names (if
/// any; `None` when it does not exist). Pure.
pub fn connection_source(cluster: &ProxmoxCluster, provider: Option<&Provider>) -> Result<ConnectionSource> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let spec = &cluster.spec;
    if let Some(pref) = &spec.provider_ref {
        let provider = provider.ok_or_else(|| Error::Provider {
            reason: "ProviderNotFound",
            message: format!("Provider {:?} (spec.providerRef) not found", pref.name),
        })?;
        if provider.spec.backend != Backend::Proxmox {
            return Err(Error::Provider {
                reason: "ProviderBackendMismatch",
                message: format!(
                    "Provider {:?} has backend {}, a ProxmoxCluster needs a proxmox Provider",
                    pref.name,
                    provider.spec.backend.as_str()
                ),
            });
        }
        let cref = provider.spec.credentials_ref.clone().ok_or_else(|| {
            Error::Credentials(format!("Provider {:?} has no spec.credentialsRef", pref.name))
        })?;
        // A Provider is cluster-scoped: its references carry their namespace (a CEL rule
        // enforces it); fall back to the ProxmoxCluster's namespace regardless.
        let credentials = SecretReference {
            namespace: Some(cref.namespace.unwrap_or_else(|| namespace.clone())),
            name: cref.name,
        };
        let mut tls = provider.spec.tls.clone();
        if let Some(ca) = tls.as_mut().and_then(|t| t.ca_bundle_ref.as_mut())
            && ca.namespace.is_none()
        {
            ca.namespace = Some(namespace.clone());
        }
        let allowed_nodes = if spec.allowed_nodes.is_empty() {
            provider.spec.nodes.clone()
        } else {
            spec.allowed_nodes.clone()
        };
        return Ok(ConnectionSource {
            endpoint: provider.spec.endpoint.clone(),
            credentials,
            tls,
            allowed_nodes,
        });
    }
    let endpoint = spec.endpoint.clone().ok_or_else(|| {
        Error::Credentials(format!("ProxmoxCluster {namespace}/{name} has no spec.endpoint"))
    })?;
    let cref = spec.credentials_ref.as_ref().ok_or_else(|| {
        Error::Credentials(format!(
            "ProxmoxCluster {namespace}/{name} has no spec.credentialsRef"
        ))
    })?;
    let mut tls = spec.tls.clone();
    if let Some(ca) = tls.as_mut().and_then(|t| t.ca_bundle_ref.as_mut())
        && ca.namespace.is_none()
    {
        ca.namespace = Some(namespace.clone());
    }
    Ok(ConnectionSource {
        endpoint,
        credentials: SecretReference {
            name: cref.name.clone(),
            namespace: Some(cref.namespace.clone().unwrap_or_else(|| namespace.clone())),
        },
        tls,
        allowed_nodes: spec.allowed_nodes.clone(),
    })
}

/// The Secrets a connection source references: the credentials and a CA bundle Secret (what
/// the Secret watch triggers the ProxmoxCluster on, [`banlieue_provider_runtime::secret_watch`]).
pub fn referenced_secrets(source: &ConnectionSource) -> Vec<SecretKey> {
    let credentials = SecretKey::new(
        source.credentials.namespace.clone().unwrap_or_default(),
        source.credentials.name.clone(),
    );
    let ca = source
        .tls
        .as_ref()
        .and_then(|t| t.ca_bundle_ref.as_ref())
        .filter(|ca| matches!(ca.kind, CaBundleKind::Secret))
        .map(|ca| SecretKey::new(ca.namespace.clone().unwrap_or_default(), ca.name.clone()));
    std::iter::once(credentials).chain(ca).collect()
}

/// The connection source of a ProxmoxCluster ([`connection_source`]) after reading the
/// Provider its `spec.providerRef` names, and that Provider.
pub async fn read_source(
    client: &kube::Client,
    cluster: &ProxmoxCluster,
) -> Result<(ConnectionSource, Option<Provider>)> {
    let provider = match &cluster.spec.provider_ref {
        Some(p) => Api::<Provider>::all(client.clone())
            .get_opt(&p.name)
            .await
            .map_err(|e| Error::kube(format!("reading Provider {}", p.name), e))?,
        None => None,
    };
    Ok((connection_source(cluster, provider.as_ref())?, provider))
}

/// Reads the connection settings of a ProxmoxCluster: `spec.endpoint`, `spec.credentialsRef`,
/// `spec.tls`, or those of the cluster-scoped banlieue `Provider` named by `spec.providerRef`.
pub async fn read_connection(client: &kube::Client, cluster: &ProxmoxCluster) -> Result<Connection> {
    let (source, provider) = read_source(client, cluster).await?;
    connection_from(client, cluster, source, provider.as_ref()).await
}

/// Reads the Secret (and CA bundle) of `source` into connection settings.
pub async fn connection_from(
    client: &kube::Client,
    cluster: &ProxmoxCluster,
    source: ConnectionSource,
    provider: Option<&Provider>,
) -> Result<Connection> {
    let namespace = cluster.namespace().unwrap_or_default();
    let endpoint = source.endpoint.clone();
    let cref = &source.credentials;
    let secret_ns = cref.namespace.clone().unwrap_or_else(|| namespace.clone());
    let secret = Api::<Secret>::namespaced(client.clone(), &secret_ns)
        .get_opt(&cref.name)
        .await
        .map_err(|e| Error::kube(format!("reading Secret {secret_ns}/{}", cref.name), e))?
        .ok_or_else(|| Error::Credentials(format!("Secret {secret_ns}/{} not found", cref.name)))?;
    let auth = match (
        secret_text(&secret, TOKEN_ID_KEY),
        secret_text(&secret, TOKEN_SECRET_KEY),
        secret_text(&secret, USERNAME_KEY),
        secret_text(&secret, PASSWORD_KEY),
    ) {
        (Some(token_id), Some(secret), _, _) => Auth::Token {
            token_id,
            secret: secret.into(),
        },
        (_, _, Some(username), Some(password)) => Auth::Password {
            username,
            password: password.into(),
        },
        _ => {
            return Err(Error::Credentials(format!(
                "Secret {secret_ns}/{} must have keys {TOKEN_ID_KEY} and {TOKEN_SECRET_KEY} (or {USERNAME_KEY} and {PASSWORD_KEY})",
                cref.name
            )));
        }
    };
    let mut version = format!(
        "{endpoint}|{}|{}",
        secret.metadata.uid.as_deref().unwrap_or(""),
        secret.resource_version().unwrap_or_default()
    );
    let tls = match &source.tls {
        None => TlsVerification::WebPki,
        Some(t) if t.insecure_skip_verify == Some(true) => TlsVerification::InsecureSkipVerify,
        Some(t) if t.sha256_fingerprint.is_some() => {
            TlsVerification::Fingerprint(t.sha256_fingerprint.clone().unwrap_or_default())
        }
        Some(t) => match &t.ca_bundle_ref {
            None => TlsVerification::WebPki,
            Some(ca) => {
                let ns = ca.namespace.clone().unwrap_or_else(|| namespace.clone());
                let key = ca.key.clone().unwrap_or_else(|| "ca.crt".to_owned());
                let missing = || {
                    Error::Credentials(format!(
                        "CA bundle {:?} {ns}/{} has no key {key}",
                        ca.kind, ca.name
                    ))
                };
                let pem = match ca.kind {
                    CaBundleKind::Secret => {
                        let s = Api::<Secret>::namespaced(client.clone(), &ns)
                            .get(&ca.name)
                            .await
                            .map_err(|e| {
                                Error::kube(format!("reading CA bundle Secret {ns}/{}", ca.name), e)
                            })?;
                        version.push_str(&s.resource_version().unwrap_or_default());
                        secret_text(&s, &key).ok_or_else(missing)?
                    }
                    CaBundleKind::ConfigMap => {
                        let c = Api::<ConfigMap>::namespaced(client.clone(), &ns)
                            .get(&ca.name)
                            .await
                            .map_err(|e| {
                                Error::kube(format!("reading CA bundle ConfigMap {ns}/{}", ca.name), e)
                            })?;
                        version.push_str(&c.resource_version().unwrap_or_default());
                        c.data
                            .as_ref()
                            .and_then(|d| d.get(&key))
                            .cloned()
                            .ok_or_else(missing)?
                    }
                };
                TlsVerification::CaBundle(pem)
            }
        },
    };
    version.push_str(&format!("|{tls:?}").chars().take(64).collect::<String>());
    if let Some(p) = provider {
        version.push_str(&format!("|{}", p.resource_version().unwrap_or_default()));
    }
    Ok(Connection {
        endpoint,
        auth,
        tls,
        version,
        allowed_nodes: source.allowed_nodes,
    })
}

/// Turns connection settings into a [`Hypervisor`].
pub trait Connector: Send + Sync + 'static {
    /// The hypervisor handle.
    type Hv: Hypervisor + Clone;
    /// A handle for the ProxmoxCluster `key` (`namespace/name`) with these settings; may be cached.
    fn connect(&self, key: &str, connection: &Connection) -> Result<Self::Hv>;
}

/// Builds real [`Client`]s, one per ProxmoxCluster, rebuilt when its settings change.
#[derive(Default)]
pub struct ClientConnector {
    cache: Mutex<HashMap<String, (String, Client)>>,
}

impl Connector for ClientConnector {
    type Hv = Client;

    fn connect(&self, key: &str, connection: &Connection) -> Result<Client> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((version, client)) = cache.get(key)
            && *version == connection.version
        {
            return Ok(client.clone());
        }
        let client = Client::builder(connection.endpoint.clone())
            .auth(connection.auth.clone())
            .tls(connection.tls.clone())
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| {
                Error::Credentials(format!("cannot build a client for {}: {e}", connection.endpoint))
            })?;
        cache.insert(key.to_owned(), (connection.version.clone(), client.clone()));
        Ok(client)
    }
}

/// Hands out one shared [`crate::fake::FakePve`] whatever the settings (tests).
#[derive(Clone, Default)]
pub struct FakeConnector(pub crate::fake::FakePve);

impl Connector for FakeConnector {
    type Hv = crate::fake::FakePve;

    fn connect(&self, _key: &str, _connection: &Connection) -> Result<crate::fake::FakePve> {
        Ok(self.0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::banlieue::ProviderSpec;
    use banlieue_api::common::ProviderReference;
    use banlieue_api::infrastructure::ProxmoxClusterSpec;
    use pretty_assertions::assert_eq;

    fn standalone(allowed: &[&str]) -> ProxmoxCluster {
        let mut c = ProxmoxCluster::new(
            "banlieue-pve-a",
            ProxmoxClusterSpec {
                provider_ref: Some(ProviderReference { name: "pve-a".into() }),
                allowed_nodes: allowed.iter().map(|n| n.to_string()).collect(),
                ..Default::default()
            },
        );
        c.metadata.namespace = Some("team-a".into());
        c
    }

    fn provider(backend: Backend) -> Provider {
        Provider::new(
            "pve-a",
            ProviderSpec {
                backend,
                endpoint: "https://pve.example.com:8006".into(),
                credentials_ref: Some(SecretReference {
                    name: "pve-a".into(),
                    namespace: Some("banlieue-system".into()),
                }),
                tls: Some(TlsTrust {
                    sha256_fingerprint: Some("AB".repeat(32)),
                    ..Default::default()
                }),
                nodes: vec!["pve1".into(), "pve2".into()],
                ..Default::default()
            },
        )
    }

    #[test]
    fn a_standalone_cluster_takes_everything_from_its_provider() {
        let source = connection_source(&standalone(&[]), Some(&provider(Backend::Proxmox))).unwrap();
        assert_eq!(source.endpoint, "https://pve.example.com:8006");
        assert_eq!(
            source.credentials,
            SecretReference {
                name: "pve-a".into(),
                namespace: Some("banlieue-system".into())
            }
        );
        assert!(source.tls.is_some_and(|t| t.sha256_fingerprint.is_some()));
        assert_eq!(source.allowed_nodes, vec!["pve1", "pve2"]);
        // The cluster's own allowedNodes narrow the Provider's nodes.
        let narrowed = connection_source(&standalone(&["pve2"]), Some(&provider(Backend::Proxmox))).unwrap();
        assert_eq!(narrowed.allowed_nodes, vec!["pve2"]);
    }

    #[test]
    fn a_provider_of_another_backend_or_none_is_reported_with_a_reason() {
        let reason = |p: Option<&Provider>| match connection_source(&standalone(&[]), p) {
            Err(Error::Provider { reason, message }) => (reason, message),
            other => panic!("unexpected {other:?}"),
        };
        let (r, m) = reason(Some(&provider(Backend::Vsphere)));
        assert_eq!(r, "ProviderBackendMismatch");
        assert!(m.contains("vsphere"), "{m}");
        assert_eq!(reason(None).0, "ProviderNotFound");
    }

    #[test]
    fn an_own_endpoint_cluster_resolves_its_secret_namespace() {
        let mut c = ProxmoxCluster::new(
            "c1",
            ProxmoxClusterSpec {
                endpoint: Some("https://pve:8006".into()),
                credentials_ref: Some(SecretReference {
                    name: "creds".into(),
                    namespace: None,
                }),
                allowed_nodes: vec!["pve3".into()],
                ..Default::default()
            },
        );
        c.metadata.namespace = Some("ns".into());
        let source = connection_source(&c, None).unwrap();
        assert_eq!(source.credentials.namespace.as_deref(), Some("ns"));
        assert_eq!(source.allowed_nodes, vec!["pve3"]);
    }
}
