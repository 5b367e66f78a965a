//! A clusterctl local repository: `<dir>/<provider label>/<version>/{components, metadata.yaml,
//! cluster-template*.yaml}` plus a `clusterctl.yaml` whose `providers:` entries point at it.
//!
//! For the test harness (and air-gapped trials) it can also hold Cluster API's core, kubeadm
//! bootstrap and kubeadm control-plane providers, either built from CAPI's CRDs only (a Namespace
//! per provider, its CRDs, and for the core provider the aggregating manager ClusterRole; no
//! manager Deployments: the tests run the managers as processes), or CAPI's release components
//! themselves ([`write_capi_release`]: the managers run as Pods from their images).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::{Error, Infra, Result, VERSION, components, metadata, yaml};

/// The Cluster API release whose CRDs `tests/controlplane/build.sh` copies to `bin/capi-crds`.
pub const CAPI_VERSION: &str = "v1.14.2";

/// One provider entry of `clusterctl.yaml`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderEntry {
    /// clusterctl name (`cluster-api`, `kubeadm`, `banlieue-proxmox`).
    pub name: String,
    /// `CoreProvider`, `BootstrapProvider`, `ControlPlaneProvider`, `InfrastructureProvider`.
    pub type_: String,
    /// The components file.
    pub components: PathBuf,
}

impl ProviderEntry {
    fn yaml(&self) -> Value {
        json!({
            "name": self.name,
            "type": self.type_,
            "url": format!("file://{}", self.components.display()),
        })
    }
}

/// Writes `text` to `path`, creating its folder.
pub(crate) fn write_file(path: &Path, text: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io("creating", parent, e))?;
    }
    std::fs::write(path, text).map_err(|e| Error::io("writing", path, e))
}

/// The cluster templates (`cluster-template.yaml`, `cluster-template-<flavor>.yaml`) and
/// ClusterClass files (`clusterclass-<name>.yaml`, which clusterctl adds to a generated cluster
/// whose class is missing) in `dir`, sorted by file name.
pub fn template_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io("reading", dir, e))? {
        let path = entry.map_err(|e| Error::io("reading", dir, e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if (name.starts_with("cluster-template") || name.starts_with("clusterclass-"))
            && name.ends_with(".yaml")
        {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Writes `infrastructure-banlieue-proxmox/<VERSION>/` under `dir` with the templates of
/// `templates`; returns its entry.
pub fn write_proxmox(dir: &Path, templates: &Path) -> Result<ProviderEntry> {
    write_infra(dir, Infra::Proxmox, templates)
}

/// The folder of `infra`'s cluster templates under the repository's `templates/` folder:
/// Proxmox's are at its top level, the others in `templates/<short name>/`.
pub fn templates_dir(templates_root: &Path, infra: Infra) -> PathBuf {
    match infra {
        Infra::Proxmox => templates_root.to_owned(),
        other => templates_root.join(other.short()),
    }
}

/// Writes `<provider label>/<VERSION>/` of `infra` under `dir` (components, metadata and every
/// template file of `templates`, the provider's own template folder); returns its entry.
pub fn write_infra(dir: &Path, infra: Infra, templates: &Path) -> Result<ProviderEntry> {
    let version_dir = dir.join(infra.label()).join(VERSION);
    let components_file = version_dir.join("infrastructure-components.yaml");
    write_file(&components_file, &crate::artifacts::components_yaml(infra)?)?;
    write_file(&version_dir.join("metadata.yaml"), &metadata::metadata_yaml()?)?;
    let found = template_files(templates)?;
    if found.is_empty() {
        return Err(Error::Invalid(format!(
            "no cluster-template*.yaml in {}",
            templates.display()
        )));
    }
    for template in found {
        let text = std::fs::read_to_string(&template).map_err(|e| Error::io("reading", &template, e))?;
        let name = template.file_name().unwrap_or_default();
        write_file(&version_dir.join(name), &text)?;
    }
    Ok(ProviderEntry {
        name: infra.name(),
        type_: "InfrastructureProvider".into(),
        components: components_file,
    })
}

/// Writes every infrastructure provider, each with its templates from `templates_root` (the
/// repository's `templates/`); returns their entries.
pub fn write_all_infra(dir: &Path, templates_root: &Path) -> Result<Vec<ProviderEntry>> {
    Infra::ALL
        .into_iter()
        .map(|infra| write_infra(dir, infra, &templates_dir(templates_root, infra)))
        .collect()
}

/// One of CAPI's providers in a local repository.
struct CapiProvider {
    name: &'static str,
    type_: &'static str,
    label: &'static str,
    file: &'static str,
    namespace: &'static str,
    /// CRD group; `None`: every group not taken by another provider (the core provider).
    group: Option<&'static str>,
}

const CAPI_PROVIDERS: [CapiProvider; 3] = [
    CapiProvider {
        name: "cluster-api",
        type_: "CoreProvider",
        label: "cluster-api",
        file: "core-components.yaml",
        namespace: "capi-system",
        group: None,
    },
    CapiProvider {
        name: "kubeadm",
        type_: "BootstrapProvider",
        label: "bootstrap-kubeadm",
        file: "bootstrap-components.yaml",
        namespace: "capi-kubeadm-bootstrap-system",
        group: Some("bootstrap.cluster.x-k8s.io"),
    },
    CapiProvider {
        name: "kubeadm",
        type_: "ControlPlaneProvider",
        label: "control-plane-kubeadm",
        file: "control-plane-components.yaml",
        namespace: "capi-kubeadm-control-plane-system",
        group: Some("controlplane.cluster.x-k8s.io"),
    },
];

/// Reads every CRD document of the `*.yaml` files in `crd_dir`.
fn read_crds(crd_dir: &Path) -> Result<Vec<Value>> {
    let files = banlieue_capi::crds::files_in(crd_dir).map_err(|e| Error::io("reading", crd_dir, e))?;
    let mut crds = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| Error::io("reading", &file, e))?;
        for doc in yaml::parse(&text, &file.display().to_string())? {
            if doc["kind"] == "CustomResourceDefinition" {
                crds.push(doc);
            }
        }
    }
    Ok(crds)
}

/// CAPI's `metadata.yaml` for `capi_version`: its minor release series on banlieue's contract.
fn capi_metadata_yaml(capi_version: &str) -> Result<String> {
    let (major, minor) = major_minor(capi_version)?;
    let capi_metadata =
        banlieue_capi::clusterctl::Metadata::new(vec![banlieue_capi::clusterctl::ReleaseSeries {
            major,
            minor,
            contract: metadata::CONTRACT.to_owned(),
        }]);
    serde_yaml::to_string(&capi_metadata).map_err(|source| Error::Yaml {
        what: "CAPI metadata.yaml".into(),
        source,
    })
}

/// Writes one CAPI provider's components `text` and `metadata` under `<dir>/<label>/<version>/`.
fn write_capi_provider(
    dir: &Path,
    provider: &CapiProvider,
    capi_version: &str,
    text: &str,
    metadata: &str,
) -> Result<ProviderEntry> {
    let version_dir = dir.join(provider.label).join(capi_version);
    let components_file = version_dir.join(provider.file);
    write_file(&components_file, text)?;
    write_file(&version_dir.join("metadata.yaml"), metadata)?;
    Ok(ProviderEntry {
        name: provider.name.into(),
        type_: provider.type_.into(),
        components: components_file,
    })
}

/// Writes CAPI's core, kubeadm bootstrap and kubeadm control-plane providers at `capi_version`
/// from the CRDs in `crd_dir` (e.g. `tests/controlplane/bin/capi-crds`); returns their entries.
pub fn write_capi(dir: &Path, crd_dir: &Path, capi_version: &str) -> Result<Vec<ProviderEntry>> {
    let crds = read_crds(crd_dir)?;
    let metadata_text = capi_metadata_yaml(capi_version)?;
    let mut entries = Vec::new();
    for provider in &CAPI_PROVIDERS {
        let CapiProvider {
            name,
            type_,
            namespace,
            group,
            ..
        } = provider;
        let mut docs =
            vec![json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})];
        let mine = |crd: &&Value| {
            let g = crd["spec"]["group"].as_str().unwrap_or_default();
            match group {
                // clusterctl installs its own inventory CRDs; a components file must not carry them.
                None => {
                    g != banlieue_capi::crds::CLUSTERCTL_GROUP
                        && !CAPI_PROVIDERS.iter().any(|p| p.group == Some(g))
                }
                Some(other) => g == *other,
            }
        };
        let selected: Vec<Value> = crds.iter().filter(mine).cloned().collect();
        if selected.is_empty() {
            return Err(Error::Invalid(format!(
                "no {name} {type_} CRDs in {}",
                crd_dir.display()
            )));
        }
        // CAPI's release manifests label its CRDs with the contract they implement (kustomize
        // `commonLabels`); the CRDs built from the Go module carry none. Without it CAPI finds
        // no version of KubeadmControlPlane/KubeadmConfigTemplate for contract v1beta2.
        docs.extend(selected.into_iter().map(|mut crd| {
            crd["metadata"]["labels"][banlieue_capi::contract::CONTRACT_LABEL] = json!(metadata::CONTRACT);
            crd
        }));
        if *type_ == "CoreProvider" {
            docs.push(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "capi-aggregated-manager-role"},
                "aggregationRule": {"clusterRoleSelectors": [
                    {"matchLabels": {components::AGGREGATE_TO_MANAGER: "true"}}
                ]},
                "rules": [],
            }));
        }
        let header = format!(
            "Cluster API {capi_version} {type_} `{name}` for a test or air-gapped management cluster:\n\
             its Namespace and CRDs only (no manager Deployment); generated by banlieue-clusterctl."
        );
        let text = yaml::render(&header, &docs)?;
        entries.push(write_capi_provider(
            dir,
            provider,
            capi_version,
            &text,
            &metadata_text,
        )?);
    }
    Ok(entries)
}

/// Writes CAPI's core, kubeadm bootstrap and kubeadm control-plane providers at `capi_version`
/// from CAPI's release components in `components_dir` (`core-components.yaml`,
/// `bootstrap-components.yaml`, `control-plane-components.yaml`, as CAPI publishes them or as
/// `tests/controlplane/build.sh` renders them into `bin/capi-components`), copied unchanged:
/// the managers' Deployments, RBAC, webhooks and cert-manager Certificates; returns their entries.
pub fn write_capi_release(
    dir: &Path,
    components_dir: &Path,
    capi_version: &str,
) -> Result<Vec<ProviderEntry>> {
    let metadata_text = capi_metadata_yaml(capi_version)?;
    let mut entries = Vec::new();
    for provider in &CAPI_PROVIDERS {
        let source = components_dir.join(provider.file);
        let text = std::fs::read_to_string(&source).map_err(|e| Error::io("reading", &source, e))?;
        let docs = yaml::parse(&text, &source.display().to_string())?;
        let deploys_manager = docs
            .iter()
            .any(|doc| doc["kind"] == "Deployment" && doc["metadata"]["namespace"] == provider.namespace);
        if !deploys_manager {
            return Err(Error::Invalid(format!(
                "{} is not CAPI's {} {} release components: no Deployment in {}",
                source.display(),
                provider.name,
                provider.type_,
                provider.namespace
            )));
        }
        entries.push(write_capi_provider(
            dir,
            provider,
            capi_version,
            &text,
            &metadata_text,
        )?);
    }
    Ok(entries)
}

fn major_minor(version: &str) -> Result<(i32, i32)> {
    let core = version.trim_start_matches('v');
    let mut parts = core.split('.').map(|p| p.parse::<i32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => Ok((major, minor)),
        _ => Err(Error::Invalid(format!("not a version: {version}"))),
    }
}

/// File name of the configuration listing banlieue's providers only (CAPI and cert-manager then
/// come from clusterctl's built-in GitHub URLs).
pub const CONFIG_FILE: &str = "clusterctl.yaml";
/// File name of the configuration that also lists the repository's CAPI providers and
/// cert-manager stand-in (see [`crate::offline`]).
pub const OFFLINE_CONFIG_FILE: &str = "clusterctl-offline.yaml";

/// Writes `<dir>/clusterctl.yaml` with the `providers:` entries; returns its path.
pub fn write_config(dir: &Path, entries: &[ProviderEntry]) -> Result<PathBuf> {
    write_named_config(&dir.join(CONFIG_FILE), entries, None)
}

/// Writes a clusterctl configuration at `path` with the `providers:` entries and, when given,
/// `cert-manager.url` pointing at a local cert-manager components file (its version is the name
/// of the file's folder); returns `path`.
pub fn write_named_config(
    path: &Path,
    entries: &[ProviderEntry],
    cert_manager: Option<&Path>,
) -> Result<PathBuf> {
    let mut config = json!({
        "providers": entries.iter().map(ProviderEntry::yaml).collect::<Vec<_>>(),
    });
    if let Some(file) = cert_manager {
        let version = file
            .parent()
            .and_then(Path::file_name)
            .and_then(|v| v.to_str())
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{} is not in a <version>/ folder of a local repository",
                    file.display()
                ))
            })?;
        config["cert-manager"] = json!({
            "url": format!("file://{}", file.display()),
            "version": version,
        });
    }
    let body = serde_yaml::to_string(&config).map_err(|source| Error::Yaml {
        what: path.display().to_string(),
        source,
    })?;
    write_file(
        path,
        &format!("# Local clusterctl repository written by banlieue-clusterctl; use with --config.\n{body}"),
    )?;
    Ok(path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_proxmox_layout_and_config() {
        let dir = tempfile::tempdir().unwrap();
        let templates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates");
        let entry = write_proxmox(dir.path(), &templates).unwrap();
        let version_dir = dir.path().join("infrastructure-banlieue-proxmox").join(VERSION);
        for file in [
            "infrastructure-components.yaml",
            "metadata.yaml",
            "cluster-template.yaml",
        ] {
            assert!(version_dir.join(file).is_file(), "{file}");
        }
        let config = write_config(dir.path(), &[entry]).unwrap();
        let parsed: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
        assert_eq!(parsed["providers"][0]["name"].as_str(), Some("banlieue-proxmox"));
        assert_eq!(
            parsed["providers"][0]["type"].as_str(),
            Some("InfrastructureProvider")
        );
        let url = parsed["providers"][0]["url"].as_str().unwrap();
        assert!(
            url.starts_with("file:///") && url.ends_with("/infrastructure-components.yaml"),
            "{url}"
        );
    }

    #[test]
    fn writes_every_provider_with_its_own_templates() {
        let dir = tempfile::tempdir().unwrap();
        let templates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates");
        let entries = write_all_infra(dir.path(), &templates).unwrap();
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            ["banlieue-proxmox", "banlieue-libvirt", "banlieue-vsphere"]
        );
        for infra in Infra::ALL {
            let version_dir = dir.path().join(infra.label()).join(VERSION);
            let template = std::fs::read_to_string(version_dir.join("cluster-template.yaml")).unwrap();
            assert!(
                template.contains(&format!("kind: {}Cluster", infra.kind_prefix())),
                "{infra:?} got another provider's template"
            );
            let components =
                std::fs::read_to_string(version_dir.join("infrastructure-components.yaml")).unwrap();
            assert!(components.contains(&format!("cluster.x-k8s.io/provider: {}", infra.label())));
        }
    }

    #[test]
    fn copies_capi_release_components_and_refuses_files_without_their_manager() {
        let release = tempfile::tempdir().unwrap();
        for provider in &CAPI_PROVIDERS {
            let text = format!(
                "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n---\napiVersion: apps/v1\n\
                 kind: Deployment\nmetadata: {{name: manager, namespace: {ns}}}\n",
                ns = provider.namespace
            );
            std::fs::write(release.path().join(provider.file), text).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let entries = write_capi_release(dir.path(), release.path(), CAPI_VERSION).unwrap();
        let types: Vec<&str> = entries.iter().map(|e| e.type_.as_str()).collect();
        assert_eq!(
            types,
            ["CoreProvider", "BootstrapProvider", "ControlPlaneProvider"]
        );
        for (entry, provider) in entries.iter().zip(&CAPI_PROVIDERS) {
            assert_eq!(
                std::fs::read_to_string(&entry.components).unwrap(),
                std::fs::read_to_string(release.path().join(provider.file)).unwrap(),
                "copied unchanged"
            );
            assert!(entry.components.with_file_name("metadata.yaml").is_file());
        }

        // A CRD-only file (or another provider's) is not taken for CAPI's release components.
        std::fs::write(
            release.path().join("bootstrap-components.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: capi-kubeadm-bootstrap-system}\n",
        )
        .unwrap();
        let err = write_capi_release(dir.path(), release.path(), CAPI_VERSION)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("bootstrap-components.yaml") && err.contains("no Deployment"),
            "{err}"
        );
    }

    #[test]
    fn splits_capi_crds_by_provider() {
        let dir = tempfile::tempdir().unwrap();
        let crds = banlieue_capi::crds::dir();
        let entries = write_capi(dir.path(), &crds, CAPI_VERSION).unwrap();
        assert_eq!(entries.len(), 3);
        let control_plane = std::fs::read_to_string(&entries[2].components).unwrap();
        let docs = yaml::parse(&control_plane, "cp").unwrap();
        assert!(
            docs.iter()
                .skip(1)
                .all(|d| d["spec"]["group"] == "controlplane.cluster.x-k8s.io")
        );
        assert_eq!(docs[0]["metadata"]["name"], "capi-kubeadm-control-plane-system");
        assert!(
            docs.iter()
                .skip(1)
                .all(|d| d["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"] == "v1beta2"),
            "every CAPI CRD carries the contract label its release manifests add"
        );
        let core = yaml::parse(&std::fs::read_to_string(&entries[0].components).unwrap(), "core").unwrap();
        assert!(
            core.iter()
                .any(|d| d["metadata"]["name"] == "clusters.cluster.x-k8s.io")
        );
        assert!(
            !core
                .iter()
                .any(|d| d["spec"]["group"] == "bootstrap.cluster.x-k8s.io")
        );
    }
}
