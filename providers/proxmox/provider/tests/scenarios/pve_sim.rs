//! The Proxmox provider under the shared scenario suite: the wire-level simulator
//! (`banlieue-pve-sim`, one per scenario) reached by the real client, and the ProxmoxCluster
//! and ProxmoxMachine controllers running in-process for the scenario's namespace.

use std::time::Duration;

use anyhow::Result;
use banlieue_proxmox::in_process;
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
        let mut config = SimConfig::fast();
        // The template's disks on storage every node reaches (as with Ceph or NFS), so each
        // node (failure domain) can clone it.
        for storage in &mut config.storages {
            storage.shared |= storage.id == "local-lvm";
        }
        let sim = banlieue_pve_sim::start(config).await?;
        // The token has exactly the privileges the provider's README documents.
        let role = banlieue_pve_sim::acl::Acl::from_markdown(
            include_str!("../../README.md"),
            banlieue_pve_sim::acl::LEAST_PRIVILEGE_MARKER,
            "capi@pve!banlieue",
        )
        .map_err(anyhow::Error::msg)?;
        sim.set_acl(Some(role));
        Ok(Self {
            kube,
            ns: ns.to_owned(),
            sim,
            controllers: Controllers::default(),
        })
    }

    fn failure_domains(&self) -> Vec<String> {
        self.sim.config().nodes.clone()
    }

    async fn cluster_spec(&self, access: Access) -> Result<Value> {
        let secret = match access {
            Access::Valid => self.sim.token_secret(),
            Access::Bad => WRONG_SECRET.to_owned(),
        };
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "pve-credentials"},
            "stringData": {"tokenID": self.sim.token_id(), "secret": secret},
        }))?;
        Api::<Secret>::namespaced(self.kube.clone(), &self.ns)
            .create(&PostParams::default(), &secret)
            .await?;
        Ok(json!({
            "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
            "endpoint": self.sim.url(),
            "credentialsRef": {"name": "pve-credentials"},
            "tls": {"sha256Fingerprint": self.sim.fingerprint_sha256()},
        }))
    }

    fn machine_spec(&self, template: Template) -> Value {
        let source = match template {
            Template::Valid => json!({"vmid": 9000}),
            Template::Missing => json!({"name": Self::MISSING_TEMPLATE}),
        };
        json!({"source": source, "cpu": {"cores": 2}, "memoryMiB": 2048})
    }

    fn start(&mut self) {
        for task in
            in_process::spawn_controllers(self.kube.clone(), "local", "banlieue-proxmox-test", &self.ns)
        {
            self.controllers.push(task);
        }
    }

    async fn stop(&mut self) {
        self.controllers.stop().await;
    }

    async fn vms(&self, _machines: &[MachineHint]) -> Result<Vec<Vm>> {
        Ok(self
            .sim
            .vms()
            .into_iter()
            .filter(|v| !v.template)
            .map(|v| Vm {
                id: v.vmid.to_string(),
                owner_uid: v.config.get("tags").and_then(|tags| {
                    tags.split([';', ',', ' '])
                        .find_map(|t| t.strip_prefix(OWNER_TAG))
                        .map(str::to_owned)
                }),
                failure_domain: Some(v.node.clone()),
                user_data: self
                    .sim
                    .seed(v.vmid)
                    .and_then(|s| s.user_data)
                    .map(String::into_bytes),
                network_config: self.sim.seed(v.vmid).and_then(|s| s.network_config),
            })
            .collect())
    }

    async fn slow_down(&self) -> Result<()> {
        self.sim
            .faults()
            .add(FaultRule::latency(Duration::from_millis(40)))?;
        Ok(())
    }

    async fn outage(&self, down: bool) -> Result<()> {
        let faults = self.sim.faults();
        if down {
            faults.add(FaultRule::drop_connection())?;
        } else {
            faults.clear();
        }
        Ok(())
    }

    fn secrets(&self) -> Vec<String> {
        vec![self.sim.token_secret(), WRONG_SECRET.to_owned()]
    }
}
