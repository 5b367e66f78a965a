//! What cert-manager does for Cluster API's release components, done by the harness: each
//! cert-manager `Certificate` gets its Secret (`tls.crt`, `tls.key`, `ca.crt`, type
//! `kubernetes.io/tls`) for its `dnsNames`, and every webhook configuration and CRD annotated
//! `cert-manager.io/inject-ca-from: <namespace>/<certificate>` gets that certificate's CA as its
//! `caBundle` (cert-manager's cainjector).
//!
//! Why not cert-manager itself: the Go module proxy serves cert-manager's root module (its
//! libraries, charts and CRDs) but not the nested modules that hold its programs' `main`
//! packages (`cmd/controller`, `cmd/webhook`, `cmd/cainjector`), so its binaries cannot be built
//! here. What differs from cert-manager: the certificates are signed by the test control plane's
//! CA rather than self-signed, and they are issued when [`issue_and_inject`] runs, not watched
//! and renewed.

use std::collections::BTreeSet;

use anyhow::Context;
use banlieue_testenv::TestEnv;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

/// cainjector's annotation: `<namespace>/<Certificate name>`.
pub const INJECT_CA_FROM: &str = "cert-manager.io/inject-ca-from";

/// What [`issue_and_inject`] did.
#[derive(Debug, Default)]
pub struct Issued {
    /// `<namespace>/<Certificate>` of every certificate issued.
    pub certificates: BTreeSet<String>,
    /// `<kind>/<name>` of every object whose CA bundle was set.
    pub injected: BTreeSet<String>,
}

fn certificate_api(client: &kube::Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"));
    Api::all_with(client.clone(), &resource)
}

/// Issues every `Certificate` in the cluster from `env`'s CA into its Secret, then injects that
/// CA into every object that names one of them in [`INJECT_CA_FROM`]. Running it again reissues
/// and re-injects (it is meant to run once, after `clusterctl init`).
pub async fn issue_and_inject(env: &TestEnv, client: &kube::Client) -> anyhow::Result<Issued> {
    let ca = env.ca_pem()?;
    let mut issued = Issued::default();
    for certificate in certificate_api(client).list(&ListParams::default()).await? {
        let namespace = certificate.namespace().unwrap_or_default();
        let name = certificate.name_any();
        let spec = &certificate.data["spec"];
        let secret_name = spec["secretName"]
            .as_str()
            .with_context(|| format!("Certificate {namespace}/{name} has no spec.secretName"))?;
        let dns_names: Vec<&str> = spec["dnsNames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str())
            .collect();
        anyhow::ensure!(
            !dns_names.is_empty(),
            "Certificate {namespace}/{name} has no spec.dnsNames (only DNS names are issued here)"
        );
        let pair = env.serving_certificate(&[], &dns_names)?;
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": secret_name,
                "namespace": namespace,
                "annotations": {"cert-manager.io/certificate-name": name},
            },
            "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": pair.cert_pem, "tls.key": pair.key_pem, "ca.crt": ca},
        }))?;
        Api::<Secret>::namespaced(client.clone(), &namespace)
            .patch(
                secret_name,
                &PatchParams::apply(crate::FIELD_MANAGER).force(),
                &Patch::Apply(&secret),
            )
            .await
            .with_context(|| format!("writing Secret {namespace}/{secret_name}"))?;
        issued.certificates.insert(format!("{namespace}/{name}"));
    }
    let bundle = ByteString(ca.into_bytes());
    let wanted = |annotations: &std::collections::BTreeMap<String, String>| {
        annotations
            .get(INJECT_CA_FROM)
            .is_some_and(|from| issued.certificates.contains(from))
    };
    let mut injected = BTreeSet::new();

    inject_into_webhooks::<MutatingWebhookConfiguration>(client, &wanted, &bundle, &mut injected).await?;
    inject_into_webhooks::<ValidatingWebhookConfiguration>(client, &wanted, &bundle, &mut injected).await?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in api.list(&ListParams::default()).await? {
        if !wanted(crd.annotations()) {
            continue;
        }
        let Some(webhook) = crd.spec.conversion.as_ref().and_then(|c| c.webhook.as_ref()) else {
            continue;
        };
        if webhook.client_config.is_some() {
            let patch = json!({"spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": bundle}}}}});
            merge_patch(&api, &crd, &patch).await?;
            injected.insert(kind_name(&crd));
        }
    }
    issued.injected = injected;
    Ok(issued)
}

/// Sets `bundle` as the CA bundle of every webhook of each `K` (mutating or validating webhook
/// configuration) whose annotations are `wanted`; records each in `injected`.
async fn inject_into_webhooks<K>(
    client: &kube::Client,
    wanted: &impl Fn(&std::collections::BTreeMap<String, String>) -> bool,
    bundle: &ByteString,
    injected: &mut BTreeSet<String>,
) -> anyhow::Result<()>
where
    K: Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    for config in api.list(&ListParams::default()).await? {
        if !wanted(config.annotations()) {
            continue;
        }
        let mut webhooks = serde_json::to_value(&config)?["webhooks"].take();
        for webhook in webhooks.as_array_mut().into_iter().flatten() {
            webhook["clientConfig"]["caBundle"] = json!(bundle);
        }
        merge_patch(&api, &config, &json!({"webhooks": webhooks})).await?;
        injected.insert(kind_name(&config));
    }
    Ok(())
}

fn kind_name<K: Resource<DynamicType = ()>>(object: &K) -> String {
    format!("{}/{}", K::kind(&()), object.name_any())
}

/// A JSON merge patch (no resourceVersion: the CAPI managers update these objects too).
async fn merge_patch<K>(api: &Api<K>, object: &K, patch: &serde_json::Value) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(&object.name_any(), &PatchParams::default(), &Patch::Merge(patch))
        .await
        .with_context(|| format!("setting the CA bundle of {}", kind_name(object)))?;
    Ok(())
}
