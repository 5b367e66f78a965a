//! Installing `CustomResourceDefinition`s and waiting until they are served.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};

use crate::error::{Error, Result};

/// The field manager this crate uses for server-side apply.
pub const FIELD_MANAGER: &str = "banlieue-testenv";

/// Parses every `CustomResourceDefinition` of a (multi-document) YAML text. Empty documents are
/// skipped; a document of another kind is an error, so a wrong file is noticed. `what` names the
/// source in errors.
pub fn crds_from_yaml(text: &str, what: &str) -> Result<Vec<CustomResourceDefinition>> {
    use serde::Deserialize as _;
    let mut crds = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let bad = |message: String| Error::Manifest {
            what: format!("{what} (document {index})"),
            message,
        };
        let value = serde_yaml::Value::deserialize(document).map_err(|e| bad(e.to_string()))?;
        if value.is_null() {
            continue;
        }
        let kind = value
            .get("kind")
            .and_then(serde_yaml::Value::as_str)
            .unwrap_or("<none>");
        if kind != "CustomResourceDefinition" {
            return Err(bad(format!("kind is {kind}, expected CustomResourceDefinition")));
        }
        crds.push(serde_yaml::from_value(value).map_err(|e| bad(e.to_string()))?);
    }
    Ok(crds)
}

/// cert-manager's `Issuer` and `Certificate` kinds, schema-less. `clusterctl init` installs
/// cert-manager (downloaded from GitHub, unreachable here) unless it can create its test Issuer
/// and Certificate; with these CRDs it can, and prints `Skipping installing cert-manager`.
pub fn cert_manager_stub_crds() -> Result<Vec<CustomResourceDefinition>> {
    crds_from_yaml(CERT_MANAGER_CRDS, "cert-manager stub CRDs")
}

const CERT_MANAGER_CRDS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: issuers.cert-manager.io}
spec:
  group: cert-manager.io
  scope: Namespaced
  names: {kind: Issuer, plural: issuers, singular: issuer, listKind: IssuerList}
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: certificates.cert-manager.io}
spec:
  group: cert-manager.io
  scope: Namespaced
  names: {kind: Certificate, plural: certificates, singular: certificate, listKind: CertificateList}
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
"#;

/// Reads [`crds_from_yaml`] from each file, in order.
pub fn crds_from_files<P: AsRef<Path>>(
    paths: impl IntoIterator<Item = P>,
) -> Result<Vec<CustomResourceDefinition>> {
    let mut crds = Vec::new();
    for path in paths {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))?;
        crds.extend(crds_from_yaml(&text, &path.display().to_string())?);
    }
    Ok(crds)
}

/// Server-side-applies the CRDs (forcing ownership, so re-installing a changed CRD works) and waits
/// until each is `Established`, at most `timeout` in all.
pub async fn install_crds(
    client: &kube::Client,
    crds: &[CustomResourceDefinition],
    timeout: Duration,
) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::with_capacity(crds.len());
    for crd in crds {
        let name = crd.metadata.name.clone().ok_or_else(|| Error::Manifest {
            what: format!("CustomResourceDefinition for {}", crd.spec.names.kind),
            message: "metadata.name is missing".into(),
        })?;
        let mut crd = crd.clone();
        // A CRD read back from a cluster carries fields that server-side apply rejects.
        crd.metadata.managed_fields = None;
        crd.metadata.resource_version = None;
        crd.metadata.uid = None;
        crd.metadata.creation_timestamp = None;
        crd.status = None;
        let patch = Patch::Apply(&crd);
        tokio::time::timeout(timeout, api.patch(&name, &params, &patch))
            .await
            .map_err(|_| Error::Timeout {
                what: format!("applying CRD {name}"),
                timeout,
                detail: String::new(),
            })?
            .map_err(|e| Error::kube(format!("applying CRD {name}"), e))?;
        names.push(name);
    }
    let deadline = Instant::now() + timeout;
    for name in names {
        wait_established(&api, &name, deadline, timeout).await?;
    }
    Ok(())
}

async fn wait_established(
    api: &Api<CustomResourceDefinition>,
    name: &str,
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    let mut last = String::from("no status yet");
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if let Ok(result) = tokio::time::timeout(remaining.max(Duration::from_millis(1)), api.get(name)).await
        {
            let crd = result.map_err(|e| Error::kube(format!("reading CRD {name}"), e))?;
            let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
            if conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
            {
                return Ok(());
            }
            if !conditions.is_empty() {
                last = conditions
                    .iter()
                    .map(|c| {
                        format!(
                            "{}={} ({})",
                            c.type_,
                            c.status,
                            c.message.as_deref().unwrap_or("")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
            }
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!("CRD {name} to become Established"),
                timeout,
                detail: format!("; conditions: {last}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object}
"#;

    #[test]
    fn parses_multi_document_yaml_and_skips_empty_documents() {
        let text = format!("---\n{CRD}\n---\n---\n{}", CRD.replace("widgets", "gadgets"));
        let crds = crds_from_yaml(&text, "test").unwrap();
        let names: Vec<_> = crds.iter().map(|c| c.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, ["widgets.example.com", "gadgets.example.com"]);
    }

    #[test]
    fn rejects_documents_of_other_kinds() {
        let text = format!("{CRD}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n");
        let err = crds_from_yaml(&text, "mixed.yaml").unwrap_err().to_string();
        assert!(
            err.contains("mixed.yaml (document 1)") && err.contains("kind is ConfigMap"),
            "{err}"
        );
    }

    #[test]
    fn reports_unreadable_files() {
        let err = crds_from_files(["/nonexistent/crds.yaml"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/crds.yaml"), "{err}");
    }
}
