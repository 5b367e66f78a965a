//! Cluster API's own managers as Pods, as a management cluster runs them: CAPI's release
//! components (rendered by `tests/controlplane/build.sh` from the pinned CAPI module's `config/`
//! folders the way CAPI's release does, into `bin/capi-components/`), installed by the real
//! `clusterctl init`, with each manager's image built here from the binary built from the same
//! module, under the name and tag its Deployment references (`registry.k8s.io/cluster-api/…`),
//! as CAPI's Dockerfile lays it out (`/manager`, user 65532).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use banlieue_capi::webhooks::Manager;
use banlieue_testenv::TestEnv;
use banlieue_testenv::images::BinaryImage;
use banlieue_testenv::nodes::Node;
use serde::Deserialize;
use serde_json::Value;

use crate::pods::Components;

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
    /// Its leader-election Lease (in its namespace; `LeaderElectionID` of its `main.go`).
    pub lease: &'static str,
}

/// CAPI's core, kubeadm bootstrap and kubeadm control-plane managers.
pub const RELEASE_MANAGERS: [ReleaseManager; 3] = [
    ReleaseManager {
        manager: Manager::Core,
        file: "core-components.yaml",
        namespace: "capi-system",
        deployment: "capi-controller-manager",
        service_account: "capi-manager",
        lease: "controller-leader-election-capi",
    },
    ReleaseManager {
        manager: Manager::KubeadmBootstrap,
        file: "bootstrap-components.yaml",
        namespace: "capi-kubeadm-bootstrap-system",
        deployment: "capi-kubeadm-bootstrap-controller-manager",
        service_account: "capi-kubeadm-bootstrap-manager",
        lease: "kubeadm-bootstrap-manager-leader-election-capi",
    },
    ReleaseManager {
        manager: Manager::KubeadmControlPlane,
        file: "control-plane-components.yaml",
        namespace: "capi-kubeadm-control-plane-system",
        deployment: "capi-kubeadm-control-plane-controller-manager",
        service_account: "capi-kubeadm-control-plane-manager",
        lease: "kubeadm-control-plane-manager-leader-election-capi",
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

/// Namespace and Deployment of CAPI's managers and of `banlieue`'s components.
pub fn manager_deployments(banlieue: &[Components]) -> Vec<(&'static str, &'static str)> {
    RELEASE_MANAGERS
        .iter()
        .map(|m| (m.namespace, m.deployment))
        .chain(banlieue.iter().map(|c| (c.namespace, c.deployment)))
        .collect()
}

/// Builds into `out` the images of CAPI's managers (from the release components of
/// [`components_dir`]) and of `banlieue`'s components (binaries in `bin_dir`): (reference,
/// tarball) of each, to import into the nodes that run them.
pub fn manager_images(
    banlieue: &[Components],
    bin_dir: &Path,
    out: &Path,
) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let components = components_dir();
    let mut images = Vec::new();
    for manager in &RELEASE_MANAGERS {
        images.push(manager.build_image(&components, out)?);
    }
    for installed in banlieue {
        let tarball = installed.image.build(bin_dir, out)?;
        images.push((installed.image.reference.to_owned(), tarball));
    }
    Ok(images)
}

/// Runs what `clusterctl init` installed from a repository holding CAPI's release components
/// (`banlieue-clusterctl repository --capi-components`): issues their certificates
/// ([`crate::certificates`]), starts node `node_name` on `env`, imports CAPI's managers' images
/// and those of `banlieue` (components the same `clusterctl init` applied; binaries in
/// `bin_dir`), and waits until each Deployment is Available. The node stops on drop.
pub async fn run_installed(
    env: &TestEnv,
    node_name: &str,
    banlieue: &[Components],
    bin_dir: &Path,
    progress: impl Fn(&str),
) -> anyhow::Result<Node> {
    let client = env.client().await?;
    let issued = crate::certificates::issue_and_inject(env, &client).await?;
    progress(&format!(
        "issued {} certificates, CA injected into {} objects",
        issued.certificates.len(),
        issued.injected.len()
    ));
    let started = Instant::now();
    let node = Node::start(env, 0, node_name).await?;
    progress(&format!(
        "node {node_name} Ready in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    let started = Instant::now();
    let images = manager_images(banlieue, bin_dir, &env.workdir().join("images"))?;
    for (reference, tarball) in &images {
        node.import(reference, tarball)?;
    }
    progress(&format!(
        "{} images built and imported in {:.1}s",
        images.len(),
        started.elapsed().as_secs_f64()
    ));
    let started = Instant::now();
    for (namespace, deployment) in manager_deployments(banlieue) {
        crate::pods::wait_available(&client, namespace, deployment, &node).await?;
    }
    progress(&format!(
        "every manager Available in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    Ok(node)
}

/// `banlieue-dev --pods --capi`: a management cluster as users install it. `clusterctl init`
/// installs CAPI's release components (ClusterTopology on) and banlieue-proxmox (the simulator's
/// token as its credentials) from the local repository, all of them run as Pods on node
/// [`crate::pods::NODE_NAME`], then the banlieue controller is installed from its components.
/// The node stops on drop.
pub async fn install_management(
    env: &TestEnv,
    sim: &banlieue_pve_sim::SimHandle,
    bin_dir: &Path,
    progress: impl Fn(&str),
) -> anyhow::Result<Node> {
    let dir = env.workdir().join("clusterctl");
    let components = components_dir();
    progress(
        "clusterctl init --infrastructure banlieue-proxmox (CAPI's release components, local repository)",
    );
    let started = Instant::now();
    crate::clusterctl::init(
        env,
        &dir,
        "banlieue-proxmox",
        &[
            ("PROXMOX_TOKEN", sim.token_id()),
            ("PROXMOX_SECRET", sim.token_secret()),
            ("PROXMOX_URL", sim.url()),
            ("CLUSTER_TOPOLOGY", "true".to_owned()),
        ],
        &["--capi-components".as_ref(), components.as_os_str()],
    )?;
    progress(&format!(
        "clusterctl init done in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    let node = run_installed(
        env,
        crate::pods::NODE_NAME,
        &[crate::pods::PROXMOX_COMPONENTS],
        bin_dir,
        &progress,
    )
    .await?;
    crate::pods::install_components(
        env,
        &node,
        &[crate::pods::CONTROLLER_COMPONENTS],
        &std::collections::BTreeMap::new(),
        bin_dir,
        &progress,
    )
    .await?;
    Ok(node)
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
