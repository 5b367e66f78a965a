//! Benchmark: how many VSphereMachines per minute the provider brings to `Ready` against vcsim.
//!
//! Starts a vcsim and a real kube-apiserver (banlieue-testenv), runs the two controllers in
//! this process, creates N VirtualMachine-owned VSphereMachines at once, plays VMware Tools for
//! each (sets the guest IP through vcsim's `SET.guest.ipAddress` once the machine waits for its
//! guest), and measures until all are Ready; then deletes them all and measures until every VM
//! is gone from vcsim.
//!
//! ```sh
//! cargo run --release -p banlieue-vsphere --example vsphere_bench -- 50
//! ```

#[path = "../../client/tests/support/vcsim.rs"]
mod vcsim_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use banlieue_api::banlieue::{Provider, VirtualMachine};
use banlieue_api::infrastructure::{VSphereCluster, VSphereMachine};
use banlieue_api::standalone::infra_cluster_name;
use banlieue_testenv::TestEnv;
use banlieue_vsphere::provision::OWNER_KEY;
use banlieue_vsphere_client::MoRef;
use banlieue_vsphere_client::vim::ConfigSpec;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use vcsim_support::{PASSWORD, USER, Vcsim};

const TEMPLATE: &str = "DC0_C0_RP0_VM0";

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::main]
async fn main() -> Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20);
    let sim = Vcsim::start(&[])?;
    let vc = sim.client()?;
    sim.make_template(&vc, TEMPLATE).await?;

    let env = TestEnv::builder().crds(banlieue_api::crds::all()).start().await?;
    let ns = env.namespace("vs-bench").await?.to_string();
    let kube = env.client().await?;
    let provider = "vc-bench".to_owned();
    Api::<Secret>::namespaced(kube.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "vc"}, "stringData": {"username": USER, "password": PASSWORD}}),
            )?,
        )
        .await?;
    let p = Api::<Provider>::all(kube.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": provider},
                "spec": {"backend": "vsphere", "endpoint": sim.url,
                         "credentialsRef": {"name": "vc", "namespace": ns},
                         "tls": {"sha256Fingerprint": sim.thumbprint}},
            }))?,
        )
        .await?;
    Api::<VSphereCluster>::namespaced(kube.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "VSphereCluster",
                "metadata": {"name": infra_cluster_name(&provider), "ownerReferences": [{
                    "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "name": provider,
                    "uid": p.uid().unwrap_or_default(), "controller": true}]},
                "spec": {"providerRef": {"name": provider}, "datacenter": "DC0"},
            }))?,
        )
        .await?;
    let _controllers = banlieue_vsphere::provider("banlieue-vsphere-bench").spawn(kube.clone(), &ns, (0, 0));

    let vms: Api<VirtualMachine> = Api::namespaced(kube.clone(), &ns);
    let machines: Api<VSphereMachine> = Api::namespaced(kube.clone(), &ns);
    let start = Instant::now();
    for i in 0..n {
        let name = format!("m-{i:04}");
        let bvm = vms
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
                    "spec": {"providerRef": {"name": provider}, "source": {"vsphere": {"template": TEMPLATE}},
                             "cpu": {"cores": 2}, "memoryMiB": 2048},
                }))?,
            )
            .await?;
        machines
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "VSphereMachine",
                    "metadata": {"name": name, "ownerReferences": [{
                        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "name": name,
                        "uid": bvm.uid().unwrap_or_default(), "controller": true}]},
                    "spec": {"providerRef": {"name": provider}, "source": {"template": TEMPLATE},
                             "resourcePool": "DC0_C0/Resources", "cpu": {"cores": 2}, "memoryMiB": 2048},
                }))?,
            )
            .await?;
    }
    let created = start.elapsed();
    let mut ip_set = BTreeSet::new();
    let mut ready_at: BTreeMap<String, Duration> = BTreeMap::new();
    while ready_at.len() < n {
        if start.elapsed() > Duration::from_secs(600) {
            bail!("only {} of {n} machines Ready after 10 min", ready_at.len());
        }
        for m in machines.list(&ListParams::default()).await?.items {
            let name = m.name_any();
            let st = m.status.clone().unwrap_or_default();
            let ready = st
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if ready {
                ready_at.entry(name).or_insert_with(|| start.elapsed());
                continue;
            }
            let waiting = st
                .provisioning
                .as_ref()
                .is_some_and(|p| p.state.as_str() == "WaitingForGuest");
            if let (true, Some(vm)) = (waiting, st.vm_ref.clone())
                && ip_set.insert(name.clone())
            {
                let ip = format!("10.0.{}.{}", ip_set.len() / 250, ip_set.len() % 250 + 1);
                let spec = ConfigSpec {
                    extra_config: vec![
                        ("SET.guest.ipAddress".into(), ip),
                        banlieue_vsphere::guest_report::published_done(),
                    ],
                    ..ConfigSpec::default()
                };
                vc.reconfigure(&MoRef::new("VirtualMachine", vm), &spec).await?;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let all_ready = start.elapsed();
    let mut times: Vec<f64> = ready_at.values().map(Duration::as_secs_f64).collect();
    times.sort_by(f64::total_cmp);

    let del_start = Instant::now();
    for i in 0..n {
        machines
            .delete(&format!("m-{i:04}"), &DeleteParams::default())
            .await?;
    }
    loop {
        let left = machines.list(&ListParams::default()).await?.items.len();
        if left == 0 {
            break;
        }
        if del_start.elapsed() > Duration::from_secs(600) {
            bail!("{left} machines not deleted after 10 min");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let deleted = del_start.elapsed();
    let leftover = vc.find_vms_by_extra_config(OWNER_KEY, "").await?.len();
    let ours = vc
        .all_vms(&["config.extraConfig"])
        .await?
        .into_iter()
        .filter(|(_, p)| {
            p.get("config.extraConfig")
                .is_some_and(|v| v.children.iter().any(|o| o.child_text("key") == Some(OWNER_KEY)))
        })
        .count();
    println!("machines: {n}");
    println!("objects created in: {:.2} s", created.as_secs_f64());
    println!(
        "all Ready after: {:.2} s  => {:.1} machines/min",
        all_ready.as_secs_f64(),
        n as f64 / all_ready.as_secs_f64() * 60.0
    );
    println!(
        "time to Ready: p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        percentile(&times, 1.0)
    );
    println!(
        "all deleted (VMs destroyed, finalizers released) after: {:.2} s => {:.1} machines/min",
        deleted.as_secs_f64(),
        n as f64 / deleted.as_secs_f64() * 60.0
    );
    println!("VMs of ours left in vcsim: {ours} (empty-UID matches: {leftover})");
    Ok(())
}
