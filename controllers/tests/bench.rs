//! Throughput and latency of the controller on a real apiserver (its own control plane, so no
//! other test's traffic is counted). N VirtualMachines (default 100, `BANLIEUE_BENCH_N`) are
//! created at once; a fake provider answers each ProxmoxMachine with a Running status as soon as
//! it appears. Reported: wall time until every VirtualMachine is Running, API writes per VM
//! (asserted against the theoretical minimum: 1 machine apply + 2 status writes, Provisioning
//! and Running), and p50/p99 latency from the provider's status write to the mirrored
//! VirtualMachine status.
//!
//! `cargo test -p banlieue-controllers --release --test bench -- --nocapture`

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use banlieue_api::banlieue::{Provider, VirtualMachine, VirtualMachinePhase};
use banlieue_api::infrastructure::ProxmoxMachine;
use banlieue_controllers::controller::{Metrics, run_with_metrics};
use banlieue_testenv::TestEnv;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

type Stamps = Arc<Mutex<HashMap<String, Instant>>>;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Answers every ProxmoxMachine without status with a Running status, recording when.
async fn fake_provider(client: Client, ns: String, written: Stamps) -> anyhow::Result<()> {
    let api: Api<ProxmoxMachine> = Api::namespaced(client, &ns);
    let pp = PatchParams::apply("bench-provider").force();
    let mut machines = watcher(api.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    while let Some(pm) = machines.try_next().await? {
        let name = pm.name_any();
        if pm.status.is_some() || written.lock().expect("lock").contains_key(&name) {
            continue;
        }
        let body = json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachine",
            "status": {"initialization": {"provisioned": true}, "powerState": "On",
                "addresses": [{"type": "InternalIP", "address": "192.0.2.10"}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "Running", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
        api.patch_status(&name, &pp, &Patch::Apply(&body)).await?;
        written.lock().expect("lock").insert(name, Instant::now());
    }
    Ok(())
}

#[tokio::test]
async fn many_virtual_machines_at_once() -> anyhow::Result<()> {
    let n: usize = std::env::var("BANLIEUE_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let env = TestEnv::shared_with(|b| b.crds(banlieue_api::crds::all())).await?;
    let ns = env.namespace("bench").await?.to_string();
    let client = env.client().await?;
    let provider: Provider = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "bench-pve"},
        "spec": {"backend": "proxmox", "endpoint": "https://pve.example:8006",
                 "credentialsRef": {"name": "pve", "namespace": "banlieue-system"}},
    }))?;
    Api::<Provider>::all(client.clone())
        .create(&PostParams::default(), &provider)
        .await?;

    let metrics = Arc::new(Metrics::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(run_with_metrics(
        client.clone(),
        Some(ns.clone()),
        async move {
            let _ = stopped.await;
        },
        metrics.clone(),
    ));
    let written: Stamps = Arc::default();
    let provider_task = tokio::spawn(fake_provider(client.clone(), ns.clone(), written.clone()));

    // Observe the VirtualMachines becoming Running.
    let running: Stamps = Arc::default();
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let observer = {
        let (vms, running) = (vms.clone(), running.clone());
        tokio::spawn(async move {
            let mut stream = watcher(vms, watcher::Config::default()).applied_objects().boxed();
            while let Some(Ok(vm)) = stream.next().await {
                if vm.status.as_ref().and_then(|s| s.phase) == Some(VirtualMachinePhase::Running) {
                    running
                        .lock()
                        .expect("lock")
                        .entry(vm.name_any())
                        .or_insert_with(Instant::now);
                }
            }
        })
    };

    let start = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let vms = vms.clone();
            async move {
                let vm: VirtualMachine = serde_json::from_value(json!({
                    "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                    "metadata": {"name": format!("vm-{i:04}")},
                    "spec": {"providerRef": {"name": "bench-pve"}, "source": {"proxmox": {"vmid": 9000}},
                             "cpu": {"cores": 1}, "memoryMiB": 512},
                }))?;
                vms.create(&PostParams::default(), &vm).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    let created = start.elapsed();
    let deadline = start + Duration::from_secs(300);
    while running.lock().expect("lock").len() < n {
        if Instant::now() > deadline {
            bail!(
                "only {} of {n} VirtualMachines Running after 300 s",
                running.lock().expect("lock").len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let wall = start.elapsed();
    // Let the controller settle, then count: no write may follow the last mirror.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let counters = metrics.snapshot();

    let mut latencies: Vec<Duration> = {
        let (written, running) = (written.lock().expect("lock"), running.lock().expect("lock"));
        running
            .iter()
            .filter_map(|(name, done)| written.get(name).map(|w| done.saturating_duration_since(*w)))
            .collect()
    };
    latencies.sort();
    println!(
        "bench: N={n} created in {created:?}, all Running in {wall:?}; per VM: {:.2} machine applies, {:.2} status writes (minimum 1 + 2), {:.2} reconciles, {} errors; provider write → VM status p50 {:?} p99 {:?}",
        counters.machine_applies as f64 / n as f64,
        counters.status_writes as f64 / n as f64,
        counters.reconciles as f64 / n as f64,
        counters.errors,
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
    );
    assert_eq!(latencies.len(), n);
    assert_eq!(counters.machine_applies, n as u64, "one machine apply per VM");
    assert_eq!(
        counters.status_writes,
        2 * n as u64,
        "two status writes per VM (Provisioning, Running)"
    );

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(30), controller).await;
    provider_task.abort();
    observer.abort();
    Ok(())
}
