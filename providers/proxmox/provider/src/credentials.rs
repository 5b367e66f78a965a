//! Connection settings of a ProxmoxCluster: endpoint, credentials Secret and TLS trust, turned
//! into a Proxmox client. Secrets are read here and never logged (the client's `Secret` type
//! redacts them in `Debug`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use banlieue_api::banlieue::Backend;
use banlieue_api::infrastructure::{ProxmoxCluster, ProxmoxClusterEndpoint};
use banlieue_provider_kit::cluster::Problem;
use banlieue_provider_kit::connection::{self, CREDENTIALS_INVALID, Own, Trust};
use banlieue_provider_kit::lock;
use banlieue_provider_kit::usable;
use banlieue_provider_runtime::secret_watch::SecretKey;
use banlieue_pve_client::{Auth, Client, TlsVerification};
use kube::ResourceExt;

use crate::error::Result;
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
    /// `tls.serverName`: the name the certificate is verified against.
    pub server_name: Option<String>,
    /// Changes whenever a referenced Secret/ConfigMap or the settings change (cache key).
    pub version: String,
    /// Nodes machines may use: the ProxmoxCluster's `allowedNodes`, else its Provider's
    /// `nodes`; empty = every online node.
    pub allowed_nodes: Vec<String>,
}

impl Connection {
    /// Whether the API's certificate is not verified (`tls.insecureSkipVerify`).
    pub fn skips_tls_verification(&self) -> bool {
        matches!(self.tls, TlsVerification::InsecureSkipVerify)
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("endpoint", &self.endpoint)
            .field("auth", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// The nodes machines may use: the cluster's own `allowedNodes` narrow its Provider's `nodes`.
pub fn allowed_nodes(own: &[String], provider_nodes: &[String]) -> Vec<String> {
    if own.is_empty() { provider_nodes } else { own }.to_vec()
}

/// The API token, else the user name and password, of a credentials Secret.
pub fn auth(credentials: &connection::Credentials) -> std::result::Result<Auth, Problem> {
    let text = |key| credentials.text(key);
    match (
        text(TOKEN_ID_KEY),
        text(TOKEN_SECRET_KEY),
        text(USERNAME_KEY),
        text(PASSWORD_KEY),
    ) {
        (Some(token_id), Some(secret), _, _) => Ok(Auth::Token {
            token_id,
            secret: secret.into(),
        }),
        (_, _, Some(username), Some(password)) => Ok(Auth::Password {
            username,
            password: password.into(),
        }),
        _ => Err(Problem::new(
            CREDENTIALS_INVALID,
            format!(
                "Secret {} must have keys {TOKEN_ID_KEY} and {TOKEN_SECRET_KEY} (or {USERNAME_KEY} and {PASSWORD_KEY})",
                credentials.secret
            ),
        )),
    }
}

/// Reads the connection settings of one of a ProxmoxCluster's `spec.endpoints` (`Some`), or of
/// the ProxmoxCluster itself (`None`): `endpoint`, `credentialsRef`, `tls`, or those of the
/// cluster-scoped banlieue `Provider` named by `providerRef`
/// ([`banlieue_provider_kit::connection`]). `record` gets the referenced Secrets before they are
/// read.
pub async fn read_endpoint_connection(
    client: &kube::Client,
    cluster: &ProxmoxCluster,
    site: Option<&ProxmoxClusterEndpoint>,
    record: impl FnOnce(Vec<SecretKey>),
) -> Result<std::result::Result<Connection, Problem>> {
    let spec = &cluster.spec;
    let (own, own_nodes, kind) = match site {
        None => (
            Own {
                endpoint: spec.endpoint.as_deref(),
                credentials: spec.credentials_ref.as_ref(),
                tls: spec.tls.as_ref(),
                provider: spec.provider_ref.as_ref().map(|p| p.name.as_str()),
            },
            &spec.allowed_nodes,
            "ProxmoxCluster".to_owned(),
        ),
        Some(site) => (
            Own {
                endpoint: site.endpoint.as_deref(),
                credentials: site.credentials_ref.as_ref(),
                tls: site.tls.as_ref(),
                provider: site.provider_ref.as_ref().map(|p| p.name.as_str()),
            },
            &site.allowed_nodes,
            format!("ProxmoxCluster endpoint {:?}", site.name),
        ),
    };
    let namespace = cluster.namespace().unwrap_or_default();
    let c = usable!(connection::connect(client, &namespace, own, Backend::Proxmox, &kind, record).await?);
    let auth = usable!(auth(&c.credentials));
    let tls = match c.trust {
        Trust::WebPki => TlsVerification::WebPki,
        Trust::CaBundle(pem) => TlsVerification::CaBundle(pem),
        Trust::Fingerprint(fingerprint) => TlsVerification::Fingerprint(fingerprint),
        Trust::InsecureSkipVerify => TlsVerification::InsecureSkipVerify,
    };
    Ok(Ok(Connection {
        endpoint: c.endpoint,
        auth,
        tls,
        server_name: c.server_name,
        version: c.version,
        allowed_nodes: allowed_nodes(own_nodes, &c.provider_nodes),
    }))
}

/// Turns connection settings into a [`Hypervisor`].
pub trait Connector: Send + Sync + 'static {
    /// The hypervisor handle.
    type Hv: Hypervisor + Clone;
    /// A handle for the ProxmoxCluster `key` (`namespace/name`, `namespace/name/endpoint` for one
    /// of its `spec.endpoints`) with these settings; may be cached. `Err`: why no handle can be
    /// built (a [`CREDENTIALS_INVALID`] message).
    fn connect(&self, key: &str, connection: &Connection) -> Result<Self::Hv, String>;
}

/// Builds real [`Client`]s, one per ProxmoxCluster, rebuilt when its settings change; the
/// clients of one endpoint share one bound on requests in flight (`limit_per_endpoint`).
#[derive(Default)]
pub struct ClientConnector {
    cache: Mutex<HashMap<String, (String, Client)>>,
}

impl Connector for ClientConnector {
    type Hv = Client;

    fn connect(&self, key: &str, connection: &Connection) -> Result<Client, String> {
        let mut cache = lock(&self.cache);
        if let Some((version, client)) = cache.get(key)
            && *version == connection.version
        {
            return Ok(client.clone());
        }
        // One bound on the requests in flight per endpoint, whichever ProxmoxClusters use it.
        let client = Client::builder(connection.endpoint.clone())
            .limit_per_endpoint()
            .auth(connection.auth.clone())
            .tls(connection.tls.clone())
            .server_name(connection.server_name.clone())
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| {
                format!(
                    "Proxmox credentials: cannot build a client for {}: {e}",
                    connection.endpoint
                )
            })?;
        cache.insert(key.to_owned(), (connection.version.clone(), client.clone()));
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clusters_allowed_nodes_narrow_its_providers_nodes() {
        let provider = ["pve1".to_owned(), "pve2".to_owned()];
        assert_eq!(allowed_nodes(&[], &provider), provider);
        assert_eq!(allowed_nodes(&["pve2".to_owned()], &provider), ["pve2"]);
        assert!(allowed_nodes(&[], &[]).is_empty());
    }

    #[test]
    fn a_token_wins_over_a_password_and_a_secret_with_neither_says_which_keys() {
        let creds = |pairs: &[(&str, &str)]| connection::Credentials {
            secret: "ns/pve".into(),
            data: pairs
                .iter()
                .map(|(k, v)| ((*k).into(), v.as_bytes().to_vec()))
                .collect(),
            version: String::new(),
        };
        let both = creds(&[
            ("tokenID", "root@pam!t"),
            ("secret", "s"),
            ("username", "u"),
            ("password", "p"),
        ]);
        assert!(matches!(auth(&both), Ok(Auth::Token { token_id, .. }) if token_id == "root@pam!t"));
        assert!(matches!(
            auth(&creds(&[("username", "u"), ("password", "p")])),
            Ok(Auth::Password { .. })
        ));
        let problem = auth(&creds(&[("tokenID", "root@pam!t")])).unwrap_err();
        assert_eq!(problem.reason, CREDENTIALS_INVALID);
        assert!(
            problem.message.contains("ns/pve") && problem.message.contains("secret"),
            "{}",
            problem.message
        );
    }
}
