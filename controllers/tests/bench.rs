//! Throughput and latency of the controller on a real apiserver (its own control plane, so no
//! other test's traffic is counted). N VirtualMachines (default 100, `BANLIEUE_BENCH_N`) are
//! created at once; a fake provider answers each ProxmoxMachine with a Running status as soon as
//! it appears. Reported: wall time until every VirtualMachine is Running, API writes per VM
//! (asserted against the theoretical minimum with this provider: 1 finalizer patch + 1 machine
//! apply + 1 status write, Running, or 2 when the provider answers only after the controller's
//! progress hold and the first Provisioning is written too, plus one ProxmoxCluster apply for
//! the namespace), and p50/p99 latency from the provider's status write to the mirrored
//! VirtualMachine status. The benchmark with the real provider is `tests/devenv/examples/e2e-bench/`.
//!
//! `cargo test -p banlieue-controllers --release --test bench -- --nocapture`

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use banlieue_api::banlieue::{Provider, VirtualMachine, VirtualMachinePhase};
use banlieue_api::infrastructure::ProxmoxMachine;
use banlieue_controllers::controller::MetricsSnapshot;
use banlieue_testenv::TestEnv;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

/// Kills the controller process on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A minimal HTTP/1.1 GET with 5 s timeouts; the raw response.
fn get(addr: &str, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}

/// Reads the controller's counters from its `/metrics` endpoint.
fn scrape(addr: &str) -> anyhow::Result<MetricsSnapshot> {
    let text = get(addr, "/metrics")?;
    let value = |prefix: &str| -> anyhow::Result<u64> {
        let line = text
            .lines()
            .find(|l| l.starts_with(prefix))
            .ok_or_else(|| anyhow::anyhow!("no {prefix} in /metrics"))?;
        Ok(line.rsplit(' ').next().unwrap_or_default().parse()?)
    };
    let success =
        value("controller_runtime_reconcile_total{controller=\"virtualmachine\",result=\"success\"}")?;
    let errors = value("controller_runtime_reconcile_errors_total{controller=\"virtualmachine\"}")?;
    Ok(MetricsSnapshot {
        reconciles: success + errors,
        errors,
        machine_applies: value("banlieue_controller_writes_total{target=\"infrastructure_machine\"}")?,
        status_writes: value("banlieue_controller_writes_total{target=\"virtualmachine_status\"}")?,
        cluster_applies: value("banlieue_controller_writes_total{target=\"infrastructure_cluster\"}")?,
        finalizer_writes: value("banlieue_controller_writes_total{target=\"virtualmachine_finalizer\"}")?,
        machine_deletes: value("banlieue_controller_writes_total{target=\"infrastructure_machine_delete\"}")?,
    })
}

/// Peak resident set size (`VmHWM`) of a process, in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

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

    // The controller runs as its own process (release-like conditions: it shares nothing with
    // the test but the API server), so its peak RSS can be measured.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let controller = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_banlieue"))
            .args(["controller", "--namespace", &ns, "--metrics-addr", &metrics_addr])
            .env("KUBECONFIG", env.admin().path())
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()?,
    );
    let ready_deadline = Instant::now() + Duration::from_secs(60);
    while !get(&metrics_addr, "/readyz").is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
        if Instant::now() > ready_deadline {
            bail!("the controller is not ready after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let counters = scrape(&metrics_addr)?;
    let peak_rss_kib = peak_rss_kib(controller.0.id());

    let mut latencies: Vec<Duration> = {
        let (written, running) = (written.lock().expect("lock"), running.lock().expect("lock"));
        running
            .iter()
            .filter_map(|(name, done)| written.get(name).map(|w| done.saturating_duration_since(*w)))
            .collect()
    };
    latencies.sort();
    println!(
        "bench: N={n} created in {created:?}, all Running in {wall:?}; per VM: {:.2} finalizer patches, {:.2} machine applies, {:.2} status writes (minimum 1 + 1 + 1), {:.2} reconciles, {} errors; provider write → VM status p50 {:?} p99 {:?}; controller peak RSS {} MiB",
        counters.finalizer_writes as f64 / n as f64,
        counters.machine_applies as f64 / n as f64,
        counters.status_writes as f64 / n as f64,
        counters.reconciles as f64 / n as f64,
        counters.errors,
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        peak_rss_kib.map_or_else(|| "?".to_owned(), |k| format!("{:.1}", k as f64 / 1024.0)),
    );
    assert_eq!(latencies.len(), n);
    assert_eq!(counters.machine_applies, n as u64, "one machine apply per VM");
    assert_eq!(counters.finalizer_writes, n as u64, "one finalizer patch per VM");
    assert_eq!(
        counters.cluster_applies, 1,
        "one ProxmoxCluster apply for the namespace"
    );
    assert!(
        (n as u64..=2 * n as u64).contains(&counters.status_writes),
        "one or two status writes per VM (Running; Provisioning first if held long enough): {}",
        counters.status_writes
    );

    drop(controller);
    provider_task.abort();
    observer.abort();
    Ok(())
}
