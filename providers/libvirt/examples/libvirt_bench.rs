//! Benchmark: N standalone LibvirtMachines (owned by VirtualMachines, as the banlieue
//! controller creates them) provisioned by the real controllers on the real apiserver against
//! libvirt's `test:///default` driver through the real `virt` connection.
//!
//! ```text
//! cargo build -p banlieue-libvirt --example libvirt_bench
//! BENCH_MACHINES=100 BENCH_CONCURRENCY=8 ./target/debug/examples/libvirt_bench
//! ```
//!
//! Prints machines/minute (first create → all provisioned), Kubernetes writes per machine,
//! domains on the host afterwards, and the same after deleting them all.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use banlieue_api::banlieue::{Provider, VirtualMachine};
use banlieue_api::infrastructure::{LibvirtCluster, LibvirtMachine};
use banlieue_api::standalone::infra_cluster_name;
use banlieue_libvirt::connection::VirtConnector;
use banlieue_libvirt::desired::Settings;
use banlieue_libvirt::hypervisor::Hypervisor;
use banlieue_libvirt::machine_controller::FIELD_MANAGER;
use banlieue_libvirt::xml::{self, DomainType};
use banlieue_provider_kit::cluster::{self as kit_cluster, ClusterContext};
use banlieue_provider_kit::machine::{self as kit_machine, MachineContext};
use banlieue_testenv::TestEnv;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Resource};
use serde_json::json;

const URI: &str = "test:///default";
const POOL: &str = "default-pool";

fn owner_ref<K: Resource<DynamicType = ()>>(obj: &K) -> serde_json::Value {
    json!({
        "apiVersion": K::api_version(&()), "kind": K::kind(&()),
        "name": obj.meta().name, "uid": obj.meta().uid, "controller": true,
    })
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<()> {
    let n = env_usize("BENCH_MACHINES", 50);
    let concurrency = env_usize("BENCH_CONCURRENCY", 8) as u16;
    let env = TestEnv::builder().crds(banlieue_api::crds::all()).start().await?;
    let ns = env.namespace("bench").await?;
    let ns = ns.name().to_owned();
    let client = env.client().await?;
    let connector = VirtConnector::default();
    let hv = connector.get(URI);
    hv.create_volume(POOL, &xml::plain_volume_xml("base.qcow2", 16 << 20, "qcow2"))
        .await?;

    let provider: Provider = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
        "metadata": {"name": "bench"}, "spec": {"backend": "libvirt", "endpoint": URI},
    }))?;
    let provider = Api::<Provider>::all(client.clone())
        .create(&PostParams::default(), &provider)
        .await?;
    let lvc: LibvirtCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtCluster",
        "metadata": {"name": infra_cluster_name("bench"), "ownerReferences": [owner_ref(&provider)]},
        "spec": {"providerRef": {"name": "bench"}},
    }))?;
    Api::<LibvirtCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &lvc)
        .await?;

    let settings = Settings {
        domain_type: DomainType::Qemu,
        ..Settings::default()
    };
    let backends = banlieue_libvirt::provider(connector.clone(), settings);
    let mctx = Arc::new(MachineContext::new(
        client.clone(),
        backends.machines,
        "banlieue-libvirt-bench",
    ));
    let cctx = Arc::new(ClusterContext::new(
        client.clone(),
        backends.clusters,
        FIELD_MANAGER,
    ));
    let (m, c, ns1, ns2) = (mctx.clone(), cctx, ns.clone(), ns.clone());
    tokio::spawn(async move { kit_machine::run(m, Some(&ns1), concurrency, std::future::pending()).await });
    tokio::spawn(async move { kit_cluster::run(c, Some(&ns2), 2, std::future::pending()).await });

    let vms = Api::<VirtualMachine>::namespaced(client.clone(), &ns);
    let machines = Api::<LibvirtMachine>::namespaced(client.clone(), &ns);
    let started = Instant::now();
    for i in 0..n {
        let name = format!("vm-{i:04}");
        let vm: VirtualMachine = serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": name},
            "spec": {"providerRef": {"name": "bench"}, "source": {"libvirt": {"volume": "base.qcow2", "pool": POOL}},
                     "cpu": {"cores": 1}, "memoryMiB": 256},
        }))?;
        let vm = vms.create(&PostParams::default(), &vm).await?;
        let lm: LibvirtMachine = serde_json::from_value(json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine",
            "metadata": {"name": name, "ownerReferences": [owner_ref(&vm)]},
            "spec": {"providerRef": {"name": "bench"}, "source": {"volume": "base.qcow2", "pool": POOL},
                     "cpu": {"cores": 1}, "memoryMiB": 256},
        }))?;
        machines.create(&PostParams::default(), &lm).await?;
    }
    loop {
        let list = machines.list(&ListParams::default()).await?;
        let done = list
            .items
            .iter()
            .filter(|m| {
                m.status
                    .as_ref()
                    .and_then(|s| s.initialization.as_ref())
                    .and_then(|i| i.provisioned)
                    == Some(true)
            })
            .count();
        if done == n {
            break;
        }
        if started.elapsed() > Duration::from_secs(env_usize("BENCH_TIMEOUT_S", 1800) as u64) {
            let stuck = list.items.iter().find(|m| {
                m.status
                    .as_ref()
                    .and_then(|s| s.initialization.as_ref())
                    .is_none()
            });
            bail!(
                "only {done}/{n} provisioned; e.g. {:?}: {:#?}",
                stuck.map(|m| m.metadata.name.clone()),
                stuck.map(|m| m.status.clone())
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let elapsed = started.elapsed();
    let writes = mctx.metrics.writes();
    let mut domains = 0;
    for i in 0..n {
        if hv.domain_by_name(&format!("{ns}_vm-{i:04}")).await?.is_some() {
            domains += 1;
        }
    }
    println!("machines: {n}, concurrency: {concurrency}");
    println!("first create -> all provisioned: {:.1} s", elapsed.as_secs_f64());
    println!("machines/minute: {:.0}", n as f64 / elapsed.as_secs_f64() * 60.0);
    println!("Kubernetes writes per machine: {:.1}", writes as f64 / n as f64);
    println!("domains on the host: {domains}");

    let started = Instant::now();
    machines
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    while !machines.list(&ListParams::default()).await?.items.is_empty() {
        if started.elapsed() > Duration::from_secs(1800) {
            bail!("machines not deleted after 30 min");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut left = 0;
    for i in 0..n {
        if hv.domain_by_name(&format!("{ns}_vm-{i:04}")).await?.is_some() {
            left += 1;
        }
    }
    println!(
        "delete all -> gone: {:.1} s, domains left: {left}",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
