//! Connection settings of a ProxmoxCluster: endpoint, credentials Secret and TLS trust, turned
//! into a Proxmox client. Secrets are read here and never logged (the client's `Secret` type
//! redacts them in `Debug`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use banlieue_api::common::CaBundleKind;
use banlieue_api::infrastructure::ProxmoxCluster;
use banlieue_pve_client::{Auth, Client, TlsVerification};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, ResourceExt};

use crate::error::{Error, Result};
use crate::hypervisor::Hypervisor;

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

/// Reads the connection settings of a ProxmoxCluster (`spec.endpoint`, `spec.credentialsRef`,
/// `spec.tls`). `spec.providerRef` (a banlieue Provider) is not supported yet.
pub async fn read_connection(client: &kube::Client, cluster: &ProxmoxCluster) -> Result<Connection> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let spec = &cluster.spec;
    if spec.provider_ref.is_some() {
        return Err(Error::Credentials(format!(
            "ProxmoxCluster {namespace}/{name}: spec.providerRef is not supported by this provider version; set spec.endpoint and spec.credentialsRef"
        )));
    }
    let endpoint = spec.endpoint.clone().ok_or_else(|| {
        Error::Credentials(format!("ProxmoxCluster {namespace}/{name} has no spec.endpoint"))
    })?;
    let cref = spec.credentials_ref.as_ref().ok_or_else(|| {
        Error::Credentials(format!(
            "ProxmoxCluster {namespace}/{name} has no spec.credentialsRef"
        ))
    })?;
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
    let tls = match &spec.tls {
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
    Ok(Connection {
        endpoint,
        auth,
        tls,
        version,
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
