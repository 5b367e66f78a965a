//! The README's "Trying Cluster API locally": `banlieue-dev --capi` runs CAPI's three managers
//! (ClusterTopology on, admission webhooks registered) and writes `capi.env`; the README's
//! `try-capi` block, run as written (only `.work/dev/capi.env` and `cargo run -p
//! banlieue-clusterctl --` are replaced: by this environment's file and the binary cargo built),
//! generates and applies a cluster of the default flavor and one of the `clusterclass` flavor.
//! Then: CAPI's webhooks default and validate them, each cluster's first control-plane Machine is
//! provisioned on the simulator (a `proxmox://` provider ID), the workers wait for bootstrap data
//! as the README says, and deleting the clusters removes every ProxmoxMachine.
//!
//! The same again with `--pods --capi`: every manager (CAPI's from its release components) a Pod.
//!
//! Needs CAPI's managers and clusterctl (`tests/controlplane/build.sh`, or `--capi`) and the
//! controller binaries next to `banlieue-dev` (`cargo test --workspace` builds them).

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

const CARGO_RUN: &str = "cargo run -p banlieue-clusterctl --";
const README_ENV_FILE: &str = ".work/dev/capi.env";
/// Generous bounds for a loaded 2-core machine; the README promises "within a minute".
const UP_TIMEOUT: Duration = Duration::from_secs(180);
const PROVISION_TIMEOUT: Duration = Duration::from_secs(240);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `banlieue-dev --capi` as a child process, stopped with SIGINT (Ctrl-C) on drop.
struct Dev {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Dev {
    /// With `pods`, `--pods` too: CAPI's managers and banlieue's as Pods on a real node.
    fn start(dir: &Path, pods: bool) -> Result<Self> {
        let stdout = dir.join("stdout.log");
        let stderr = dir.join("stderr.log");
        let child = Command::new(env!("CARGO_BIN_EXE_banlieue-dev"))
            .args(pods.then_some("--pods"))
            .args([
                "--capi",
                "--quiet",
                "--task-ms",
                "50",
                "--agent-ms",
                "300",
                "--kubeconfig",
            ])
            .arg(dir.join("kubeconfig"))
            .current_dir(root())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout)?)
            .stderr(std::fs::File::create(&stderr)?)
            .spawn()
            .context("starting banlieue-dev")?;
        Ok(Self {
            child,
            stdout,
            stderr,
        })
    }

    fn output(&self) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        format!(
            "--- stdout\n{}\n--- stderr\n{}",
            read(&self.stdout),
            read(&self.stderr)
        )
    }

    async fn wait_up(&mut self) -> Result<()> {
        let deadline = Instant::now() + UP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("banlieue-dev --capi stopped ({status}):\n{}", self.output());
            }
            if std::fs::read_to_string(&self.stdout)?.contains("banlieue local environment is up") {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "banlieue-dev --capi not up after {UP_TIMEOUT:?}:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Ctrl-C; whether it exited successfully within 60 s.
    fn interrupt(&mut self) -> Result<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            ensure!(Instant::now() < deadline, "banlieue-dev did not stop on Ctrl-C");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.interrupt();
            let _ = self.child.kill();
        }
    }
}

async fn client(kubeconfig: &Path) -> Result<kube::Client> {
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

fn api(client: &kube::Client, group: &str, version: &str, kind: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    Api::namespaced_with(client.clone(), "default", &resource)
}

fn label<'a>(object: &'a DynamicObject, key: &str) -> Option<&'a str> {
    object.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// The reason of a Ready condition in `status.conditions`.
fn ready_reason(object: &DynamicObject) -> Option<String> {
    object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["reason"].as_str().map(str::to_owned))
}

/// Polls `check` once a second until it gives `Some`, or fails after `timeout` with `what` and
/// the last state `describe` gives.
async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(Option<T>, String)>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let (found, state) = check().await?;
        if let Some(found) = found {
            return Ok(found);
        }
        ensure!(
            Instant::now() < deadline,
            "{what}: not after {timeout:?}; last state:\n{state}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_capi_block_provisions_each_flavors_first_control_plane_machine() -> Result<()> {
    readme_capi_block(false).await
}

/// The same block against `banlieue-dev --pods --capi`: CAPI's release components and
/// banlieue-proxmox installed by `clusterctl init`, every manager a Pod on a real node under its
/// installed RBAC, CAPI's webhooks served from their Pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_capi_block_works_with_every_manager_in_a_pod() -> Result<()> {
    readme_capi_block(true).await
}

async fn readme_capi_block(pods: bool) -> Result<()> {
    let clusterctl_binary = banlieue_dev::binary_dir()?.join("banlieue-clusterctl");
    ensure!(
        clusterctl_binary.is_file(),
        "{} is missing: `cargo test --workspace` builds it (or `cargo build -p banlieue-clusterctl`)",
        clusterctl_binary.display()
    );
    let dir = tempfile::tempdir()?;
    let mut dev = Dev::start(dir.path(), pods)?;
    dev.wait_up().await?;
    let stderr = std::fs::read_to_string(&dev.stderr)?;
    if pods {
        ensure!(
            stderr.contains("every manager Available") && stderr.contains("banlieue-controller Available"),
            "the managers did not become Available Pods:\n{stderr}"
        );
    } else {
        for manager in [
            "capi-manager",
            "capi-kubeadm-bootstrap-manager",
            "capi-kubeadm-control-plane-manager",
        ] {
            ensure!(
                stderr.contains(&format!("admission webhooks of {manager} (https://127.0.0.1:")),
                "{manager}'s webhooks were not registered:\n{stderr}"
            );
        }
    }
    let env_file = dir.path().join("capi.env");
    let variables = std::fs::read_to_string(&env_file).context("banlieue-dev --capi writes capi.env")?;
    ensure!(
        variables.contains("export PROXMOX_TLS_FINGERPRINT='"),
        "{variables}"
    );

    // The README's block, as written.
    let script = banlieue_testenv::readme::block(&root(), "README.md", "try-capi")?;
    ensure!(
        script.contains(README_ENV_FILE) && script.contains(CARGO_RUN),
        "the block no longer sources {README_ENV_FILE} or runs {CARGO_RUN}:\n{script}"
    );
    let script = script
        .replace(README_ENV_FILE, &env_file.display().to_string())
        .replace(CARGO_RUN, &clusterctl_binary.display().to_string());
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home)?;
    let mut bash = banlieue_testenv::readme::bash(&root(), &script, &home, 300, false)?;
    let output = banlieue_testenv::run_with_timeout(&mut bash, Duration::from_secs(330))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    ensure!(
        output.status.success(),
        "README block try-capi failed ({}):\n--- script\n{script}\n--- stdout\n{stdout}\n--- stderr\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        dev.output()
    );
    for created in [
        "cluster.cluster.x-k8s.io/demo created",
        "clusterclass.cluster.x-k8s.io/banlieue-proxmox created",
        "cluster.cluster.x-k8s.io/demo-cc created",
    ] {
        ensure!(stdout.contains(created), "no {created:?} in:\n{stdout}");
    }

    let client = client(&dir.path().join("kubeconfig")).await?;
    let deployments = api(&client, "cluster.x-k8s.io", "v1beta2", "MachineDeployment");
    let machines = api(&client, "cluster.x-k8s.io", "v1beta2", "Machine");
    let proxmox_machines = api(
        &client,
        "infrastructure.banlieue.io",
        "v1alpha1",
        "ProxmoxMachine",
    );

    // CAPI's defaulting webhook ran: the template leaves the MachineDeployment's labels out.
    let deployment = deployments.get("demo-md-0").await?;
    assert_eq!(
        deployment.data["spec"]["template"]["metadata"]["labels"]["cluster.x-k8s.io/deployment-name"],
        "demo-md-0",
        "CAPI's MachineDeployment defaulting webhook did not run: {:#}",
        deployment.data["spec"]
    );
    // Its validating webhook too (a rule of its Go code, not of the CRD).
    let refused = deployments
        .patch(
            "demo-md-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {"clusterName": "other"}}}})),
        )
        .await;
    let message = format!(
        "{:?}",
        refused
            .err()
            .context("the validating webhook accepted a second cluster name")?
    );
    ensure!(
        message.contains("must be set to the same value"),
        "not CAPI's webhook: {message}"
    );

    // Each flavor's first control-plane Machine gets a VM on the simulator.
    for cluster in ["demo", "demo-cc"] {
        let selector = format!("cluster.x-k8s.io/cluster-name={cluster},cluster.x-k8s.io/control-plane");
        let provider_id = eventually(
            PROVISION_TIMEOUT,
            &format!("{cluster}: a provisioned control-plane Machine"),
            || {
                let machines = machines.clone();
                let selector = selector.clone();
                async move {
                    let list = machines.list(&ListParams::default().labels(&selector)).await?;
                    let found = list
                        .items
                        .iter()
                        .find_map(|m| m.data["spec"]["providerID"].as_str().map(str::to_owned));
                    let state = list
                        .items
                        .iter()
                        .map(|m| format!("{:?}: {:#}", m.metadata.name, m.data["status"]))
                        .collect::<Vec<_>>()
                        .join("\n");
                    Ok((found, state))
                }
            },
        )
        .await?;
        ensure!(provider_id.starts_with("proxmox://"), "{cluster}: {provider_id}");
    }
    // The clusterclass flavor's control plane is the topology controller's.
    let control_planes = api(
        &client,
        "controlplane.cluster.x-k8s.io",
        "v1beta2",
        "KubeadmControlPlane",
    );
    let list = control_planes
        .list(&ListParams::default().labels("cluster.x-k8s.io/cluster-name=demo-cc"))
        .await?;
    ensure!(
        list.items
            .iter()
            .any(|kcp| label(kcp, "topology.cluster.x-k8s.io/owned").is_some()),
        "demo-cc has no KubeadmControlPlane made from the ClusterClass: {:?}",
        list.items.iter().map(|k| &k.metadata).collect::<Vec<_>>()
    );

    // The workers wait for a control plane that a simulator never initializes, as documented.
    eventually(PROVISION_TIMEOUT, "workers waiting for bootstrap data", || {
        let proxmox_machines = proxmox_machines.clone();
        async move {
            let list = proxmox_machines.list(&ListParams::default()).await?;
            let workers: Vec<&DynamicObject> = list
                .items
                .iter()
                .filter(|m| label(m, "cluster.x-k8s.io/deployment-name").is_some())
                .collect();
            let reasons: Vec<Option<String>> = workers.iter().map(|m| ready_reason(m)).collect();
            let waiting = workers.len() == 2
                && reasons
                    .iter()
                    .all(|r| r.as_deref() == Some("WaitingForBootstrapData"));
            Ok((waiting.then_some(()), format!("{reasons:?}")))
        }
    })
    .await?;

    // Deleting the clusters removes every machine and VM object.
    let clusters = api(&client, "cluster.x-k8s.io", "v1beta2", "Cluster");
    for cluster in ["demo", "demo-cc"] {
        clusters.delete(cluster, &DeleteParams::default()).await?;
    }
    eventually(PROVISION_TIMEOUT, "every ProxmoxMachine gone", || {
        let proxmox_machines = proxmox_machines.clone();
        async move {
            let list = proxmox_machines.list(&ListParams::default()).await?;
            let names: Vec<Option<String>> = list.items.iter().map(|m| m.metadata.name.clone()).collect();
            Ok((names.is_empty().then_some(()), format!("{names:?}")))
        }
    })
    .await?;

    let status = dev.interrupt()?;
    ensure!(
        status.success(),
        "banlieue-dev --capi after Ctrl-C: {status}\n{}",
        dev.output()
    );
    if !pods {
        let mut log = String::new();
        std::fs::File::open(dir.path().join("logs/capi-manager.log"))?.read_to_string(&mut log)?;
        ensure!(log.contains("Serving webhook server"), "capi-manager.log:\n{log}");
    }
    Ok(())
}
