//! The Proxmox provider under the shared scenario suite: the wire-level simulator
//! (`banlieue-pve-sim`, one per scenario) reached by the real client, and the ProxmoxCluster
//! and ProxmoxMachine controllers running in-process for the scenario's namespace.

use std::time::Duration;

use anyhow::Result;
use banlieue_pve_sim::{FaultRule, SimConfig, SimHandle};
use banlieue_scenarios::{Access, Controllers, MachineHint, ProviderUnderTest, Template, Vm};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

/// Where a Proxmox VM's owner is written: a tag `banlieue-uid-<uid>`.
const OWNER_TAG: &str = "banlieue-uid-";
const WRONG_SECRET: &str = "00000000-dead-beef-0000-000000000000";

/// pve-sim with three nodes (one failure domain each) and the template VMID 9000.
pub struct PveSim {
    kube: kube::Client,
    ns: String,
    sim: SimHandle,
    controllers: Controllers,
}

impl ProviderUnderTest for PveSim {
    const NAME: &'static str = "pxm";
    const CLUSTER_KIND: &'static str = "ProxmoxCluster";
    const MACHINE_KIND: &'static str = "ProxmoxMachine";
    const PROVIDER_ID_PREFIX: &'static str = "proxmox://";
    const BAD_TEMPLATE_REASON: &'static str = "TemplateNotFound";
    const MISSING_TEMPLATE: &'static str = "no-such-template";
    const BAD_ACCESS_REASONS: &'static [&'static str] = &["AuthenticationFailed"];
    const OUTAGE_MESSAGE: &'static str = "transport error";
    // 4 seen: finalizer, the VMID persisted before the clone, providerID, the final status; the fleet issue's target is 5.
    const PROVISIONING_WRITES: usize = 5;
    const NETWORK: &'static str = "vmbr0";

    async fn setup(kube: kube::Client, ns: &str) -> Result<Self> {
        Ok(Self {
            kube,
            ns: ns.to_owned(),
            sim: start_sim().await?,
            controllers: Controllers::default(),
        })
    }

    fn failure_domains(&self) -> Vec<String> {
        self.sim.config().nodes.clone()
    }

    async fn cluster_spec(&self, access: Access) -> Result<Value> {
        credentials_secret(&self.kube, &self.ns, "pve-credentials", &self.sim, access).await?;
        Ok(json!({
            "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
            "endpoint": self.sim.url(),
            "credentialsRef": {"name": "pve-credentials"},
            "tls": {"sha256Fingerprint": self.sim.fingerprint_sha256()},
        }))
    }

    fn machine_spec(&self, template: Template) -> Value {
        machine_spec(template)
    }

    fn start(&mut self) {
        start_controllers(&self.kube, &self.ns, &mut self.controllers);
    }

    async fn stop(&mut self) {
        self.controllers.stop().await;
    }

    async fn vms(&self, _machines: &[MachineHint]) -> Result<Vec<Vm>> {
        Ok(vms(&self.sim, |vm| (vm.vmid.to_string(), vm.node.clone())))
    }

    async fn slow_down(&self) -> Result<()> {
        slow_down(&self.sim)
    }

    async fn outage(&self, down: bool) -> Result<()> {
        outage(&self.sim, down)
    }

    fn secrets(&self) -> Vec<String> {
        vec![self.sim.token_secret(), WRONG_SECRET.to_owned()]
    }
}

fn start_controllers(kube: &kube::Client, ns: &str, controllers: &mut Controllers) {
    let spawned =
        banlieue_proxmox::provider("banlieue-proxmox-test", "local").spawn(kube.clone(), ns, (4, 2));
    controllers.extend(spawned.tasks);
}

/// A simulator whose template disks are on storage every node reaches (as with Ceph or NFS),
/// so each node can clone it, and whose token has exactly the privileges the provider's README
/// documents.
async fn start_sim() -> Result<SimHandle> {
    let mut config = SimConfig::fast();
    for storage in &mut config.storages {
        storage.shared |= storage.id == "local-lvm";
    }
    let sim = banlieue_pve_sim::start(config).await?;
    let role = banlieue_pve_sim::acl::Acl::from_markdown(
        include_str!("../../README.md"),
        banlieue_pve_sim::acl::LEAST_PRIVILEGE_MARKER,
        "capi@pve!banlieue",
    )
    .map_err(anyhow::Error::msg)?;
    sim.set_acl(Some(role));
    Ok(sim)
}

/// The credentials Secret `name` for `sim` (with a wrong secret for [`Access::Bad`]).
async fn credentials_secret(
    kube: &kube::Client,
    ns: &str,
    name: &str,
    sim: &SimHandle,
    access: Access,
) -> Result<()> {
    let secret = match access {
        Access::Valid => sim.token_secret(),
        Access::Bad => WRONG_SECRET.to_owned(),
    };
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {"tokenID": sim.token_id(), "secret": secret},
    }))?;
    Api::<Secret>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

fn machine_spec(template: Template) -> Value {
    let source = match template {
        Template::Valid => json!({"vmid": 9000}),
        Template::Missing => json!({"name": PveSim::MISSING_TEMPLATE}),
    };
    json!({"source": source, "cpu": {"cores": 2}, "memoryMiB": 2048})
}

/// The VMs of `sim` (templates aside), each with the id and failure domain `place` gives it.
fn vms(sim: &SimHandle, place: impl Fn(&banlieue_pve_sim::VmInfo) -> (String, String)) -> Vec<Vm> {
    sim.vms()
        .into_iter()
        .filter(|v| !v.template)
        .map(|v| {
            let (id, failure_domain) = place(&v);
            Vm {
                id,
                owner_uid: v.config.get("tags").and_then(|tags| {
                    tags.split([';', ',', ' '])
                        .find_map(|t| t.strip_prefix(OWNER_TAG))
                        .map(str::to_owned)
                }),
                failure_domain: Some(failure_domain),
                user_data: sim.seed(v.vmid).and_then(|s| s.user_data).map(String::into_bytes),
                network_config: sim.seed(v.vmid).and_then(|s| s.network_config),
            }
        })
        .collect()
}

fn slow_down(sim: &SimHandle) -> Result<()> {
    sim.faults().add(FaultRule::latency(Duration::from_millis(40)))?;
    Ok(())
}

fn outage(sim: &SimHandle, down: bool) -> Result<()> {
    let faults = sim.faults();
    if down {
        faults.add(FaultRule::drop_connection())?;
    } else {
        faults.clear();
    }
    Ok(())
}

/// One workload cluster spread over two Proxmox VE clusters (a simulator each): a
/// ProxmoxCluster with `spec.endpoints` `site-a` (node pve1 allowed) and `site-b` (pve2), each
/// endpoint one failure domain.
pub struct PveSpread {
    kube: kube::Client,
    ns: String,
    /// The endpoints: failure-domain name, simulator, allowed node.
    pub sites: Vec<(&'static str, SimHandle, &'static str)>,
    controllers: Controllers,
}

impl ProviderUnderTest for PveSpread {
    const NAME: &'static str = "pxs";
    const CLUSTER_KIND: &'static str = PveSim::CLUSTER_KIND;
    const MACHINE_KIND: &'static str = PveSim::MACHINE_KIND;
    const PROVIDER_ID_PREFIX: &'static str = PveSim::PROVIDER_ID_PREFIX;
    const BAD_TEMPLATE_REASON: &'static str = PveSim::BAD_TEMPLATE_REASON;
    const MISSING_TEMPLATE: &'static str = PveSim::MISSING_TEMPLATE;
    const BAD_ACCESS_REASONS: &'static [&'static str] = PveSim::BAD_ACCESS_REASONS;
    const OUTAGE_MESSAGE: &'static str = PveSim::OUTAGE_MESSAGE;
    const PROVISIONING_WRITES: usize = PveSim::PROVISIONING_WRITES;
    const NETWORK: &'static str = PveSim::NETWORK;

    async fn setup(kube: kube::Client, ns: &str) -> Result<Self> {
        Ok(Self {
            kube,
            ns: ns.to_owned(),
            // site-b first: scenarios send their first machine to the first failure domain,
            // which is then not where a machine without one would go on a tie (site-a).
            sites: vec![
                ("site-b", start_sim().await?, "pve2"),
                ("site-a", start_sim().await?, "pve1"),
            ],
            controllers: Controllers::default(),
        })
    }

    fn failure_domains(&self) -> Vec<String> {
        self.sites.iter().map(|(name, ..)| (*name).to_owned()).collect()
    }

    async fn cluster_spec(&self, access: Access) -> Result<Value> {
        let mut endpoints = Vec::new();
        for (name, sim, node) in &self.sites {
            let secret = format!("pve-{name}");
            credentials_secret(&self.kube, &self.ns, &secret, sim, access).await?;
            endpoints.push(json!({
                "name": name,
                "endpoint": sim.url(),
                "credentialsRef": {"name": secret},
                "tls": {"sha256Fingerprint": sim.fingerprint_sha256()},
                "allowedNodes": [node],
            }));
        }
        Ok(json!({
            "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
            "endpoints": endpoints,
        }))
    }

    fn machine_spec(&self, template: Template) -> Value {
        machine_spec(template)
    }

    fn start(&mut self) {
        start_controllers(&self.kube, &self.ns, &mut self.controllers);
    }

    async fn stop(&mut self) {
        self.controllers.stop().await;
    }

    /// Every VM of both endpoints; a VM on a node its endpoint does not allow is an error.
    async fn vms(&self, _machines: &[MachineHint]) -> Result<Vec<Vm>> {
        let mut all = Vec::new();
        for (name, sim, node) in &self.sites {
            for vm in sim.vms().into_iter().filter(|v| !v.template) {
                anyhow::ensure!(
                    vm.node == *node,
                    "VM {} of {name} on node {}, not {node}",
                    vm.vmid,
                    vm.node
                );
            }
            all.extend(vms(sim, |vm| (format!("{name}/{}", vm.vmid), (*name).to_owned())));
        }
        Ok(all)
    }

    async fn slow_down(&self) -> Result<()> {
        self.sites.iter().try_for_each(|(_, sim, _)| slow_down(sim))
    }

    async fn outage(&self, down: bool) -> Result<()> {
        self.sites.iter().try_for_each(|(_, sim, _)| outage(sim, down))
    }

    fn secrets(&self) -> Vec<String> {
        let mut secrets: Vec<String> = self.sites.iter().map(|(_, sim, _)| sim.token_secret()).collect();
        secrets.push(WRONG_SECRET.to_owned());
        secrets
    }
}
