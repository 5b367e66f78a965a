//! From a VSphereCluster (or the banlieue `Provider` it names) to a logged-in vSphere client:
//! server, credentials Secret (`username`, `password`), TLS trust; a failure domain may name its
//! own vCenter ([`resolve_for`]). Clients are cached per
//! (server, user, password hash, trust) so sessions are reused across reconciles.

use std::collections::HashMap;
use std::sync::Mutex;

use banlieue_api::banlieue::Backend;
use banlieue_api::infrastructure::{VSphereCluster, VSphereFailureDomain};
use banlieue_provider_kit::cluster::Problem;
use banlieue_provider_kit::connection::{self, Own, Trust};
use banlieue_provider_kit::lock;
use banlieue_provider_kit::usable;
use banlieue_provider_runtime::secret_watch::SecretKey;
use banlieue_vsphere_client::{Client, ClientBuilder, TlsVerification};
use kube::ResourceExt;
use sha2::{Digest, Sha256};

use crate::error::Result;

/// Everything needed to reach vCenter, resolved from the Kubernetes objects.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `spec.server` or the Provider's `endpoint`.
    pub server: String,
    /// User name from the Secret.
    pub username: String,
    /// Password from the Secret.
    pub password: banlieue_vsphere_client::Secret,
    /// Certificate trust.
    pub tls: TlsVerification,
    /// `tls.serverName`: the name the certificate is verified against.
    pub server_name: Option<String>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("server", &self.server)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    fn cache_key(&self) -> String {
        let digest = Sha256::digest(self.password.expose().as_bytes());
        format!(
            "{}|{}|{:x}|{:?}|{:?}",
            self.server, self.username, digest, self.tls, self.server_name
        )
    }
}

/// Resolves the vCenter of failure domain `domain` (its own `server` or `providerRef`), else
/// of the VSphereCluster (`None`, or a domain without its own): from the spec, or from a
/// `providerRef` (a cluster-scoped Provider whose backend must be `vsphere`), through
/// [`banlieue_provider_kit::connection`]. The Secret needs keys `username` and `password`.
/// Records the Secrets it references through `record`, before reading them, for the watch.
pub async fn resolve_for(
    kube: &kube::Client,
    cluster: &VSphereCluster,
    domain: Option<&VSphereFailureDomain>,
    record: impl FnOnce(Vec<SecretKey>),
) -> Result<Result<Endpoint, Problem>> {
    let spec = &cluster.spec;
    let (own, kind) = match domain.filter(|d| d.has_own_server()) {
        Some(d) => (
            Own {
                endpoint: d.server.as_deref(),
                credentials: d.credentials_ref.as_ref(),
                tls: d.tls.as_ref(),
                provider: d.provider_ref.as_ref().map(|p| p.name.as_str()),
            },
            format!("VSphereCluster failure domain {:?}", d.name),
        ),
        None => (
            Own {
                endpoint: spec.server.as_deref(),
                credentials: spec.credentials_ref.as_ref(),
                tls: spec.tls.as_ref(),
                provider: spec.provider_ref.as_ref().map(|p| p.name.as_str()),
            },
            "VSphereCluster".to_owned(),
        ),
    };
    let namespace = cluster.namespace().unwrap_or_default();
    let c = usable!(connection::connect(kube, &namespace, own, Backend::Vsphere, &kind, record).await?);
    let [username, password] = usable!(c.credentials.texts(["username", "password"]));
    let tls = match c.trust {
        Trust::WebPki => TlsVerification::WebPki,
        Trust::CaBundle(pem) => TlsVerification::CaBundle(pem),
        Trust::Fingerprint(thumbprint) => TlsVerification::Thumbprint(thumbprint),
        Trust::InsecureSkipVerify => TlsVerification::InsecureSkipVerify,
    };
    Ok(Ok(Endpoint {
        server: c.endpoint,
        username,
        password: password.into(),
        tls,
        server_name: c.server_name,
    }))
}

/// Caches clients per endpoint so that sessions are reused.
#[derive(Default)]
pub struct ClientCache(Mutex<HashMap<String, Client>>);

impl ClientCache {
    /// The client for `endpoint` (built on first use; no request is sent here).
    pub fn client(&self, endpoint: &Endpoint) -> Result<Client, Problem> {
        let key = endpoint.cache_key();
        let mut map = lock(&self.0);
        if let Some(c) = map.get(&key) {
            return Ok(c.clone());
        }
        let client = ClientBuilder::new(&endpoint.server, &endpoint.username, endpoint.password.clone())
            .tls(endpoint.tls.clone())
            .server_name(endpoint.server_name.clone())
            .build()
            .map_err(|e| Problem::new("InvalidServer", e.to_string()))?;
        map.insert(key, client.clone());
        Ok(client)
    }
}
