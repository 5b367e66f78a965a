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
    few_writes,
    creation_only_change,
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
    // finalizer, providerID, one status.
    const PROVISIONING_WRITES: usize = 3;
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

/// Starts one shard of the kit's machine and cluster controllers: only objects labelled
/// `cluster.x-k8s.io/watch-filter=<filter>`, Events reported as `shard-<filter>`.
fn start_shard(kube: &kube::Client, hv: &Hypervisor, ns: &str, filter: &str, controllers: &mut Controllers) {
    let reporter = format!("shard-{filter}");
    let mut machines = machine::MachineContext::new(kube.clone(), MemoryMachines(hv.clone()), &reporter);
    machines.watch_filter = Some(filter.to_owned());
    let mut clusters = cluster::ClusterContext::new(kube.clone(), MemoryClusters(hv.clone()), &reporter);
    clusters.watch_filter = Some(filter.to_owned());
    let (machines, clusters) = (Arc::new(machines), Arc::new(clusters));
    let (a, b) = (ns.to_owned(), ns.to_owned());
    controllers.push(tokio::spawn(async move {
        machine::run(machines, Some(&a), 4, std::future::pending()).await;
    }));
    controllers.push(tokio::spawn(async move {
        cluster::run(clusters, Some(&b), 2, std::future::pending()).await;
    }));
}

/// Sharding, as CAPI's `--watch-filter`: a manager reconciles only the objects labelled with its
/// value, so replicas with different values split the work and never touch each other's objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managers_with_a_watch_filter_split_the_work() -> Result<()> {
    use banlieue_capi::contract::WATCH_FILTER_LABEL;
    use k8s_openapi::api::core::v1::Event;
    use kube::ResourceExt;
    use kube::api::{Api, ListParams, Patch, PatchParams};

    let mut s = banlieue_scenarios::Scenario::<Memory>::new("shards").await?;
    let kube = banlieue_scenarios::env().await?.client().await?;
    let hv = Hypervisor::new(&HOSTS, &[IMAGE]);
    let label = |value: &str| Patch::Merge(json!({"metadata": {"labels": {WATCH_FILTER_LABEL: value}}}));
    s.cluster(banlieue_scenarios::Access::Valid).await?;
    let cluster = s.infra(Memory::CLUSTER_KIND).get("c1").await?;
    let ns = cluster.namespace().unwrap_or_default();
    s.infra(Memory::CLUSTER_KIND)
        .patch("c1", &PatchParams::default(), &label("a"))
        .await?;
    s.machine("m-a", None, Template::Valid).await?;
    s.machine("m-b", None, Template::Valid).await?;
    s.machines()
        .patch("m-a", &PatchParams::default(), &label("a"))
        .await?;
    s.machines()
        .patch("m-b", &PatchParams::default(), &label("b"))
        .await?;

    // Shard b alone: its machine waits for the cluster, which is shard a's; shard a's objects
    // stay untouched.
    let mut shards = Controllers::default();
    start_shard(&kube, &hv, &ns, "b", &mut shards);
    s.wait_infra(Memory::MACHINE_KIND, "m-b", "seen by shard b", |m| {
        m.pointer("/status/conditions").is_some()
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (kind, name) in [(Memory::CLUSTER_KIND, "c1"), (Memory::MACHINE_KIND, "m-a")] {
        let obj = s.infra(kind).get(name).await?;
        anyhow::ensure!(
            obj.finalizers().is_empty() && obj.data.get("status").is_none_or(Value::is_null),
            "shard b touched {kind} {name} of shard a: {:#}",
            serde_json::to_value(&obj)?
        );
    }

    // Shard a: its cluster becomes ready, and each machine is provisioned by its own shard.
    start_shard(&kube, &hv, &ns, "a", &mut shards);
    s.cluster_infrastructure_ready().await?;
    for name in ["m-a", "m-b"] {
        s.wait_infra(Memory::MACHINE_KIND, name, "provisioned", |m| {
            m.pointer("/status/initialization/provisioned") == Some(&json!(true))
        })
        .await?;
    }
    let events = Api::<Event>::namespaced(kube.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items;
    for (name, shard) in [("m-a", "shard-a"), ("m-b", "shard-b"), ("c1", "shard-a")] {
        let reporters: std::collections::BTreeSet<_> = events
            .iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .filter_map(|e| e.reporting_component.clone())
            .collect();
        anyhow::ensure!(
            reporters.iter().all(|r| r == shard) && !reporters.is_empty(),
            "{name}'s Events come from {reporters:?}, not only {shard}"
        );
    }
    assert_eq!(hv.vms().len(), 2, "one VM per machine");
    shards.stop().await;
    Ok(())
}
