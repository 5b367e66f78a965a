//! Workload clusters of real guests on the simulated hypervisors, and CAPI's e2e specs run on them.
//!
//! A [`Scenario`] is one workload cluster from `clusterctl generate cluster` (a template flavor,
//! its control plane and worker counts) and the specs run on it in order, each named after the
//! CAPI e2e spec it mirrors ([`Spec`]). Every VM the simulator runs is a lab guest
//! (`capi/guests.rs`): its real cloud-init reads the seed ISO the provider uploaded and runs
//! CAPI's `kubeadm init`/`join`. The control plane endpoint is `.2` of the lab network: held by
//! the kube-vip stand-in in the default flavor, by the lab's haproxy (`Lab::start_load_balancer`)
//! in the `external-lb` and `clusterclass` flavors. After every step the specs also check that
//! the VMs on the hypervisor match the Machines one to one ([`Fleet::settled`]).
//!
//! [`run`] records one row per spec (pass/fail, what it saw, how long) in a [`Report`]; a spec
//! that fails ends its scenario (the rows after it say they did not run).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use banlieue_conformance::report::{Outcome, Report};
use banlieue_pve_sim::{SimConfig, TemplateSpec};
use banlieue_testenv::guests::{Lab, LoadBalancer, guest_image, kubernetes_layers};
use banlieue_testenv::{TestEnv, TestNamespace, cert_manager_stub_crds};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

#[path = "workload/self_hosted.rs"]
mod self_hosted;

use super::guests::{self, Guests};
use super::hypervisor::{Hypervisor, proxmox_template_for};
use super::{
    AbortOnDrop, CLUSTER, GUEST_KUBERNETES_VERSION, GUEST_STEP_TIMEOUT, Managers, Mode, capi, clusterctl,
    clusterctl_init, condition, condition_status, controller_dir, create_documents, infra, parse_docs, poll,
    resource, run_clusterctl, to_value, workspace,
};

/// The simulated hypervisor whose VMs boot as lab guests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    /// banlieue-proxmox on the Proxmox VE simulator (guests read the NoCloud ISO).
    Proxmox,
    /// banlieue-vsphere on vcsim (guests read the VM's guestinfo through cloud-init's VMware
    /// datasource; a cloud provider stand-in sets the Nodes' providerIDs, as vSphere's CPI does).
    VSphere,
    /// banlieue-libvirt on libvirt's `test:///default` driver, its controllers in this process
    /// (guests read the NoCloud ISO the provider uploaded; their DHCP leases are what the
    /// driver reports as the domains' addresses).
    Libvirt,
}

impl Platform {
    fn label(self) -> &'static str {
        match self {
            Self::Proxmox => "Proxmox (simulator)",
            Self::VSphere => "vSphere (vcsim)",
            Self::Libvirt => "libvirt (test driver)",
        }
    }
}

/// The template flavor a scenario's cluster comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// `cluster-template.yaml`: kube-vip (here its stand-in) holds the endpoint.
    Default,
    /// `cluster-template-external-lb.yaml`: the lab's haproxy serves the endpoint.
    ExternalLb,
    /// `cluster-template-clusterclass.yaml` (Cluster with `spec.topology`), behind haproxy.
    ClusterClass,
}

impl Flavor {
    /// `--flavor`'s value (`None`: the default template).
    fn name(self) -> Option<&'static str> {
        match self {
            Self::Default => None,
            Self::ExternalLb => Some("external-lb"),
            Self::ClusterClass => Some("clusterclass"),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Default => "default flavor (kube-vip stand-in)",
            Self::ExternalLb => "external-lb flavor (haproxy)",
            Self::ClusterClass => "clusterclass flavor (haproxy)",
        }
    }
}

/// One of CAPI's e2e specs, as a banlieue test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spec {
    /// `e2e/quick_start.go`: control plane initialized, a Node per Machine, a working cluster.
    QuickStart,
    /// `e2e/mhc_remediations.go`, workers: a MachineHealthCheck replaces an unhealthy worker.
    MachineRemediation,
    /// `e2e/md_rollout.go`: a new infrastructure template rolls the workers.
    MachineDeploymentRollout,
    /// `e2e/md_scale.go`: workers 1 → 3 → 1.
    MachineDeploymentScale,
    /// The control plane 1 → 3 (`e2e/quick_start.go` with three control plane machines, the
    /// precondition of `e2e/kcp_remediations.go`).
    ControlPlaneScale,
    /// `e2e/kcp_remediations.go`: a MachineHealthCheck replaces an unhealthy control plane
    /// machine of three.
    ControlPlaneRemediation,
    /// `e2e/clusterclass_changes.go`: the class's worker template rotated, the topology rolls
    /// the workers; then its control plane machine template, KCP rolls the control plane.
    ClusterClassChanges,
    /// `e2e/node_drain.go`: a worker deleted while a PodDisruptionBudget blocks its drain; its
    /// other Pods are evicted first, its VM stays while the drain is blocked and goes once the
    /// drain timeout passed.
    NodeDrain,
    /// `e2e/cluster_upgrade.go`: the control plane, then the workers, moved to the next
    /// Kubernetes minor (its own VM template, as image-builder builds one per version); every
    /// Machine replaced, every Node's kubelet and the control plane's images at the new version.
    ClusterUpgrade,
    /// `e2e/self_hosted.go`: CAPI's managers and the provider installed into the workload
    /// cluster by `clusterctl init`, running there as Pods; the cluster moved into itself by
    /// `clusterctl move`; the managers there scale its workers; moved back before deletion.
    SelfHosted,
    /// `e2e/cluster_deletion.go`: the Cluster deleted, no VM and no guest left.
    Deletion,
}

impl Spec {
    /// The row's name in the report: the spec and the CAPI file it mirrors.
    pub fn title(self) -> &'static str {
        match self {
            Self::QuickStart => "quick-start (e2e/quick_start.go)",
            Self::MachineRemediation => "machine remediation, worker (e2e/mhc_remediations.go)",
            Self::MachineDeploymentRollout => "md-rollout (e2e/md_rollout.go)",
            Self::MachineDeploymentScale => "md-scale 1 → 3 → 1 (e2e/md_scale.go)",
            Self::ControlPlaneScale => "kcp-scale 1 → 3 (e2e/quick_start.go, 3 control planes)",
            Self::ControlPlaneRemediation => "kcp remediation (e2e/kcp_remediations.go)",
            Self::ClusterClassChanges => "clusterclass-changes (e2e/clusterclass_changes.go)",
            Self::NodeDrain => "node-drain with a drain timeout (e2e/node_drain.go)",
            Self::ClusterUpgrade => "cluster upgrade to the next minor (e2e/cluster_upgrade.go)",
            Self::SelfHosted => "self-hosted (e2e/self_hosted.go)",
            Self::Deletion => "cluster deletion (e2e/cluster_deletion.go)",
        }
    }
}

/// One workload cluster and the specs run on it.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    pub platform: Platform,
    pub flavor: Flavor,
    pub control_planes: usize,
    pub workers: usize,
    pub specs: &'static [Spec],
}

/// The default flavor: quick-start, worker remediation, md-rollout, md-scale, deletion (CI).
pub const DEFAULT_FLAVOR: Scenario = Scenario {
    platform: Platform::Proxmox,
    flavor: Flavor::Default,
    control_planes: 1,
    workers: 1,
    specs: &[
        Spec::QuickStart,
        Spec::MachineRemediation,
        Spec::MachineDeploymentRollout,
        Spec::MachineDeploymentScale,
        Spec::Deletion,
    ],
};

/// ClusterClass behind haproxy: quick-start, clusterclass-changes, deletion (CI).
pub const CLUSTERCLASS: Scenario = Scenario {
    platform: Platform::Proxmox,
    flavor: Flavor::ClusterClass,
    control_planes: 1,
    workers: 1,
    specs: &[Spec::QuickStart, Spec::ClusterClassChanges, Spec::Deletion],
};

/// An HA control plane behind haproxy: quick-start, kcp-scale, kcp remediation, deletion.
pub const EXTERNAL_LB_HA: Scenario = Scenario {
    platform: Platform::Proxmox,
    flavor: Flavor::ExternalLb,
    control_planes: 1,
    workers: 1,
    specs: &[
        Spec::QuickStart,
        Spec::ControlPlaneScale,
        Spec::ControlPlaneRemediation,
        Spec::NodeDrain,
        Spec::Deletion,
    ],
};

/// The next Kubernetes minor behind haproxy: quick-start on the image's own version, the
/// upgrade (control plane, then workers), deletion. Needs the image's layer of the next minor
/// (`tests/controlplane/build.sh --next`; `tests/workload-matrix.sh` builds it).
pub const UPGRADE: Scenario = Scenario {
    platform: Platform::Proxmox,
    flavor: Flavor::ExternalLb,
    control_planes: 1,
    workers: 1,
    specs: &[Spec::QuickStart, Spec::ClusterUpgrade, Spec::Deletion],
};

/// The cluster moved into itself behind haproxy: quick-start, self-hosted, deletion. The
/// simulator listens on the lab bridge, where the provider's Pod in the workload cluster reaches
/// it (its certificate names that address).
pub const SELF_HOSTED: Scenario = Scenario {
    platform: Platform::Proxmox,
    flavor: Flavor::ExternalLb,
    control_planes: 1,
    workers: 1,
    specs: &[Spec::QuickStart, Spec::SelfHosted, Spec::Deletion],
};

/// The specs the issue asks of every platform besides Proxmox: quick-start, worker remediation,
/// md-rollout, deletion.
const EVERY_PLATFORM_SPECS: &[Spec] = &[
    Spec::QuickStart,
    Spec::MachineRemediation,
    Spec::MachineDeploymentRollout,
    Spec::Deletion,
];

/// vSphere's default flavor on vcsim: [`EVERY_PLATFORM_SPECS`].
pub const VSPHERE_DEFAULT: Scenario = Scenario {
    platform: Platform::VSphere,
    flavor: Flavor::Default,
    control_planes: 1,
    workers: 1,
    specs: EVERY_PLATFORM_SPECS,
};

/// libvirt's default flavor on its test driver: [`EVERY_PLATFORM_SPECS`].
pub const LIBVIRT_DEFAULT: Scenario = Scenario {
    platform: Platform::Libvirt,
    flavor: Flavor::Default,
    control_planes: 1,
    workers: 1,
    specs: EVERY_PLATFORM_SPECS,
};

/// Runs `scenario` on a fresh management cluster, lab and simulator, recording one row per
/// spec in `report`; fails when a spec failed.
pub async fn run(scenario: &Scenario, report: &mut Report) -> Result<()> {
    let section = format!("{}, {}", scenario.platform.label(), scenario.flavor.label());
    let set_up_started = Instant::now();
    let mut w = match Workload::start(scenario).await {
        Ok(w) => w,
        Err(e) => {
            report.record(
                &section,
                "set-up",
                Outcome::fail(format!("{e:#}")),
                Some(set_up_started.elapsed()),
            );
            for spec in scenario.specs {
                report.record(
                    &section,
                    spec.title(),
                    Outcome::skip("not run: the set-up failed"),
                    None,
                );
            }
            return Err(e);
        }
    };
    let mut failed: Option<(Spec, anyhow::Error)> = None;
    for spec in scenario.specs {
        if let Some((first, _)) = &failed {
            report.record(
                &section,
                spec.title(),
                Outcome::skip(format!("not run: {} failed first", first.title())),
                None,
            );
            continue;
        }
        w.env.progress(&format!("{} …", spec.title()));
        let started = Instant::now();
        match w.run(*spec).await {
            Ok(detail) => {
                w.env.progress(&format!("{}: {detail}", spec.title()));
                report.record(
                    &section,
                    spec.title(),
                    Outcome::pass(detail),
                    Some(started.elapsed()),
                );
            }
            Err(e) => {
                w.env.dump_guests(&e);
                report.record(
                    &section,
                    spec.title(),
                    Outcome::fail(format!("{e:#}")),
                    Some(started.elapsed()),
                );
                failed = Some((*spec, e));
            }
        }
    }
    match failed {
        Some((spec, e)) => Err(e.context(format!("{section}: {}", spec.title()))),
        None => Ok(()),
    }
}

/// One progress line of a scenario started at `started` on stderr.
fn progress(scenario: &Scenario, started: Instant, what: &str) {
    eprintln!(
        "[{:?} {:?} {:6.1}s] {what}",
        scenario.platform,
        scenario.flavor,
        started.elapsed().as_secs_f32()
    );
}

/// A scenario's management cluster and managers (apart: waits hold the managers mutably).
struct Workload {
    procs: Managers,
    env: Env,
}

/// Everything of a scenario but its managers. Fields drop in order: the guest driver stops
/// first, the lab goes last.
struct Env {
    _driver: guests::Driver,
    /// vSphere: the cloud provider stand-in (once the workload cluster's kubeconfig exists).
    _cloud_provider: Option<AbortOnDrop>,
    load_balancer: Option<LoadBalancer>,
    running: Guests,
    guest_log: PathBuf,
    scenario: Scenario,
    started: Instant,
    /// When the workload cluster's objects were applied.
    applied: Instant,
    client: kube::Client,
    ns: String,
    hv: Arc<Hypervisor>,
    /// The workload cluster, through `clusterctl get kubeconfig` (after quick-start).
    workload: Option<kube::Client>,
    /// That kubeconfig's file (after quick-start).
    workload_kubeconfig: Option<PathBuf>,
    pod_cidr: String,
    /// The Kubernetes version the image has a layer for besides its own, and the template
    /// whose VMs boot it (scenarios with [`Spec::ClusterUpgrade`]).
    next_kubernetes: Option<String>,
    _ns_guard: TestNamespace,
    mgmt: TestEnv,
    _lab: Arc<Lab>,
}

impl Workload {
    /// The management cluster (CAPI's managers and banlieue-proxmox as processes, after the
    /// real `clusterctl init`), the simulator, the lab and its guest driver, and the workload
    /// cluster of `scenario` applied.
    async fn start(scenario: &Scenario) -> Result<Self> {
        let started = Instant::now();
        let progress = |what: &str| progress(scenario, started, what);
        let image = tokio::task::spawn_blocking(guest_image).await??;
        progress("guest image ready");
        let next_kubernetes = if scenario.specs.contains(&Spec::ClusterUpgrade) {
            let layers = kubernetes_layers(&image);
            Some(layers.last().cloned().with_context(|| {
                format!(
                    "the guest image {} has no layer of a second Kubernetes version to upgrade to: \
                     build it with tests/controlplane/build.sh --next, then tests/guest/build.sh \
                     (tests/workload-matrix.sh does both)",
                    image.display()
                )
            })?)
        } else {
            None
        };
        let lab = Arc::new(Lab::create()?);
        let mut crds: Vec<_> = banlieue_api::crds::all()
            .into_iter()
            .filter(|crd| crd.spec.group != banlieue_api::INFRASTRUCTURE_GROUP)
            .collect();
        crds.extend(cert_manager_stub_crds()?);
        let mgmt = TestEnv::builder()
            .allow_external(false)
            .crds(crds)
            .start()
            .await?;
        let client = mgmt.client().await?;
        let ns_guard = mgmt.namespace("workload").await?;
        let ns = ns_guard.name().to_owned();
        let hv = Arc::new(match scenario.platform {
            Platform::Proxmox => Hypervisor::Proxmox(Arc::new(
                banlieue_pve_sim::start(SimConfig {
                    nodes: vec!["pve1".into()],
                    external_guests: true,
                    templates: std::iter::once(TemplateSpec::ubuntu("pve1"))
                        .chain(next_kubernetes.as_deref().map(proxmox_template_for))
                        .collect(),
                    // Self-hosted: the provider's Pod in the workload cluster reaches it there.
                    bind_address: if scenario.specs.contains(&Spec::SelfHosted) {
                        lab.gateway()
                    } else {
                        SimConfig::fast().bind_address
                    },
                    ..SimConfig::fast()
                })
                .await?,
            )),
            Platform::VSphere => Hypervisor::vcsim().await?,
            Platform::Libvirt => Hypervisor::libvirt_test_driver().await?,
        });
        let config = clusterctl_init(&mgmt, &hv, Mode::Processes).await?;
        let procs = Managers::start(Mode::Processes, &hv, &mgmt, "mgmt-node", &controller_dir()?).await?;
        let running: Guests = Arc::default();
        let guest_log = mgmt.workdir().join("logs/guests.log");
        let driver = guests::drive(
            hv.clone(),
            lab.clone(),
            image,
            mgmt.workdir().join("guests"),
            running.clone(),
            guest_log.clone(),
        );
        let load_balancer = match scenario.flavor {
            Flavor::Default => None,
            Flavor::ExternalLb | Flavor::ClusterClass => Some(lab.start_load_balancer(2, 6443)?),
        };
        progress(&format!(
            "management cluster, CAPI's managers and {} up",
            hv.infra().name()
        ));
        let endpoint = lab.address(2).to_string();
        let mut env = Env {
            _driver: driver,
            _cloud_provider: None,
            load_balancer,
            running,
            guest_log,
            scenario: *scenario,
            started,
            applied: started,
            client,
            ns,
            hv: hv.clone(),
            workload: None,
            workload_kubeconfig: None,
            pod_cidr: String::new(),
            next_kubernetes,
            _ns_guard: ns_guard,
            mgmt,
            _lab: lab,
        };
        env.apply_cluster(&config, &hv, &endpoint).await?;
        Ok(Self { procs, env })
    }

    async fn run(&mut self, spec: Spec) -> Result<String> {
        match spec {
            Spec::QuickStart => self.quick_start().await,
            Spec::MachineRemediation => self.machine_remediation().await,
            Spec::MachineDeploymentRollout => self.md_rollout().await,
            Spec::MachineDeploymentScale => self.md_scale().await,
            Spec::ControlPlaneScale => self.control_plane_scale().await,
            Spec::ControlPlaneRemediation => self.control_plane_remediation().await,
            Spec::ClusterClassChanges => self.clusterclass_changes().await,
            Spec::NodeDrain => self.node_drain().await,
            Spec::ClusterUpgrade => self.cluster_upgrade().await,
            Spec::SelfHosted => self.self_hosted().await,
            Spec::Deletion => self.deletion().await,
        }
    }
}

/// What the management cluster, the workload cluster and the hypervisor hold at one moment.
#[derive(Debug)]
struct Fleet {
    /// Machine name → (its Node, if any; its infrastructure machine's VM id, if any; control
    /// plane?).
    machines: BTreeMap<String, (Option<String>, Option<String>, bool)>,
    /// The workload cluster's Nodes.
    nodes: BTreeSet<String>,
    /// Each Node's kubelet version.
    kubelets: BTreeMap<String, String>,
    /// The hypervisor's VMs (templates aside) and whether each runs.
    vms: BTreeMap<String, bool>,
    /// Each VM's configured memory (MiB).
    memory: BTreeMap<String, Option<u64>>,
    /// The VMs whose guest is powered on.
    guests: BTreeSet<String>,
}

impl Fleet {
    /// `Ok` when there are `control_planes` + `workers` Machines, each with a Node and a VM,
    /// the Nodes are exactly the Machines', and every VM runs, has a guest and is a Machine's.
    fn settled(&self, control_planes: usize, workers: usize) -> Result<(), String> {
        let cps = self.machines.values().filter(|m| m.2).count();
        let node_refs: BTreeSet<String> = self.machines.values().filter_map(|m| m.0.clone()).collect();
        let vmids: BTreeSet<String> = self.machines.values().filter_map(|m| m.1.clone()).collect();
        let vms: BTreeSet<String> = self.vms.keys().cloned().collect();
        let all_run = self.vms.values().all(|running| *running);
        if cps == control_planes
            && self.machines.len() == control_planes + workers
            && node_refs.len() == self.machines.len()
            && node_refs == self.nodes
            && vmids.len() == self.machines.len()
            && vmids == vms
            && vms == self.guests
            && all_run
        {
            Ok(())
        } else {
            Err(format!(
                "want {control_planes} control plane + {workers} worker Machines each with a Node, a \
                 running VM and its guest; have {} Machines ({cps} control plane, {} with a Node, {} \
                 with a VM), Nodes {:?}, VMs {:?}, guests {:?}",
                self.machines.len(),
                node_refs.len(),
                vmids.len(),
                self.nodes,
                self.vms,
                self.guests
            ))
        }
    }

    /// The Machines (names) of the control plane, or of the workers.
    fn machine_names(&self, control_plane: bool) -> BTreeSet<String> {
        self.machines
            .iter()
            .filter(|(_, m)| m.2 == control_plane)
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn node_of(&self, machine: &str) -> Option<String> {
        self.machines.get(machine).and_then(|m| m.0.clone())
    }
}

impl Env {
    fn progress(&self, what: &str) {
        progress(&self.scenario, self.started, what);
    }

    fn api(&self, ar: &kube::api::ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.ns, ar)
    }

    fn workload(&self) -> Result<&kube::Client> {
        self.workload
            .as_ref()
            .context("the workload cluster's kubeconfig (quick-start first)")
    }

    /// One line per guest: its console's last line.
    fn guest_state(&self) -> String {
        let guests = self.running.lock().expect("guests lock");
        guests
            .values()
            .map(|g| format!("guest {}: {}", g.name(), g.console_tail(1).trim()))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// On a failure: the guest driver's log and every guest's boot report, in one place.
    fn dump_guests(&self, error: &anyhow::Error) {
        eprintln!(
            "{:?} failed: {error:#}\nguest driver log ({}):\n{}",
            self.scenario.flavor,
            self.guest_log.display(),
            std::fs::read_to_string(&self.guest_log).unwrap_or_default()
        );
        if let Some(lb) = &self.load_balancer {
            eprintln!("== load balancer ==\n{}", lb.log_tail(20));
        }
        for guest in self.running.lock().expect("guests lock").values() {
            eprintln!("{}", guest.boot_report(40));
        }
    }

    async fn fleet(&self) -> Result<Fleet> {
        let infra_machines = self.api(&infra(&self.hv.kind("Machine")));
        let mut machines = BTreeMap::new();
        for m in self
            .api(&capi("Machine"))
            .list(&ListParams::default())
            .await?
            .items
        {
            let m = to_value(&m);
            let infra_name = m["spec"]["infrastructureRef"]["name"]
                .as_str()
                .unwrap_or_default();
            let vmid = match infra_machines.get_opt(infra_name).await? {
                Some(im) => self.hv.vm_id(&to_value(&im)),
                None => None,
            };
            machines.insert(
                m["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
                (
                    m["status"]["nodeRef"]["name"].as_str().map(str::to_owned),
                    vmid,
                    m["metadata"]["labels"]
                        .get("cluster.x-k8s.io/control-plane")
                        .is_some(),
                ),
            );
        }
        let kubelets: BTreeMap<String, String> = match &self.workload {
            Some(workload) => Api::<Node>::all(workload.clone())
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|n| {
                    let version = n
                        .status
                        .and_then(|s| s.node_info)
                        .map(|i| i.kubelet_version)
                        .unwrap_or_default();
                    n.metadata.name.map(|name| (name, version))
                })
                .collect(),
            None => BTreeMap::new(),
        };
        let nodes = kubelets.keys().cloned().collect();
        let lab_vms = self.hv.lab_vms().await?;
        let vms = lab_vms.iter().map(|vm| (vm.id.clone(), vm.running)).collect();
        let memory = lab_vms.iter().map(|vm| (vm.id.clone(), vm.memory_mib)).collect();
        // A guest whose init died is not a running guest.
        let guests = self
            .running
            .lock()
            .expect("guests lock")
            .iter_mut()
            .filter_map(|(id, guest)| guest.is_running().then(|| id.clone()))
            .collect();
        Ok(Fleet {
            machines,
            kubelets,
            nodes,
            vms,
            memory,
            guests,
        })
    }

    /// `clusterctl generate cluster` with the scenario's flavor and counts, applied as a user
    /// would, with the CNI of CAPI's quick-start (flannel by a ClusterResourceSet).
    async fn apply_cluster(
        &mut self,
        config: &std::path::Path,
        hv: &Hypervisor,
        endpoint: &str,
    ) -> Result<()> {
        let mut cmd = clusterctl(&self.mgmt)?;
        cmd.args(["generate", "cluster", CLUSTER, "--infrastructure"])
            .arg(format!("{}:{}", hv.infra().name(), banlieue_clusterctl::VERSION))
            .arg(format!("--config={}", config.display()))
            .arg(format!("--kubeconfig={}", self.mgmt.admin().path().display()))
            .args(["--target-namespace", &self.ns])
            .args(["--kubernetes-version", GUEST_KUBERNETES_VERSION])
            .arg(format!(
                "--control-plane-machine-count={}",
                self.scenario.control_planes
            ))
            .arg(format!("--worker-machine-count={}", self.scenario.workers))
            .envs(hv.template_variables(&self.ns))
            .env("CONTROL_PLANE_ENDPOINT_IP", endpoint)
            .env("CONTROL_PLANE_ENDPOINT_PORT", "6443");
        if let Some(flavor) = self.scenario.flavor.name() {
            cmd.args(["--flavor", flavor]);
        }
        let text = run_clusterctl(&mut cmd, "clusterctl generate cluster")?;
        let mut docs = parse_docs(&text)?;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.ns);
        if let Some((name, data)) = hv.credentials() {
            let creds: Secret =
                serde_json::from_value(json!({"metadata": {"name": name}, "stringData": data}))?;
            secrets.create(&PostParams::default(), &creds).await?;
        }
        self.pod_cidr = docs
            .iter()
            .find(|d| d["kind"] == "Cluster")
            .and_then(|c| c["spec"]["clusterNetwork"]["pods"]["cidrBlocks"][0].as_str())
            .context("the Cluster's Pod CIDR")?
            .to_owned();
        self.install_flannel_resource_set().await?;
        for doc in docs.iter_mut().filter(|d| d["kind"] == "Cluster") {
            doc["metadata"]["labels"]["cni"] = json!("flannel");
        }
        // The lab's guests share the host's kernel, whose conntrack table a guest cannot size (a
        // VM has its own): kube-proxy leaves it alone, as kind configures it. kubeadm reads
        // kube-proxy's configuration from its own file, which CAPI's bootstrap data writes; the
        // usual way to add to it is a command before kubeadm runs.
        let append = "if [ -f /run/kubeadm/kubeadm.yaml ]; then printf '%s\\n' '' '---' 'apiVersion: kubeproxy.config.k8s.io/v1alpha1' 'kind: KubeProxyConfiguration' 'conntrack:' '  maxPerCore: 0' >> /run/kubeadm/kubeadm.yaml; fi";
        for doc in docs.iter_mut() {
            let spec = match doc["kind"].as_str() {
                Some("KubeadmControlPlane") => &mut doc["spec"]["kubeadmConfigSpec"],
                Some("KubeadmControlPlaneTemplate") => {
                    &mut doc["spec"]["template"]["spec"]["kubeadmConfigSpec"]
                }
                _ => continue,
            };
            let commands = &mut spec["preKubeadmCommands"];
            match commands.as_array_mut() {
                Some(list) => list.push(json!(append)),
                None => *commands = json!([append]),
            }
        }
        create_documents(&self.client, &self.ns, &docs).await?;
        self.applied = Instant::now();
        self.progress(&format!(
            "clusterctl generate cluster ({}, {} control plane, {} worker) applied",
            self.scenario.flavor.label(),
            self.scenario.control_planes,
            self.scenario.workers
        ));
        Ok(())
    }

    /// Flannel's own manifest in a ConfigMap, applied to every Cluster labelled `cni: flannel`
    /// by a ClusterResourceSet, as CAPI's quick-start installs its CNI.
    async fn install_flannel_resource_set(&self) -> Result<()> {
        let flannel = std::fs::read_to_string(workspace().join("tests/guest/flannel/kube-flannel.yml"))?;
        ensure!(
            flannel.contains(r#""Network": "10.244.0.0/16""#),
            "kube-flannel.yml changed: no default Network"
        );
        // Flannel's CNI plugin is the last one built into containernetworking/plugins (v0.9.1,
        // the one served here), which speaks CNI up to 0.4.0.
        let flannel = flannel
            .replace(
                r#""Network": "10.244.0.0/16""#,
                &format!(r#""Network": "{}""#, self.pod_cidr),
            )
            .replace(r#""cniVersion": "1.0.0""#, r#""cniVersion": "0.4.0""#);
        Api::<ConfigMap>::namespaced(self.client.clone(), &self.ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": "flannel"}, "data": {"kube-flannel.yml": flannel}}),
                )?,
            )
            .await?;
        let crs: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "addons.cluster.x-k8s.io/v1beta2", "kind": "ClusterResourceSet",
            "metadata": {"name": "flannel"},
            "spec": {
                "clusterSelector": {"matchLabels": {"cni": "flannel"}},
                "resources": [{"kind": "ConfigMap", "name": "flannel"}],
                "strategy": "ApplyOnce",
            },
        }))?;
        self.api(&resource(
            "addons.cluster.x-k8s.io",
            "v1beta2",
            "ClusterResourceSet",
        ))
        .create(&PostParams::default(), &crs)
        .await
        .context("creating the ClusterResourceSet")?;
        Ok(())
    }

    /// Creates machine template `new` as a copy of `old` with 512 MiB more memory (what the
    /// rollout specs change); returns the new memory.
    async fn copy_with_more_memory(&self, old: &str, new: &str) -> Result<u64> {
        let mut memory = 0;
        self.copy_template(old, new, |spec| {
            memory = spec["memoryMiB"]
                .as_u64()
                .with_context(|| format!("the memoryMiB of template {old}"))?
                + 512;
            spec["memoryMiB"] = json!(memory);
            Ok(())
        })
        .await?;
        Ok(memory)
    }

    /// Creates machine template `new`, a copy of `old` whose machine spec `edit` changed.
    async fn copy_template(
        &self,
        old: &str,
        new: &str,
        edit: impl FnOnce(&mut Value) -> Result<()>,
    ) -> Result<()> {
        let templates = self.api(&infra(&self.hv.kind("MachineTemplate")));
        let mut template = to_value(&templates.get(old).await?);
        edit(&mut template["spec"]["template"]["spec"])?;
        let copy: DynamicObject = serde_json::from_value(json!({
            "apiVersion": template["apiVersion"], "kind": template["kind"],
            "metadata": {"name": new},
            "spec": template["spec"],
        }))?;
        templates.create(&PostParams::default(), &copy).await?;
        Ok(())
    }

    /// The only MachineDeployment of the cluster (the topology names it in the clusterclass
    /// flavor).
    async fn machine_deployment(&self) -> Result<String> {
        let list = self
            .api(&capi("MachineDeployment"))
            .list(&ListParams::default())
            .await?
            .items;
        ensure!(list.len() == 1, "{} MachineDeployments, want 1", list.len());
        list[0]
            .metadata
            .name
            .clone()
            .context("a MachineDeployment without a name")
    }

    /// Marks `node` unhealthy with the condition the remediation specs' MachineHealthChecks
    /// watch.
    async fn mark_unhealthy(&self, node: &str) -> Result<()> {
        let unhealthy = json!({"status": {"conditions": [{
            "type": "e2e.remediation.condition", "status": "False",
            "reason": "RemediationRequested", "message": "set by the remediation spec",
            "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
        }]}});
        Api::<Node>::all(self.workload()?.clone())
            .patch_status(node, &PatchParams::default(), &Patch::Strategic(&unhealthy))
            .await
            .with_context(|| format!("marking Node {node} unhealthy"))?;
        Ok(())
    }

    /// A MachineHealthCheck over the Machines matching `labels`, remediating on the specs'
    /// condition.
    async fn create_health_check(&self, name: &str, labels: Value) -> Result<()> {
        let mhc: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineHealthCheck",
            "metadata": {"name": name},
            "spec": {
                "clusterName": CLUSTER,
                "selector": {"matchLabels": labels},
                "checks": {"unhealthyNodeConditions": [
                    {"type": "e2e.remediation.condition", "status": "False", "timeoutSeconds": 10}]},
            },
        }))?;
        self.api(&capi("MachineHealthCheck"))
            .create(&PostParams::default(), &mhc)
            .await
            .with_context(|| format!("creating the MachineHealthCheck {name}"))?;
        Ok(())
    }
}

impl Workload {
    fn counts(&self) -> (usize, usize) {
        (self.env.scenario.control_planes, self.env.scenario.workers)
    }

    /// Waits until the fleet is settled at `control_planes` + `workers` and `extra` holds.
    async fn settle(
        &mut self,
        what: &str,
        (control_planes, workers): (usize, usize),
        mut extra: impl FnMut(&Fleet) -> Result<(), String>,
    ) -> Result<Fleet> {
        let env = &self.env;
        poll(&mut self.procs, what, GUEST_STEP_TIMEOUT, async || {
            let fleet = env.fleet().await?;
            Ok(
                match fleet
                    .settled(control_planes, workers)
                    .and_then(|()| extra(&fleet))
                {
                    Ok(()) => Ok(fleet),
                    Err(state) => Err(format!("{state}; {}", env.guest_state())),
                },
            )
        })
        .await
    }

    async fn quick_start(&mut self) -> Result<String> {
        let env = &self.env;
        let clusters = env.api(&capi("Cluster"));
        poll(
            &mut self.procs,
            "the control plane to be initialized",
            GUEST_STEP_TIMEOUT,
            async || {
                let cluster = to_value(&clusters.get(CLUSTER).await?);
                Ok(
                    match condition_status(&cluster, "ControlPlaneInitialized").as_deref() {
                        Some("True") => Ok(()),
                        _ => Err(format!(
                            "{}; {}",
                            condition(&cluster, "ControlPlaneInitialized")
                                .map(|c| c["message"].to_string())
                                .unwrap_or_default(),
                            env.guest_state()
                        )),
                    },
                )
            },
        )
        .await?;
        let initialized = env.applied.elapsed();
        env.progress("control plane initialized (kubeadm init ran in the first VM)");
        // The workload cluster itself, through the kubeconfig CAPI wrote.
        let kubeconfig = run_clusterctl(
            clusterctl(&self.env.mgmt)?
                .args(["get", "kubeconfig", CLUSTER, "--namespace", &self.env.ns])
                .arg(format!("--kubeconfig={}", self.env.mgmt.admin().path().display())),
            "clusterctl get kubeconfig",
        )?;
        let kubeconfig_file = self.env.mgmt.workdir().join("workload.kubeconfig");
        std::fs::write(&kubeconfig_file, &kubeconfig)
            .with_context(|| format!("writing {}", kubeconfig_file.display()))?;
        self.env.workload_kubeconfig = Some(kubeconfig_file);
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&kubeconfig)?;
        let workload = kube::Client::try_from(
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?,
        )?;
        if self.env.scenario.platform == Platform::VSphere {
            // What vSphere's cloud provider (CPI) does for a kubelet run with
            // `--cloud-provider=external`; its module is not served here (see cloud_provider_stand_in).
            self.env._cloud_provider = Some(AbortOnDrop(tokio::spawn(cloud_provider_stand_in(
                workload.clone(),
                self.env.hv.clone(),
                self.env.mgmt.workdir().join("logs/cloud-provider.log"),
            ))));
        }
        let env = &self.env;
        let (control_planes, workers) = self.counts();
        let machines = env.api(&capi("Machine"));
        let provider_ids = poll(
            &mut self.procs,
            "every Machine to get its Node",
            GUEST_STEP_TIMEOUT,
            async || {
                let list: Vec<Value> = machines
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .map(to_value)
                    .collect();
                let refs: BTreeMap<String, String> = list
                    .iter()
                    .filter_map(|m| {
                        Some((
                            m["status"]["nodeRef"]["name"].as_str()?.to_owned(),
                            m["spec"]["providerID"].as_str()?.to_owned(),
                        ))
                    })
                    .collect();
                Ok(
                    if list.len() == control_planes + workers && refs.len() == list.len() {
                        Ok(refs)
                    } else {
                        Err(format!(
                            "{} of {} Machines have a nodeRef; {}",
                            refs.len(),
                            list.len(),
                            env.guest_state()
                        ))
                    },
                )
            },
        )
        .await?;

        let seen: BTreeMap<String, String> = Api::<Node>::all(workload.clone())
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|n| {
                (
                    n.metadata.name.clone().unwrap_or_default(),
                    n.spec
                        .as_ref()
                        .and_then(|s| s.provider_id.clone())
                        .unwrap_or_default(),
                )
            })
            .collect();
        ensure!(
            seen == provider_ids,
            "the workload cluster's Nodes {seen:?} are not the Machines' nodeRefs and providerIDs {provider_ids:?}"
        );
        self.env.workload = Some(workload.clone());
        self.settle(
            "one VM and one guest per Machine",
            (control_planes, workers),
            |_| Ok(()),
        )
        .await?;

        // The seeds as real cloud-init read them: every module of every stage succeeded.
        let env = &self.env;
        let verdicts = poll(
            &mut self.procs,
            "cloud-init to finish on every guest",
            GUEST_STEP_TIMEOUT,
            async || {
                let guests = env.running.lock().expect("guests lock");
                let verdicts: Vec<(String, Option<Vec<String>>, String)> = guests
                    .values()
                    .map(|g| (g.name().to_owned(), g.cloud_init_errors(), g.boot_report(30)))
                    .collect();
                Ok(if verdicts.iter().all(|(_, errors, _)| errors.is_some()) {
                    Ok(verdicts)
                } else {
                    Err(format!(
                        "cloud-init still running on {:?}",
                        verdicts
                            .iter()
                            .filter(|v| v.1.is_none())
                            .map(|v| &v.0)
                            .collect::<Vec<_>>()
                    ))
                })
            },
        )
        .await?;
        for (name, errors, report) in verdicts {
            ensure!(
                errors.as_ref().is_some_and(Vec::is_empty),
                "cloud-init on guest {name} reported errors: {errors:?}\n{report}"
            );
        }
        {
            // The provider followed the same cloud-init: it read each guest's report (Proxmox and
            // libvirt: through the guest agent; vSphere: as the vendor data's script published
            // it in the guest's guestinfo), and every machine's Ready turned True after
            // WaitingForCloudInit.
            let infra_machines = env.api(&infra(&env.hv.kind("Machine")));
            poll(
                &mut self.procs,
                "every infrastructure machine Ready once cloud-init finished in its guest",
                GUEST_STEP_TIMEOUT,
                async || {
                    let waiting: Vec<String> = infra_machines
                        .list(&ListParams::default())
                        .await?
                        .items
                        .iter()
                        .map(to_value)
                        .filter(|m| condition_status(m, "Ready").as_deref() != Some("True"))
                        .map(|m| {
                            format!(
                                "{}: {}",
                                m["metadata"]["name"].as_str().unwrap_or_default(),
                                condition(&m, "Ready").map(|c| c.to_string()).unwrap_or_default()
                            )
                        })
                        .collect();
                    Ok(if waiting.is_empty() {
                        Ok(())
                    } else {
                        Err(waiting.join("; "))
                    })
                },
            )
            .await?;
        }

        // A working cluster: flannel (from the ClusterResourceSet) makes every Node Ready,
        // CoreDNS (which reaches the API through its Service, so kube-proxy works) becomes
        // available, and a Pod runs on a worker with an address of the Pod network.
        let node_api: Api<Node> = Api::all(workload.clone());
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(workload.clone(), "kube-system");
        poll(
            &mut self.procs,
            "every Node Ready and CoreDNS available",
            GUEST_STEP_TIMEOUT,
            async || {
                let not_ready: Vec<String> = node_api
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .filter(|n| {
                        !n.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                    })
                    .map(|n| n.metadata.name.clone().unwrap_or_default())
                    .collect();
                let coredns = deployments.get("coredns").await?;
                let ready = coredns
                    .status
                    .as_ref()
                    .and_then(|s| s.ready_replicas)
                    .unwrap_or(0);
                let wanted = coredns.spec.replicas.unwrap_or(1);
                Ok(if not_ready.is_empty() && ready == wanted {
                    Ok(())
                } else {
                    Err(format!(
                        "Nodes not Ready: {not_ready:?}; CoreDNS {ready}/{wanted} ready"
                    ))
                })
            },
        )
        .await?;
        let ready = self.env.applied.elapsed();
        let fleet = self.env.fleet().await?;
        let worker = fleet
            .machine_names(false)
            .iter()
            .find_map(|m| fleet.node_of(m))
            .context("a worker's Node")?;
        let pods: Api<Pod> = Api::namespaced(workload.clone(), "default");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "on-the-worker"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": worker},
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}],
            },
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        let pod_ip = poll(
            &mut self.procs,
            "a Pod running on the worker",
            GUEST_STEP_TIMEOUT,
            async || {
                let status = pods.get("on-the-worker").await?.status.unwrap_or_default();
                Ok(match (status.phase.as_deref(), status.pod_ip) {
                    (Some("Running"), Some(ip)) => Ok(ip),
                    (phase, _) => Err(format!("phase {phase:?}")),
                })
            },
        )
        .await?;
        ensure!(
            in_network(&pod_ip, &self.env.pod_cidr),
            "the Pod's address {pod_ip} is not in the Pod network {}",
            self.env.pod_cidr
        );
        let memory: Vec<String> = self
            .env
            .running
            .lock()
            .expect("guests lock")
            .values()
            .map(|g| format!("guest {} {} MiB", g.name(), g.memory_bytes().unwrap_or(0) >> 20))
            .collect();
        Ok(format!(
            "control plane initialized {:.0} s after apply, every Node Ready and CoreDNS available at \
             {:.0} s; Nodes {:?} carry the Machines' providerIDs; cloud-init without an error; Pod on \
             worker {worker} at {pod_ip}; memory (cgroup usage) {}",
            initialized.as_secs_f32(),
            ready.as_secs_f32(),
            provider_ids.keys().collect::<Vec<_>>(),
            memory.join(", ")
        ))
    }

    async fn machine_remediation(&mut self) -> Result<String> {
        let deployment = self.env.machine_deployment().await?;
        let fleet = self.env.fleet().await?;
        let old = fleet
            .machine_names(false)
            .into_iter()
            .next()
            .context("a worker Machine")?;
        let old_node = fleet.node_of(&old).context("the worker's Node")?;
        self.env
            .create_health_check("workers", json!({"cluster.x-k8s.io/deployment-name": deployment}))
            .await?;
        self.env.mark_unhealthy(&old_node).await?;
        let counts = self.counts();
        let fleet = self
            .settle("the worker to be remediated and replaced", counts, |f| {
                if f.machines.contains_key(&old) || f.nodes.contains(&old_node) {
                    Err(format!("the old worker {old} (Node {old_node}) is still there"))
                } else {
                    Ok(())
                }
            })
            .await?;
        let new: Vec<String> = fleet.machine_names(false).into_iter().collect();
        Ok(format!(
            "Machine {old} (Node {old_node}) marked unhealthy, replaced by {new:?}; one VM and one guest per Machine"
        ))
    }

    async fn md_rollout(&mut self) -> Result<String> {
        let deployment = self.env.machine_deployment().await?;
        let md_api = self.env.api(&capi("MachineDeployment"));
        let md = to_value(&md_api.get(&deployment).await?);
        let old_template = md["spec"]["template"]["spec"]["infrastructureRef"]["name"]
            .as_str()
            .context("the MachineDeployment's infrastructure template")?
            .to_owned();
        let new_template = format!("{old_template}-rollout");
        let memory = self
            .env
            .copy_with_more_memory(&old_template, &new_template)
            .await?;
        let before = self.env.fleet().await?.machine_names(false);
        md_api
            .patch(
                &deployment,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"spec": {"template": {"spec": {"infrastructureRef": {"name": new_template}}}}}),
                ),
            )
            .await?;
        self.rolled(false, &before, memory).await?;
        Ok(format!(
            "MachineDeployment moved to {new_template}: every worker replaced, its VM with {memory} MiB"
        ))
    }

    /// Waits until no worker (or control plane Machine) of `before` is left and every worker's
    /// (control plane Machine's) VM has `memory` MiB.
    async fn rolled(&mut self, control_plane: bool, before: &BTreeSet<String>, memory: u64) -> Result<()> {
        let counts = self.counts();
        let what = if control_plane {
            "control plane"
        } else {
            "workers'"
        };
        self.settle(&format!("the {what} rollout"), counts, |f| {
            let old: Vec<String> = f
                .machine_names(control_plane)
                .into_iter()
                .filter(|m| before.contains(m))
                .collect();
            let wrong: Vec<String> = f
                .machine_names(control_plane)
                .iter()
                .filter_map(|m| {
                    let vmid = f.machines[m].1.clone()?;
                    let got = f.memory.get(&vmid).copied().flatten();
                    (got != Some(memory)).then(|| format!("{m}: VM {vmid} memory {got:?}"))
                })
                .collect();
            if old.is_empty() && wrong.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "old Machines {old:?} left; Machines with other memory than {memory}: {wrong:?}"
                ))
            }
        })
        .await?;
        Ok(())
    }

    async fn md_scale(&mut self) -> Result<String> {
        let deployment = self.env.machine_deployment().await?;
        let md_api = self.env.api(&capi("MachineDeployment"));
        let control_planes = self.env.scenario.control_planes;
        let mut seen = Vec::new();
        for replicas in [3usize, 1] {
            md_api
                .patch(
                    &deployment,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": replicas}})),
                )
                .await?;
            self.settle(
                &format!("{replicas} workers with their Nodes"),
                (control_planes, replicas),
                |_| Ok(()),
            )
            .await?;
            seen.push(replicas.to_string());
        }
        self.env.scenario.workers = 1;
        Ok(format!(
            "scaled to {}: after each, one Node, one running VM and one guest per Machine",
            seen.join(" then ")
        ))
    }

    async fn control_plane_scale(&mut self) -> Result<String> {
        let replicas = 3;
        match self.env.scenario.flavor {
            Flavor::ClusterClass => {
                self.env
                    .api(&capi("Cluster"))
                    .patch(
                        CLUSTER,
                        &PatchParams::default(),
                        &Patch::Merge(
                            json!({"spec": {"topology": {"controlPlane": {"replicas": replicas}}}}),
                        ),
                    )
                    .await?;
            }
            Flavor::Default | Flavor::ExternalLb => {
                self.env
                    .api(&resource(
                        "controlplane.cluster.x-k8s.io",
                        "v1beta2",
                        "KubeadmControlPlane",
                    ))
                    .patch(
                        &format!("{CLUSTER}-control-plane"),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"replicas": replicas}})),
                    )
                    .await?;
            }
        }
        let workers = self.env.scenario.workers;
        self.settle(
            "three control plane Machines with their Nodes",
            (replicas, workers),
            |_| Ok(()),
        )
        .await?;
        self.env.scenario.control_planes = replicas;
        let members = self.etcd_members(replicas).await?;
        Ok(format!(
            "3 control plane Machines, each with a Node, a VM and a guest; etcd running on {members:?}, \
             KubeadmControlPlane EtcdClusterHealthy"
        ))
    }

    /// Waits until etcd runs on exactly the `count` control plane Machines' Nodes (a Pod of a
    /// Node that went away may linger until the Pod garbage collector removes it); returns those
    /// Nodes.
    async fn etcd_members(&mut self, count: usize) -> Result<BTreeSet<String>> {
        let pods: Api<Pod> = Api::namespaced(self.env.workload()?.clone(), "kube-system");
        let env = &self.env;
        poll(
            &mut self.procs,
            &format!("etcd running on the {count} control plane Nodes and nowhere else"),
            GUEST_STEP_TIMEOUT,
            async || {
                let fleet = env.fleet().await?;
                let control_plane_nodes: BTreeSet<String> = fleet
                    .machine_names(true)
                    .iter()
                    .filter_map(|m| fleet.node_of(m))
                    .collect();
                let running: BTreeSet<String> = pods
                    .list(&ListParams::default().labels("component=etcd"))
                    .await?
                    .items
                    .into_iter()
                    .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                    .filter_map(|p| p.spec.and_then(|s| s.node_name))
                    .collect();
                // KCP's own view: it lists etcd's members through the workload cluster.
                let control_planes = env
                    .api(&resource(
                        "controlplane.cluster.x-k8s.io",
                        "v1beta2",
                        "KubeadmControlPlane",
                    ))
                    .list(&ListParams::default())
                    .await?
                    .items;
                let etcd_healthy = control_planes
                    .iter()
                    .map(to_value)
                    .all(|kcp| condition_status(&kcp, "EtcdClusterHealthy").as_deref() == Some("True"));
                Ok(
                    if running.len() == count && running == control_plane_nodes && etcd_healthy {
                        Ok(running)
                    } else {
                        Err(format!(
                            "etcd Pods running on {running:?}, control plane Nodes {control_plane_nodes:?}, \
                         KubeadmControlPlane EtcdClusterHealthy: {etcd_healthy}"
                        ))
                    },
                )
            },
        )
        .await
    }

    async fn control_plane_remediation(&mut self) -> Result<String> {
        let fleet = self.env.fleet().await?;
        let control_planes = fleet.machine_names(true);
        ensure!(
            control_planes.len() == 3,
            "control plane remediation needs 3 control plane Machines, there are {}",
            control_planes.len()
        );
        let old = control_planes
            .iter()
            .next_back()
            .cloned()
            .context("a control plane Machine")?;
        let old_node = fleet.node_of(&old).context("its Node")?;
        self.env
            .create_health_check("control-plane", json!({"cluster.x-k8s.io/control-plane": ""}))
            .await?;
        self.env.mark_unhealthy(&old_node).await?;
        let counts = self.counts();
        let fleet = self
            .settle(
                "the control plane Machine to be remediated and replaced",
                counts,
                |f| {
                    if f.machines.contains_key(&old) || f.nodes.contains(&old_node) {
                        Err(format!(
                            "the old control plane Machine {old} (Node {old_node}) is still there"
                        ))
                    } else {
                        Ok(())
                    }
                },
            )
            .await?;
        let members = self.etcd_members(3).await?;
        ensure!(
            !members.contains(&old_node),
            "etcd still runs on the remediated Node {old_node}: {members:?}"
        );
        Ok(format!(
            "Machine {old} (Node {old_node}) marked unhealthy, replaced: control plane {:?}, etcd on {members:?}",
            fleet.machine_names(true)
        ))
    }

    async fn clusterclass_changes(&mut self) -> Result<String> {
        let (old_template, new_template, memory) = self
            .rotate_class_template(
                "/spec/workers/machineDeployments/0/infrastructure/templateRef",
                false,
            )
            .await?;
        // The topology's own copy of the template is the new one's.
        let templates = self.env.api(&infra(&self.env.hv.kind("MachineTemplate")));
        let deployment = self.env.machine_deployment().await?;
        let md = to_value(&self.env.api(&capi("MachineDeployment")).get(&deployment).await?);
        let md_template = md["spec"]["template"]["spec"]["infrastructureRef"]["name"]
            .as_str()
            .context("the MachineDeployment's template")?;
        let md_template = to_value(&templates.get(md_template).await?);
        ensure!(
            md_template["spec"]["template"]["spec"]["memoryMiB"] == json!(memory),
            "the topology's worker template has {} MiB, the class's new one {memory}",
            md_template["spec"]["template"]["spec"]["memoryMiB"]
        );
        // Then the control plane's machine template, as the spec's control plane changes: KCP
        // rolls out the control plane.
        let (old_cp_template, new_cp_template, cp_memory) = self
            .rotate_class_template("/spec/controlPlane/machineInfrastructure/templateRef", true)
            .await?;
        let members = self.etcd_members(self.env.scenario.control_planes).await?;
        Ok(format!(
            "class worker template rotated {old_template} → {new_template} ({memory} MiB): the topology \
             cloned it, every worker replaced, its VM with {memory} MiB; class control plane template \
             rotated {old_cp_template} → {new_cp_template}: the control plane rolled out, its VMs with \
             {cp_memory} MiB, etcd on {members:?}"
        ))
    }

    /// Points the ClusterClass's template reference at `pointer` (a JSON pointer into the class)
    /// to a copy of its template with more memory and waits until the workers (or the control
    /// plane) rolled out onto it; returns the old and new templates and the new memory.
    async fn rotate_class_template(
        &mut self,
        pointer: &str,
        control_plane: bool,
    ) -> Result<(String, String, u64)> {
        const CLASS: &str = "banlieue-proxmox";
        let classes = self.env.api(&capi("ClusterClass"));
        let mut class = to_value(&classes.get(CLASS).await?);
        let reference = class
            .pointer_mut(pointer)
            .with_context(|| format!("no {pointer} in ClusterClass {CLASS}"))?;
        let old = reference["name"]
            .as_str()
            .with_context(|| format!("the template name at {pointer}"))?
            .to_owned();
        let new = format!("{old}-v2");
        reference["name"] = json!(new);
        let memory = self.env.copy_with_more_memory(&old, &new).await?;
        let before = self.env.fleet().await?.machine_names(control_plane);
        classes
            .patch(
                CLASS,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": class["spec"]})),
            )
            .await
            .with_context(|| format!("rotating the ClusterClass's template at {pointer}"))?;
        self.rolled(control_plane, &before, memory).await?;
        Ok((old, new, memory))
    }

    /// CAPI's cluster upgrade spec: the KubeadmControlPlane moved to the next minor and a
    /// machine template of its VM template (as CAPI's spec sets `KUBERNETES_VERSION_UPGRADE_TO`
    /// and the upgraded image), then the MachineDeployment; waits as the spec does for every
    /// control plane Machine, then every worker, to be replaced at the new version, and checks
    /// from the workload cluster that every Node's kubelet, the API servers and kube-proxy run it.
    async fn cluster_upgrade(&mut self) -> Result<String> {
        let to = self
            .env
            .next_kubernetes
            .clone()
            .context("the scenario set up no second Kubernetes version")?;
        let source = self.env.hv.template_source_for(&to)?;
        let suffix = to.replace('.', "-");
        let kcp_api = self.env.api(&resource(
            "controlplane.cluster.x-k8s.io",
            "v1beta2",
            "KubeadmControlPlane",
        ));
        let kcp_name = format!("{CLUSTER}-control-plane");
        let kcp = to_value(&kcp_api.get(&kcp_name).await?);
        let from = kcp["spec"]["version"].as_str().unwrap_or_default().to_owned();
        let deployment = self.env.machine_deployment().await?;
        let md_api = self.env.api(&capi("MachineDeployment"));
        let md = to_value(&md_api.get(&deployment).await?);
        let mut moved = Vec::new();
        for (template, kind) in [
            (
                &kcp["spec"]["machineTemplate"]["spec"]["infrastructureRef"]["name"],
                "control plane",
            ),
            (
                &md["spec"]["template"]["spec"]["infrastructureRef"]["name"],
                "worker",
            ),
        ] {
            let old = template
                .as_str()
                .with_context(|| format!("the {kind} machine template"))?;
            let new = format!("{old}-{suffix}");
            self.env
                .copy_template(old, &new, |spec| {
                    spec["source"] = source.clone();
                    Ok(())
                })
                .await?;
            moved.push(new);
        }
        let upgraded = |f: &Fleet, control_plane: bool, before: &BTreeSet<String>| {
            let machines = f.machine_names(control_plane);
            let old: Vec<&String> = machines.iter().filter(|m| before.contains(*m)).collect();
            let behind: Vec<(String, &String)> = machines
                .iter()
                .filter_map(|m| f.node_of(m))
                .filter_map(|node| f.kubelets.get(&node).map(|version| (node, version)))
                .filter(|(_, version)| **version != to)
                .collect();
            if old.is_empty() && behind.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "Machines from before the upgrade left: {old:?}; Nodes whose kubelet is not {to}: {behind:?}"
                ))
            }
        };

        let started = Instant::now();
        let before = self.env.fleet().await?.machine_names(true);
        kcp_api
            .patch(
                &kcp_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {
                    "version": to,
                    "machineTemplate": {"spec": {"infrastructureRef": {"name": moved[0]}}},
                }})),
            )
            .await?;
        let counts = self.counts();
        self.settle("the control plane upgraded", counts, |f| {
            upgraded(f, true, &before)
        })
        .await?;
        let control_plane_took = started.elapsed();
        let members = self.etcd_members(counts.0).await?;

        let started = Instant::now();
        let before = self.env.fleet().await?.machine_names(false);
        md_api
            .patch(
                &deployment,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"template": {"spec": {
                    "version": to,
                    "infrastructureRef": {"name": moved[1]},
                }}}})),
            )
            .await?;
        let fleet = self
            .settle("the workers upgraded", counts, |f| upgraded(f, false, &before))
            .await?;
        let workers_took = started.elapsed();
        let images = self.control_plane_images(&to, fleet.nodes.len()).await?;
        Ok(format!(
            "{from} → {to}: control plane replaced in {} s (etcd on {members:?}), workers in {} s; \
             every Node's kubelet {to} ({:?}); {images}",
            control_plane_took.as_secs(),
            workers_took.as_secs(),
            fleet.kubelets.keys().collect::<Vec<_>>(),
        ))
    }

    /// Waits until every kube-apiserver Pod runs the `version` image and kube-proxy's
    /// DaemonSet, updated by KCP to that version, is available on all `nodes` Nodes.
    async fn control_plane_images(&mut self, version: &str, nodes: usize) -> Result<String> {
        let workload = self.env.workload()?.clone();
        let pods: Api<Pod> = Api::namespaced(workload.clone(), "kube-system");
        let daemon_sets: Api<k8s_openapi::api::apps::v1::DaemonSet> =
            Api::namespaced(workload, "kube-system");
        let tag = format!(":{version}");
        poll(
            &mut self.procs,
            &format!("the API servers and kube-proxy at {version}"),
            GUEST_STEP_TIMEOUT,
            async || {
                let apiservers: Vec<String> = pods
                    .list(&ListParams::default().labels("component=kube-apiserver"))
                    .await?
                    .items
                    .into_iter()
                    .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                    .filter_map(|p| p.spec?.containers.into_iter().next()?.image)
                    .collect();
                let proxy = daemon_sets.get("kube-proxy").await?;
                let proxy_image = proxy
                    .spec
                    .template
                    .spec
                    .as_ref()
                    .and_then(|s| s.containers.first())
                    .and_then(|c| c.image.clone())
                    .unwrap_or_default();
                let available = proxy.status.as_ref().map_or(0, |s| s.number_available.unwrap_or(0));
                let updated = proxy
                    .status
                    .as_ref()
                    .map_or(0, |s| s.updated_number_scheduled.unwrap_or(0));
                Ok(
                    if !apiservers.is_empty()
                        && apiservers.iter().all(|i| i.ends_with(&tag))
                        && proxy_image.ends_with(&tag)
                        && available as usize == nodes
                        && updated as usize == nodes
                    {
                        Ok(format!(
                            "kube-apiserver {apiservers:?}; kube-proxy {proxy_image} available on {available} Nodes"
                        ))
                    } else {
                        Err(format!(
                            "kube-apiserver images {apiservers:?}; kube-proxy {proxy_image}, {updated} updated and \
                             {available} available of {nodes}"
                        ))
                    },
                )
            },
        )
        .await
    }

    async fn node_drain(&mut self) -> Result<String> {
        const DRAIN_TIMEOUT_SECONDS: i64 = 45;
        let workload = self.env.workload()?.clone();
        let deployment = self.env.machine_deployment().await?;
        let md_api = self.env.api(&capi("MachineDeployment"));
        // Two workloads on the workers (the control plane is tainted): one a PodDisruptionBudget
        // allows no disruption of, one without.
        let apps: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(workload.clone(), "default");
        for name in ["drain-blocked", "drain-evicted"] {
            let deployment: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]},
                    },
                },
            }))?;
            apps.create(&PostParams::default(), &deployment).await?;
        }
        let budgets: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
            Api::namespaced(workload.clone(), "default");
        budgets
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": "drain-blocked"},
                    "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "drain-blocked"}}},
                }))?,
            )
            .await?;
        let pods: Api<Pod> = Api::namespaced(workload.clone(), "default");
        // Where each workload's Pod runs (by app label), once both run.
        let placed = poll(
            &mut self.procs,
            "the drain workloads running on a worker",
            GUEST_STEP_TIMEOUT,
            async || {
                let running: BTreeMap<String, String> = pods
                    .list(&ListParams::default().labels("app in (drain-blocked,drain-evicted)"))
                    .await?
                    .items
                    .into_iter()
                    .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                    .filter_map(|p| {
                        let app = p.metadata.labels.as_ref()?.get("app")?.clone();
                        Some((app, p.spec?.node_name?))
                    })
                    .collect();
                Ok(if running.len() == 2 {
                    Ok(running)
                } else {
                    Err(format!("running: {running:?}"))
                })
            },
        )
        .await?;
        // The drain timeout, set on the MachineDeployment, reaches its Machines in place.
        md_api
            .patch(
                &deployment,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"template": {"spec": {"deletion": {
                    "nodeDrainTimeoutSeconds": DRAIN_TIMEOUT_SECONDS}}}}})),
            )
            .await?;
        let machines = self.env.api(&capi("Machine"));
        let worker_selector = format!("cluster.x-k8s.io/deployment-name={deployment}");
        poll(
            &mut self.procs,
            "the drain timeout on the workers' Machines",
            GUEST_STEP_TIMEOUT,
            async || {
                let list = machines
                    .list(&ListParams::default().labels(&worker_selector))
                    .await?
                    .items;
                let missing: Vec<String> = list
                    .iter()
                    .map(to_value)
                    .filter(|m| {
                        m["spec"]["deletion"]["nodeDrainTimeoutSeconds"] != json!(DRAIN_TIMEOUT_SECONDS)
                    })
                    .map(|m| m["metadata"]["name"].as_str().unwrap_or_default().to_owned())
                    .collect();
                Ok(if missing.is_empty() && !list.is_empty() {
                    Ok(())
                } else {
                    Err(format!("not yet on {missing:?}"))
                })
            },
        )
        .await?;
        let fleet = self.env.fleet().await?;
        let blocked_node = placed["drain-blocked"].clone();
        let (machine, vm) = fleet
            .machines
            .iter()
            .find(|(_, m)| m.0.as_deref() == Some(blocked_node.as_str()))
            .map(|(name, m)| (name.clone(), m.1.clone()))
            .context("the Machine of the Node the blocked Pod runs on")?;
        let vm = vm.context("its VM")?;
        // Every worker goes: the MachineDeployment scales to 0.
        md_api
            .patch(
                &deployment,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 0}})),
            )
            .await?;
        let started = Instant::now();
        // While the budget blocks the drain: the Machine says so, the other Pod is evicted, and
        // the VM is still there.
        let env = &self.env;
        let blocked = poll(&mut self.procs, "the drain to be blocked by the PodDisruptionBudget", GUEST_STEP_TIMEOUT, async || {
            let Some(m) = machines.get_opt(&machine).await? else {
                return Ok(Err(format!("Machine {machine} is gone already")));
            };
            let m = to_value(&m);
            let deleting = condition(&m, "Deleting").cloned().unwrap_or_default();
            let evicted = !pods
                .list(&ListParams::default().labels("app=drain-evicted"))
                .await?
                .items
                .iter()
                .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(blocked_node.as_str()));
            let vm_there = env.hv.lab_vms().await?.iter().any(|v| v.id == vm);
            Ok(
                if deleting["reason"] == "DrainingNode"
                    && deleting["message"].as_str().is_some_and(|t| t.contains("drain-blocked"))
                    && (evicted || placed["drain-evicted"] != blocked_node)
                    && vm_there
                {
                    Ok(deleting["message"].as_str().unwrap_or_default().lines().next().unwrap_or_default().to_owned())
                } else {
                    Err(format!(
                        "Deleting {}: {}; the unprotected Pod evicted: {evicted}; VM {vm} there: {vm_there}",
                        deleting["reason"], deleting["message"]
                    ))
                },
            )
        })
        .await?;
        // Then the timeout passes: the Machine and its VM go although the Pod is still protected.
        self.env.scenario.workers = 0;
        let counts = self.counts();
        self.settle("the worker deleted after its drain timeout", counts, |f| {
            if f.vms.contains_key(&vm) {
                Err(format!("VM {vm} still there"))
            } else {
                Ok(())
            }
        })
        .await?;
        let waited = started.elapsed();
        ensure!(
            waited >= Duration::from_secs(DRAIN_TIMEOUT_SECONDS.unsigned_abs()),
            "Machine {machine} and VM {vm} went {:.0} s after the scale-down, before the {DRAIN_TIMEOUT_SECONDS} s drain timeout",
            waited.as_secs_f32()
        );
        Ok(format!(
            "Machine {machine} (Node {blocked_node}): drain blocked ({blocked}), the unprotected Pod evicted, VM {vm} kept; \
             Machine and VM gone {:.0} s after the scale-down (drain timeout {DRAIN_TIMEOUT_SECONDS} s)",
            waited.as_secs_f32()
        ))
    }

    async fn deletion(&mut self) -> Result<String> {
        let clusters = self.env.api(&capi("Cluster"));
        clusters.delete(CLUSTER, &DeleteParams::default()).await?;
        let env = &self.env;
        poll(
            &mut self.procs,
            "the cluster and its VMs to be deleted",
            GUEST_STEP_TIMEOUT,
            async || {
                let left = env.hv.lab_vms().await?.len();
                let guests = env.running.lock().expect("guests lock").len();
                let cluster = clusters.get_opt(CLUSTER).await?;
                Ok(if left == 0 && guests == 0 && cluster.is_none() {
                    Ok(())
                } else {
                    Err(format!(
                        "{left} VMs and {guests} guests left, Cluster {}",
                        if cluster.is_some() { "still there" } else { "gone" }
                    ))
                })
            },
        )
        .await?;
        Ok("the Cluster, its Machines and every VM gone; every guest powered off".to_owned())
    }
}

/// A stand-in for vSphere's cloud provider (cloud-provider-vsphere, whose module is not served
/// here) in a workload cluster whose kubelets run with `--cloud-provider=external`: what the CPI's
/// node controller does for a new Node. It finds the Node's VM in vCenter (here vcsim) by the
/// Node's `status.nodeInfo.systemUUID` (the VM's BIOS uuid, which the lab guest's SMBIOS carries as
/// vSphere's firmware does), sets `spec.providerID` to `vsphere://<BIOS uuid>` (the ID CAPV and
/// banlieue-vsphere put on the Machine), the Node's addresses to the VM's guest IPs (VMware Tools'
/// report) and its hostname, and removes the `node.cloudprovider.kubernetes.io/uninitialized`
/// taint. Runs until aborted; `log` gets one line per Node it initializes or cannot.
async fn cloud_provider_stand_in(workload: kube::Client, hv: Arc<Hypervisor>, log: PathBuf) {
    const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
    let note = |line: String| {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&log) {
            let _ = writeln!(f, "{line}");
        }
    };
    let nodes: Api<Node> = Api::all(workload);
    loop {
        if let (Ok(list), Ok(vms)) = (nodes.list(&ListParams::default()).await, hv.lab_vms().await) {
            for node in list.items {
                let name = node.metadata.name.clone().unwrap_or_default();
                let spec = node.spec.clone().unwrap_or_default();
                let taints = spec.taints.clone().unwrap_or_default();
                if !taints.iter().any(|t| t.key == UNINITIALIZED) {
                    continue;
                }
                let uuid = node
                    .status
                    .as_ref()
                    .and_then(|s| s.node_info.as_ref())
                    .map(|i| i.system_uuid.clone())
                    .unwrap_or_default();
                let vm = vms.iter().find(|vm| {
                    vm.smbios
                        .as_ref()
                        .is_some_and(|s| s.uuid.eq_ignore_ascii_case(&uuid))
                });
                let Some(vm) = vm.filter(|vm| !vm.guest_ips.is_empty()) else {
                    note(format!(
                        "Node {name}: no VM with BIOS uuid {uuid:?} and a guest IP yet"
                    ));
                    continue;
                };
                let mut addresses: Vec<Value> = vm
                    .guest_ips
                    .iter()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .map(|ip| json!({"type": "InternalIP", "address": ip}))
                    .collect();
                addresses.push(json!({"type": "Hostname", "address": name}));
                let status = json!({"status": {"addresses": addresses}});
                if let Err(e) = nodes
                    .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&status))
                    .await
                {
                    note(format!("Node {name}: addresses: {e}"));
                    continue;
                }
                let kept: Vec<_> = taints.into_iter().filter(|t| t.key != UNINITIALIZED).collect();
                let mut patch = json!({"spec": {"taints": kept}});
                if spec.provider_id.as_deref().unwrap_or_default().is_empty() {
                    patch["spec"]["providerID"] = json!(format!("vsphere://{uuid}"));
                }
                match nodes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => note(format!(
                        "Node {name}: initialized (providerID vsphere://{uuid}, addresses {:?})",
                        vm.guest_ips
                    )),
                    Err(e) => note(format!("Node {name}: {e}")),
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Whether IPv4 `ip` is in `cidr`.
fn in_network(ip: &str, cidr: &str) -> bool {
    let parsed = ip
        .parse::<std::net::Ipv4Addr>()
        .ok()
        .zip(cidr.split_once('/'))
        .and_then(|(ip, (net, bits))| {
            Some((
                ip,
                net.parse::<std::net::Ipv4Addr>().ok()?,
                bits.parse::<u32>().ok()?,
            ))
        });
    parsed.is_some_and(|(ip, net, bits)| {
        let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
        u32::from(ip) & mask == u32::from(net) & mask
    })
}

#[test]
fn pod_addresses_are_checked_against_the_pod_network() {
    assert!(in_network("192.168.1.7", "192.168.0.0/16"));
    assert!(!in_network("10.244.1.7", "192.168.0.0/16"));
    assert!(!in_network("not an address", "192.168.0.0/16"));
}
