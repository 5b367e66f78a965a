//! Benchmark of the whole standalone path: N VirtualMachines created at once on a private
//! control plane, the real Proxmox provider (`banlieue-proxmox`) and the banlieue controller
//! (`banlieue controller`) as their own processes, a Proxmox VE simulator with zero-delay tasks.
//!
//! ```sh
//! cargo build -p banlieue-controllers -p banlieue-proxmox -p banlieue-dev --example e2e-bench
//! target/debug/examples/e2e-bench 500            # N (default 500); BENCH_PROVIDER_CONCURRENCY=16
//! ```
//!
//! Reported: wall time from the first create until every VirtualMachine is `Running` and
//! `Ready`; the controller's API writes per VM by kind (from its `/metrics`) against the
//! theoretical minimum; how often each machine's mirrored fields changed (each change is at
//! most one status write); p50/p99 latency from the provider's final status write (as this process's
//! watch sees it) to the VirtualMachine showing it (same watch, so the watch delay cancels);
//! the controller's peak RSS (`VmHWM`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use banlieue_api::banlieue::{VirtualMachine, VirtualMachinePhase};
use banlieue_api::condition;
use banlieue_api::infrastructure::ProxmoxMachine;
use banlieue_testenv::TestEnv;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

type Stamps = Arc<Mutex<HashMap<String, Instant>>>;
/// Per machine: the last mirrored state seen and how many times it changed.
type Transitions = Arc<Mutex<HashMap<String, (String, usize)>>>;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()
        .context("N must be a number")?
        .unwrap_or(500);
    let concurrency = std::env::var("BENCH_PROVIDER_CONCURRENCY").unwrap_or_else(|_| "16".to_owned());

    let env = TestEnv::builder().allow_external(false).start().await?;
    env.install_crds(&banlieue_api::crds::all()).await?;
    let client = env.client().await?;
    let sim = banlieue_pve_sim::start(banlieue_pve_sim::SimConfig {
        check_returns: false,
        ..banlieue_pve_sim::SimConfig::fast()
    })
    .await?;
    let provider = "bench-sim";
    banlieue_dev::register_simulator_as(&client, &sim, provider).await?;
    let namespace = env.namespace("bench").await?;
    let ns = namespace.to_string();

    let bin_dir = banlieue_dev::binary_dir()?;
    let logs = env.workdir().join("bench-logs");
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let _provider = banlieue_dev::start_controller(
        &bin_dir,
        banlieue_dev::PROXMOX_PROVIDER,
        &[
            "--namespace",
            &ns,
            "--concurrency",
            &concurrency,
            "--metrics-bind-address=127.0.0.1:0",
            "--health-probe-bind-address=127.0.0.1:0",
            "--log-format=text",
        ],
        env.admin().path(),
        &logs,
    )?;
    let mut controller = banlieue_dev::start_controller(
        &bin_dir,
        banlieue_dev::BANLIEUE,
        &["controller", "--namespace", &ns, "--metrics-addr", &metrics_addr],
        env.admin().path(),
        &logs,
    )?;
    let ready_deadline = Instant::now() + Duration::from_secs(60);
    while !get(&metrics_addr, "/readyz").is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
        controller.check_running()?;
        if Instant::now() > ready_deadline {
            bail!("the controller is not ready after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Observers: the provider's final write per machine, distinct provider states per machine,
    // and each VirtualMachine becoming Running and Ready.
    let provider_done: Stamps = Arc::default();
    let states: Transitions = Arc::default();
    let vm_done: Stamps = Arc::default();
    let machines_task = tokio::spawn(observe_machines(
        client.clone(),
        ns.clone(),
        provider_done.clone(),
        states.clone(),
    ));
    let vms_task = tokio::spawn(observe_vms(client.clone(), ns.clone(), vm_done.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;

    eprintln!("creating {n} VirtualMachines");
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let start = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let vms = vms.clone();
            async move {
                let vm: VirtualMachine = serde_json::from_value(json!({
                    "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                    "metadata": {"name": format!("vm-{i:04}")},
                    "spec": {"providerRef": {"name": provider}, "source": {"proxmox": {"vmid": 9000}},
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
    eprintln!("created in {created:?}; waiting for all Running and Ready");
    let deadline = start + Duration::from_secs(1800);
    let mut last_report = Instant::now();
    while vm_done.lock().expect("lock").len() < n {
        controller.check_running()?;
        if Instant::now() > deadline {
            bail!(
                "only {} of {n} VirtualMachines Ready after 1800 s",
                vm_done.lock().expect("lock").len()
            );
        }
        if last_report.elapsed() > Duration::from_secs(15) {
            eprintln!(
                "  {:>6.1}s: {} Ready",
                start.elapsed().as_secs_f64(),
                vm_done.lock().expect("lock").len()
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let wall = start.elapsed();
    // Let the controller settle, then count (no write may follow the last mirror).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let metrics = get(&metrics_addr, "/metrics")?;
    let peak_rss_kib = peak_rss_kib(controller.id());
    let value = |target: &str| -> f64 {
        let prefix = format!("banlieue_controller_writes_total{{target=\"{target}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    let reconciles = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "controller_runtime_reconcile_total{controller=\"virtualmachine\",result=\"success\"} ",
            )
        })
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    let per_vm = |v: f64| v / n as f64;
    let finalizers = value("virtualmachine_finalizer");
    let machine_applies = value("infrastructure_machine");
    let cluster_applies = value("infrastructure_cluster");
    let status_writes = value("virtualmachine_status");
    let total = finalizers + machine_applies + cluster_applies + status_writes;

    let mut latencies: Vec<Duration> = {
        let (p, v) = (provider_done.lock().expect("lock"), vm_done.lock().expect("lock"));
        v.iter()
            .filter_map(|(name, done)| p.get(name).map(|w| done.saturating_duration_since(*w)))
            .collect()
    };
    latencies.sort();
    let changes: Vec<usize> = states.lock().expect("lock").values().map(|(_, c)| *c).collect();
    let mean_changes = changes.iter().sum::<usize>() as f64 / changes.len().max(1) as f64;
    let sim_vms = sim.vms().into_iter().filter(|v| !v.template).count();

    println!(
        "N = {n} VirtualMachines, provider --concurrency {concurrency}, simulator with zero-delay tasks"
    );
    println!(
        "created in {:.1} s; all Running and Ready after {:.1} s",
        created.as_secs_f64(),
        wall.as_secs_f64()
    );
    println!("simulated VMs: {sim_vms}");
    println!(
        "controller writes per VM: {:.2} total = {:.2} finalizer + {:.2} machine apply + {:.3} infra cluster apply ({cluster_applies} in all) + {:.2} status",
        per_vm(total),
        per_vm(finalizers),
        per_vm(machine_applies),
        per_vm(cluster_applies),
        per_vm(status_writes),
    );
    println!(
        "theoretical minimum per VM: 3 + 1/N (finalizer, machine, one final status; one infra cluster per namespace); \
         machine state changes seen per machine (fields the mirror reads; each is at most one status write): {mean_changes:.2}"
    );
    println!("controller reconciles per VM: {:.2}", per_vm(reconciles));
    if !latencies.is_empty() {
        println!(
            "provider's final status write → VirtualMachine Ready: p50 {:?}, p99 {:?}, max {:?} ({} samples)",
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            latencies[latencies.len() - 1],
            latencies.len()
        );
    }
    println!(
        "controller peak RSS: {}",
        peak_rss_kib.map_or_else(|| "?".to_owned(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
    );
    machines_task.abort();
    vms_task.abort();
    drop(controller);
    sim.shutdown().await;
    Ok(())
}

/// What the mirror reads of a machine, as a string: one distinct value per provider state.
fn machine_state(pm: &ProxmoxMachine) -> String {
    let status = serde_json::to_value(&pm.status).unwrap_or_default();
    let ready = pm
        .status
        .as_ref()
        .and_then(|s| condition::find(&s.conditions, condition::READY))
        .map(|c| format!("{}/{}/{}", c.status, c.reason, c.message));
    format!(
        "{:?}|{ready:?}|{}|{}|{}|{}|{:?}",
        pm.spec.provider_id,
        status["initialization"],
        status["provisioning"],
        status["addresses"],
        status["powerState"],
        status.get("node"),
    )
}

async fn observe_machines(
    client: Client,
    ns: String,
    done: Stamps,
    states: Transitions,
) -> anyhow::Result<()> {
    let api: Api<ProxmoxMachine> = Api::namespaced(client, &ns);
    let mut stream = watcher(api, watcher::Config::default()).applied_objects().boxed();
    while let Some(pm) = stream.try_next().await? {
        let name = pm.name_any();
        {
            let mut states = states.lock().expect("lock");
            let (last, changes) = states.entry(name.clone()).or_default();
            let now = machine_state(&pm);
            if *last != now {
                *last = now;
                *changes += 1;
            }
        }
        let ready = pm
            .status
            .as_ref()
            .is_some_and(|s| condition::is_true(&s.conditions, condition::READY));
        if ready {
            done.lock()
                .expect("lock")
                .entry(name)
                .or_insert_with(Instant::now);
        }
    }
    Ok(())
}

async fn observe_vms(client: Client, ns: String, done: Stamps) -> anyhow::Result<()> {
    let api: Api<VirtualMachine> = Api::namespaced(client, &ns);
    let mut stream = watcher(api, watcher::Config::default()).applied_objects().boxed();
    while let Some(vm) = stream.try_next().await? {
        let ok = vm.status.as_ref().is_some_and(|s| {
            s.phase == Some(VirtualMachinePhase::Running)
                && condition::is_true(&s.conditions, condition::READY)
        });
        if ok {
            done.lock()
                .expect("lock")
                .entry(vm.name_any())
                .or_insert_with(Instant::now);
        }
    }
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Peak resident set size (`VmHWM`) of a process, in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
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
