//! Where an infra cluster's hypervisor connection comes from, read the same way for every
//! backend: the cluster's own endpoint, credentials Secret and TLS trust, or those of the
//! cluster-scoped banlieue `Provider` its `spec.providerRef` names. What cannot work is a
//! [`Problem`] with one of this module's reasons, for `Ready=False` and the VirtualMachine.
//!
//! References without a namespace resolve to the infra cluster's. Tenancy: credentials shared
//! across namespaces live on a cluster-scoped Provider, which an infra cluster may use only if
//! the Provider's `namespaceSelector` selects its namespace ([`PROVIDER_NOT_ALLOWED`]), as for
//! VirtualMachines. An infra cluster's own `credentialsRef` may name a Secret of another
//! namespace only if that Secret allows the namespace in its
//! [`ALLOWED_NAMESPACES_ANNOTATION`] ([`CREDENTIALS_NAMESPACE_FORBIDDEN`] otherwise): a tenant
//! cannot borrow another team's account by naming it. Where a Secret goes: a Secret with the
//! [`ALLOWED_ENDPOINTS_ANNOTATION`] is sent only to the endpoints it lists, whoever uses it; one
//! that other namespaces may use must carry it, since they choose the endpoint
//! ([`CREDENTIALS_ENDPOINT_FORBIDDEN`] otherwise): a tenant editing an endpoint to a host of
//! theirs does not receive the account's token or password. Secrets are recorded for the Secret
//! watch before they are read (a missing one is what the watch waits for), and their content
//! never appears in a message: messages name the object and the key only.

use std::collections::BTreeMap;

use banlieue_api::banlieue::{Backend, Provider};
use banlieue_api::common::{CaBundleKind, SecretReference, TlsTrust};
use banlieue_api::{ALLOWED_ENDPOINTS_ANNOTATION, ALLOWED_NAMESPACES_ANNOTATION};
use banlieue_capi::contract::CLUSTERCTL_MOVE_LABEL;
use banlieue_provider_runtime::secret_watch::SecretKey;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};

use crate::cluster::Problem;
use crate::connection_memo;
use crate::error::{Error, Result};

/// `spec.providerRef` names no Provider.
pub const PROVIDER_NOT_FOUND: &str = "ProviderNotFound";
/// The Provider is for another hypervisor.
pub const PROVIDER_BACKEND_MISMATCH: &str = "ProviderBackendMismatch";
/// No credentials Secret is named, or it does not exist.
pub const CREDENTIALS_NOT_FOUND: &str = "CredentialsNotFound";
/// The credentials Secret lacks a key the backend needs.
pub const CREDENTIALS_INVALID: &str = "CredentialsInvalid";
/// The CA bundle Secret or ConfigMap, or its key, does not exist.
pub const CA_BUNDLE_NOT_FOUND: &str = "CABundleNotFound";
/// Neither the infra cluster nor its Provider names an endpoint.
pub const NO_ENDPOINT: &str = "NoEndpoint";
/// The infra cluster names a Secret of another namespace that does not allow it.
pub const CREDENTIALS_NAMESPACE_FORBIDDEN: &str = "CredentialsNamespaceForbidden";
/// The credentials Secret may not be sent to the endpoint the object names.
pub const CREDENTIALS_ENDPOINT_FORBIDDEN: &str = "CredentialsEndpointForbidden";
/// The Provider's `namespaceSelector` does not select the infra cluster's namespace.
pub const PROVIDER_NOT_ALLOWED: &str = "ProviderNotAllowedInNamespace";

/// What an infra cluster's own spec says about its connection.
#[derive(Clone, Copy, Debug, Default)]
pub struct Own<'a> {
    /// Its endpoint (`spec.endpoint`, `spec.server`, `spec.uri`).
    pub endpoint: Option<&'a str>,
    /// `spec.credentialsRef`.
    pub credentials: Option<&'a SecretReference>,
    /// `spec.tls`.
    pub tls: Option<&'a TlsTrust>,
    /// `spec.providerRef`'s name.
    pub provider: Option<&'a str>,
}

/// The Secrets connection settings reference (credentials, a CA bundle Secret; namespaces filled
/// in), for the watch.
pub fn secret_keys(credentials: Option<&SecretReference>, tls: Option<&TlsTrust>) -> Vec<SecretKey> {
    let key = |ns: &Option<String>, name: &str| SecretKey::new(ns.clone().unwrap_or_default(), name);
    let ca = tls
        .and_then(|t| t.ca_bundle_ref.as_ref())
        .filter(|ca| matches!(ca.kind, CaBundleKind::Secret))
        .map(|ca| key(&ca.namespace, &ca.name));
    credentials
        .iter()
        .map(|r| key(&r.namespace, &r.name))
        .chain(ca)
        .collect()
}

/// `r` with its namespace defaulted to `namespace`.
pub fn in_namespace(r: &SecretReference, namespace: &str) -> SecretReference {
    SecretReference {
        name: r.name.clone(),
        namespace: Some(r.namespace.clone().unwrap_or_else(|| namespace.to_owned())),
    }
}

/// The Provider `name` for a `kind` in `namespace`: it must be for `backend`, and its
/// `namespaceSelector` must select the namespace ([`PROVIDER_NOT_ALLOWED`] otherwise).
pub async fn allowed_provider(
    client: &kube::Client,
    name: &str,
    backend: Backend,
    kind: &str,
    namespace: &str,
) -> Result<std::result::Result<Provider, Problem>> {
    let Some(provider) = Api::<Provider>::all(client.clone())
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("reading Provider {name}"), e))?
    else {
        return Ok(Err(Problem::new(
            PROVIDER_NOT_FOUND,
            format!("Provider {name:?} (spec.providerRef) does not exist"),
        )));
    };
    if provider.spec.backend != backend {
        return Ok(Err(Problem::new(
            PROVIDER_BACKEND_MISMATCH,
            format!(
                "Provider {name:?} has backend {}, a {kind} needs a {} Provider",
                provider.spec.backend.as_str(),
                backend.as_str()
            ),
        )));
    }
    if !admits(client, &provider, namespace).await? {
        return Ok(Err(Problem::new(
            PROVIDER_NOT_ALLOWED,
            format!(
                "Provider {name:?} does not allow namespace {namespace}: its spec.namespaceSelector \
                 must select the namespace's labels for a {kind} there to use its endpoint and \
                 credentials"
            ),
        )));
    }
    Ok(Ok(provider))
}

/// Whether `provider` may serve an infra cluster in `namespace`: no `namespaceSelector`, or one
/// selecting the namespace's labels.
async fn admits(client: &kube::Client, provider: &Provider, namespace: &str) -> Result<bool> {
    if provider.spec.namespace_selector.is_none() {
        return Ok(true);
    }
    let labels = Api::<Namespace>::all(client.clone())
        .get_opt(namespace)
        .await
        .map_err(|e| Error::kube(format!("reading Namespace {namespace}"), e))?
        .map(|n| n.labels().clone())
        .unwrap_or_default();
    // A selector that cannot be read selects nothing.
    Ok(provider.admits_namespace(&labels).unwrap_or(false))
}

/// A credentials Secret's data. Its `Debug` shows the keys only.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// `namespace/name` of the Secret, for messages.
    pub secret: String,
    /// Key to value (the Secret's `data`).
    pub data: BTreeMap<String, Vec<u8>>,
    /// Changes whenever the Secret does.
    pub version: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("secret", &self.secret)
            .field("keys", &self.data.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Credentials {
    /// The non-empty text of `key`, without a trailing line end (`echo` adds one; spaces are
    /// kept: they may belong to a password).
    pub fn text(&self, key: &str) -> Option<String> {
        self.data
            .get(key)
            .map(|v| {
                String::from_utf8_lossy(v)
                    .trim_end_matches(['\n', '\r'])
                    .to_owned()
            })
            .filter(|v| !v.is_empty())
    }

    /// The text of every key of `keys`, or a [`CREDENTIALS_INVALID`] problem naming them.
    pub fn texts<const N: usize>(&self, keys: [&str; N]) -> std::result::Result<[String; N], Problem> {
        let mut out = std::array::from_fn(|_| String::new());
        for (slot, key) in out.iter_mut().zip(keys) {
            *slot = self.text(key).ok_or_else(|| {
                Problem::new(
                    CREDENTIALS_INVALID,
                    format!("Secret {} needs non-empty keys {}", self.secret, keys.join(", ")),
                )
            })?;
        }
        Ok(out)
    }
}

/// The entries of a comma-separated grant annotation (blanks and quotes around each removed, as
/// clusterctl's quoted defaults leave them); `None` without the annotation.
fn grant_list<'a>(annotations: &'a BTreeMap<String, String>, key: &str) -> Option<Vec<&'a str>> {
    annotations.get(key).map(|list| {
        list.split(',')
            .map(|e| e.trim().trim_matches(['"', '\'']))
            .collect()
    })
}

/// Whether a Secret with these annotations may be used by an object of `namespace` (its own
/// namespace is `secret_namespace`).
pub fn grants(annotations: &BTreeMap<String, String>, secret_namespace: &str, namespace: &str) -> bool {
    secret_namespace == namespace
        || grant_list(annotations, ALLOWED_NAMESPACES_ANNOTATION)
            .is_some_and(|list| list.iter().any(|n| *n == "*" || *n == namespace))
}

/// Whether a Secret with these annotations may be sent to `endpoint`, for an object of
/// `namespace` (`None`: a cluster-scoped Provider) when the Secret is in `secret_namespace`:
/// its [`ALLOWED_ENDPOINTS_ANNOTATION`] lists the endpoint (or `*`); without the annotation,
/// only when the endpoint is chosen in the Secret's own namespace or by a Provider. Endpoints
/// compare as written, but for case, surrounding blanks, a trailing `/` and an `https://` prefix.
pub fn sends_to(
    annotations: &BTreeMap<String, String>,
    secret_namespace: &str,
    namespace: Option<&str>,
    endpoint: &str,
) -> bool {
    match grant_list(annotations, ALLOWED_ENDPOINTS_ANNOTATION) {
        Some(list) => {
            let wanted = comparable_endpoint(endpoint);
            list.iter()
                .any(|e| *e == "*" || (!e.is_empty() && comparable_endpoint(e) == wanted))
        }
        None => namespace.is_none_or(|ns| ns == secret_namespace),
    }
}

fn comparable_endpoint(endpoint: &str) -> String {
    let e = endpoint.trim().to_ascii_lowercase();
    let e = e.strip_prefix("https://").unwrap_or(&e);
    e.trim_end_matches('/').to_owned()
}

/// Reads the credentials Secret `r` (its namespace filled in, see [`in_namespace`]) that will be
/// sent to `endpoint`, for an object of namespace `user` that names it in its own spec (`None`:
/// a cluster-scoped Provider names it, which its `namespaceSelector` governs). A Secret of
/// another namespace must allow `user` ([`grants`]), and every Secret the endpoint
/// ([`sends_to`]).
pub async fn credentials(
    client: &kube::Client,
    r: Option<&SecretReference>,
    user: Option<&str>,
    endpoint: &str,
) -> Result<std::result::Result<Credentials, Problem>> {
    let Some(r) = r else {
        return Ok(Err(Problem::new(
            CREDENTIALS_NOT_FOUND,
            "no credentialsRef: name the Secret with the hypervisor credentials",
        )));
    };
    let ns = r.namespace.clone().unwrap_or_default();
    let Some(secret) = Api::<Secret>::namespaced(client.clone(), &ns)
        .get_opt(&r.name)
        .await
        .map_err(|e| Error::kube(format!("reading Secret {ns}/{}", r.name), e))?
    else {
        return Ok(Err(Problem::new(
            CREDENTIALS_NOT_FOUND,
            format!("credentials Secret {ns}/{} does not exist", r.name),
        )));
    };
    if let Some(user) = user
        && !grants(secret.annotations(), &ns, user)
    {
        return Ok(Err(Problem::new(
            CREDENTIALS_NAMESPACE_FORBIDDEN,
            format!(
                "credentials Secret {ns}/{} is in another namespace and does not allow namespace \
                 {user}: its owner may allow it with the annotation {ALLOWED_NAMESPACES_ANNOTATION}: \
                 \"{user}\" (comma-separated, or \"*\"), or use a Secret of {user} or a Provider \
                 whose namespaceSelector selects {user}",
                r.name
            ),
        )));
    }
    if !sends_to(secret.annotations(), &ns, user, endpoint) {
        let listed = secret.annotations().contains_key(ALLOWED_ENDPOINTS_ANNOTATION);
        return Ok(Err(Problem::new(
            CREDENTIALS_ENDPOINT_FORBIDDEN,
            format!(
                "credentials Secret {ns}/{} may not be sent to {endpoint}: {}; its owner may allow \
                 the endpoint by adding it to the annotation {ALLOWED_ENDPOINTS_ANNOTATION} \
                 (comma-separated)",
                r.name,
                if listed {
                    "the endpoint is not among those its annotation lists"
                } else {
                    "a Secret shared with other namespaces must list the endpoints it may be sent to"
                },
            ),
        )));
    }
    if user == Some(ns.as_str()) {
        label_for_move::<Secret>(client, &ns, &r.name, secret.labels()).await;
    }
    let version = format!(
        "{}|{}",
        secret.uid().unwrap_or_default(),
        secret.resource_version().unwrap_or_default()
    );
    // (A Secret read from the API server has no `stringData`: it is merged into `data` on write.)
    let data = secret.data.unwrap_or_default().into_iter();
    Ok(Ok(Credentials {
        secret: format!("{ns}/{}", r.name),
        data: data.map(|(k, v)| (k, v.0)).collect(),
        version,
    }))
}

/// Labels a Secret or ConfigMap that an infra cluster of its own namespace reads (credentials,
/// CA bundle) with [`CLUSTERCTL_MOVE_LABEL`], once: `clusterctl move` takes along only the
/// objects of a Cluster's graph and those labelled so, and a cluster moved without its
/// credentials could not reach its hypervisor. A refusal (RBAC of an older release) is logged
/// and changes nothing else: the label only matters for a later move.
async fn label_for_move<K: banlieue_api::infrastructure::kinds::NamespacedKind>(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
) {
    if labels.contains_key(CLUSTERCTL_MOVE_LABEL) {
        return;
    }
    let patch = serde_json::json!({"metadata": {"labels": {CLUSTERCTL_MOVE_LABEL: ""}}});
    let kind = K::kind(&());
    match Api::<K>::namespaced(client.clone(), namespace)
        .patch_metadata(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => tracing::info!(%kind, namespace, name, "labelled for clusterctl move"),
        Err(error) => tracing::warn!(
            %kind,
            namespace,
            name,
            %error,
            "could not label for clusterctl move: a move of this namespace would leave it behind"
        ),
    }
}

/// How to verify the endpoint's certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trust {
    /// The system roots.
    WebPki,
    /// Only this PEM bundle.
    CaBundle(String),
    /// Only the leaf certificate with this SHA-256 fingerprint.
    Fingerprint(String),
    /// Nothing (labs only).
    InsecureSkipVerify,
}

/// Reads the trust `tls` asks for (a CA bundle from its Secret or ConfigMap), and a version
/// that changes with the bundle; for an object of namespace `user` (`None`: a Provider) whose
/// bundle is in that namespace, labels the bundle for `clusterctl move`.
pub async fn trust(
    client: &kube::Client,
    tls: Option<&TlsTrust>,
    user: Option<&str>,
) -> Result<std::result::Result<(Trust, String), Problem>> {
    let Some(tls) = tls else {
        return Ok(Ok((Trust::WebPki, String::new())));
    };
    if let Some(fingerprint) = &tls.sha256_fingerprint {
        return Ok(Ok((Trust::Fingerprint(fingerprint.clone()), String::new())));
    }
    if tls.insecure_skip_verify == Some(true) {
        return Ok(Ok((Trust::InsecureSkipVerify, String::new())));
    }
    let Some(ca) = &tls.ca_bundle_ref else {
        return Ok(Ok((Trust::WebPki, String::new())));
    };
    let ns = ca.namespace.clone().unwrap_or_default();
    let key = ca.key.as_deref().unwrap_or("ca.crt");
    let context = format!("reading CA bundle {:?} {ns}/{}", ca.kind, ca.name);
    let found = match ca.kind {
        CaBundleKind::Secret => Api::<Secret>::namespaced(client.clone(), &ns)
            .get_opt(&ca.name)
            .await
            .map_err(|e| Error::kube(context, e))?
            .map(|s| {
                let pem = s.data.as_ref().and_then(|d| d.get(key));
                let pem = pem.map(|v| String::from_utf8_lossy(&v.0).into_owned());
                (pem, s.resource_version(), s.labels().clone())
            }),
        CaBundleKind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .get_opt(&ca.name)
            .await
            .map_err(|e| Error::kube(context, e))?
            .map(|c| {
                (
                    c.data.as_ref().and_then(|d| d.get(key)).cloned(),
                    c.resource_version(),
                    c.labels().clone(),
                )
            }),
    };
    let (found, found_labels) = match found {
        Some((pem, version, labels)) => (Some((pem, version)), labels),
        None => (None, BTreeMap::new()),
    };
    if found.is_some() && user == Some(ns.as_str()) {
        match ca.kind {
            CaBundleKind::Secret => label_for_move::<Secret>(client, &ns, &ca.name, &found_labels).await,
            CaBundleKind::ConfigMap => {
                label_for_move::<ConfigMap>(client, &ns, &ca.name, &found_labels).await
            }
        }
    }
    Ok(match found {
        Some((Some(pem), version)) if !pem.trim().is_empty() => {
            Ok((Trust::CaBundle(pem), version.unwrap_or_default()))
        }
        Some(_) => Err(Problem::new(
            CA_BUNDLE_NOT_FOUND,
            format!("CA bundle {:?} {ns}/{} has no key {key}", ca.kind, ca.name),
        )),
        None => Err(Problem::new(
            CA_BUNDLE_NOT_FOUND,
            format!("CA bundle {:?} {ns}/{} does not exist", ca.kind, ca.name),
        )),
    })
}

/// Everything a backend needs to build its client: endpoint, credentials, trust, and a version
/// that changes whenever any of them (or the Provider) does, for client caches.
#[derive(Clone, Debug, PartialEq)]
pub struct Connection {
    /// The endpoint.
    pub endpoint: String,
    /// The credentials Secret's data.
    pub credentials: Credentials,
    /// Certificate trust.
    pub trust: Trust,
    /// Nodes the Provider lists (empty: all).
    pub provider_nodes: Vec<String>,
    /// `tls.serverName`: the name the certificate is verified against, when not the endpoint's
    /// host.
    pub server_name: Option<String>,
    /// Cache key.
    pub version: String,
}

/// Resolves the connection settings of an infra cluster in `namespace` of `kind` for `backend`
/// (its own, or its Provider's) and reads them ([`credentials`], [`trust`]); `record` gets the
/// referenced Secrets before any is read. Inside a running controller a connection read from the
/// same settings moments ago is reused ([`connection_memo`]).
pub async fn connect(
    client: &kube::Client,
    namespace: &str,
    own: Own<'_>,
    backend: Backend,
    kind: &str,
    record: impl FnOnce(Vec<SecretKey>),
) -> Result<std::result::Result<Connection, Problem>> {
    let settings = format!("{namespace}|{}|{kind}|{own:?}", backend.as_str());
    if let Some((secrets, connection)) = connection_memo::recall::<Connection>(&settings) {
        record(secrets);
        return Ok(Ok(connection));
    }
    let (endpoint, credentials_ref, mut tls, provider) = match own.provider {
        Some(name) => match allowed_provider(client, name, backend, kind, namespace).await? {
            Err(problem) => return Ok(Err(problem)),
            Ok(p) => (
                Some(p.spec.endpoint.clone()),
                p.spec.credentials_ref.clone(),
                p.spec.tls.clone(),
                Some(p),
            ),
        },
        None => (
            own.endpoint.map(str::to_owned),
            own.credentials.cloned(),
            own.tls.cloned(),
            None,
        ),
    };
    let Some(endpoint) = endpoint.filter(|e| !e.is_empty()) else {
        return Ok(Err(Problem::new(
            NO_ENDPOINT,
            format!("the {kind} names no endpoint: set it, or spec.providerRef"),
        )));
    };
    if let Some(ca) = tls.as_mut().and_then(|t| t.ca_bundle_ref.as_mut()) {
        ca.namespace.get_or_insert_with(|| namespace.to_owned());
    }
    let credentials_ref = credentials_ref.map(|r| in_namespace(&r, namespace));
    let secrets = secret_keys(credentials_ref.as_ref(), tls.as_ref());
    record(secrets.clone());
    let user = provider.is_none().then_some(namespace);
    let credentials = crate::usable!(credentials(client, credentials_ref.as_ref(), user, &endpoint).await?);
    let (trust, ca_version) = crate::usable!(trust(client, tls.as_ref(), user).await?);
    let provider_version = provider.as_ref().and_then(|p| p.resource_version());
    let server_name = tls.as_ref().and_then(|t| t.server_name.clone());
    let version = format!(
        "{endpoint}|{}|{trust:?}|{server_name:?}|{ca_version}|{}",
        credentials.version,
        provider_version.unwrap_or_default()
    );
    let connection = Connection {
        provider_nodes: provider.map(|p| p.spec.nodes).unwrap_or_default(),
        server_name,
        endpoint,
        credentials,
        trust,
        version,
    };
    connection_memo::remember(settings, secrets, &connection);
    Ok(Ok(connection))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_of_another_namespace_serves_only_the_namespaces_it_allows() {
        let annotated =
            |value: &str| BTreeMap::from([(ALLOWED_NAMESPACES_ANNOTATION.to_owned(), value.to_owned())]);
        assert!(grants(&BTreeMap::new(), "team-a", "team-a"), "its own namespace");
        assert!(!grants(&BTreeMap::new(), "platform", "team-a"), "no grant");
        assert!(grants(&annotated("team-b, team-a"), "platform", "team-a"));
        assert!(!grants(&annotated("team-b"), "platform", "team-a"));
        assert!(
            !grants(&annotated("team-a-dev"), "platform", "team-a"),
            "whole names only"
        );
        assert!(grants(&annotated("*"), "platform", "team-a"));
        assert!(
            grants(&annotated("\"*\""), "platform", "team-a"),
            "as clusterctl's default leaves it"
        );
        assert!(!grants(&annotated(""), "platform", "team-a"));
    }

    #[test]
    fn a_secret_goes_only_to_the_endpoints_its_owner_allows() {
        let annotated =
            |value: &str| BTreeMap::from([(ALLOWED_ENDPOINTS_ANNOTATION.to_owned(), value.to_owned())]);
        let none = BTreeMap::new();
        assert!(
            sends_to(&none, "team-a", Some("team-a"), "https://evil.example"),
            "the namespace's own choice"
        );
        assert!(
            sends_to(&none, "platform", None, "https://pve:8006"),
            "a Provider's choice"
        );
        assert!(
            !sends_to(&none, "platform", Some("team-a"), "https://pve:8006"),
            "another namespace chooses the endpoint: the Secret must list it"
        );
        let pve = annotated("https://pve.example.com:8006/, vcenter.example.com");
        for ns in [Some("team-a"), Some("platform"), None] {
            assert!(sends_to(&pve, "platform", ns, "HTTPS://PVE.example.com:8006"));
            assert!(
                sends_to(&pve, "platform", ns, "https://vcenter.example.com/"),
                "https:// and / aside"
            );
            assert!(!sends_to(
                &pve,
                "platform",
                ns,
                "https://pve.example.com:8006.evil.example"
            ));
            assert!(
                !sends_to(&pve, "platform", ns, "https://evil.example"),
                "held for every user"
            );
        }
        assert!(sends_to(
            &annotated("\"*\""),
            "platform",
            Some("team-a"),
            "https://any"
        ));
        assert!(
            !sends_to(&annotated(""), "team-a", Some("team-a"), "https://any"),
            "an empty list allows none"
        );
        assert!(
            !sends_to(
                &annotated("qemu+ssh://host/system"),
                "p",
                None,
                "qemu+ssh://other/system"
            ),
            "libvirt URIs compare whole"
        );
    }

    fn creds(pairs: &[(&str, &str)]) -> Credentials {
        Credentials {
            secret: "ns/s".into(),
            data: pairs
                .iter()
                .map(|(k, v)| ((*k).into(), v.as_bytes().to_vec()))
                .collect(),
            version: String::new(),
        }
    }

    #[test]
    fn credentials_show_no_value_and_name_the_missing_keys() {
        let c = creds(&[("username", "root\n"), ("password", " hunter2 ")]);
        assert_eq!(
            c.texts(["username", "password"]).unwrap(),
            ["root", " hunter2 "],
            "a line end goes, a password's spaces stay"
        );
        assert!(!format!("{c:?}").contains("hunter2"));
        let problem = creds(&[("username", "root"), ("password", "\n")])
            .texts(["username", "password"])
            .unwrap_err();
        assert_eq!(problem.reason, CREDENTIALS_INVALID);
        assert_eq!(
            problem.message,
            "Secret ns/s needs non-empty keys username, password"
        );
    }

    #[test]
    fn connection_settings_list_their_credentials_and_ca_secret_for_the_watch() {
        let tls = TlsTrust {
            ca_bundle_ref: Some(banlieue_api::common::CaBundleReference {
                kind: CaBundleKind::Secret,
                name: "ca".into(),
                namespace: Some("ns".into()),
                key: None,
            }),
            ..TlsTrust::default()
        };
        let credentials = in_namespace(
            &SecretReference {
                name: "creds".into(),
                namespace: None,
            },
            "ns",
        );
        assert_eq!(
            secret_keys(Some(&credentials), Some(&tls)),
            vec![SecretKey::new("ns", "creds"), SecretKey::new("ns", "ca")]
        );
    }
}
