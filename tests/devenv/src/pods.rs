//! The local environment with banlieue's managers as Pods on a real node (`banlieue-dev --pods`):
//! a node joins the control plane (`banlieue_testenv::nodes`), the Proxmox provider's and the
//! banlieue controller's images are built here and imported into it, and their components
//! (`clusterctl/dist/`, the files users install) are applied as they are, with only clusterctl's
//! variables filled in. Each manager then runs as its own ServiceAccount under the RBAC its
//! components install, and reaches the simulator at the host's address on the node bridge.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use banlieue_testenv::TestEnv;
use banlieue_testenv::nodes::Node;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;

use crate::images;

/// The node's name.
pub const NODE_NAME: &str = "node-1";

/// How long the managers get to become Available.
const AVAILABLE_TIMEOUT: Duration = Duration::from_secs(180);

/// A components file of `clusterctl/dist/` and the Deployment it runs.
#[derive(Clone, Copy, Debug)]
pub struct Components {
    /// The file, relative to the repository root.
    pub file: &'static str,
    /// Namespace of its Deployment.
    pub namespace: &'static str,
    /// Its Deployment.
    pub deployment: &'static str,
    /// The image the Deployment runs.
    pub image: images::Image,
}

/// The Proxmox provider's components (what `clusterctl init --infrastructure banlieue-proxmox`
/// installs).
pub const PROXMOX_COMPONENTS: Components = Components {
    file: "clusterctl/dist/infrastructure-banlieue-proxmox/infrastructure-components.yaml",
    namespace: "banlieue-proxmox-system",
    deployment: "banlieue-proxmox-controller-manager",
    image: images::PROXMOX,
};

/// The banlieue controller's components (standalone VirtualMachines).
pub const CONTROLLER_COMPONENTS: Components = Components {
    file: "clusterctl/dist/banlieue-core.yaml",
    namespace: "banlieue-system",
    deployment: "banlieue-controller",
    image: images::CONTROLLER,
};

const INSTALLED: [Components; 2] = [PROXMOX_COMPONENTS, CONTROLLER_COMPONENTS];

fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Starts the node, imports the images, applies the components and waits until both managers
/// are Available. The node stops when the returned value drops.
pub async fn install(
    env: &TestEnv,
    sim: &banlieue_pve_sim::SimHandle,
    bin_dir: &Path,
    progress: impl Fn(&str),
) -> anyhow::Result<Node> {
    progress(&format!(
        "starting node {NODE_NAME} (containerd, kubelet, kube-proxy)"
    ));
    let started = Instant::now();
    let node = Node::start(env, 0, NODE_NAME).await?;
    progress(&format!(
        "node {NODE_NAME} Ready in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    let variables = BTreeMap::from([
        ("PROXMOX_TOKEN", sim.token_id()),
        ("PROXMOX_SECRET", sim.token_secret()),
        ("PROXMOX_URL", sim.url()),
    ]);
    install_components(env, &node, &INSTALLED, &variables, bin_dir, progress).await?;
    Ok(node)
}

/// Builds and imports each of `installed`'s image into `node`, applies its components file (as
/// it is, with clusterctl's `variables` filled in) and waits until its Deployment is Available.
pub async fn install_components(
    env: &TestEnv,
    node: &Node,
    installed: &[Components],
    variables: &BTreeMap<&str, String>,
    bin_dir: &Path,
    progress: impl Fn(&str),
) -> anyhow::Result<()> {
    let out = env.workdir().join("images");
    for components in installed {
        let image = components.image;
        progress(&format!(
            "building image {} from {}",
            image.reference, image.binary
        ));
        let tarball = image.build(bin_dir, &out)?;
        node.import(image.reference, &tarball)?;
        let path = repository_root().join(components.file);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let manifest = env.workdir().join(format!("{}.yaml", components.deployment));
        std::fs::write(&manifest, substitute(&text, variables)?)?;
        progress(&format!("applying {}", components.file));
        let mut kubectl = env.kubectl();
        kubectl
            .args(["apply", "--server-side", "--force-conflicts", "-f"])
            .arg(&manifest);
        let output = banlieue_testenv::run_with_timeout(&mut kubectl, Duration::from_secs(60))?;
        ensure!(
            output.status.success(),
            "kubectl apply -f {}: {}",
            components.file,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let client = env.client().await?;
    for components in installed {
        wait_available(&client, components.namespace, components.deployment, node).await?;
        progress(&format!(
            "{}/{} Available (a Pod on {})",
            components.namespace,
            components.deployment,
            node.name()
        ));
    }
    Ok(())
}

/// Waits until Deployment `namespace/name` has an available replica (at most three minutes);
/// the error gives its conditions and where the node's log is.
pub async fn wait_available(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    node: &Node,
) -> anyhow::Result<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + AVAILABLE_TIMEOUT;
    loop {
        let deployment = api.get_opt(name).await?;
        let status = deployment.and_then(|d| d.status);
        if status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0) >= 1 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{namespace}/{name} not Available after {AVAILABLE_TIMEOUT:?} ({:?}); node log: {}",
                status.and_then(|s| s.conditions),
                node.dir().join("node.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// clusterctl's variable syntax: `${NAME}` takes `variables[NAME]` (an error when missing),
/// `${NAME:=default}` takes it or the default.
pub fn substitute(text: &str, variables: &BTreeMap<&str, String>) -> anyhow::Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .with_context(|| format!("an unterminated ${{ in {:?}", &rest[start..]))?;
        let expression = &after[..end];
        let (name, default) = match expression.split_once(":=") {
            Some((name, default)) => (name, Some(default)),
            None => (expression, None),
        };
        match (variables.get(name), default) {
            (Some(value), _) => out.push_str(value),
            (None, Some(default)) => out.push_str(default),
            (None, None) => bail!("variable {name} is required and not set"),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_and_defaults_are_filled_in() {
        let vars = BTreeMap::from([("A", "x".to_owned())]);
        assert_eq!(substitute("a=${A} b=${B:=2} c", &vars).unwrap(), "a=x b=2 c");
        assert_eq!(substitute("${A:=default}", &vars).unwrap(), "x");
        let err = substitute("${MISSING}", &vars).unwrap_err().to_string();
        assert!(err.contains("MISSING"), "{err}");
        assert!(substitute("${A", &vars).is_err());
    }
}
