//! From a VSphereCluster (or the banlieue `Provider` it names) to a logged-in vSphere client:
//! server, credentials Secret (`username`, `password`), TLS trust. Clients are cached per
//! (server, user, password hash, trust) so sessions are reused across reconciles.

use std::collections::HashMap;
use std::sync::Mutex;

use banlieue_api::banlieue::{Backend, Provider};
use banlieue_api::common::{CaBundleKind, SecretReference, TlsTrust};
use banlieue_api::infrastructure::VSphereCluster;
use banlieue_provider_runtime::secret_watch::SecretKey;
use banlieue_vsphere_client::{Client, ClientBuilder, TlsVerification};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, ResourceExt};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Why no client could be built: a condition reason and an actionable message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct ConnectionProblem {
    /// Condition reason.
    pub reason: &'static str,
    /// What to fix.
    pub message: String,
}

fn problem(reason: &'static str, message: impl Into<String>) -> ConnectionProblem {
    ConnectionProblem {
        reason,
        message: message.into(),
    }
}

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
        format!("{}|{}|{:x}|{:?}", self.server, self.username, digest, self.tls)
    }
}

/// Resolves the endpoint of a VSphereCluster: directly from its spec, or from its
/// `spec.providerRef` (a cluster-scoped Provider whose backend must be `vsphere`). Records the
/// Secrets it references (credentials, CA bundle Secret) through `record`, before reading them, for
/// the Secret watch.
pub async fn resolve(
    kube: &kube::Client,
    cluster: &VSphereCluster,
    record: impl FnOnce(Vec<SecretKey>),
) -> Result<Result<Endpoint, ConnectionProblem>> {
    let ns = cluster.namespace().unwrap_or_default();
    let (server, creds, tls, default_ns) = if let Some(pref) = &cluster.spec.provider_ref {
        let providers: Api<Provider> = Api::all(kube.clone());
        let Some(p) = providers
            .get_opt(&pref.name)
            .await
            .map_err(|e| Error::kube("reading the Provider", e))?
        else {
            return Ok(Err(problem(
                "ProviderNotFound",
                format!("Provider {:?} (spec.providerRef) does not exist", pref.name),
            )));
        };
        if p.spec.backend != Backend::Vsphere {
            return Ok(Err(problem(
                "ProviderBackendMismatch",
                format!(
                    "Provider {:?} has backend {:?}; a VSphereCluster needs backend vsphere",
                    pref.name,
                    p.spec.backend.as_str()
                ),
            )));
        }
        (
            p.spec.endpoint.clone(),
            p.spec.credentials_ref.clone(),
            p.spec.tls.clone(),
            None,
        )
    } else {
        (
            cluster.spec.server.clone().unwrap_or_default(),
            cluster.spec.credentials_ref.clone(),
            cluster.spec.tls.clone(),
            Some(ns.clone()),
        )
    };
    let in_ns = |r_ns: &Option<String>, name: &str| {
        r_ns.as_deref()
            .or(default_ns.as_deref())
            .map(|n| SecretKey::new(n, name))
    };
    let ca_secret = tls
        .as_ref()
        .and_then(|t| t.ca_bundle_ref.as_ref())
        .filter(|r| matches!(r.kind, CaBundleKind::Secret))
        .and_then(|r| in_ns(&r.namespace, &r.name));
    let creds_secret = creds.as_ref().and_then(|r| in_ns(&r.namespace, &r.name));
    record(creds_secret.into_iter().chain(ca_secret).collect());
    let Some(creds) = creds else {
        return Ok(Err(problem(
            "CredentialsNotFound",
            "no credentialsRef: name a Secret with keys username and password",
        )));
    };
    let (username, password) = match read_credentials(kube, &creds, default_ns.as_deref()).await? {
        Ok(c) => c,
        Err(p) => return Ok(Err(p)),
    };
    let tls = match tls_verification(kube, tls.as_ref(), default_ns.as_deref()).await? {
        Ok(t) => t,
        Err(p) => return Ok(Err(p)),
    };
    Ok(Ok(Endpoint {
        server,
        username,
        password: password.into(),
        tls,
    }))
}

async fn read_credentials(
    kube: &kube::Client,
    r: &SecretReference,
    default_ns: Option<&str>,
) -> Result<Result<(String, String), ConnectionProblem>> {
    let Some(ns) = r.namespace.as_deref().or(default_ns) else {
        return Ok(Err(problem(
            "CredentialsNotFound",
            "credentialsRef of a Provider needs a namespace",
        )));
    };
    let secrets: Api<Secret> = Api::namespaced(kube.clone(), ns);
    let Some(secret) = secrets
        .get_opt(&r.name)
        .await
        .map_err(|e| Error::kube("reading the credentials Secret", e))?
    else {
        return Ok(Err(problem(
            "CredentialsNotFound",
            format!("Secret {ns}/{} does not exist", r.name),
        )));
    };
    let key = |k: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(k).cloned()))
            .filter(|v| !v.is_empty())
    };
    match (key("username"), key("password")) {
        (Some(u), Some(p)) => Ok(Ok((u, p))),
        _ => Ok(Err(problem(
            "CredentialsInvalid",
            format!(
                "Secret {ns}/{} needs non-empty keys username and password",
                r.name
            ),
        ))),
    }
}

async fn tls_verification(
    kube: &kube::Client,
    trust: Option<&TlsTrust>,
    default_ns: Option<&str>,
) -> Result<Result<TlsVerification, ConnectionProblem>> {
    let Some(trust) = trust else {
        return Ok(Ok(TlsVerification::WebPki));
    };
    if let Some(tp) = &trust.sha256_fingerprint {
        return Ok(Ok(TlsVerification::Thumbprint(tp.clone())));
    }
    if let Some(r) = &trust.ca_bundle_ref {
        let Some(ns) = r.namespace.as_deref().or(default_ns) else {
            return Ok(Err(problem(
                "CABundleNotFound",
                "caBundleRef of a Provider needs a namespace",
            )));
        };
        let key = r.key.as_deref().unwrap_or("ca.crt");
        let pem = match r.kind {
            CaBundleKind::Secret => Api::<Secret>::namespaced(kube.clone(), ns)
                .get_opt(&r.name)
                .await
                .map_err(|e| Error::kube("reading the CA bundle Secret", e))?
                .and_then(|s| {
                    s.data?
                        .get(key)
                        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
                }),
            CaBundleKind::ConfigMap => Api::<ConfigMap>::namespaced(kube.clone(), ns)
                .get_opt(&r.name)
                .await
                .map_err(|e| Error::kube("reading the CA bundle ConfigMap", e))?
                .and_then(|c| c.data?.get(key).cloned()),
        };
        return Ok(match pem {
            Some(pem) => Ok(TlsVerification::CaBundle(pem)),
            None => Err(problem(
                "CABundleNotFound",
                format!("{:?} {ns}/{} has no key {key}", r.kind, r.name),
            )),
        });
    }
    if trust.insecure_skip_verify == Some(true) {
        return Ok(Ok(TlsVerification::InsecureSkipVerify));
    }
    Ok(Ok(TlsVerification::WebPki))
}

/// Caches clients per endpoint so that sessions are reused.
#[derive(Default)]
pub struct ClientCache(Mutex<HashMap<String, Client>>);

impl ClientCache {
    /// The client for `endpoint` (built on first use; no request is sent here).
    pub fn client(&self, endpoint: &Endpoint) -> Result<Client, ConnectionProblem> {
        let key = endpoint.cache_key();
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(&key) {
            return Ok(c.clone());
        }
        let client = ClientBuilder::new(&endpoint.server, &endpoint.username, endpoint.password.clone())
            .tls(endpoint.tls.clone())
            .build()
            .map_err(|e| problem("InvalidServer", e.to_string()))?;
        map.insert(key, client.clone());
        Ok(client)
    }
}

/// Maps a client error to a condition reason: a distinct word per cause (the banlieue
/// controller copies the infra cluster's reason to the VirtualMachine): `PermissionDenied` (a
/// `NoPermission` fault: logged in, not allowed) apart from `AuthenticationFailed`.
pub fn reason_of(err: &banlieue_vsphere_client::Error) -> &'static str {
    use banlieue_vsphere_client::ErrorClass;
    match err.class() {
        ErrorClass::Auth if err.fault() == Some("NoPermission") => "PermissionDenied",
        ErrorClass::Auth => "AuthenticationFailed",
        ErrorClass::Tls => "TLSVerificationFailed",
        ErrorClass::Transient => "VCenterUnreachable",
        ErrorClass::NotFound => "NotFound",
        ErrorClass::Permanent => "VCenterError",
    }
}

#[cfg(test)]
mod reason_tests {
    use super::*;

    fn fault(name: &str) -> banlieue_vsphere_client::Error {
        banlieue_vsphere_client::Error::Fault {
            method: "RetrieveProperties".into(),
            fault: name.into(),
            message: "denied".into(),
        }
    }

    #[test]
    fn permission_denied_is_told_apart_from_a_failed_login() {
        assert_eq!(reason_of(&fault("NoPermission")), "PermissionDenied");
        assert_eq!(reason_of(&fault("InvalidLogin")), "AuthenticationFailed");
        assert_eq!(reason_of(&fault("NotAuthenticated")), "AuthenticationFailed");
    }
}
