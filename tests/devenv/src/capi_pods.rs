//! Cluster API's own managers as Pods, as a management cluster runs them: CAPI's release
//! components (rendered by `tests/controlplane/build.sh` from the pinned CAPI module's `config/`
//! folders the way CAPI's release does, into `bin/capi-components/`), installed by the real
//! `clusterctl init`, with each manager's image built here from the binary built from the same
//! module, under the name and tag its Deployment references (`registry.k8s.io/cluster-api/…`),
//! as CAPI's Dockerfile lays it out (`/manager`, user 65532).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use banlieue_capi::webhooks::Manager;
use banlieue_testenv::images::BinaryImage;
use serde::Deserialize;
use serde_json::Value;

/// One of CAPI's managers as its release components deploy it.
#[derive(Clone, Copy, Debug)]
pub struct ReleaseManager {
    /// Which manager.
    pub manager: Manager,
    /// Its components file in the release (and in a clusterctl repository).
    pub file: &'static str,
    /// Namespace of its Deployment.
    pub namespace: &'static str,
    /// Its Deployment.
    pub deployment: &'static str,
    /// The ServiceAccount its Pod runs as.
    pub service_account: &'static str,
}

/// CAPI's core, kubeadm bootstrap and kubeadm control-plane managers.
pub const RELEASE_MANAGERS: [ReleaseManager; 3] = [
    ReleaseManager {
        manager: Manager::Core,
        file: "core-components.yaml",
        namespace: "capi-system",
        deployment: "capi-controller-manager",
        service_account: "capi-manager",
    },
    ReleaseManager {
        manager: Manager::KubeadmBootstrap,
        file: "bootstrap-components.yaml",
        namespace: "capi-kubeadm-bootstrap-system",
        deployment: "capi-kubeadm-bootstrap-controller-manager",
        service_account: "capi-kubeadm-bootstrap-manager",
    },
    ReleaseManager {
        manager: Manager::KubeadmControlPlane,
        file: "control-plane-components.yaml",
        namespace: "capi-kubeadm-control-plane-system",
        deployment: "capi-kubeadm-control-plane-controller-manager",
        service_account: "capi-kubeadm-control-plane-manager",
    },
];

/// Where CAPI's Dockerfile puts the manager (also its entrypoint).
const MANAGER_PATH: &str = "/manager";
/// The user CAPI's images run as (distroless `nonroot`).
const MANAGER_USER: &str = "65532";
/// Webhook, health and diagnostics ports of CAPI's managers.
const MANAGER_PORTS: [u16; 3] = [9443, 9440, 8443];

/// The folder of CAPI's release components that `tests/controlplane/build.sh` renders.
pub fn components_dir() -> PathBuf {
    banlieue_testenv::bin_dir().join("capi-components")
}

impl ReleaseManager {
    /// The image its Deployment in `components_dir` runs.
    pub fn image_reference(&self, components_dir: &Path) -> anyhow::Result<String> {
        let path = components_dir.join(self.file);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {} (tests/controlplane/build.sh renders CAPI's release components)",
                path.display()
            )
        })?;
        for document in serde_yaml::Deserializer::from_str(&text) {
            let doc = Value::deserialize(document).with_context(|| format!("parsing {}", path.display()))?;
            if doc["kind"] == "Deployment"
                && doc["metadata"]["name"] == self.deployment
                && doc["metadata"]["namespace"] == self.namespace
            {
                let image = doc["spec"]["template"]["spec"]["containers"][0]["image"].as_str();
                return image
                    .map(str::to_owned)
                    .with_context(|| format!("{} in {} names no image", self.deployment, path.display()));
            }
        }
        bail!(
            "{} has no Deployment {}/{}",
            path.display(),
            self.namespace,
            self.deployment
        )
    }

    /// Builds its image (the binary of [`crate::capi::binary_name`] in the control plane's bin
    /// folder) into `out`, under the reference its Deployment uses; returns (reference, tarball).
    pub fn build_image(&self, components_dir: &Path, out: &Path) -> anyhow::Result<(String, PathBuf)> {
        let reference = self.image_reference(components_dir)?;
        let binary = banlieue_testenv::bin_dir().join(crate::capi::binary_name(self.manager));
        anyhow::ensure!(
            binary.is_file(),
            "{} is missing: run tests/controlplane/build.sh",
            binary.display()
        );
        let tarball = BinaryImage {
            reference: &reference,
            binary: &binary,
            path: MANAGER_PATH,
            user: MANAGER_USER,
            ports: &MANAGER_PORTS,
        }
        .build(out)
        .with_context(|| format!("building image {reference}"))?;
        Ok((reference, tarball))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_comes_from_the_deployment_of_the_components() {
        let dir = tempfile::tempdir().unwrap();
        let core = RELEASE_MANAGERS[0];
        std::fs::write(
            dir.path().join(core.file),
            "kind: Namespace\nmetadata: {name: capi-system}\n---\nkind: Deployment\nmetadata: \
             {name: capi-controller-manager, namespace: capi-system}\nspec:\n  template:\n    \
             spec:\n      containers:\n      - image: registry.k8s.io/cluster-api/cluster-api-controller:v9.9.9\n",
        )
        .unwrap();
        assert_eq!(
            core.image_reference(dir.path()).unwrap(),
            "registry.k8s.io/cluster-api/cluster-api-controller:v9.9.9"
        );
        let err = RELEASE_MANAGERS[1]
            .image_reference(dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("build.sh"), "{err}");
    }
}
