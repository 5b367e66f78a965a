//! The whole banlieue stack on this machine, as a library: the `banlieue-dev` binary (the
//! README's `tests/dev.sh`) and the end-to-end tests (`tests/e2e.rs`) start it the same way.
//!
//! [`Stack::start`] starts a private etcd + kube-apiserver + kube-controller-manager (built by
//! `tests/controlplane/build.sh`), installs banlieue's CRDs (and CAPI's when a folder is given:
//! the repository's `api/capi/crds` by default, labelled with their contract as CAPI's releases do),
//! starts the Proxmox VE simulator on loopback and registers it as the cluster-scoped `Provider`
//! [`PROVIDER_NAME`] with a credentials Secret in [`SYSTEM_NAMESPACE`]. [`start_controller`]
//! runs one of the [`CONTROLLERS`] from its own binary, as its own process, sharing nothing with
//! the caller but the API server.

pub mod capi;
pub mod capi_pods;
pub mod certificates;
pub mod clusterctl;
pub mod fixtures;
pub mod images;
pub mod pods;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use banlieue_testenv::{ManagedProcess, TestEnv};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};

/// Field manager of the objects the environment applies.
pub const FIELD_MANAGER: &str = "banlieue-dev";
/// Namespace of the simulator's credentials Secret.
pub const SYSTEM_NAMESPACE: &str = "banlieue-system";
/// Name of the Provider (and of its Secret) registered for the simulator.
pub const PROVIDER_NAME: &str = "pve-sim";

/// The Proxmox provider's binary.
pub const PROXMOX_PROVIDER: &str = "banlieue-proxmox";
/// The banlieue CLI, whose `controller` subcommand is the banlieue controller.
pub const BANLIEUE: &str = "banlieue";

/// The controllers the environment runs, by binary name and flags (metrics on ephemeral ports).
pub const CONTROLLERS: [(&str, &[&str]); 2] = [
    (
        PROXMOX_PROVIDER,
        &[
            "--metrics-bind-address=127.0.0.1:0",
            "--health-probe-bind-address=127.0.0.1:0",
            "--log-format=text",
        ],
    ),
    (
        BANLIEUE,
        &["controller", "--metrics-addr=127.0.0.1:0", "--log-format=text"],
    ),
];

/// What to start.
#[derive(Clone, Debug)]
pub struct StackConfig {
    /// The simulator's configuration.
    pub sim: banlieue_pve_sim::SimConfig,
    /// Folder of CAPI's CRDs to install as well (`None`: none; a folder without CRDs is an
    /// error).
    pub capi_crds: Option<PathBuf>,
    /// Whether real nodes can join ([`banlieue_testenv::TestEnvBuilder::node_network`]); the
    /// simulator then listens on the node bridge's host address, where Pods reach it.
    pub node_network: bool,
}

/// A running control plane with banlieue's CRDs and the simulator registered as a Provider.
pub struct Stack {
    /// The control plane.
    pub env: TestEnv,
    /// The Proxmox VE simulator.
    pub sim: banlieue_pve_sim::SimHandle,
}

impl Stack {
    /// Starts everything, reporting each step to `progress`.
    pub async fn start(config: StackConfig, progress: impl Fn(&str)) -> anyhow::Result<Self> {
        progress("starting etcd, kube-apiserver and kube-controller-manager");
        let env = TestEnv::builder()
            .allow_external(false)
            .node_network(config.node_network)
            .start()
            .await
            .context("starting the control plane (did `tests/controlplane/build.sh` run?)")?;
        progress(&format!(
            "control plane ready at {} in {:.1}s",
            env.server(),
            env.started_in().as_secs_f64()
        ));

        progress("installing banlieue CRDs");
        env.install_crds(&banlieue_api::crds::all()).await?;
        env.install_admission_policies(&banlieue_api::policies::all())
            .await?;
        if let Some(dir) = &config.capi_crds {
            let capi = capi_crds(dir)?;
            progress(&format!(
                "installing {} CAPI CRDs from {}",
                capi.len(),
                dir.display()
            ));
            env.install_crds(&capi).await?;
        }

        progress("starting the Proxmox VE simulator");
        let mut sim_config = config.sim;
        if let Some(network) = env.node_network() {
            sim_config.bind_address = network.gateway();
        }
        let sim = banlieue_pve_sim::start(sim_config)
            .await
            .context("starting the Proxmox VE simulator")?;
        progress(&format!("registering the simulator as Provider {PROVIDER_NAME}"));
        register_simulator(&env, &sim).await?;
        Ok(Self { env, sim })
    }

    /// Stops the simulator, then the control plane.
    pub async fn stop(self) {
        self.sim.shutdown().await;
        drop(self.env);
    }
}

/// The simulator configuration of the dev environment: `nodes` nodes named `pve1…`, every task
/// taking `task`, guest agents answering `agent` after a VM starts. The template (VMID
/// [`capi::SIM_TEMPLATE_VMID`] on `pve1`) keeps its disks on a shared storage, [`SHARED_STORAGE`]
/// (Ceph RBD, as in most multi-node Proxmox VE clusters), so machines can be cloned to every node:
/// CAPI spreads control-plane machines over the nodes (each a failure domain), and Proxmox VE
/// refuses to clone a template on local storage to another node.
pub fn sim_config(nodes: usize, task: Duration, agent: Duration) -> banlieue_pve_sim::SimConfig {
    let defaults = banlieue_pve_sim::SimConfig::default();
    let mut shared = banlieue_pve_sim::StorageSpec::new(SHARED_STORAGE, "rbd", &["images", "rootdir"]);
    shared.shared = true;
    let mut storages = defaults.storages.clone();
    storages.push(shared);
    let mut template = banlieue_pve_sim::TemplateSpec::ubuntu("pve1");
    for value in template.config.values_mut() {
        if let Some(rest) = value.strip_prefix("local-lvm:") {
            *value = format!("{SHARED_STORAGE}:{rest}");
        }
    }
    banlieue_pve_sim::SimConfig {
        nodes: (1..=nodes).map(|n| format!("pve{n}")).collect(),
        task_duration: task,
        agent_delay: agent,
        storages,
        templates: vec![template],
        ..defaults
    }
}

/// The shared storage of the dev environment's simulator, where its template's disks are.
pub const SHARED_STORAGE: &str = "ceph";

/// Folder of the controller binaries when running from `target/<profile>/` (the binary itself),
/// `target/<profile>/deps/` (a test) or `target/<profile>/examples/` (the benchmark).
pub fn binary_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") || dir.ends_with("examples") {
        dir.pop();
    }
    Ok(dir)
}

/// Starts controller `name` (one of [`CONTROLLERS`]) from `bin_dir` with `args`, `KUBECONFIG`
/// set (the rest of the environment, e.g. `RUST_LOG`, is inherited) and its output in
/// `logs/<name>.log`; the logs of earlier starts are kept as `<name>.log.1` (the last) to
/// `<name>.log.{KEPT_LOGS}` (see [`rotate_log`]). It dies with this process (and on drop).
pub fn start_controller(
    bin_dir: &Path,
    name: &str,
    args: &[&str],
    kubeconfig: &Path,
    logs: &Path,
) -> anyhow::Result<ManagedProcess> {
    let binary = bin_dir.join(name);
    anyhow::ensure!(
        binary.is_file(),
        "{} is missing: build it with `cargo build -p banlieue-controllers -p banlieue-proxmox` \
         (tests/dev.sh does), or pass --no-controllers",
        binary.display()
    );
    let mut argv = vec![
        format!("KUBECONFIG={}", kubeconfig.display()),
        binary.display().to_string(),
    ];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    std::fs::create_dir_all(logs).with_context(|| format!("creating {}", logs.display()))?;
    let log = logs.join(format!("{name}.log"));
    rotate_log(&log, KEPT_LOGS)?;
    Ok(ManagedProcess::start(
        name,
        Path::new("/usr/bin/env"),
        &argv,
        &log,
    )?)
}

/// How many logs of earlier starts [`start_controller`] keeps per controller.
pub const KEPT_LOGS: usize = 5;

/// Moves `log` to `log.1`, `log.1` to `log.2`, … keeping at most `keep` old files (the oldest
/// is dropped). A missing `log` (first start) moves nothing.
pub fn rotate_log(log: &Path, keep: usize) -> anyhow::Result<()> {
    if keep == 0 || !log.exists() {
        return Ok(());
    }
    let numbered = |n: usize| {
        let mut name = log.as_os_str().to_owned();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    };
    for n in (1..keep).rev() {
        let from = numbered(n);
        if from.exists() {
            std::fs::rename(&from, numbered(n + 1))
                .with_context(|| format!("rotating {}", from.display()))?;
        }
    }
    std::fs::rename(log, numbered(1)).with_context(|| format!("rotating {}", log.display()))
}

/// The flags of controller `name` in [`CONTROLLERS`].
pub fn controller_args(name: &str) -> &'static [&'static str] {
    CONTROLLERS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, a)| *a)
        .unwrap_or(&[])
}

/// CAPI's CRDs of `dir` as a CAPI release installs them: every CRD but clusterctl's, labelled
/// with the contract it implements (`cluster.x-k8s.io/v1beta2: v1beta2`, which CAPI's release
/// manifests add and CAPI reads to pick the version of a referenced kind). A folder without CRDs
/// is an error naming it.
pub fn capi_crds(dir: &Path) -> anyhow::Result<Vec<CustomResourceDefinition>> {
    let files = banlieue_capi::crds::files_in(dir)?;
    let mut crds = banlieue_testenv::crds_from_files(&files)?;
    crds.retain(|crd| crd.spec.group != banlieue_capi::crds::CLUSTERCTL_GROUP);
    for crd in &mut crds {
        crd.metadata.labels.get_or_insert_default().insert(
            banlieue_capi::contract::CONTRACT_LABEL.to_owned(),
            banlieue_capi::contract::CONTRACT.to_owned(),
        );
    }
    Ok(crds)
}

/// Registers the simulator as the Provider [`PROVIDER_NAME`]: see [`register_simulator_as`].
pub async fn register_simulator(env: &TestEnv, sim: &banlieue_pve_sim::SimHandle) -> anyhow::Result<()> {
    register_simulator_as(&env.client().await?, sim, PROVIDER_NAME).await
}

/// Registers the simulator as the cluster-scoped Provider `name`: the Namespace
/// [`SYSTEM_NAMESPACE`], the credentials Secret `name` in it (usable from every namespace) and the Provider (TLS pinned by
/// fingerprint, defaults for storage, network and pool, the simulator's nodes). Idempotent
/// (server-side apply).
pub async fn register_simulator_as(
    client: &kube::Client,
    sim: &banlieue_pve_sim::SimHandle,
    name: &str,
) -> anyhow::Result<()> {
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let namespace: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}
    }))?;
    Api::<Namespace>::all(client.clone())
        .patch(SYSTEM_NAMESPACE, &apply, &Patch::Apply(&namespace))
        .await?;

    // The local environment's one account: clusters generated by clusterctl in any namespace
    // name it directly (besides the Provider), so it allows every namespace, and goes only to
    // the simulator.
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": name, "namespace": SYSTEM_NAMESPACE,
            "annotations": {
                banlieue_api::ALLOWED_NAMESPACES_ANNOTATION: "*",
                banlieue_api::ALLOWED_ENDPOINTS_ANNOTATION: sim.url(),
            },
        },
        "stringData": {"tokenID": sim.token_id(), "secret": sim.token_secret()}
    }))?;
    Api::<Secret>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .patch(name, &apply, &Patch::Apply(&secret))
        .await
        .context("applying the simulator's credentials Secret")?;

    let provider: banlieue_api::banlieue::Provider = serde_json::from_value(serde_json::json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
        "metadata": {"name": name, "labels": {"banlieue.io/simulated": "true"}},
        "spec": {
            "backend": "proxmox",
            "endpoint": sim.url(),
            "credentialsRef": {"name": name, "namespace": SYSTEM_NAMESPACE},
            "tls": {"sha256Fingerprint": sim.fingerprint_sha256()},
            "defaults": {"storage": "local-lvm", "network": "vmbr0", "resourcePool": "banlieue"},
            "nodes": sim.config().nodes,
        }
    }))
    .context("building the Provider object")?;
    Api::<banlieue_api::banlieue::Provider>::all(client.clone())
        .patch(name, &apply, &Patch::Apply(&provider))
        .await
        .context("applying the simulator's Provider")?;
    Ok(())
}

/// Stops a controller the way a kubelet does: SIGTERM, up to `grace` for it to exit, then
/// SIGKILL. Returns whether it exited by itself within `grace`.
pub fn terminate(process: &mut ManagedProcess, grace: Duration) -> bool {
    if process.check_running().is_err() {
        return true;
    }
    // The process id is the controller's own (setpriv and env exec into it).
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &process.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    let deadline = std::time::Instant::now() + grace;
    let mut exited = false;
    while sent && std::time::Instant::now() < deadline {
        if process.check_running().is_err() {
            exited = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    process.stop();
    exited
}

/// Copies the admin kubeconfig to `to` (creating its folder).
pub fn write_kubeconfig(from: &Path, to: &Path) -> anyhow::Result<()> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::copy(from, to).with_context(|| format!("writing {}", to.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_keeps_the_last_starts_and_drops_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("c.log");
        rotate_log(&log, 2).unwrap(); // first start: nothing to move
        assert!(!dir.path().join("c.log.1").exists());
        for start in 1..=4 {
            std::fs::write(&log, format!("start {start}")).unwrap();
            rotate_log(&log, 2).unwrap();
        }
        assert!(!log.exists());
        let read = |n: usize| std::fs::read_to_string(dir.path().join(format!("c.log.{n}"))).unwrap();
        assert_eq!(read(1), "start 4");
        assert_eq!(read(2), "start 3");
        assert!(!dir.path().join("c.log.3").exists());
    }
}
