//! The conformance run: Cluster API v1.14.2's own controllers drive `banlieue-proxmox` on the
//! Proxmox VE simulator (and `banlieue-vsphere` on vcsim), and every step asserts what CAPI
//! itself reports. What differs per hypervisor is in `capi/hypervisor.rs`.
//!
//! One environment for the whole run: a harness control plane (etcd + kube-apiserver +
//! kube-controller-manager) with CAPI's and banlieue's CRDs; CAPI's core, kubeadm bootstrap and
//! kubeadm control-plane managers and the `banlieue-proxmox` binary as processes; `pve-sim` in
//! process. The workload cluster comes from the real `clusterctl generate cluster` output of
//! banlieue's local clusterctl repository (1 control plane, 2 workers).
//!
//! No kubelet can boot here, so the test emulates the guest (test code only, never in the
//! provider): a second harness kube-apiserver stands in for the workload cluster's API server at
//! the control-plane endpoint, and when a simulated VM boots with kubeadm cloud-init the emulator
//! does what `kubeadm init`/`join` + kubelet would visibly do to that API: the `kubeadm-config`
//! ConfigMap (init) and a Node whose `spec.providerID` is `proxmox://<meta-data instance-id>`
//! (the kubelet flag of the cluster template) or, on vSphere, `vsphere://<BIOS uuid>` (what
//! vSphere's cloud provider sets); on vcsim it also plays VMware Tools (the guest's IP).
//!
//! Writes `target/conformance/capi.md` (and `capi-pods.md`, `capi-vsphere.md`). Run: `cargo
//! build -p banlieue-proxmox -p banlieue-vsphere -p banlieue-controllers && cargo test -p
//! banlieue-conformance --test capi` (needs `tests/controlplane/build.sh`).

#[path = "capi/guests.rs"]
mod guests;
#[path = "capi/hypervisor.rs"]
mod hypervisor;
#[path = "../../../providers/vsphere/client/tests/support/vcsim.rs"]
mod vcsim_support;
#[path = "capi/workload.rs"]
mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use banlieue_clusterctl::repository::CAPI_VERSION;
use banlieue_conformance::report::{Outcome, Report, report_dir};
use banlieue_pve_sim::SimConfig;
use banlieue_testenv::{ManagedProcess, TestEnv, bin_dir, cert_manager_stub_crds};
use hypervisor::{Guest, Hypervisor};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

const CLUSTER: &str = "conf";
const KUBERNETES_VERSION: &str = "v1.33.1";
const STEP_TIMEOUT: Duration = Duration::from_secs(120);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn resource(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

fn capi(kind: &str) -> ApiResource {
    resource("cluster.x-k8s.io", "v1beta2", kind)
}

fn infra(kind: &str) -> ApiResource {
    resource("infrastructure.banlieue.io", "v1alpha1", kind)
}

/// Folder of `banlieue-proxmox` and `banlieue` (the controller): `$BANLIEUE_BIN_DIR`, else this
/// test's `target/<profile>/`. Both must be built (`cargo test --workspace` builds them).
fn controller_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os("BANLIEUE_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => banlieue_dev::binary_dir()?,
    };
    for name in [banlieue_dev::PROXMOX_PROVIDER, banlieue_dev::BANLIEUE] {
        ensure!(
            dir.join(name).is_file(),
            "{} is missing: `cargo build -p banlieue-proxmox -p banlieue-controllers` first",
            dir.join(name).display()
        );
    }
    Ok(dir)
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn condition_status(obj: &Value, type_: &str) -> Option<String> {
    condition(obj, type_).and_then(|c| c["status"].as_str().map(str::to_owned))
}

fn to_value(obj: &DynamicObject) -> Value {
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

/// Paths of `null` values in a provider object: CAPI reads provider objects as unstructured JSON
/// and treats a `null` where it expects a value as a reconcile error.
fn null_paths(value: &Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Null => out.push(path.to_owned()),
        Value::Object(map) => {
            for (k, v) in map {
                null_paths(v, &format!("{path}.{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                null_paths(v, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// How the run's managers run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// As processes beside the control plane, with admin credentials (quick, no node needed).
    Processes,
    /// As Pods on a real node, from the Deployments `clusterctl init` installed (CAPI's release
    /// components and banlieue's), each under its ServiceAccount and installed RBAC only.
    Pods,
}

/// The managers of a management cluster; checked while waiting so a crashed one fails fast.
enum Managers {
    /// Processes, and the provider's controllers when they run in the test process.
    Processes(Vec<ManagedProcess>, InProcess),
    Pods {
        node: Box<banlieue_testenv::nodes::Node>,
        admin: Box<banlieue_testenv::KubeconfigFile>,
        client: kube::Client,
        /// Namespace and Deployment of every manager.
        deployments: Vec<(&'static str, &'static str)>,
    },
}

/// One container of a manager's Pod, as its status reports it.
struct ManagerContainer {
    namespace: &'static str,
    deployment: &'static str,
    pod: String,
    status: k8s_openapi::api::core::v1::ContainerStatus,
}

/// Every container of the Pods in the namespaces of `deployments` (namespace, Deployment) on
/// `cluster`.
async fn manager_containers(
    cluster: &kube::Client,
    deployments: &[(&'static str, &'static str)],
) -> Result<Vec<ManagerContainer>> {
    let mut containers = Vec::new();
    for &(namespace, deployment) in deployments {
        for pod in Api::<Pod>::namespaced(cluster.clone(), namespace)
            .list(&Default::default())
            .await?
        {
            let name = pod.metadata.name.unwrap_or_default();
            for status in pod.status.and_then(|s| s.container_statuses).unwrap_or_default() {
                containers.push(ManagerContainer {
                    namespace,
                    deployment,
                    pod: name.clone(),
                    status,
                });
            }
        }
    }
    Ok(containers)
}

/// Controllers running in the test process (aborted on drop), and their log.
struct InProcess(Vec<tokio::task::JoinHandle<()>>, PathBuf);

impl Drop for InProcess {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

impl Managers {
    /// Starts the managers of management cluster `env`, on which `clusterctl init` ran: CAPI's
    /// three and the banlieue provider of `hv`.
    async fn start(
        mode: Mode,
        hv: &Hypervisor,
        env: &TestEnv,
        node_name: &str,
        controller_dir: &Path,
    ) -> Result<Self> {
        match mode {
            Mode::Processes => {
                let mut processes = Vec::new();
                for manager in
                    banlieue_dev::capi::start_all(env, &env.workdir().join("logs"), true, |_| {}).await?
                {
                    processes.push(manager.process);
                }
                let log = env
                    .workdir()
                    .join("logs")
                    .join(format!("{}.log", hv.infra().name()));
                if let Some(task) = hv.serve_in_process(&env.client().await?, &log) {
                    return Ok(Self::Processes(processes, InProcess(vec![task], log)));
                }
                // Every provider takes banlieue-provider-runtime's flags, as the Proxmox one does.
                processes.push(banlieue_dev::start_controller(
                    controller_dir,
                    &hv.infra().name(),
                    banlieue_dev::controller_args(banlieue_dev::PROXMOX_PROVIDER),
                    env.admin().path(),
                    &env.workdir().join("logs"),
                )?);
                Ok(Self::Processes(processes, InProcess(Vec::new(), log)))
            }
            Mode::Pods => {
                ensure!(
                    hv.infra() == banlieue_clusterctl::Infra::Proxmox,
                    "the run with Pods is Proxmox's"
                );
                let proxmox = banlieue_dev::pods::PROXMOX_COMPONENTS;
                let node = banlieue_dev::capi_pods::run_installed(
                    env,
                    node_name,
                    &[proxmox],
                    controller_dir,
                    |step| eprintln!("[{node_name}] {step}"),
                )
                .await?;
                let deployments = banlieue_dev::capi_pods::manager_deployments(&[proxmox]);
                Ok(Self::Pods {
                    node: Box::new(node),
                    admin: Box::new(env.admin().clone()),
                    client: env.client().await?,
                    deployments,
                })
            }
        }
    }

    /// Adds the banlieue controller (standalone VirtualMachines) on `env`.
    async fn add_banlieue_controller(&mut self, env: &TestEnv, controller_dir: &Path) -> Result<()> {
        match self {
            Self::Processes(processes, _) => processes.push(banlieue_dev::start_controller(
                controller_dir,
                banlieue_dev::BANLIEUE,
                banlieue_dev::controller_args(banlieue_dev::BANLIEUE),
                env.admin().path(),
                &env.workdir().join("logs"),
            )?),
            Self::Pods {
                node, deployments, ..
            } => {
                let controller = banlieue_dev::pods::CONTROLLER_COMPONENTS;
                banlieue_dev::pods::install_components(
                    env,
                    node,
                    &[controller],
                    &BTreeMap::new(),
                    controller_dir,
                    |step| eprintln!("[{}] {step}", node.name()),
                )
                .await?;
                deployments.push((controller.namespace, controller.deployment));
            }
        }
        Ok(())
    }

    /// Fails when a manager stopped (a process exited, a container restarted or terminated).
    async fn check(&mut self) -> Result<()> {
        match self {
            Self::Processes(processes, in_process) => {
                ensure!(
                    !in_process.0.iter().any(tokio::task::JoinHandle::is_finished),
                    "a controller running in the test process stopped"
                );
                for p in processes {
                    p.check_running().with_context(|| {
                        format!(
                            "{} stopped; last lines of its log:\n{}",
                            p.log().display(),
                            p.log_tail(30)
                        )
                    })?;
                }
            }
            Self::Pods {
                admin,
                client,
                deployments,
                ..
            } => {
                for c in manager_containers(client, deployments).await? {
                    let terminated = c.status.state.as_ref().and_then(|s| s.terminated.as_ref());
                    if c.status.restart_count > 0 || terminated.is_some() {
                        let output = admin
                            .kubectl()
                            .args(["logs", "-n", c.namespace, &c.pod, "--previous", "--tail=30"])
                            .output()?;
                        bail!(
                            "{}/{}: Pod {} restarted {} times ({:?}); its previous log:\n{}",
                            c.namespace,
                            c.deployment,
                            c.pod,
                            c.status.restart_count,
                            c.status.last_state,
                            String::from_utf8_lossy(&output.stdout)
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// With Pods, the resident memory of the node running them.
    fn node_memory(&self) -> Option<Result<u64>> {
        match self {
            Self::Processes(..) => None,
            Self::Pods { node, .. } => Some(node.resident_memory_bytes().map_err(Into::into)),
        }
    }

    /// The last lines of every manager's log.
    fn tails(&self) -> String {
        match self {
            Self::Processes(processes, in_process) => {
                let mut tails: Vec<String> = processes
                    .iter()
                    .map(|p| format!("--- {} ---\n{}", p.log().display(), p.log_tail(15)))
                    .collect();
                if !in_process.0.is_empty() {
                    let text = std::fs::read_to_string(&in_process.1).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    tails.push(format!(
                        "--- {} (in this process) ---\n{}",
                        in_process.1.display(),
                        lines[lines.len().saturating_sub(15)..].join("\n")
                    ));
                }
                tails.join("\n")
            }
            Self::Pods {
                admin, deployments, ..
            } => deployments
                .iter()
                .map(|(namespace, deployment)| {
                    let logs = admin
                        .kubectl()
                        .args([
                            "logs",
                            "-n",
                            namespace,
                            &format!("deployment/{deployment}"),
                            "--tail=15",
                        ])
                        .output()
                        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                        .unwrap_or_else(|e| e.to_string());
                    format!("--- {namespace}/{deployment} ---\n{logs}")
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// Polls `probe` every 500 ms until it returns `Some`, the processes die, or `timeout` passes;
/// the error carries the last `Err`/state the probe described.
async fn poll<T>(
    procs: &mut Managers,
    what: &str,
    timeout: Duration,
    mut probe: impl AsyncFnMut() -> Result<Result<T, String>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        procs.check().await?;
        let last = match probe().await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(state)) => state,
            Err(e) => format!("error: {e:#}"),
        };
        if Instant::now() > deadline {
            bail!(
                "timed out after {}s waiting for {what}; last state: {last}",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

struct Run {
    client: kube::Client,
    ns: String,
    hv: Arc<Hypervisor>,
    report: Report,
}

impl Run {
    fn api(&self, ar: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.ns, ar)
    }

    async fn list(&self, ar: &ApiResource) -> Result<Vec<Value>> {
        Ok(self
            .api(ar)
            .list(&Default::default())
            .await?
            .items
            .iter()
            .map(to_value)
            .collect())
    }

    async fn get(&self, ar: &ApiResource, name: &str) -> Result<Option<Value>> {
        Ok(self.api(ar).get_opt(name).await?.as_ref().map(to_value))
    }

    /// The provider's kind `suffix` (`Machine` → `ProxmoxMachine`).
    fn infra(&self, suffix: &str) -> ApiResource {
        infra(&self.hv.kind(suffix))
    }

    /// The hypervisor's VMs (templates excluded), by id.
    async fn vms(&self) -> Result<BTreeMap<String, Guest>> {
        Ok(self
            .hv
            .guests()
            .await?
            .into_iter()
            .map(|g| (g.id.clone(), g))
            .collect())
    }

    /// The VM an infra machine's status names, with what its guest reads.
    async fn vm_of(&self, infra_machine: &Value) -> Result<Guest> {
        let name = infra_machine["metadata"]["name"].as_str().unwrap_or_default();
        let id = self
            .hv
            .vm_id(infra_machine)
            .with_context(|| format!("{name}: no VM in its status"))?;
        self.vms()
            .await?
            .remove(&id)
            .with_context(|| format!("{name}: VM {id} not on the hypervisor"))
    }

    fn record(&mut self, section: &str, check: &str, started: Instant, result: &Result<String>) {
        let outcome = match result {
            Ok(detail) => Outcome::pass(detail.clone()),
            Err(e) => Outcome::fail(format!("{e:#}")),
        };
        self.report
            .record(section, check, outcome, Some(started.elapsed()));
    }
}

/// Machines of the cluster with their infra machines, checked for what CAPI copies: provisioned,
/// providerID, addresses, failure domain. `Err(state)` until every one of `expected` matches.
async fn machines_provisioned(
    run: &Run,
    selector: &str,
    expected: usize,
) -> Result<Result<Vec<(Value, Value)>, String>> {
    let machines: Vec<Value> = run
        .api(&capi("Machine"))
        .list(&kube::api::ListParams::default().labels(selector))
        .await?
        .items
        .iter()
        .map(to_value)
        .collect();
    if machines.len() != expected {
        return Ok(Err(format!("{} machines, want {expected}", machines.len())));
    }
    let mut pairs = Vec::new();
    for m in machines {
        let name = m["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        if m["metadata"]["deletionTimestamp"].is_string() {
            return Ok(Err(format!("{name} is being deleted")));
        }
        let infra_name = m["spec"]["infrastructureRef"]["name"]
            .as_str()
            .unwrap_or_default();
        let Some(pm) = run.get(&run.infra("Machine"), infra_name).await? else {
            return Ok(Err(format!("{name}: no infra machine {infra_name} yet")));
        };
        if m["status"]["initialization"]["infrastructureProvisioned"] != true {
            return Ok(Err(format!(
                "{name}: infrastructure not provisioned (infra machine state {})",
                pm["status"]["provisioning"]["state"]
            )));
        }
        let checks = [
            (
                "spec.providerID",
                &m["spec"]["providerID"],
                &pm["spec"]["providerID"],
            ),
            (
                "status.addresses",
                &m["status"]["addresses"],
                &pm["status"]["addresses"],
            ),
            (
                "status.failureDomain",
                &m["status"]["failureDomain"],
                &pm["status"]["failureDomain"],
            ),
        ];
        let prefix = run.hv.provider_id_prefix();
        if !pm["spec"]["providerID"]
            .as_str()
            .is_some_and(|id| id.starts_with(prefix) && id.len() > prefix.len())
        {
            return Ok(Err(format!(
                "{name}: providerID {} is not {prefix}…",
                pm["spec"]["providerID"]
            )));
        }
        for (field, on_machine, on_infra) in checks {
            // Without failure domains a machine has none.
            let may_be_unset = field == "status.failureDomain" && !run.hv.publishes_failure_domains();
            if (on_infra.is_null() && !may_be_unset) || on_machine != on_infra {
                return Ok(Err(format!(
                    "{name}: {field} on the Machine {on_machine} != infra machine {on_infra}"
                )));
            }
        }
        pairs.push((m, pm));
    }
    Ok(Ok(pairs))
}

/// The bootstrap Secret `value` of each Machine equals, byte for byte, the `user-data` the
/// simulated VM booted with.
async fn bootstrap_bytes_match(run: &Run, pairs: &[(Value, Value)]) -> Result<String> {
    let secrets: Api<Secret> = Api::namespaced(run.client.clone(), &run.ns);
    let mut total = 0;
    for (m, pm) in pairs {
        let name = m["metadata"]["name"].as_str().unwrap_or_default();
        let secret_name = m["spec"]["bootstrap"]["dataSecretName"]
            .as_str()
            .with_context(|| format!("{name}: no dataSecretName"))?;
        let secret = secrets.get(secret_name).await?;
        ensure!(
            secret
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "KubeadmConfig"),
            "{secret_name} was not written by the kubeadm bootstrap provider"
        );
        let value = secret
            .data
            .as_ref()
            .and_then(|d| d.get("value"))
            .with_context(|| format!("{secret_name}: no value"))?;
        let vm = run.vm_of(pm).await?;
        let vmid = &vm.id;
        let user_data = vm
            .user_data
            .with_context(|| format!("VM {vmid} booted without user data"))?;
        ensure!(
            user_data.as_bytes() == value.0.as_slice(),
            "{name}: VM {vmid} user-data ({} bytes) differs from {secret_name} value ({} bytes)",
            user_data.len(),
            value.0.len()
        );
        ensure!(
            user_data.contains("kubeadm"),
            "{name}: the bootstrap data is not kubeadm's"
        );
        total += value.0.len();
    }
    Ok(format!("{} machines, {total} bytes compared", pairs.len()))
}

/// The control-plane VM's `kubeadm init` cloud-config writes `/etc/kubernetes/pki/ca.crt` =
/// `ca_pem` (the CA of the emulated workload API server), and the `<cluster>-kubeconfig` Secret
/// was generated by KCP (not by the test) for that CA.
async fn cluster_ca_in_bootstrap_data(run: &Run, pairs: &[(Value, Value)], ca_pem: &str) -> Result<String> {
    let (_, pm) = pairs.first().context("no control-plane machine")?;
    let vm = run.vm_of(pm).await?;
    let vmid = &vm.id;
    let user_data = vm.user_data.context("control-plane VM without user-data")?;
    let config: Value = serde_yaml::from_str(&user_data).context("kubeadm cloud-config is not YAML")?;
    let written = config["write_files"]
        .as_array()
        .context("no write_files")?
        .iter()
        .find(|f| f["path"] == "/etc/kubernetes/pki/ca.crt")
        .and_then(|f| f["content"].as_str())
        .context("no /etc/kubernetes/pki/ca.crt in the bootstrap data")?;
    ensure!(
        written.trim() == ca_pem.trim(),
        "the bootstrap data's ca.crt is not the workload API server's CA"
    );
    let secrets: Api<Secret> = Api::namespaced(run.client.clone(), &run.ns);
    let kubeconfig = secrets
        .get(&format!("{CLUSTER}-kubeconfig"))
        .await
        .context("no <cluster>-kubeconfig Secret")?;
    let owners: Vec<String> = kubeconfig
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|o| o.kind.clone())
        .collect();
    ensure!(
        owners.iter().any(|k| k == "KubeadmControlPlane"),
        "<cluster>-kubeconfig not generated by KCP (owners {owners:?})"
    );
    Ok(format!(
        "ca.crt in VM {vmid}'s cloud-config = the workload CA; {CLUSTER}-kubeconfig owned by {owners:?}"
    ))
}

/// The guest emulator: registers what kubeadm + kubelet would in the workload API server, and
/// reports the guest's address where the hypervisor does not (vcsim has no VMware Tools).
async fn emulate_guests(hv: Arc<Hypervisor>, workload: kube::Client, log: PathBuf) {
    let nodes: Api<Node> = Api::all(workload.clone());
    let config_maps: Api<ConfigMap> = Api::namespaced(workload, "kube-system");
    let mut registered = BTreeSet::new();
    let mut addresses = 0u8;
    let mut initialized = false;
    let note = |line: String| {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&log) {
            let _ = writeln!(f, "{line}");
        }
    };
    loop {
        let guests = match hv.guests().await {
            Ok(guests) => guests,
            Err(e) => {
                note(format!("listing the VMs: {e:#}"));
                Vec::new()
            }
        };
        for vm in guests.into_iter().filter(|v| v.running) {
            if !vm.has_address {
                addresses = addresses.wrapping_add(1).max(10);
                match hv.report_address(&vm, addresses).await {
                    Ok(()) => note(format!("VM {}: guest address reported", vm.id)),
                    Err(e) => note(format!("VM {}: reporting its address: {e:#}", vm.id)),
                }
            }
            let (Some(user), Some(host), Some(provider_id)) = (
                vm.user_data.as_deref(),
                vm.hostname.as_deref(),
                vm.node_provider_id.as_deref(),
            ) else {
                continue;
            };
            if !user.contains("kubeadm") || registered.contains(provider_id) {
                continue;
            }
            if user.contains("kubeadm init") && !initialized {
                let cm: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
                    "data": {"ClusterConfiguration": format!(
                        "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: {KUBERNETES_VERSION}\n")},
                }))
                .expect("static ConfigMap");
                match config_maps.create(&PostParams::default(), &cm).await {
                    Ok(_) => note(format!(
                        "kubeadm init on VM {} ({host}): kubeadm-config created",
                        vm.id
                    )),
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => {
                        note(format!("creating kubeadm-config: {e}"));
                        continue;
                    }
                }
                initialized = true;
            }
            let node: Node = serde_json::from_value(json!({
                "metadata": {"name": host},
                "spec": {"providerID": provider_id},
            }))
            .expect("static Node");
            let created = match nodes.create(&PostParams::default(), &node).await {
                Ok(_) => true,
                Err(kube::Error::Api(e)) if e.code == 409 => true,
                Err(e) => {
                    note(format!("registering Node {host}: {e}"));
                    false
                }
            };
            if created {
                let ready = json!({"status": {"conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "emulated by the conformance test"}]}});
                let _ = nodes
                    .patch_status(host, &PatchParams::default(), &Patch::Merge(&ready))
                    .await;
                note(format!(
                    "kubelet on VM {} registered Node {host} {provider_id}",
                    vm.id
                ));
                registered.insert(provider_id.to_owned());
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Writes banlieue's local clusterctl repository for this management cluster: CAPI v1.14.2's
/// core, kubeadm bootstrap and control-plane providers (with [`Mode::Processes`] their CRDs from
/// `tests/controlplane/bin/capi-crds`, no Deployments: the managers run as processes; with
/// [`Mode::Pods`] CAPI's release components from `tests/controlplane/bin/capi-components`) and
/// the banlieue provider `infra` from this tree. Returns the `clusterctl.yaml` pointing at it.
fn write_repository(repo: &Path, infra: banlieue_clusterctl::Infra, mode: Mode) -> Result<PathBuf> {
    let mut entries = match mode {
        Mode::Processes => {
            banlieue_clusterctl::repository::write_capi(repo, &bin_dir().join("capi-crds"), CAPI_VERSION)?
        }
        Mode::Pods => banlieue_clusterctl::repository::write_capi_release(
            repo,
            &banlieue_dev::capi_pods::components_dir(),
            CAPI_VERSION,
        )?,
    };
    let templates = banlieue_clusterctl::repository::templates_dir(&workspace().join("templates"), infra);
    entries.push(banlieue_clusterctl::repository::write_infra(
        repo, infra, &templates,
    )?);
    Ok(banlieue_clusterctl::repository::write_config(repo, &entries)?)
}

/// clusterctl with a private HOME and no version check.
fn clusterctl(env: &TestEnv) -> Result<std::process::Command> {
    let home = env.workdir().join("clusterctl/home");
    std::fs::create_dir_all(&home)?;
    let mut cmd = std::process::Command::new(bin_dir().join("clusterctl"));
    cmd.env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true");
    Ok(cmd)
}

fn run_clusterctl(cmd: &mut std::process::Command, what: &str) -> Result<String> {
    let output = banlieue_testenv::run_with_timeout(cmd, Duration::from_secs(300))
        .with_context(|| format!("running {what}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        output.status.success(),
        "{what} failed ({}):\n{text}",
        output.status
    );
    Ok(text)
}

/// Makes `env` a management cluster the way a user does: the real `clusterctl init` with CAPI's
/// core, kubeadm bootstrap and kubeadm control-plane providers and the banlieue provider of `hv`
/// from the local repository (cert-manager is skipped: the env has its stub CRDs). Waits until
/// the installed CRDs are served. Returns the `clusterctl.yaml` of the repository.
async fn clusterctl_init(env: &TestEnv, hv: &Hypervisor, mode: Mode) -> Result<PathBuf> {
    clusterctl_init_into(
        env,
        &ClusterctlTarget {
            kubeconfig: env.admin().path(),
            client: env.client().await?,
            repository: env.workdir().join("clusterctl/repository"),
        },
        hv,
        mode,
    )
    .await
}

/// A cluster `clusterctl init` installs into, and the local repository it installs from.
struct ClusterctlTarget<'a> {
    kubeconfig: &'a Path,
    client: kube::Client,
    /// The folder of the repository (written here for `mode`).
    repository: PathBuf,
}

/// `clusterctl init` (clusterctl of `env`'s work folder) of CAPI's three providers and `hv`'s
/// into `target`, from a repository of `mode`'s components; waits until their kinds are served
/// and returns the repository's configuration file.
async fn clusterctl_init_into(
    env: &TestEnv,
    target: &ClusterctlTarget<'_>,
    hv: &Hypervisor,
    mode: Mode,
) -> Result<PathBuf> {
    let config = write_repository(&target.repository, hv.infra(), mode)?;
    let output = run_clusterctl(
        clusterctl(env)?
            .arg("init")
            .arg(format!("--config={}", config.display()))
            .arg(format!("--kubeconfig={}", target.kubeconfig.display()))
            .args([
                &format!("--core=cluster-api:{CAPI_VERSION}"),
                &format!("--bootstrap=kubeadm:{CAPI_VERSION}"),
                &format!("--control-plane=kubeadm:{CAPI_VERSION}"),
                &format!(
                    "--infrastructure={}:{}",
                    hv.infra().name(),
                    banlieue_clusterctl::VERSION
                ),
            ])
            .envs(hv.init_variables())
            // CAPI's release components take their feature gates from clusterctl variables; the
            // processes get ClusterTopology from banlieue_dev::capi.
            .env("CLUSTER_TOPOLOGY", "true"),
        "clusterctl init",
    )?;
    ensure!(
        output.contains("Skipping installing cert-manager"),
        "clusterctl init did not skip cert-manager:\n{output}"
    );
    let client = target.client.clone();
    let kinds = [
        capi("Cluster"),
        capi("Machine"),
        resource("controlplane.cluster.x-k8s.io", "v1beta2", "KubeadmControlPlane"),
        resource("bootstrap.cluster.x-k8s.io", "v1beta2", "KubeadmConfig"),
        infra(&hv.kind("Machine")),
        infra(&hv.kind("Cluster")),
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    for ar in &kinds {
        loop {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
            match api.list(&kube::api::ListParams::default().limit(1)).await {
                Ok(_) => break,
                Err(e) if Instant::now() > deadline => {
                    bail!("{} not served after clusterctl init: {e}", ar.kind)
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
    }
    Ok(config)
}

/// `clusterctl generate cluster` from banlieue's local repository (written by
/// `banlieue-clusterctl`), with the simulator and the emulated workload endpoint as variables.
fn generate_cluster(
    env: &TestEnv,
    config: &Path,
    ns: &str,
    hv: &Hypervisor,
    endpoint: (&str, u16),
    kubernetes_version: &str,
    workers: u32,
) -> Result<String> {
    let output = clusterctl(env)?
        .args(["generate", "cluster", CLUSTER, "--infrastructure"])
        .arg(format!("{}:{}", hv.infra().name(), banlieue_clusterctl::VERSION))
        .arg(format!("--config={}", config.display()))
        .arg(format!("--kubeconfig={}", env.admin().path().display()))
        .args([
            "--target-namespace",
            ns,
            "--kubernetes-version",
            kubernetes_version,
        ])
        .args(["--control-plane-machine-count", "1", "--worker-machine-count"])
        .arg(workers.to_string())
        .envs(hv.template_variables(ns))
        .env("CONTROL_PLANE_ENDPOINT_IP", endpoint.0)
        .env("CONTROL_PLANE_ENDPOINT_PORT", endpoint.1.to_string())
        .output()
        .context("running clusterctl")?;
    ensure!(
        output.status.success(),
        "clusterctl generate cluster failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// Creates every object of `docs` (e.g. `clusterctl generate cluster`'s output) in namespace
/// `ns`, in order, as `kubectl create` would.
async fn create_documents(client: &kube::Client, ns: &str, docs: &[Value]) -> Result<()> {
    for doc in docs {
        let api_version = doc["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let ar = resource(group, version, doc["kind"].as_str().unwrap_or_default());
        let obj: DynamicObject = serde_json::from_value(doc.clone())?;
        Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar)
            .create(&PostParams::default(), &obj)
            .await
            .with_context(|| {
                format!(
                    "creating {} {}",
                    ar.kind,
                    obj.metadata.name.as_deref().unwrap_or("")
                )
            })?;
    }
    Ok(())
}

fn parse_docs(text: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in text.lines().chain(std::iter::once("---")) {
        if line.trim_end() == "---" {
            let value: Value = serde_yaml::from_str(&current).context("parsing clusterctl output")?;
            if !value.is_null() {
                docs.push(value);
            }
            current.clear();
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    Ok(docs)
}

/// The Kubernetes version of the lab guest image (kubelet, kubeadm and the control plane images
/// of `tests/guest`, built from the harness's pinned module).
const GUEST_KUBERNETES_VERSION: &str = "v1.33.13";
/// How long a workload cluster of real guests gets for each step (two nice'd guests boot, pull
/// nothing, run `kubeadm init`/`join`: about a minute each here).
const GUEST_STEP_TIMEOUT: Duration = Duration::from_secs(480);

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The workload-cluster tests run one at a time (each boots real guests on two cores).
static ONE_WORKLOAD_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `scenarios` (`capi/workload.rs`) one after the other, writes their report to
/// `target/conformance/<file>` and fails when a spec failed.
async fn workload_report(
    title: &str,
    scenarios: &[&workload::Scenario],
    file: &str,
    notes: &[&str],
) -> Result<()> {
    let _turn = ONE_WORKLOAD_AT_A_TIME.lock().await;
    let mut report = Report::new(title);
    let mut failures = Vec::new();
    for scenario in scenarios {
        if let Err(e) = workload::run(scenario, &mut report).await {
            failures.push(format!("{e:#}"));
        }
    }
    for note in notes {
        report.note(*note);
    }
    let path = report.write(&report_dir().join(file))?;
    eprintln!("{}\nreport: {}", report.to_markdown(), path.display());
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// CAPI's quick-start spec (`e2e/quick_start.go`) with guests that boot, on the default flavor:
/// every VM the Proxmox simulator runs is a lab guest (`capi/guests.rs`) whose real cloud-init
/// reads the provider's seed ISO and runs CAPI's bootstrap data: `kubeadm init` on the control
/// plane VM (kube-vip's stand-in holds the endpoint address on `net0`, the name the seed gives the
/// NIC, as the template's manifest says), `kubeadm join` on the worker. Asserts what the spec
/// asserts, from the workload cluster itself (`clusterctl get kubeconfig`): one Node per Machine,
/// named and identified (`spec.providerID`) as CAPI expects; one VM and one guest per Machine;
/// cloud-init without an error; a working cluster (flannel from a ClusterResourceSet, every Node
/// Ready, CoreDNS available, a Pod on the worker). Then CAPI's MachineRemediation spec for the
/// worker, its MachineDeployment rollout and scale specs, and deletion: no VM and no guest left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_start_boots_real_kubeadm_nodes_on_the_proxmox_simulator() -> Result<()> {
    workload_report(
        "Workload cluster of real kubeadm nodes: default flavor on the Proxmox simulator",
        &[&workload::DEFAULT_FLAVOR],
        "workload-default.md",
        &[],
    )
    .await
}

/// CAPI's quick-start with ClusterClass (the `clusterclass` flavor: a Cluster with
/// `spec.topology`) and its clusterclass-changes spec, with real kubeadm nodes behind the lab's
/// haproxy (the class runs no kube-vip): the class's worker template rotated, the topology rolls
/// the workers. Then deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_start_with_clusterclass_and_its_changes_behind_haproxy() -> Result<()> {
    workload_report(
        "Workload cluster of real kubeadm nodes: ClusterClass on the Proxmox simulator",
        &[&workload::CLUSTERCLASS],
        "workload-clusterclass.md",
        &[],
    )
    .await
}

/// CAPI's quick-start, worker remediation and md-rollout specs with real kubeadm nodes on vcsim
/// (banlieue-vsphere's default flavor): every VM vcsim powers on boots as a lab guest whose real
/// cloud-init reads the VM's guestinfo through its VMware datasource; VMware Tools' address is the
/// guest's own; a cloud provider stand-in sets `vsphere://<BIOS uuid>` on each Node as vSphere's
/// CPI does (its module is not served). Then deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_start_boots_real_kubeadm_nodes_on_vcsim() -> Result<()> {
    workload_report(
        "Workload cluster of real kubeadm nodes: default flavor on vcsim",
        &[&workload::VSPHERE_DEFAULT],
        "workload-vsphere.md",
        &[],
    )
    .await
}

/// CAPI's quick-start, worker remediation and md-rollout specs with real kubeadm nodes on
/// libvirt's test driver (banlieue-libvirt's default flavor, its controllers in this process):
/// every domain the driver runs boots as a lab guest whose real cloud-init reads the NoCloud ISO
/// the provider uploaded; the guest's DHCP lease is what the driver reports as the domain's
/// address (the driver has no DHCP server). Then deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_start_boots_real_kubeadm_nodes_on_libvirt() -> Result<()> {
    workload_report(
        "Workload cluster of real kubeadm nodes: default flavor on libvirt's test driver",
        &[&workload::LIBVIRT_DEFAULT],
        "workload-libvirt.md",
        &[],
    )
    .await
}

/// An HA control plane of real kubeadm nodes behind the lab's haproxy (the `external-lb`
/// flavor): KubeadmControlPlane scaled 1 → 3 (three etcd members), then CAPI's KCP remediation
/// spec (a control plane Machine of three marked unhealthy is replaced), its node-drain spec
/// (the worker deleted while a PodDisruptionBudget blocks its drain), then deletion. Part of
/// the matrix; alone: `cargo test -p banlieue-conformance --test capi control_plane -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "in the full matrix (tests/workload-matrix.sh)"]
async fn control_plane_scale_and_remediation_behind_haproxy() -> Result<()> {
    workload_report(
        "Workload cluster of real kubeadm nodes: HA control plane behind haproxy on the Proxmox simulator",
        &[&workload::EXTERNAL_LB_HA],
        "workload-external-lb.md",
        &[],
    )
    .await
}

/// CAPI's cluster upgrade spec with real kubeadm nodes behind the lab's haproxy: quick-start on
/// the guest image's Kubernetes, then the control plane and the workers moved to the next minor
/// (a second Proxmox template whose VMs boot the image's layer of that version), then deletion.
/// Part of the matrix; needs `tests/controlplane/build.sh --next` before the guest image is
/// built. Alone: `cargo test -p banlieue-conformance --test capi cluster_upgrade -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "in the full matrix (tests/workload-matrix.sh): needs the next Kubernetes minor built"]
async fn cluster_upgrade_to_the_next_minor() -> Result<()> {
    workload_report(
        "Workload cluster of real kubeadm nodes: upgrade to the next minor on the Proxmox simulator",
        &[&workload::UPGRADE],
        "workload-upgrade.md",
        &[],
    )
    .await
}

/// CAPI's self-hosted spec with real kubeadm nodes behind the lab's haproxy: quick-start, then
/// `clusterctl init` into the workload cluster (CAPI's managers and banlieue-proxmox as Pods on
/// its guests), `clusterctl move` into it, a worker added by the managers there, the move back,
/// then deletion. Part of the matrix; alone:
/// `cargo test -p banlieue-conformance --test capi self_hosted -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "in the full matrix (tests/workload-matrix.sh)"]
async fn self_hosted_cluster_moved_into_itself() -> Result<()> {
    workload_report(
        "Workload cluster of real kubeadm nodes: self-hosted on the Proxmox simulator",
        &[&workload::SELF_HOSTED],
        "workload-self-hosted.md",
        &[],
    )
    .await
}

/// The full matrix of CAPI e2e specs with real kubeadm nodes (not in CI; about 30 minutes): every
/// scenario of `capi/workload.rs` (Proxmox, vcsim, libvirt), the report (spec × provider, pass or
/// fail, time) in `target/conformance/workload-matrix.md`. Run with `tests/workload-matrix.sh`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the full matrix (about 30 minutes): tests/workload-matrix.sh"]
async fn workload_matrix() -> Result<()> {
    workload_report(
        "CAPI e2e specs with real kubeadm nodes: the full matrix",
        &[
            &workload::DEFAULT_FLAVOR,
            &workload::CLUSTERCLASS,
            &workload::EXTERNAL_LB_HA,
            &workload::UPGRADE,
            &workload::SELF_HOSTED,
            &workload::VSPHERE_DEFAULT,
            &workload::LIBVIRT_DEFAULT,
        ],
        "workload-matrix.md",
        MATRIX_NOTES,
    )
    .await
}

/// What the matrix does not run yet, and why (printed under its table).
const MATRIX_NOTES: &[&str] = &[
    "libvirt: the runs use libvirt's test driver (a real libvirtd would run QEMU, and KVM does not work here): it has no DHCP server, so the lab reports each guest's DHCP lease to the provider's connection, which returns it as the domain's address on that driver only (`VirtHypervisor::report_leases`).",
    "vSphere: vSphere's cloud provider (CPI) cannot be built here (its module is not served); a stand-in in the test sets each Node's providerID from its systemUUID (the VM's BIOS uuid) and removes the uninitialized taint, as the CPI does.",
    "cluster upgrade: v1.33.13 → v1.34.4 (tests/controlplane/build.sh --next builds the second minor; the guest image gets a layer of it, which the VMs of a second Proxmox template boot). On Proxmox only: the other platforms have one template.",
    "self-hosted: the managers' images are built here and imported into every guest's containerd (a user's nodes pull them from a registry), and the harness issues the webhooks' certificates in cert-manager's place, as on the management cluster; the simulator listens on the lab bridge, where the provider's Pod reaches it.",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capi_drives_banlieue_proxmox_on_the_simulator() -> Result<()> {
    conformance(Backend::Proxmox, Mode::Processes).await
}

/// The same run for `banlieue-vsphere` on vcsim (managers as processes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capi_drives_banlieue_vsphere_on_vcsim() -> Result<()> {
    conformance(Backend::VSphere, Mode::Processes).await
}

/// The same run for the libvirt provider on libvirt's test driver (CAPI's managers as processes,
/// the provider's controllers in the test process: the test driver's state is per process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capi_drives_banlieue_libvirt_on_the_test_driver() -> Result<()> {
    conformance(Backend::Libvirt, Mode::Processes).await
}

/// The same run with every manager (CAPI's three, banlieue-proxmox, the banlieue controller) a
/// Pod on a real node of its management cluster, from the Deployments `clusterctl init`
/// installed, under their ServiceAccounts and installed RBAC: no admin credentials anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capi_drives_banlieue_proxmox_with_every_manager_in_a_pod() -> Result<()> {
    conformance(Backend::Proxmox, Mode::Pods).await
}

/// Which provider and hypervisor a run drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    /// banlieue-proxmox on pve-sim.
    Proxmox,
    /// banlieue-vsphere on vcsim.
    VSphere,
    /// The libvirt provider on libvirt's test driver.
    Libvirt,
}

async fn conformance(backend: Backend, mode: Mode) -> Result<()> {
    let (title, file, notes) = match (backend, mode) {
        (Backend::Proxmox, Mode::Processes) => (
            "banlieue CAPI conformance: real CAPI v1.14.2 controllers + banlieue-proxmox + pve-sim",
            "capi.md",
            NOTES,
        ),
        (Backend::Proxmox, Mode::Pods) => (
            "banlieue CAPI conformance, every manager a Pod: CAPI v1.14.2's release components + banlieue-proxmox + pve-sim",
            "capi-pods.md",
            POD_NOTES,
        ),
        (Backend::VSphere, Mode::Processes) => (
            "banlieue CAPI conformance: real CAPI v1.14.2 controllers + banlieue-vsphere + vcsim",
            "capi-vsphere.md",
            VSPHERE_NOTES,
        ),
        (Backend::Libvirt, Mode::Processes) => (
            "banlieue CAPI conformance: real CAPI v1.14.2 controllers + the libvirt provider + libvirt's test driver",
            "capi-libvirt.md",
            LIBVIRT_NOTES,
        ),
        (Backend::VSphere | Backend::Libvirt, Mode::Pods) => bail!("the run with Pods is Proxmox's"),
    };
    let mut report = Report::new(title);
    let started = Instant::now();

    // ---- environment ----
    // banlieue's own kinds (VirtualMachine, Provider, …) for the coexistence step; the
    // infrastructure kinds and CAPI's come from `clusterctl init`, as for a user.
    let mut crds: Vec<_> = banlieue_api::crds::all()
        .into_iter()
        .filter(|crd| crd.spec.group != banlieue_api::INFRASTRUCTURE_GROUP)
        .collect();
    crds.extend(cert_manager_stub_crds()?);
    let controller_dir = controller_dir()?;
    // The management cluster, the workload cluster's API server, and the target of `clusterctl
    // move`.
    // With Pods, each cluster has a node network: the managers' Pods reach the simulator and
    // the workload API server at host addresses on their node's bridge.
    let pods = mode == Mode::Pods;
    let (mgmt, workload, target) = tokio::try_join!(
        TestEnv::builder()
            .allow_external(false)
            .node_network(pods)
            .crds(crds.clone())
            .start(),
        TestEnv::builder()
            .allow_external(false)
            .node_network(pods)
            .controller_manager(false)
            .start(),
        TestEnv::builder()
            .allow_external(false)
            .node_network(pods)
            // banlieue's kinds too, as a user applies banlieue-core.yaml there before the move:
            // clusterctl copies the Providers labelled for move (the vSphere run has one).
            .crds(crds)
            .start(),
    )?;
    let client = mgmt.client().await?;
    let ns = mgmt.namespace("conformance").await?;
    let ns_name = ns.name().to_owned();
    let hv = Arc::new(match backend {
        Backend::Proxmox => {
            let sim_config = SimConfig {
                // One node: the template lives on pve1 and the simulator (like PVE) refuses
                // linked and full clones to another node from non-shared storage.
                nodes: vec!["pve1".into()],
                agent_delay: Duration::from_millis(500),
                bind_address: match mgmt.node_network() {
                    Some(network) => network.gateway(),
                    None => SimConfig::fast().bind_address,
                },
                ..SimConfig::fast()
            };
            Hypervisor::Proxmox(Arc::new(banlieue_pve_sim::start(sim_config).await?))
        }
        Backend::VSphere => Hypervisor::vcsim().await?,
        Backend::Libvirt => Hypervisor::libvirt_test_driver().await?,
    });
    let provider = hv.infra().name();
    let t = Instant::now();
    let config = clusterctl_init(&mgmt, &hv, mode)
        .await
        .context("clusterctl init on the management cluster")?;
    report.record(
        "install",
        format!("clusterctl init --core cluster-api --bootstrap kubeadm --control-plane kubeadm --infrastructure {provider} (local repository)"),
        Outcome::pass("providers in clusterctl's inventory, CRDs served"),
        Some(t.elapsed()),
    );
    let mut procs = Managers::start(mode, &hv, &mgmt, "mgmt-node", &controller_dir).await?;
    let emulator_log = mgmt.workdir().join("logs/guest-emulator.log");
    let emulator = tokio::spawn(emulate_guests(
        hv.clone(),
        workload.client().await?,
        emulator_log.clone(),
    ));
    report.record(
        "environment",
        format!("harness + workload apiserver + 3 CAPI managers + {provider} + its hypervisor up"),
        Outcome::pass(format!(
            "management {} workload {}",
            mgmt.server(),
            workload.server()
        )),
        Some(started.elapsed()),
    );

    let mut run = Run {
        client,
        ns: ns_name.clone(),
        hv: hv.clone(),
        report,
    };
    let envs = Envs {
        mgmt: &mgmt,
        workload: &workload,
        target: &target,
        config: &config,
        controller_dir: &controller_dir,
        mode,
    };
    let result = lifecycle(&mut run, &mut procs, &envs).await;
    if let Some(memory) = procs.node_memory() {
        let outcome = match memory {
            Ok(bytes) => Outcome::pass(format!(
                "{} MiB resident (init, containerd, kubelet, kube-proxy, shims, CAPI's 3 managers, banlieue-proxmox)",
                bytes >> 20
            )),
            Err(e) => Outcome::fail(format!("{e:#}")),
        };
        run.report.record(
            "resources",
            "the node of the target management cluster",
            outcome,
            None,
        );
    }
    emulator.abort();
    if let Err(e) = &result {
        run.report.record(
            "run",
            "stopped at the first failure",
            Outcome::fail(format!("{e:#}")),
            None,
        );
    }
    for note in notes {
        run.report.note(*note);
    }
    let path = run.report.write(&report_dir().join(file))?;
    eprintln!("report: {}", path.display());
    if result.is_err() {
        eprintln!(
            "{}\n--- guest emulator ---\n{}\n--- hypervisor ---\n{}",
            procs.tails(),
            std::fs::read_to_string(&emulator_log).unwrap_or_default(),
            hv.log_tail()
        );
    }
    result?;
    let failures = run.report.failures();
    ensure!(failures.is_empty(), "failed checks: {failures:#?}");
    drop(ns);
    Ok(())
}

const NOTES: &[&str] = &[
    "CAPI's managers run as processes with admin credentials (ClusterTopology on); their \
     admission webhooks are registered with CAPI's own webhook configurations pointed at each \
     manager's loopback port (`banlieue_dev::capi`), so the generated manifest is applied as \
     clusterctl wrote it and CAPI defaults and validates it.",
    "Both management clusters are set up by the real `clusterctl init` from banlieue's local \
     repository. CAPI's providers there are its CRDs only (no manager Deployments; the CRDs carry \
     the contract label `cluster.x-k8s.io/v1beta2: v1beta2` CAPI's release manifests add); \
     banlieue-proxmox's are its real components, whose Deployment gets no pod (no kubelet): the \
     controllers run as processes with admin credentials instead.",
    "The workload cluster is emulated: a second harness kube-apiserver is the control-plane \
     endpoint; its CA is given to CAPI as the `<cluster>-ca` Secret (CAPI's custom-certificates \
     way), so KCP writes that CA into the kubeadm bootstrap data and generates the \
     `<cluster>-kubeconfig` CAPI uses to reach the endpoint; kubeadm init/join + kubelet are emulated by creating `kube-system/kubeadm-config` and \
     a Node with `spec.providerID = proxmox://<meta-data instance-id>` once a VM boots with \
     kubeadm cloud-init. Without it KCP never reports the control plane initialized, so CABPK \
     never generates join data and workers stop at bootstrap (no VM).",
];

const VSPHERE_NOTES: &[&str] = &[
    "The same run as Proxmox's with the managers as processes, for `banlieue-vsphere` on govmomi's \
     vcsim (its default inventory: datacenter `DC0`, its model VM made the template): the \
     management cluster is set up by the real `clusterctl init --infrastructure banlieue-vsphere`, \
     the cluster by the real `clusterctl generate cluster` over `templates/vsphere/`, vCenter's \
     certificate pinned by `VSPHERE_TLS_FINGERPRINT`.",
    "vcsim boots no guest: the emulator plays VMware Tools (it reports an IP for every powered-on \
     VM through vcsim's `SET.guest.ipAddress`) and, as on Proxmox, kubeadm and the kubelet; the \
     Node's `spec.providerID` is `vsphere://<BIOS uuid>`, what vSphere's cloud provider sets. \
     The template names no failure domain, so none is published. vcsim's task history is not \
     read: the move is checked by the VMs' ids and BIOS uuids, not by a task count.",
];

const LIBVIRT_NOTES: &[&str] = &[
    "The same run as Proxmox's for the libvirt provider on libvirt's `test:///default` driver: the \
     management clusters are set up by the real `clusterctl init --infrastructure \
     banlieue-libvirt` and the cluster by the real `clusterctl generate cluster` over \
     `templates/libvirt/` (URI `test:///default`, pool `default-pool`, base volume `base.qcow2`, \
     256 MiB and 1 GiB per machine: the test driver's pool is small). CAPI's managers run as \
     processes; the libvirt provider's LibvirtCluster and LibvirtMachine controllers run in the \
     test process, from the provider's library with the settings of its binary (domain type \
     `qemu`): the test driver's state lives in the process that opened it, so the provider's \
     binary would see domains the test cannot. On the move, the source's controllers stop and the \
     target's start against the same driver. The `banlieue-libvirt` binary and its Pod run \
     against a real libvirtd in `tests/devenv/tests/e2e_backends.rs` and `pods.rs`.",
    "The test driver boots no guest: the emulator reads the seed ISO the provider uploaded \
     (user-data, meta-data) and plays kubeadm and the kubelet; the Node's `spec.providerID` is \
     `libvirt://localhost/<meta-data instance-id>`, the kubelet flag of the cluster template. The \
     move is checked by the domains' uuids (the test driver keeps no task history).",
];

const POD_NOTES: &[&str] = &[
    "Every manager is a Pod on a real node (containerd, kubelet, kube-proxy; \
     `banlieue_testenv::nodes`) of its management cluster: CAPI's core, kubeadm bootstrap and \
     kubeadm control-plane managers from CAPI v1.14.2's release components (rendered from the \
     pinned module's config/ by tests/controlplane/build.sh as CAPI's release does, installed by \
     the real `clusterctl init` with CLUSTER_TOPOLOGY=true), banlieue-proxmox from its \
     components, the banlieue controller from banlieue-core.yaml; each image built here from the \
     binaries. Each runs as its ServiceAccount under the RBAC its components install; a restart \
     of any of them fails the run.",
    "cert-manager's programs cannot be built here (the Go module proxy serves its root module, not \
     the nested modules holding its `main` packages): `banlieue_dev::certificates` issues each \
     Certificate's Secret from the harness CA and injects the CA into the webhook configurations \
     and CRDs annotated `cert-manager.io/inject-ca-from`, once after `clusterctl init`.",
    "The workload cluster is emulated as in the process run (see there); its API server listens \
     on a host address of its own node network, which the managers' Pods reach.",
];

/// The banlieue Provider of the run: the standalone VirtualMachine's, and the cluster's where
/// [`Hypervisor::cluster_through_provider`].
const PROVIDER: &str = "conformance-hypervisor";

/// The clusters and files of the run.
struct Envs<'a> {
    /// How the managers run.
    mode: Mode,
    /// The management cluster (`clusterctl init` done, managers running).
    mgmt: &'a TestEnv,
    /// The emulated workload cluster's API server.
    workload: &'a TestEnv,
    /// The second management cluster, target of `clusterctl move`.
    target: &'a TestEnv,
    /// `clusterctl.yaml` of the local repository.
    config: &'a Path,
    /// Folder of the banlieue binaries.
    controller_dir: &'a Path,
}

async fn lifecycle(run: &mut Run, procs: &mut Managers, envs: &Envs<'_>) -> Result<()> {
    let (mgmt, workload) = (envs.mgmt, envs.workload);
    let ns = run.ns.clone();
    let endpoint = workload
        .server()
        .strip_prefix("https://")
        .and_then(|hp| hp.rsplit_once(':'))
        .map(|(h, p)| (h.to_owned(), p.parse::<u16>().unwrap_or(0)))
        .context("workload server address")?;

    // ---- generate + apply ----
    let t = Instant::now();
    let generated = generate_cluster(
        mgmt,
        envs.config,
        &ns,
        &run.hv,
        (&endpoint.0, endpoint.1),
        KUBERNETES_VERSION,
        2,
    );
    let docs = generated.and_then(|text| parse_docs(&text));
    let result = docs.as_ref().map(|d| {
        let kinds: Vec<&str> = d.iter().filter_map(|d| d["kind"].as_str()).collect();
        kinds.join(", ")
    });
    let result = result.map_err(|e| anyhow!("{e:#}"));
    run.record(
        "install",
        "clusterctl generate cluster (local repository, 1 CP + 2 workers)",
        t,
        &result,
    );
    result?;
    let mut docs = docs?;

    let t = Instant::now();
    let secrets: Api<Secret> = Api::namespaced(run.client.clone(), &ns);
    if run.hv.cluster_through_provider() {
        // The cluster names a Provider, whose Secret is in the provider's namespace.
        run.hv.register_provider(&run.client, PROVIDER).await?;
        let kind = run.hv.kind("Cluster");
        let infra_cluster = docs
            .iter_mut()
            .find(|d| d["kind"] == kind.as_str())
            .with_context(|| format!("no {kind} in the generated manifest"))?;
        let spec = infra_cluster["spec"]
            .as_object_mut()
            .with_context(|| format!("{kind} without spec"))?;
        for own in ["server", "credentialsRef", "tls"] {
            spec.remove(own);
        }
        spec.insert("providerRef".into(), json!({"name": PROVIDER}));
    } else if let Some((creds_name, creds_data)) = run.hv.credentials() {
        let creds: Secret = serde_json::from_value(json!({
            // In the cluster's namespace and owned by no Cluster: `clusterctl move` takes it
            // along only with the label `clusterctl.cluster.x-k8s.io/move`, which the provider
            // adds when its infra cluster reads it (checked before the move).
            "metadata": {"name": creds_name},
            "stringData": creds_data,
        }))?;
        secrets.create(&PostParams::default(), &creds).await?;
    }
    // The cluster CA, provided the way CAPI documents for custom certificates: the emulated
    // workload API server serves with this CA, KCP puts it into the `kubeadm init` bootstrap
    // data and signs the `<cluster>-kubeconfig` it generates with it.
    let ca_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{CLUSTER}-ca"), "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
        "type": "cluster.x-k8s.io/secret",
        "stringData": {"tls.crt": workload.ca_pem()?, "tls.key": workload.ca_key_pem()?},
    }))?;
    secrets.create(&PostParams::default(), &ca_secret).await?;
    create_documents(&run.client, &run.ns, &docs).await?;
    run.record(
        "install",
        "apply the generated manifest",
        t,
        &Ok(format!("{} objects", docs.len())),
    );

    // ---- the Cluster's infrastructure ----
    let t = Instant::now();
    let r = poll(
        procs,
        "Cluster infrastructure provisioned",
        STEP_TIMEOUT,
        async || {
            let c = run.get(&capi("Cluster"), CLUSTER).await?.context("no Cluster")?;
            let px = run
                .get(&run.infra("Cluster"), CLUSTER)
                .await?
                .context("no infra cluster")?;
            if c["status"]["initialization"]["infrastructureProvisioned"] != true {
                return Ok(Err(format!("Cluster status {}", c["status"])));
            }
            if condition_status(&c, "InfrastructureReady").as_deref() != Some("True") {
                return Ok(Err("InfrastructureReady not True".into()));
            }
            // CAPI drops an empty list: none published is none copied.
            let fds = &c["status"]["failureDomains"];
            let published = &px["status"]["failureDomains"];
            let published = if published.as_array().is_some_and(Vec::is_empty) {
                &Value::Null
            } else {
                published
            };
            if fds != published
                || (run.hv.publishes_failure_domains() && fds.as_array().is_none_or(Vec::is_empty))
            {
                return Ok(Err(format!(
                    "failure domains {fds} vs {}",
                    px["status"]["failureDomains"]
                )));
            }
            Ok(Ok(format!("InfrastructureReady=True, failureDomains {fds}")))
        },
    )
    .await;
    run.record(
        "cluster",
        "Cluster status.initialization.infrastructureProvisioned + failure domains copied",
        t,
        &r,
    );
    r?;

    let t = Instant::now();
    let r = poll(procs, "control plane endpoint", STEP_TIMEOUT, async || {
        let c = run.get(&capi("Cluster"), CLUSTER).await?.context("no Cluster")?;
        let px = run
            .get(&run.infra("Cluster"), CLUSTER)
            .await?
            .context("no infra cluster")?;
        let ep = &c["spec"]["controlPlaneEndpoint"];
        if ep != &px["spec"]["controlPlaneEndpoint"]
            || ep["host"] != endpoint.0.as_str()
            || ep["port"] != endpoint.1
        {
            return Ok(Err(format!(
                "Cluster {ep} vs infra cluster {}",
                px["spec"]["controlPlaneEndpoint"]
            )));
        }
        Ok(Ok(format!(
            "{}:{}",
            ep["host"].as_str().unwrap_or(""),
            ep["port"]
        )))
    })
    .await;
    run.record(
        "cluster",
        &format!(
            "control plane endpoint on the Cluster = {}'s",
            run.hv.kind("Cluster")
        ),
        t,
        &r,
    );
    r?;

    // ---- control plane machine ----
    let cp = format!("cluster.x-k8s.io/cluster-name={CLUSTER},cluster.x-k8s.io/control-plane");
    let t = Instant::now();
    let r = poll(
        procs,
        "control plane Machine provisioned",
        STEP_TIMEOUT,
        async || machines_provisioned(run, &cp, 1).await,
    )
    .await;
    let cp_pairs = r.as_ref().ok().cloned();
    let r = r.map(|p| {
        format!(
            "providerID {}, failureDomain {}",
            p[0].0["spec"]["providerID"], p[0].0["status"]["failureDomain"]
        )
    });
    run.record(
        "control plane",
        "Machine infrastructure provisioned; providerID, addresses, failure domain copied",
        t,
        &r,
    );
    r?;
    let t = Instant::now();
    let r = bootstrap_bytes_match(run, cp_pairs.as_deref().unwrap_or_default()).await;
    run.record(
        "control plane",
        "VM user-data == kubeadm bootstrap Secret value (bytes)",
        t,
        &r,
    );
    r?;

    let t = Instant::now();
    let r =
        cluster_ca_in_bootstrap_data(run, cp_pairs.as_deref().unwrap_or_default(), &workload.ca_pem()?).await;
    run.record(
        "control plane",
        "the kubeadm init bootstrap data carries the cluster CA the workload API server serves with; KCP generated the cluster's kubeconfig from it",
        t,
        &r,
    );
    r?;

    let t = Instant::now();
    let r = poll(procs, "ControlPlaneInitialized", STEP_TIMEOUT, async || {
        let c = run.get(&capi("Cluster"), CLUSTER).await?.context("no Cluster")?;
        if c["status"]["initialization"]["controlPlaneInitialized"] != true {
            return Ok(Err(format!("conditions {}", c["status"]["conditions"])));
        }
        Ok(Ok(
            "Cluster status.initialization.controlPlaneInitialized=true".to_owned()
        ))
    })
    .await;
    run.record(
        "control plane",
        "KCP reports the control plane initialized (emulated kubeadm init)",
        t,
        &r,
    );
    r?;

    // ---- workers ----
    let workers =
        format!("cluster.x-k8s.io/cluster-name={CLUSTER},cluster.x-k8s.io/deployment-name={CLUSTER}-md-0");
    let t = Instant::now();
    let r = poll(procs, "2 worker Machines provisioned", STEP_TIMEOUT, async || {
        machines_provisioned(run, &workers, 2).await
    })
    .await;
    let worker_pairs = r.as_ref().ok().cloned();
    let r2 = r.map(|p| format!("{} workers", p.len()));
    run.record(
        "workers",
        "2 Machines provisioned; providerID, addresses, failure domain copied",
        t,
        &r2,
    );
    r2?;
    let t = Instant::now();
    let r = bootstrap_bytes_match(run, worker_pairs.as_deref().unwrap_or_default()).await;
    run.record(
        "workers",
        "VM user-data == kubeadm join bootstrap Secret value (bytes)",
        t,
        &r,
    );
    r?;

    let t = Instant::now();
    let all = format!("cluster.x-k8s.io/cluster-name={CLUSTER}");
    let r = poll(procs, "nodeRef on every Machine", STEP_TIMEOUT, async || {
        let machines = run
            .api(&capi("Machine"))
            .list(&kube::api::ListParams::default().labels(&all))
            .await?;
        let missing: Vec<String> = machines
            .items
            .iter()
            .filter(|m| to_value(m)["status"]["nodeRef"]["name"].is_null())
            .filter_map(|m| m.metadata.name.clone())
            .collect();
        if missing.is_empty() {
            Ok(Ok(format!("{} Machines with a nodeRef", machines.items.len())))
        } else {
            Ok(Err(format!("no nodeRef yet: {missing:?}")))
        }
    })
    .await;
    run.record(
        "workers",
        "every Machine gets a nodeRef (emulated kubelet registers the Node)",
        t,
        &r,
    );
    r?;

    let t = Instant::now();
    let r = check_no_nulls(run).await;
    run.record(
        "contract",
        &format!(
            "no null values in any {}/{} (CAPI reads them unstructured)",
            run.hv.kind("Machine"),
            run.hv.kind("Cluster")
        ),
        t,
        &r,
    );
    r?;

    let t = Instant::now();
    let r = check_owner_references(run).await;
    run.record(
        "contract",
        &format!(
            "owner references as CAPI sets them (Machine controller ref on {}s, Cluster ref on the {}) + provider finalizers",
            run.hv.kind("Machine"),
            run.hv.kind("Cluster")
        ),
        t,
        &r,
    );
    r?;

    let t = Instant::now();
    let r = check_resource_versions_stable(run, procs).await;
    run.record(
        "contract",
        &format!(
            "converged: no {}/{}/Machine/Cluster write in a quiet window (CAPI e2e resourceVersion check)",
            run.hv.kind("Machine"),
            run.hv.kind("Cluster")
        ),
        t,
        &r,
    );
    r?;

    // ---- scale ----
    for replicas in [4usize, 1] {
        let t = Instant::now();
        let r = scale(run, procs, &workers, replicas).await;
        run.record(
            "scale",
            &format!("MachineDeployment → {replicas}: VMs one-to-one with Machines"),
            t,
            &r,
        );
        r?;
    }

    // ---- pause ----
    for paused in [true, false] {
        let t = Instant::now();
        let r = pause(run, procs, paused).await;
        let what = if paused {
            "Cluster spec.paused=true → Paused=True on every banlieue object and CAPI Machine"
        } else {
            "unpause → Paused=False everywhere"
        };
        run.record("pause", what, t, &r);
        r?;
    }

    // ---- standalone VirtualMachine beside the cluster ----
    let t = Instant::now();
    let r = coexist(run, procs, mgmt, envs.controller_dir).await;
    run.record(
        "coexistence",
        "a standalone VirtualMachine (banlieue controller) in the same namespace: provisioned and deleted; neither side touches the other's objects",
        t,
        &r,
    );
    r?;

    // ---- clusterctl move ----
    let t = Instant::now();
    let r = move_cluster(run, procs, envs).await;
    run.record(
        "move",
        &format!(
            "clusterctl move to a second management cluster (clusterctl init, CAPI + {provider} running): the objects arrive, {provider} there adopts the same VMs (ids, uuids) without cloning, starting or deleting any, CAPI there reports every Machine provisioned with its providerID and nodeRef; nothing left on the source",
            provider = run.hv.infra().name()
        ),
        t,
        &r,
    );
    r?;

    // ---- delete (on the target management cluster) ----
    let t = Instant::now();
    let r = delete_cluster(run, procs).await;
    run.record(
        "delete",
        "delete the Cluster: no VM, no seed, no banlieue object left",
        t,
        &r,
    );
    r?;

    for (spec, why) in NOT_RUNNABLE {
        run.report
            .record("not runnable", *spec, Outcome::skip(*why), None);
    }
    Ok(())
}

const NOT_RUNNABLE: &[(&str, &str)] = &[
    (
        "QuickStart (as CAPI's e2e runs it)",
        "needs a real workload cluster (CNI, pods); the lifecycle above is its control-plane half",
    ),
    (
        "MachineDeploymentRemediation / KCPRemediation",
        "MachineHealthChecks need real Node health; the emulated Nodes never turn unhealthy",
    ),
    (
        "ClusterctlUpgrade",
        "needs an older published release of each provider to upgrade from",
    ),
    (
        "KCP scale / rollout",
        "KCP checks etcd membership through the workload cluster's etcd pods, which are not emulated",
    ),
];

async fn check_no_nulls(run: &Run) -> Result<String> {
    let mut paths = Vec::new();
    let mut count = 0;
    for kind in ["Machine", "Cluster", "MachineTemplate"].map(|k| run.hv.kind(k)) {
        for obj in run.list(&infra(&kind)).await? {
            count += 1;
            let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            null_paths(&obj["spec"], &format!("{kind}/{name}.spec"), &mut paths);
            null_paths(&obj["status"], &format!("{kind}/{name}.status"), &mut paths);
        }
    }
    ensure!(paths.is_empty(), "null values: {paths:?}");
    Ok(format!("{count} objects"))
}

fn owner_kinds(obj: &Value) -> Vec<String> {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .map(|l| {
            l.iter()
                .filter_map(|o| o["kind"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The cluster's infra machines and infra cluster by name → resourceVersion.
async fn capi_side_versions(run: &Run) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for kind in ["Machine", "Cluster"].map(|k| run.hv.kind(k)) {
        for obj in run.list(&infra(&kind)).await? {
            if obj["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] == CLUSTER
                || obj["metadata"]["name"] == CLUSTER
            {
                out.insert(
                    format!("{kind}/{}", obj["metadata"]["name"].as_str().unwrap_or_default()),
                    obj["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                );
            }
        }
    }
    Ok(out)
}

/// Issue step 7: the banlieue controller and a standalone VirtualMachine in the cluster's
/// namespace. The VM gets its own infra machine (controlled by the VirtualMachine, never by a
/// Machine) and VM; the cluster's infra machines and infra cluster are not written while it
/// lives and dies; CAPI creates no Machine for it; the cluster's VMs stay.
async fn coexist(run: &Run, procs: &mut Managers, mgmt: &TestEnv, controller_dir: &Path) -> Result<String> {
    const VM: &str = "standalone";
    let hypervisor_spec = run.hv.register_provider(&run.client, PROVIDER).await?;
    procs.add_banlieue_controller(mgmt, controller_dir).await?;
    let capi_before = capi_side_versions(run).await?;
    let machines_before: BTreeSet<String> = run
        .list(&capi("Machine"))
        .await?
        .iter()
        .filter_map(|m| m["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    let cluster_vms: BTreeSet<String> = run.vms().await?.into_keys().collect();

    let user_data = "#cloud-config\nruncmd:\n  - [echo, standalone beside a CAPI cluster]\n";
    let secrets: Api<Secret> = Api::namespaced(run.client.clone(), &run.ns);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "standalone-user-data"},
        "stringData": {"value": user_data},
    }))?;
    secrets.create(&PostParams::default(), &secret).await?;
    let vm_ar = resource("banlieue.io", "v1alpha1", "VirtualMachine");
    let mut spec = json!({
        "providerRef": {"name": PROVIDER},
        "cpu": {"cores": 1}, "memoryMiB": 1024,
        "userDataSecretRef": {"name": "standalone-user-data"},
        "powerState": "On",
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), hypervisor_spec.as_object()) {
        spec.extend(extra.clone());
    }
    let vm: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": VM},
        "spec": spec,
    }))?;
    run.api(&vm_ar).create(&PostParams::default(), &vm).await?;
    let pm = poll(
        procs,
        "the standalone VirtualMachine Ready",
        STEP_TIMEOUT,
        async || {
            let Some(vm) = run.get(&vm_ar, VM).await? else {
                return Ok(Err("VirtualMachine gone".into()));
            };
            if condition_status(&vm, "Ready").as_deref() != Some("True") {
                return Ok(Err(format!(
                    "VirtualMachine conditions {}",
                    vm["status"]["conditions"]
                )));
            }
            let pms = run.list(&run.infra("Machine")).await?;
            match pms
                .into_iter()
                .find(|pm| owner_kinds(pm).iter().any(|k| k == "VirtualMachine"))
            {
                Some(pm) => Ok(Ok(pm)),
                None => Ok(Err("no infra machine owned by the VirtualMachine".into())),
            }
        },
    )
    .await?;
    ensure!(
        owner_kinds(&pm) == ["VirtualMachine"],
        "the VM's infra machine has owners {:?}",
        owner_kinds(&pm)
    );
    let vm = run.vm_of(&pm).await?;
    let vmid = &vm.id;
    let seed = vm.user_data.clone().unwrap_or_default();
    ensure!(
        seed == user_data,
        "standalone VM {vmid} booted with other user-data: {seed:?}"
    );
    let machines_now: BTreeSet<String> = run
        .list(&capi("Machine"))
        .await?
        .iter()
        .filter_map(|m| m["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    ensure!(
        machines_now == machines_before,
        "CAPI Machines changed: {machines_now:?}"
    );

    run.api(&vm_ar).delete(VM, &DeleteParams::default()).await?;
    let pm_name = pm["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    poll(
        procs,
        "the standalone VirtualMachine gone",
        STEP_TIMEOUT,
        async || {
            if run.get(&vm_ar, VM).await?.is_some()
                || run.get(&run.infra("Machine"), &pm_name).await?.is_some()
            {
                return Ok(Err("VirtualMachine or its infra machine still there".into()));
            }
            let vms: BTreeSet<String> = run.vms().await?.into_keys().collect();
            if vms != cluster_vms {
                return Ok(Err(format!("VMs {vms:?}, the cluster's {cluster_vms:?}")));
            }
            Ok(Ok(()))
        },
    )
    .await?;
    let capi_after = capi_side_versions(run).await?;
    ensure!(
        capi_after == capi_before,
        "the cluster's infra objects were written meanwhile: before {capi_before:?} after {capi_after:?}"
    );
    Ok(format!(
        "VM {vmid} provisioned with its user-data and deleted; {} cluster objects unchanged, cluster VMs {cluster_vms:?} kept",
        capi_before.len()
    ))
}

async fn check_owner_references(run: &Run) -> Result<String> {
    let owner = |obj: &Value, kind: &str| -> Option<Value> {
        obj["metadata"]["ownerReferences"]
            .as_array()?
            .iter()
            .find(|o| o["kind"] == kind && o["apiVersion"] == "cluster.x-k8s.io/v1beta2")
            .cloned()
    };
    let has_finalizer = |obj: &Value, f: &str| {
        obj["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|l| l.iter().any(|x| x == f))
    };
    let (machine_kind, cluster_kind) = (run.hv.kind("Machine"), run.hv.kind("Cluster"));
    let pms = run.list(&run.infra("Machine")).await?;
    for pm in &pms {
        let name = &pm["metadata"]["name"];
        let o = owner(pm, "Machine").with_context(|| format!("{machine_kind} {name}: no Machine owner"))?;
        ensure!(
            o["controller"] == true && o["blockOwnerDeletion"] == true,
            "{machine_kind} {name}: Machine owner ref {o} is not controller+blockOwnerDeletion"
        );
        ensure!(
            pm["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] == CLUSTER,
            "{machine_kind} {name}: no cluster-name label"
        );
        ensure!(
            has_finalizer(pm, &run.hv.finalizer()),
            "{machine_kind} {name}: no provider finalizer"
        );
    }
    let pxc = run
        .get(&run.infra("Cluster"), CLUSTER)
        .await?
        .with_context(|| format!("no {cluster_kind}"))?;
    let o = owner(&pxc, "Cluster").with_context(|| format!("{cluster_kind} without a Cluster owner"))?;
    ensure!(
        o["controller"] != true,
        "{cluster_kind}: Cluster owner ref {o} is a controller ref (CAPI sets a plain one without topology)"
    );
    let finalizers = pxc["metadata"]["finalizers"].clone();
    ensure!(
        finalizers.as_array().is_some_and(|l| !l.is_empty()),
        "{cluster_kind} without a finalizer"
    );
    Ok(format!(
        "{} {machine_kind}s owned by their Machine; {cluster_kind} finalizers {finalizers}",
        pms.len()
    ))
}

/// Records the resourceVersion of every provider object and of CAPI's Machines and Cluster,
/// waits a quiet window (no test action), and compares: a converged provider makes no writes.
async fn check_resource_versions_stable(run: &Run, procs: &mut Managers) -> Result<String> {
    async fn versions(run: &Run) -> Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for ar in [
            run.infra("Machine"),
            run.infra("Cluster"),
            capi("Machine"),
            capi("Cluster"),
        ] {
            for obj in run.list(&ar).await? {
                out.insert(
                    format!(
                        "{}/{}",
                        ar.kind,
                        obj["metadata"]["name"].as_str().unwrap_or_default()
                    ),
                    obj["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                );
            }
        }
        Ok(out)
    }
    // Converged first: CAPI's own status updates (conditions after the nodeRef) settle.
    let mut before = versions(run).await?;
    let mut stable_rounds = 0;
    let mut rounds = 0;
    while stable_rounds < 2 {
        procs.check().await?;
        tokio::time::sleep(QUIET_WINDOW).await;
        let now = versions(run).await?;
        rounds += 1;
        if now == before {
            stable_rounds += 1;
        } else {
            stable_rounds = 0;
            ensure!(
                rounds < 12,
                "objects still written after {rounds} windows of {}s: {:?}",
                QUIET_WINDOW.as_secs(),
                now.iter()
                    .filter(|(k, v)| before.get(*k) != Some(*v))
                    .map(|(k, _)| k)
                    .collect::<Vec<_>>()
            );
        }
        before = now;
    }
    Ok(format!(
        "{} objects unchanged over 2 consecutive {}s windows",
        before.len(),
        QUIET_WINDOW.as_secs()
    ))
}

const QUIET_WINDOW: Duration = Duration::from_secs(5);

async fn scale(run: &Run, procs: &mut Managers, workers: &str, replicas: usize) -> Result<String> {
    let patch = json!({"spec": {"replicas": replicas}});
    run.api(&capi("MachineDeployment"))
        .patch(
            &format!("{CLUSTER}-md-0"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    poll(procs, &format!("{replicas} workers"), STEP_TIMEOUT, async || {
        let pairs = match machines_provisioned(run, workers, replicas).await? {
            Ok(p) => p,
            Err(state) => return Ok(Err(state)),
        };
        let cp_pms: Vec<Value> = run
            .list(&run.infra("Machine"))
            .await?
            .into_iter()
            .filter(|pm| pm["metadata"]["labels"]["cluster.x-k8s.io/control-plane"].is_string())
            .collect();
        let machine_vmids: BTreeSet<String> = pairs
            .iter()
            .map(|(_, pm)| pm)
            .chain(cp_pms.iter())
            .filter_map(|pm| run.hv.vm_id(pm))
            .collect();
        let vms: BTreeSet<String> = run.vms().await?.into_keys().collect();
        if machine_vmids != vms || vms.len() != replicas + 1 {
            return Ok(Err(format!("VMs {vms:?}, machines' VMs {machine_vmids:?}")));
        }
        Ok(Ok(format!(
            "{} VMs for {} Machines (VMs {vms:?})",
            vms.len(),
            replicas + 1
        )))
    })
    .await
}

async fn pause(run: &Run, procs: &mut Managers, paused: bool) -> Result<String> {
    let patch = json!({"spec": {"paused": paused}});
    run.api(&capi("Cluster"))
        .patch(CLUSTER, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let want = if paused { "True" } else { "False" };
    poll(procs, &format!("Paused={want}"), STEP_TIMEOUT, async || {
        let mut objects = run.list(&run.infra("Machine")).await?;
        objects.extend(run.list(&run.infra("Cluster")).await?);
        objects.extend(run.list(&capi("Machine")).await?);
        for obj in &objects {
            let status = condition_status(obj, "Paused");
            if status.as_deref() != Some(want) {
                return Ok(Err(format!(
                    "{} {}: Paused={status:?}",
                    obj["kind"], obj["metadata"]["name"]
                )));
            }
        }
        Ok(Ok(format!("{} objects Paused={want}", objects.len())))
    })
    .await
}

/// `(id, SMBIOS / BIOS uuid)` of every VM: what must not change across a move.
async fn vm_identities(run: &Run) -> Result<BTreeMap<String, String>> {
    Ok(run
        .vms()
        .await?
        .into_iter()
        .map(|(id, vm)| (id, vm.identity))
        .collect())
}

/// CAPI's SelfHosted step: `clusterctl move` from the management cluster to `envs.target`, where
/// `clusterctl init` ran and CAPI's managers and banlieue-proxmox run. The run continues on the
/// target (`run.client`, `procs`).
async fn move_cluster(run: &mut Run, procs: &mut Managers, envs: &Envs<'_>) -> Result<String> {
    let all = format!("cluster.x-k8s.io/cluster-name={CLUSTER}");
    let before_vms = vm_identities(run).await?;
    let tasks_before = run.hv.lifecycle_tasks();
    let provider_ids: BTreeMap<String, Value> = run
        .list(&capi("Machine"))
        .await?
        .iter()
        .map(|m| {
            (
                m["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
                m["spec"]["providerID"].clone(),
            )
        })
        .collect();
    ensure!(
        !before_vms.is_empty() && before_vms.len() == provider_ids.len(),
        "before the move: {} VMs for {} Machines",
        before_vms.len(),
        provider_ids.len()
    );
    let provider_secret = match run.hv.provider_secret() {
        Some(secret) => {
            let data = provider_owns_secret(&run.client, &secret, "before the move").await?;
            Some((secret, data))
        }
        None => None,
    };
    if let (Some((creds_name, _)), None) = (run.hv.credentials(), &provider_secret) {
        let creds = Api::<Secret>::namespaced(run.client.clone(), &run.ns)
            .get(creds_name)
            .await?;
        ensure!(
            kube::ResourceExt::labels(&creds).contains_key("clusterctl.cluster.x-k8s.io/move"),
            "before the move: the provider did not label the credentials Secret {creds_name} for clusterctl move: {:?}",
            kube::ResourceExt::labels(&creds)
        );
    }

    // The target management cluster: `clusterctl init` (inventory, CRDs) and the controllers its
    // Deployments would run.
    let config = clusterctl_init(envs.target, &run.hv, envs.mode)
        .await
        .context("clusterctl init on the target management cluster")?;
    let target = Managers::start(
        envs.mode,
        &run.hv,
        envs.target,
        "target-node",
        envs.controller_dir,
    )
    .await?;

    let output = run_clusterctl(
        clusterctl(envs.mgmt)?
            .arg("move")
            .arg(format!("--config={}", config.display()))
            .arg(format!("--kubeconfig={}", envs.mgmt.admin().path().display()))
            .arg(format!(
                "--to-kubeconfig={}",
                envs.target.admin().path().display()
            ))
            .args(["--namespace", &run.ns, "-v", "1"]),
        "clusterctl move",
    )?;

    // Nothing of the cluster is left on the source (the Provider-owned infra cluster of the
    // standalone step is not the cluster's).
    let mut left = Vec::new();
    for ar in [
        capi("Cluster"),
        capi("Machine"),
        run.infra("Machine"),
        run.infra("Cluster"),
        run.infra("MachineTemplate"),
    ] {
        for obj in run.list(&ar).await? {
            if owner_kinds(&obj) != ["Provider"] {
                left.push(format!("{}/{}", ar.kind, obj["metadata"]["name"]));
            }
        }
    }
    ensure!(
        left.is_empty(),
        "left on the source after the move: {left:?}\n{output}"
    );

    // The Provider and its Secret: copied to the target, with the owner reference to the
    // target's Provider, and kept on the source (clusterctl keeps global objects there).
    let provider_moved = match &provider_secret {
        Some((secret, source_data)) => {
            provider_owns_secret(&run.client, secret, "on the source after the move").await?;
            let target_client = envs.target.client().await?;
            let target_data = provider_owns_secret(&target_client, secret, "on the target").await?;
            ensure!(
                &target_data == source_data,
                "the Provider's Secret {}/{} arrived with other data",
                secret.0,
                secret.1
            );
            format!(
                "; Provider {PROVIDER} and its Secret {}/{} copied, owned by the target's Provider",
                secret.0, secret.1
            )
        }
        None => String::new(),
    };

    // From here on the run is on the target.
    *procs = target;
    run.client = envs.target.client().await?;
    let pairs = poll(
        procs,
        "Machines provisioned again on the target",
        STEP_TIMEOUT,
        async || {
            let c = run
                .get(&capi("Cluster"), CLUSTER)
                .await?
                .context("no Cluster on the target")?;
            if c["spec"]["paused"] == true {
                return Ok(Err("Cluster still paused".into()));
            }
            if condition_status(&c, "InfrastructureReady").as_deref() != Some("True") {
                return Ok(Err(format!("Cluster conditions {}", c["status"]["conditions"])));
            }
            let pairs = match machines_provisioned(run, &all, provider_ids.len()).await? {
                Ok(pairs) => pairs,
                Err(state) => return Ok(Err(state)),
            };
            for (m, pm) in &pairs {
                let name = m["metadata"]["name"].as_str().unwrap_or_default();
                if provider_ids.get(name) != Some(&m["spec"]["providerID"]) {
                    return Ok(Err(format!(
                        "{name}: providerID {} changed",
                        m["spec"]["providerID"]
                    )));
                }
                if m["status"]["nodeRef"]["name"].is_null() {
                    return Ok(Err(format!("{name}: no nodeRef yet")));
                }
                if condition_status(pm, "Ready").as_deref() != Some("True") {
                    return Ok(Err(format!(
                        "{name}: infra machine not Ready: {}",
                        pm["status"]["conditions"]
                    )));
                }
            }
            Ok(Ok(pairs))
        },
    )
    .await?;

    // The same VMs, none cloned, started, stopped or deleted, each now marked for the target's
    // infra machine (so that deleting it deletes the VM).
    let after_vms = vm_identities(run).await?;
    ensure!(
        after_vms == before_vms,
        "VMs changed across the move: before {before_vms:?}, after {after_vms:?}"
    );
    let tasks = match (tasks_before, run.hv.lifecycle_tasks()) {
        (Some(before), Some(after)) => {
            ensure!(
                after == before,
                "{} clone/start/stop/delete tasks ran during the move",
                after - before
            );
            ", 0 clone/start/stop/delete tasks"
        }
        _ => "",
    };
    for (_, pm) in &pairs {
        let uid = pm["metadata"]["uid"].as_str().unwrap_or_default();
        let vm = run.vm_of(pm).await?;
        let vmid = &vm.id;
        ensure!(before_vms.contains_key(vmid), "VM {vmid} is new");
        ensure!(vm.running, "VM {vmid} is not running");
        ensure!(
            vm.owner_uid.as_deref() == Some(uid),
            "VM {vmid} is not marked for the target's infra machine {uid}: marked for {:?}",
            vm.owner_uid
        );
    }
    Ok(format!(
        "{} Machines provisioned with their nodeRef on the target; VMs {:?} and uuids unchanged{tasks}; VMs re-marked for the new {} UIDs{provider_moved}",
        pairs.len(),
        before_vms.keys().collect::<Vec<_>>(),
        run.hv.kind("Machine")
    ))
}

/// Checks (`when`, for messages) that the Provider [`PROVIDER`] exists and owns the Secret
/// `(namespace, name)` (the owner reference the provider adds, with the Provider's UID there);
/// returns the Secret's data (compared, never printed).
async fn provider_owns_secret(
    client: &kube::Client,
    (namespace, name): &(String, &'static str),
    when: &str,
) -> Result<BTreeMap<String, k8s_openapi::ByteString>> {
    let provider = Api::<banlieue_api::banlieue::Provider>::all(client.clone())
        .get_opt(PROVIDER)
        .await?
        .with_context(|| format!("{when}: no Provider {PROVIDER}"))?;
    let uid = provider.metadata.uid.clone().unwrap_or_default();
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
        .with_context(|| format!("{when}: no Secret {namespace}/{name}"))?;
    let owners: Vec<_> = secret.metadata.owner_references.iter().flatten().collect();
    ensure!(
        owners
            .iter()
            .any(|o| o.kind == "Provider" && o.name == PROVIDER && o.uid == uid),
        "{when}: Secret {namespace}/{name} is not owned by Provider {PROVIDER} ({uid}): owners {:?}",
        owners
            .iter()
            .map(|o| format!("{}/{}/{}", o.kind, o.name, o.uid))
            .collect::<Vec<_>>()
    );
    Ok(secret.data.unwrap_or_default())
}

async fn delete_cluster(run: &Run, procs: &mut Managers) -> Result<String> {
    run.api(&capi("Cluster"))
        .delete(CLUSTER, &DeleteParams::default())
        .await?;
    poll(procs, "everything gone", Duration::from_secs(180), async || {
        if run.get(&capi("Cluster"), CLUSTER).await?.is_some() {
            let machines = run.list(&capi("Machine")).await?.len();
            return Ok(Err(format!("Cluster still there ({machines} Machines left)")));
        }
        let vms = run.vms().await?;
        if !vms.is_empty() {
            return Ok(Err(format!("VMs left: {:?}", vms.keys().collect::<Vec<_>>())));
        }
        let leftovers = run.hv.leftovers().await?;
        if !leftovers.is_empty() {
            return Ok(Err(format!("left on the hypervisor: {leftovers:?}")));
        }
        let mut left = Vec::new();
        for kind in ["Cluster", "Machine", "MachineTemplate"].map(|k| run.hv.kind(k)) {
            // The Provider-owned infra cluster of the standalone step is the banlieue
            // controller's, not the Cluster's: it stays with its Provider.
            for obj in run
                .list(&infra(&kind))
                .await?
                .into_iter()
                .filter(|o| owner_kinds(o) != ["Provider"])
            {
                left.push(format!(
                    "{kind}/{} finalizers {}",
                    obj["metadata"]["name"], obj["metadata"]["finalizers"]
                ));
            }
        }
        if !left.is_empty() {
            return Ok(Err(format!("banlieue objects left: {left:?}")));
        }
        Ok(Ok(format!(
            "0 VMs, nothing else on the hypervisor, 0 {} objects",
            run.hv.infra().kind_prefix()
        )))
    })
    .await
}
