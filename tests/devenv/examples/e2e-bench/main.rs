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
//! `Ready`, and each VM's time from its create to Ready (p50/p95/max); the API server's own
//! count of writes (`apiserver_request_total`, by verb and resource, the bench's own creates
//! apart) per VM, and the controller's by kind (its `/metrics`) against the theoretical minimum;
//! the reads it served (GET, LIST, WATCH by resource) per VM and its own CPU seconds until Ready;
//! Proxmox calls per VM (the simulator's count, task status polls apart); how often each
//! machine's mirrored fields changed; p50/p99 latency from the provider's final status write to
//! the VirtualMachine showing it (same watch, so the watch delay cancels); each manager's peak
//! RSS (`VmHWM`) and CPU seconds; writes and Proxmox calls per minute once everything is Ready
//! (`BENCH_IDLE_SECS`, default 60); and the floor: as many writes as the managers made, from a
//! plain client with 32 requests in flight against the same API server.
//!
//! `BENCH_SIM=realistic` gives the simulator PVE-like task durations and a guest agent that
//! answers 5 s after boot (default `instant`). `BENCH_JSON=path` writes the results as JSON
//! (with the commit); `tests/devenv/bench/last-run.json` is the committed last run.
//!
//! `BENCH_SCENARIO=capi`: the second scenario, N CAPI Machines through CAPI's own core manager
//! (`capi.rs`; its committed last run is `tests/devenv/bench/last-run-capi.json`).
//! `BENCH_BACKEND=vsphere` or `libvirt`: the standalone scenario on vcsim or libvirt's test
//! driver (`backends.rs`; `tests/devenv/bench/last-run-vsphere.json`, `last-run-libvirt.json`).

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

mod backends;
mod capi;

/// What both scenarios take from the command line and the environment.
struct Options {
    /// VirtualMachines (standalone) or Machines (CAPI).
    n: usize,
    /// The provider's `--concurrency`.
    concurrency: String,
    /// PVE-like task times and a guest agent 5 s after boot, else zero-delay tasks.
    realistic: bool,
    /// How long idle cost is watched after the run.
    idle_secs: u64,
}

impl Options {
    fn from_env() -> anyhow::Result<Self> {
        let n: usize = std::env::args()
            .nth(1)
            .map(|a| a.parse())
            .transpose()
            .context("N must be a number")?
            .unwrap_or(500);
        let concurrency = std::env::var("BENCH_PROVIDER_CONCURRENCY").unwrap_or_else(|_| "16".to_owned());
        let realistic = match std::env::var("BENCH_SIM").as_deref() {
            Ok("realistic") => true,
            Ok("instant") | Err(_) => false,
            Ok(other) => bail!("BENCH_SIM must be instant or realistic, not {other:?}"),
        };
        let idle_secs: u64 = std::env::var("BENCH_IDLE_SECS")
            .ok()
            .map(|v| v.parse())
            .transpose()
            .context("BENCH_IDLE_SECS must be a number of seconds")?
            .unwrap_or(60);
        Ok(Self {
            n,
            concurrency,
            realistic,
            idle_secs,
        })
    }

    fn sim_config(&self) -> banlieue_pve_sim::SimConfig {
        if self.realistic {
            banlieue_pve_sim::SimConfig::default()
        } else {
            banlieue_pve_sim::SimConfig::fast()
        }
    }

    fn sim_name(&self) -> &'static str {
        if self.realistic { "realistic" } else { "instant" }
    }

    fn sim_kind(&self) -> &'static str {
        if self.realistic {
            "PVE-like task times, guest agent 5 s after boot"
        } else {
            "zero-delay tasks"
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let options = Options::from_env()?;
    let scenario = std::env::var("BENCH_SCENARIO").unwrap_or_else(|_| "standalone".to_owned());
    let backend = std::env::var("BENCH_BACKEND").unwrap_or_else(|_| "proxmox".to_owned());
    match (scenario.as_str(), backend.as_str()) {
        ("standalone", "proxmox") => standalone(options).await,
        ("capi", "proxmox") => capi::run(options).await,
        ("standalone", "vsphere") => backends::run(options, backends::Backend::Vsphere).await,
        ("standalone", "libvirt") => backends::run(options, backends::Backend::Libvirt).await,
        _ => bail!(
            "BENCH_SCENARIO={scenario:?} with BENCH_BACKEND={backend:?} is not a run this bench has: \
             standalone with proxmox, vsphere or libvirt, capi with proxmox"
        ),
    }
}

/// The first scenario: N standalone VirtualMachines.
async fn standalone(options: Options) -> anyhow::Result<()> {
    let Options {
        n,
        ref concurrency,
        idle_secs,
        ..
    } = options;
    // `BENCH_APISERVER_PROFILE=file`: a Go CPU profile of the API server over the first
    // `BENCH_APISERVER_PROFILE_SECS` (default 20) seconds from the first create, for
    // `go tool pprof -top <kube-apiserver> file`.
    let profile_to = std::env::var_os("BENCH_APISERVER_PROFILE").map(std::path::PathBuf::from);
    let profile_secs: u64 = std::env::var("BENCH_APISERVER_PROFILE_SECS")
        .ok()
        .map(|v| v.parse())
        .transpose()
        .context("BENCH_APISERVER_PROFILE_SECS must be a number of seconds")?
        .unwrap_or(20);
    let mut env = TestEnv::builder().allow_external(false);
    if profile_to.is_some() {
        env = env.apiserver_arg("--profiling=true");
    }
    let env = env.start().await?;
    env.install_crds(&banlieue_api::crds::all()).await?;
    let client = env.client().await?;
    let sim = banlieue_pve_sim::start(banlieue_pve_sim::SimConfig {
        check_returns: false,
        ..options.sim_config()
    })
    .await?;
    let provider = "bench-sim";
    banlieue_dev::register_simulator_as(&client, &sim, provider).await?;
    let namespace = env.namespace("bench").await?;
    let ns = namespace.to_string();

    let bin_dir = banlieue_dev::binary_dir()?;
    let logs = env.workdir().join("bench-logs");
    let provider_process = banlieue_dev::start_controller(
        &bin_dir,
        banlieue_dev::PROXMOX_PROVIDER,
        &[
            "--namespace",
            &ns,
            "--concurrency",
            concurrency,
            "--metrics-bind-address=127.0.0.1:0",
            "--health-probe-bind-address=127.0.0.1:0",
            "--log-format=text",
        ],
        env.admin().path(),
        &logs,
    )?;
    let (mut controller, metrics_addr) = start_banlieue_controller(&env, &ns, &logs).await?;

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

    let (requests_before, apiserver_cpu_before) = apiserver_requests(&client).await?;
    sim.reset_calls();
    eprintln!("creating {n} VirtualMachines");
    let start = Instant::now();
    let profile = profile_to.map(|path| {
        let client = client.clone();
        tokio::spawn(async move { apiserver_profile(&client, profile_secs, &path).await })
    });
    let spec = json!({"source": {"proxmox": {"vmid": 9000}}, "cpu": {"cores": 1}, "memoryMiB": 512});
    let created_at = create_vms(&client, &ns, n, provider, &spec).await?;
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
    if let Some(profile) = profile {
        let path = profile.await??;
        eprintln!("API server CPU profile: {}", path.display());
    }
    // Let the controller settle, then count (no write may follow the last mirror).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (requests_ready, apiserver_cpu_ready) = apiserver_requests(&client).await?;
    let writes_ready = of_verbs(&requests_ready, WRITE_VERBS);
    let calls_ready = sim.calls();
    let agents_since: HashMap<String, Instant> = sim.agents_answering_since().into_iter().collect();
    let cpu_ready = [cpu_seconds(provider_process.id()), cpu_seconds(controller.id())];
    eprintln!("all Ready; watching {idle_secs} s of idle");
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let writes_idle = of_verbs(&apiserver_requests(&client).await?.0, WRITE_VERBS);
    let calls_idle = sim.calls();
    let metrics = get(&metrics_addr, "/metrics")?;
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
    let mut to_ready: Vec<Duration> = {
        let (c, v) = (created_at.lock().expect("lock"), vm_done.lock().expect("lock"));
        v.iter()
            .filter_map(|(name, done)| c.get(name).map(|t| done.saturating_duration_since(*t)))
            .collect()
    };
    to_ready.sort();
    // From the moment the simulated guest agent starts answering to the VirtualMachine's Ready:
    // what polling costs in latency.
    let mut agent_to_ready: Vec<Duration> = {
        let v = vm_done.lock().expect("lock");
        v.iter()
            .filter_map(|(name, done)| agents_since.get(name).map(|t| done.saturating_duration_since(*t)))
            .collect()
    };
    agent_to_ready.sort();
    // The API server's count: every write to the API during the run, by verb and resource,
    // the bench's own N creates of VirtualMachines apart.
    let (by_kind, reads) = served_between(&requests_ready, &requests_before, ("virtualmachines", n as f64));
    let managers_writes: f64 = by_kind.values().sum();
    let apiserver_cpu = apiserver_cpu_ready - apiserver_cpu_before;
    let idle_writes: f64 = diff(&writes_idle, &writes_ready).values().sum();
    let polls = |calls: &std::collections::BTreeMap<String, u64>| -> (u64, u64) {
        let status = calls
            .iter()
            .filter(|(k, _)| k.contains("/tasks/") || k.contains("/agent/"))
            .map(|(_, v)| v)
            .sum();
        (calls.values().sum::<u64>() - status, status)
    };
    let (pve_calls, pve_polls) = polls(&calls_ready);
    let idle_calls: u64 = calls_idle.values().sum::<u64>() - calls_ready.values().sum::<u64>();
    let per_minute = |v: f64| v * 60.0 / idle_secs.max(1) as f64;
    let cpu_done = [cpu_seconds(provider_process.id()), cpu_seconds(controller.id())];
    let rss = [peak_rss_kib(provider_process.id()), peak_rss_kib(controller.id())];
    let floor = floor_rate(&client, &ns, managers_writes.round() as usize).await?;

    println!(
        "N = {n} VirtualMachines, provider --concurrency {concurrency}, simulator with {}",
        options.sim_kind()
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
    if !to_ready.is_empty() {
        println!(
            "create → VirtualMachine Running and Ready: p50 {:.1} s, p95 {:.1} s, max {:.1} s",
            percentile(&to_ready, 0.5).as_secs_f64(),
            percentile(&to_ready, 0.95).as_secs_f64(),
            to_ready[to_ready.len() - 1].as_secs_f64()
        );
    }
    if !agent_to_ready.is_empty() {
        println!(
            "guest agent answering → VirtualMachine Running and Ready: p50 {:.2} s, p95 {:.2} s, max {:.2} s",
            percentile(&agent_to_ready, 0.5).as_secs_f64(),
            percentile(&agent_to_ready, 0.95).as_secs_f64(),
            agent_to_ready[agent_to_ready.len() - 1].as_secs_f64()
        );
    }
    println!(
        "API server writes per VM (apiserver_request_total, both managers, the bench's creates apart): {:.2}",
        per_vm(managers_writes)
    );
    println!("  {:<8} {:<36} {:>9}", "verb", "resource", "per VM");
    for ((verb, resource), count) in &by_kind {
        println!("  {verb:<8} {resource:<36} {:>9.2}", per_vm(*count));
    }
    println!(
        "API server reads per VM: {:.2}; its CPU until Ready: {apiserver_cpu:.1} s",
        per_vm(reads.values().sum())
    );
    for ((verb, resource), count) in &reads {
        println!("  {verb:<8} {resource:<36} {:>9.2}", per_vm(*count));
    }
    println!(
        "Proxmox calls per VM: {:.2} (+ {:.2} task status and guest agent polls)",
        per_vm(pve_calls as f64),
        per_vm(pve_polls as f64)
    );
    let mut by_call: Vec<(&String, &u64)> = calls_ready.iter().collect();
    by_call.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (call, count) in by_call {
        println!("  {call:<60} {:>9.2}", per_vm(*count as f64));
    }
    let show_cpu = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.1} s", b - a.min(b)),
        _ => "?".to_owned(),
    };
    println!(
        "provider: peak RSS {}, CPU {} until Ready; controller: peak RSS {}, CPU {} until Ready",
        show_rss(rss[0]),
        cpu_ready[0].map_or_else(|| "?".to_owned(), |c| format!("{c:.1} s")),
        show_rss(rss[1]),
        cpu_ready[1].map_or_else(|| "?".to_owned(), |c| format!("{c:.1} s")),
    );
    println!(
        "idle after Ready ({idle_secs} s): {:.1} API writes/min, {:.1} Proxmox calls/min, CPU {} (provider), {} (controller)",
        per_minute(idle_writes),
        per_minute(idle_calls as f64),
        show_cpu(cpu_ready[0], cpu_done[0]),
        show_cpu(cpu_ready[1], cpu_done[1]),
    );
    println!(
        "floor: {} writes from a plain client ({CREATES_IN_FLIGHT} in flight) took {:.1} s ({:.0} writes/s); the managers' writes took {:.1} s end to end: {:.1}× the floor",
        floor.0,
        floor.1.as_secs_f64(),
        floor.0 as f64 / floor.1.as_secs_f64().max(1e-9),
        wall.as_secs_f64(),
        wall.as_secs_f64() / floor.1.as_secs_f64().max(1e-9),
    );
    write_json(json!({
            "scenario": "standalone",
            "n": n,
            "simulator": options.sim_name(),
            "provider_concurrency": concurrency,
            "wall_seconds": wall.as_secs_f64(),
            "to_ready_seconds": (!to_ready.is_empty()).then(|| json!({
                "p50": percentile(&to_ready, 0.5).as_secs_f64(),
                "p95": percentile(&to_ready, 0.95).as_secs_f64(),
                "max": to_ready[to_ready.len() - 1].as_secs_f64(),
            })),
            "agent_to_ready_seconds": (!agent_to_ready.is_empty()).then(|| json!({
                "p50": percentile(&agent_to_ready, 0.5).as_secs_f64(),
                "p95": percentile(&agent_to_ready, 0.95).as_secs_f64(),
                "max": agent_to_ready[agent_to_ready.len() - 1].as_secs_f64(),
            })),
            "api_writes_per_vm": per_vm(managers_writes),
            "api_writes_per_vm_by_verb_and_resource": by_kind.iter()
                .map(|((verb, resource), c)| json!({"verb": verb, "resource": resource, "per_vm": per_vm(*c)}))
                .collect::<Vec<_>>(),
            "api_reads_per_vm_by_verb_and_resource": reads.iter()
                .map(|((verb, resource), c)| json!({"verb": verb, "resource": resource, "per_vm": per_vm(*c)}))
                .collect::<Vec<_>>(),
            "apiserver_cpu_seconds_until_ready": apiserver_cpu,
            "controller_writes_per_vm": per_vm(total),
            "proxmox_calls_per_vm": per_vm(pve_calls as f64),
            "proxmox_polls_per_vm": per_vm(pve_polls as f64),
            "proxmox_calls_per_vm_by_endpoint": calls_ready
                .iter()
                .map(|(call, count)| (call.clone(), serde_json::json!(per_vm(*count as f64))))
                .collect::<serde_json::Map<_, _>>(),
            "provider": {"peak_rss_mib": rss[0].map(|k| k as f64 / 1024.0), "cpu_seconds_until_ready": cpu_ready[0]},
            "controller": {"peak_rss_mib": rss[1].map(|k| k as f64 / 1024.0), "cpu_seconds_until_ready": cpu_ready[1]},
            "idle": {"seconds": idle_secs, "api_writes_per_minute": per_minute(idle_writes),
                     "proxmox_calls_per_minute": per_minute(idle_calls as f64)},
            "floor": {"writes": floor.0, "seconds": floor.1.as_secs_f64()},
    }))?;
    machines_task.abort();
    vms_task.abort();
    drop(controller);
    drop(provider_process);
    sim.shutdown().await;
    Ok(())
}

/// With `BENCH_JSON=path`, writes `result` there with the commit measured (`git rev-parse`).
fn write_json(mut result: serde_json::Value) -> anyhow::Result<()> {
    let Ok(path) = std::env::var("BENCH_JSON") else {
        return Ok(());
    };
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    result["commit"] = json!(commit);
    std::fs::write(&path, serde_json::to_string_pretty(&result)? + "\n")
        .with_context(|| format!("writing {path}"))?;
    eprintln!("results written to {path}");
    Ok(())
}

/// A peak RSS in KiB, shown in MiB.
fn show_rss(kib: Option<u64>) -> String {
    kib.map_or_else(|| "?".to_owned(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

/// Requests the API server has served so far, by (verb, resource[/subresource]), from its own
/// `apiserver_request_total`, and its CPU seconds (`process_cpu_seconds_total`); read with the
/// admin client.
async fn apiserver_requests(client: &Client) -> anyhow::Result<(Requests, f64)> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(request)
        .await
        .context("reading the API server's /metrics")?;
    let cpu = text
        .lines()
        .find_map(|l| l.strip_prefix("process_cpu_seconds_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    let mut out = Requests::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let resource = match label("subresource").as_str() {
            "" => label("resource"),
            sub => format!("{}/{sub}", label("resource")),
        };
        *out.entry((label("verb"), resource)).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    Ok((out, cpu))
}

/// Writes the API server's CPU profile over the next `seconds` (its `/debug/pprof/profile`,
/// served with `--profiling=true`) to `path`.
async fn apiserver_profile(
    client: &Client,
    seconds: u64,
    path: &std::path::Path,
) -> anyhow::Result<std::path::PathBuf> {
    use http_body_util::BodyExt;
    let request = http::Request::get(format!("/debug/pprof/profile?seconds={seconds}")).body(Vec::new())?;
    let response = client
        .send(request.map(kube::client::Body::from))
        .await
        .context("asking the API server for a CPU profile")?;
    anyhow::ensure!(
        response.status().is_success(),
        "the API server's profile answered {}",
        response.status()
    );
    let bytes = response.into_body().collect().await?.to_bytes();
    std::fs::write(path, &bytes).with_context(|| format!("writing {}", path.display()))?;
    Ok(path.to_owned())
}

/// What the managers asked of the API server between `before` and `after`: writes by (verb,
/// resource) without the bench's own `creates` (`(resource, count)` POSTs), and reads (GET, LIST,
/// WATCH; the bench's own watches included), each without zero rows.
fn served_between(after: &Requests, before: &Requests, creates: (&str, f64)) -> (Requests, Requests) {
    let mut writes = diff(&of_verbs(after, WRITE_VERBS), &of_verbs(before, WRITE_VERBS));
    if let Some(count) = writes.get_mut(&("POST".to_owned(), creates.0.to_owned())) {
        *count -= creates.1;
    }
    writes.retain(|_, v| *v > 0.0);
    let mut reads = diff(&of_verbs(after, READ_VERBS), &of_verbs(before, READ_VERBS));
    reads.retain(|_, v| *v > 0.0);
    (writes, reads)
}

/// Starts the banlieue controller on `ns` with its metrics on a free loopback port, and waits
/// (60 s at most) until it is ready; the process and that address.
async fn start_banlieue_controller(
    env: &TestEnv,
    ns: &str,
    logs: &std::path::Path,
) -> anyhow::Result<(banlieue_testenv::ManagedProcess, String)> {
    let metrics_addr = format!(
        "127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()
    );
    let mut controller = banlieue_dev::start_controller(
        &banlieue_dev::binary_dir()?,
        banlieue_dev::BANLIEUE,
        &["controller", "--namespace", ns, "--metrics-addr", &metrics_addr],
        env.admin().path(),
        logs,
    )?;
    let ready_deadline = Instant::now() + Duration::from_secs(60);
    while !get(&metrics_addr, "/readyz").is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
        controller.check_running()?;
        if Instant::now() > ready_deadline {
            bail!("the controller is not ready after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((controller, metrics_addr))
}

/// Creates VirtualMachines `vm-0000` … of `spec` (its `providerRef` set to `provider`), 32
/// requests in flight; when each create was sent.
async fn create_vms(
    client: &Client,
    ns: &str,
    n: usize,
    provider: &str,
    spec: &serde_json::Value,
) -> anyhow::Result<Stamps> {
    let created_at: Stamps = Arc::default();
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let mut spec = spec.clone();
    spec["providerRef"] = json!({"name": provider});
    create_in_flight(n, |i| {
        let (vms, created_at, spec) = (vms.clone(), created_at.clone(), spec.clone());
        async move {
            let name = format!("vm-{i:04}");
            created_at
                .lock()
                .expect("lock")
                .insert(name.clone(), Instant::now());
            let vm: VirtualMachine = serde_json::from_value(json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                "metadata": {"name": name},
                "spec": spec,
            }))?;
            vms.create(&PostParams::default(), &vm).await?;
            anyhow::Ok(())
        }
    })
    .await?;
    Ok(created_at)
}

/// How many creates the bench keeps in flight: for its VMs and for the floor alike, so the floor
/// is measured as the VMs are created.
const CREATES_IN_FLIGHT: usize = 32;

/// Runs `create(0)` … `create(n - 1)`, [`CREATES_IN_FLIGHT`] at a time; the first error ends it.
async fn create_in_flight<F, Fut>(n: usize, create: F) -> anyhow::Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    futures::stream::iter(0..n)
        .map(create)
        .buffer_unordered(CREATES_IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Request counts by (verb, resource).
type Requests = std::collections::BTreeMap<(String, String), f64>;

const WRITE_VERBS: &[&str] = &["POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"];
const READ_VERBS: &[&str] = &["GET", "LIST", "WATCH"];

/// The requests among `requests` with one of `verbs`.
fn of_verbs(requests: &Requests, verbs: &[&str]) -> Requests {
    requests
        .iter()
        .filter(|((verb, _), _)| verbs.contains(&verb.as_str()))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

/// `after - before`, per key.
fn diff(after: &Requests, before: &Requests) -> Requests {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .collect()
}

/// The floor: `writes` small writes (ConfigMap creates) from a plain client with
/// [`CREATES_IN_FLIGHT`] in flight, on the same API server; how many and how long.
async fn floor_rate(client: &Client, ns: &str, writes: usize) -> anyhow::Result<(usize, Duration)> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let start = Instant::now();
    create_in_flight(writes, |i| {
        let api = api.clone();
        async move {
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": format!("floor-{i:06}")}, "data": {"k": "v"},
            }))?;
            api.create(&PostParams::default(), &cm).await?;
            anyhow::Ok(())
        }
    })
    .await?;
    Ok((writes, start.elapsed()))
}

/// CPU seconds (user + system) a process has used, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces, in parentheses).
    let rest = stat.rsplit_once(") ")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // USER_HZ is 100 on Linux.
    Some(ticks / 100.0)
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
