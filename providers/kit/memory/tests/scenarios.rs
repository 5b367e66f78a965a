//! The shared CAPI-style scenario suite (`banlieue-scenarios`) against the in-memory backend:
//! the kit's contract alone, without a hypervisor's quirks, on the real control plane harness.
//!
//! Run: `cargo test -p banlieue-provider-memory --test scenarios` (needs
//! `tests/controlplane/build.sh`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use banlieue_provider_kit::{cluster, machine};
use banlieue_provider_memory::{ENDPOINT, Hypervisor, MemoryClusters, MemoryMachines, PROVIDER_ID_PREFIX};
use banlieue_scenarios::{Access, Controllers, MachineHint, ProviderUnderTest, Template, Vm};
use serde_json::{Value, json};

const HOSTS: [&str; 2] = ["mem-a", "mem-b"];
const IMAGE: &str = "base.img";

banlieue_scenarios::scenario_tests!(
    Memory: provision,
    scale,
    delete,
    pause,
    bad_template,
    bad_credentials,
    crash_restart,
    outage,
    address_modes,
);

/// One in-memory hypervisor per scenario, and the kit's controllers with its backends.
struct Memory {
    kube: kube::Client,
    ns: String,
    hv: Hypervisor,
    controllers: Controllers,
}

impl ProviderUnderTest for Memory {
    const NAME: &'static str = "mem";
    const CLUSTER_KIND: &'static str = "LibvirtCluster";
    const MACHINE_KIND: &'static str = "LibvirtMachine";
    const PROVIDER_ID_PREFIX: &'static str = PROVIDER_ID_PREFIX;
    const BAD_TEMPLATE_REASON: &'static str = banlieue_provider_memory::IMAGE_NOT_FOUND;
    const MISSING_TEMPLATE: &'static str = "missing.img";
    const BAD_ACCESS_REASONS: &'static [&'static str] = &[banlieue_provider_memory::UNREACHABLE];
    const OUTAGE_MESSAGE: &'static str = "(test outage)";
    const NETWORK: &'static str = "default";

    async fn setup(kube: kube::Client, ns: &str) -> Result<Self> {
        Ok(Self {
            kube,
            ns: ns.to_owned(),
            hv: Hypervisor::new(&HOSTS, &[IMAGE]),
            controllers: Controllers::default(),
        })
    }

    fn failure_domains(&self) -> Vec<String> {
        HOSTS.iter().map(|h| (*h).to_owned()).collect()
    }

    async fn cluster_spec(&self, access: Access) -> Result<Value> {
        Ok(match access {
            Access::Valid => json!({"uri": ENDPOINT}),
            Access::Bad => json!({"uri": "test:///nowhere"}),
        })
    }

    fn machine_spec(&self, template: Template) -> Value {
        let image = match template {
            Template::Valid => IMAGE,
            Template::Missing => Self::MISSING_TEMPLATE,
        };
        json!({"source": {"volume": image, "pool": "default"}, "cpu": {"cores": 1}, "memoryMiB": 256})
    }

    fn start(&mut self) {
        let machines = Arc::new(machine::MachineContext::new(
            self.kube.clone(),
            MemoryMachines(self.hv.clone()),
            "banlieue-memory-test",
        ));
        let clusters = Arc::new(cluster::ClusterContext::new(
            self.kube.clone(),
            MemoryClusters(self.hv.clone()),
            "banlieue-memory-test",
        ));
        let (a, b) = (self.ns.clone(), self.ns.clone());
        self.controllers.push(tokio::spawn(async move {
            machine::run(machines, Some(&a), 4, std::future::pending()).await;
        }));
        self.controllers.push(tokio::spawn(async move {
            cluster::run(clusters, Some(&b), 2, std::future::pending()).await;
        }));
    }

    async fn stop(&mut self) {
        self.controllers.stop().await;
    }

    async fn vms(&self, _machines: &[MachineHint]) -> Result<Vec<Vm>> {
        Ok(self
            .hv
            .vms()
            .into_iter()
            .map(|v| Vm {
                id: v.id,
                owner_uid: Some(v.owner_uid),
                failure_domain: Some(v.host),
                user_data: Some(v.user_data),
                network_config: v.network_config,
            })
            .collect())
    }

    async fn slow_down(&self) -> Result<()> {
        self.hv.set_delay(Duration::from_millis(150));
        Ok(())
    }

    async fn outage(&self, down: bool) -> Result<()> {
        self.hv.set_down(down);
        Ok(())
    }

    fn secrets(&self) -> Vec<String> {
        Vec::new()
    }
}
