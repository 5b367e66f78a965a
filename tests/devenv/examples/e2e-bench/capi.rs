//! The bench's second scenario (`BENCH_SCENARIO=capi`): M Machines through Cluster API's own
//! core manager (`capi-manager`, built by `tests/controlplane/build.sh --capi`, its admission
//! webhooks registered) and the real Proxmox provider, on the same kind of private control plane
//! and simulator as the standalone scenario.
//!
//! One Cluster (no control plane: the Machines' bootstrap data is a ready Secret, so no kubeadm
//! manager runs) over a ProxmoxCluster, and one MachineDeployment of M replicas from a
//! ProxmoxMachineTemplate, created at once. A Machine is done when CAPI shows its
//! infrastructure provisioned and copied the provider ID (`status.initialization.
//! infrastructureProvisioned` and `spec.providerID`): what the provider's contract delivers; the
//! simulated guests run no kubelet, so no Machine gets a Node. Reported: time to all done and
//! each Machine's first sight → done (p50/p95/max), the provider's writes per Machine (its own
//! `banlieue_kubernetes_writes_total`, by kind) beside every API write per Machine (all managers,
//! by verb and resource), reads, the API server's CPU, Proxmox calls per Machine, RSS and CPU of
//! the provider and CAPI's manager, idle cost, and the floor.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use banlieue_capi::webhooks::Manager;
use banlieue_testenv::TestEnv;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::{
    CREATES_IN_FLIGHT, Options, WRITE_VERBS, apiserver_requests, cpu_seconds, diff, floor_rate, get,
    of_verbs, peak_rss_kib, percentile, show_rss, write_json,
};

/// Per Machine: when the bench first saw it and when it was done.
#[derive(Default)]
struct Seen {
    first: HashMap<String, Instant>,
    done: HashMap<String, Instant>,
}

pub async fn run(options: Options) -> anyhow::Result<()> {
    let m = options.n;
    let env = TestEnv::builder().allow_external(false).start().await?;
    env.install_crds(&banlieue_api::crds::all()).await?;
    let capi_crds = banlieue_dev::capi_crds(&banlieue_capi::crds::dir())?;
    env.install_crds(&capi_crds).await?;
    let client = env.client().await?;
    let sim = banlieue_pve_sim::start(banlieue_pve_sim::SimConfig {
        check_returns: false,
        ..options.sim_config()
    })
    .await?;
    let namespace = env.namespace("bench").await?;
    let ns = namespace.to_string();
    let logs = env.workdir().join("bench-logs");
    std::fs::create_dir_all(&logs)?;

    eprintln!(
        "starting CAPI's core manager (log: {}/capi-manager.log)",
        logs.display()
    );
    let capi = banlieue_dev::capi::start_manager(&env, Manager::Core, &logs).await?;
    banlieue_dev::capi::register(&client, Manager::Core, capi.webhook_port, &env.ca_pem()?).await?;
    let bin_dir = banlieue_dev::binary_dir()?;
    let provider_metrics = format!(
        "127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()
    );
    let mut provider = banlieue_dev::start_controller(
        &bin_dir,
        banlieue_dev::PROXMOX_PROVIDER,
        &[
            "--namespace",
            &ns,
            "--concurrency",
            &options.concurrency,
            &format!("--metrics-bind-address={provider_metrics}"),
            "--health-probe-bind-address=127.0.0.1:0",
            "--log-format=text",
        ],
        env.admin().path(),
        &logs,
    )?;

    create_cluster(&client, &ns, &sim).await?;
    eprintln!("waiting for the Cluster's infrastructure");
    let cluster_deadline = Instant::now() + Duration::from_secs(120);
    loop {
        provider.check_running()?;
        let cluster = dynamic(&client, &ns, "cluster.x-k8s.io", "v1beta2", "Cluster")
            .get("bench")
            .await?;
        if cluster.data["status"]["initialization"]["infrastructureProvisioned"] == true {
            break;
        }
        if Instant::now() > cluster_deadline {
            bail!(
                "the Cluster's infrastructure is not provisioned after 120 s: {}",
                cluster.data["status"]
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let seen: Arc<Mutex<Seen>> = Arc::default();
    let watch = tokio::spawn(observe_machines(client.clone(), ns.clone(), seen.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (requests_before, apiserver_cpu_before) = apiserver_requests(&client).await?;
    let provider_writes_before = provider_writes(&provider_metrics)?;
    let capi_cpu_before = cpu_seconds(capi.process.id());
    sim.reset_calls();
    eprintln!("creating a MachineDeployment of {m} Machines");
    let start = Instant::now();
    create_machine_deployment(&client, &ns, m).await?;
    let deadline = start + Duration::from_secs(1800);
    let mut last_report = Instant::now();
    loop {
        let done = seen.lock().expect("lock").done.len();
        if done >= m {
            break;
        }
        provider.check_running()?;
        if Instant::now() > deadline {
            bail!("only {done} of {m} Machines provisioned after 1800 s");
        }
        if last_report.elapsed() > Duration::from_secs(15) {
            eprintln!("  {:>6.1}s: {done} provisioned", start.elapsed().as_secs_f64());
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let wall = start.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (requests_done, apiserver_cpu_done) = apiserver_requests(&client).await?;
    let writes_done = of_verbs(&requests_done, WRITE_VERBS);
    let provider_writes_done = provider_writes(&provider_metrics)?;
    let calls_done = sim.calls();
    let cpu_done = [cpu_seconds(provider.id()), cpu_seconds(capi.process.id())];
    eprintln!("all provisioned; watching {} s of idle", options.idle_secs);
    tokio::time::sleep(Duration::from_secs(options.idle_secs)).await;
    let writes_idle = of_verbs(&apiserver_requests(&client).await?.0, WRITE_VERBS);
    let calls_idle = sim.calls();
    watch.abort();

    let per_machine = |v: f64| v / m as f64;
    // The bench's own create of the MachineDeployment apart.
    let (by_kind, reads) =
        crate::served_between(&requests_done, &requests_before, ("machinedeployments", 1.0));
    let all_writes: f64 = by_kind.values().sum();
    let provider_by_kind: BTreeMap<String, f64> = provider_writes_done
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v - provider_writes_before.get(k).copied().unwrap_or(0.0),
            )
        })
        .filter(|(_, v)| *v > 0.0)
        .collect();
    let provider_total: f64 = provider_by_kind.values().sum();
    let to_done: Vec<Duration> = {
        let seen = seen.lock().expect("lock");
        let mut v: Vec<Duration> = seen
            .done
            .iter()
            .filter_map(|(name, done)| seen.first.get(name).map(|f| done.saturating_duration_since(*f)))
            .collect();
        v.sort();
        v
    };
    let polls: u64 = calls_done
        .iter()
        .filter(|(k, _)| k.contains("/tasks/") || k.contains("/agent/"))
        .map(|(_, v)| v)
        .sum();
    let calls: u64 = calls_done.values().sum::<u64>() - polls;
    let idle_writes: f64 = diff(&writes_idle, &writes_done).values().sum();
    let idle_calls = calls_idle.values().sum::<u64>() - calls_done.values().sum::<u64>();
    let mut idle_writes_by_kind = diff(&writes_idle, &writes_done);
    idle_writes_by_kind.retain(|_, v| *v > 0.0);
    let idle_calls_by_endpoint: BTreeMap<&String, u64> = calls_idle
        .iter()
        .map(|(call, count)| (call, count - calls_done.get(call).copied().unwrap_or(0)))
        .filter(|(_, count)| *count > 0)
        .collect();
    let per_minute = |v: f64| v * 60.0 / options.idle_secs.max(1) as f64;
    let rss = [peak_rss_kib(provider.id()), peak_rss_kib(capi.process.id())];
    let provider_cpu = cpu_done[0];
    let capi_cpu = cpu_done[1].zip(capi_cpu_before).map(|(a, b)| a - b);
    let floor = floor_rate(&client, &ns, all_writes.round() as usize).await?;

    println!(
        "M = {m} CAPI Machines (one MachineDeployment), CAPI's core manager, provider --concurrency {}, simulator with {}",
        options.concurrency,
        options.sim_kind()
    );
    println!(
        "all Machines' infrastructure provisioned after {:.1} s",
        wall.as_secs_f64()
    );
    if !to_done.is_empty() {
        println!(
            "Machine first seen → infrastructure provisioned: p50 {:.1} s, p95 {:.1} s, max {:.1} s",
            percentile(&to_done, 0.5).as_secs_f64(),
            percentile(&to_done, 0.95).as_secs_f64(),
            to_done[to_done.len() - 1].as_secs_f64()
        );
    }
    println!(
        "provider writes per Machine (its banlieue_kubernetes_writes_total): {:.2}",
        per_machine(provider_total)
    );
    for (kind, count) in &provider_by_kind {
        println!("  {kind:<45} {:>9.2}", per_machine(*count));
    }
    println!(
        "API server writes per Machine (apiserver_request_total, CAPI's and the provider's, the bench's create apart): {:.2}",
        per_machine(all_writes)
    );
    for ((verb, resource), count) in &by_kind {
        println!("  {verb:<8} {resource:<36} {:>9.2}", per_machine(*count));
    }
    println!(
        "API server reads per Machine: {:.2}; its CPU until provisioned: {:.1} s",
        per_machine(reads.values().sum()),
        apiserver_cpu_done - apiserver_cpu_before
    );
    println!(
        "Proxmox calls per Machine: {:.2} (+ {:.2} task status and guest agent polls)",
        per_machine(calls as f64),
        per_machine(polls as f64)
    );
    println!(
        "provider: peak RSS {}, CPU {} s; CAPI core manager: peak RSS {}, CPU {} s during the run",
        show_rss(rss[0]),
        provider_cpu.map_or_else(|| "?".to_owned(), |c| format!("{c:.1}")),
        show_rss(rss[1]),
        capi_cpu.map_or_else(|| "?".to_owned(), |c| format!("{c:.1}")),
    );
    println!(
        "idle after provisioned ({} s): {:.1} API writes/min (all managers), {:.1} Proxmox calls/min",
        options.idle_secs,
        per_minute(idle_writes),
        per_minute(idle_calls as f64),
    );
    for ((verb, resource), count) in &idle_writes_by_kind {
        println!("  {verb:<8} {resource:<36} {:>9.1}/min", per_minute(*count));
    }
    for (call, count) in &idle_calls_by_endpoint {
        println!("  {call:<60} {:>9.1}/min", per_minute(*count as f64));
    }
    println!(
        "floor: {} writes from a plain client ({CREATES_IN_FLIGHT} in flight) took {:.1} s; the Machines took {:.1} s: {:.1}× the floor",
        floor.0,
        floor.1.as_secs_f64(),
        wall.as_secs_f64(),
        wall.as_secs_f64() / floor.1.as_secs_f64().max(1e-9),
    );
    write_json(json!({
        "scenario": "capi",
        "m": m,
        "simulator": options.sim_name(),
        "provider_concurrency": options.concurrency,
        "wall_seconds": wall.as_secs_f64(),
        "to_provisioned_seconds": (!to_done.is_empty()).then(|| json!({
            "p50": percentile(&to_done, 0.5).as_secs_f64(),
            "p95": percentile(&to_done, 0.95).as_secs_f64(),
            "max": to_done[to_done.len() - 1].as_secs_f64(),
        })),
        "provider_writes_per_machine": per_machine(provider_total),
        "provider_writes_per_machine_by_kind": provider_by_kind.iter()
            .map(|(k, v)| (k.clone(), json!(per_machine(*v))))
            .collect::<serde_json::Map<_, _>>(),
        "api_writes_per_machine": per_machine(all_writes),
        "api_writes_per_machine_by_verb_and_resource": by_kind.iter()
            .map(|((verb, resource), c)| json!({"verb": verb, "resource": resource, "per_machine": per_machine(*c)}))
            .collect::<Vec<_>>(),
        "api_reads_per_machine": per_machine(reads.values().sum()),
        "apiserver_cpu_seconds_until_provisioned": apiserver_cpu_done - apiserver_cpu_before,
        "proxmox_calls_per_machine": per_machine(calls as f64),
        "proxmox_polls_per_machine": per_machine(polls as f64),
        "proxmox_calls_per_machine_by_endpoint": calls_done
            .iter()
            .map(|(call, count)| (call.clone(), json!(per_machine(*count as f64))))
            .collect::<serde_json::Map<_, _>>(),
        "provider": {"peak_rss_mib": rss[0].map(|k| k as f64 / 1024.0), "cpu_seconds": provider_cpu},
        "capi_manager": {"peak_rss_mib": rss[1].map(|k| k as f64 / 1024.0), "cpu_seconds_during_run": capi_cpu},
        "idle": {"seconds": options.idle_secs, "api_writes_per_minute": per_minute(idle_writes),
                 "proxmox_calls_per_minute": per_minute(idle_calls as f64),
                 "api_writes_per_minute_by_verb_and_resource": idle_writes_by_kind.iter()
                     .map(|((verb, resource), c)| json!({"verb": verb, "resource": resource, "per_minute": per_minute(*c)}))
                     .collect::<Vec<_>>(),
                 "proxmox_calls_per_minute_by_endpoint": idle_calls_by_endpoint.iter()
                     .map(|(call, c)| ((*call).clone(), json!(per_minute(*c as f64))))
                     .collect::<serde_json::Map<_, _>>()},
        "floor": {"writes": floor.0, "seconds": floor.1.as_secs_f64()},
    }))?;
    drop(provider);
    drop(capi);
    sim.shutdown().await;
    Ok(())
}

fn dynamic(client: &Client, ns: &str, group: &str, version: &str, kind: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    Api::namespaced_with(client.clone(), ns, &resource)
}

/// Creates `object` (a whole manifest) in `ns`.
async fn create(client: &Client, ns: &str, object: Value) -> anyhow::Result<()> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default().to_owned();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let typed: DynamicObject = serde_json::from_value(object)?;
    dynamic(client, ns, group, version, &kind)
        .create(&PostParams::default(), &typed)
        .await
        .with_context(|| format!("creating {kind} {ns}/{name}"))?;
    Ok(())
}

/// The credentials Secret, the bootstrap data Secret, the ProxmoxCluster and the Cluster `bench`
/// (no control plane), and the Machines' ProxmoxMachineTemplate.
async fn create_cluster(client: &Client, ns: &str, sim: &banlieue_pve_sim::SimHandle) -> anyhow::Result<()> {
    create(
        client,
        ns,
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "pve-credentials"},
            "stringData": {"tokenID": sim.token_id(), "secret": sim.token_secret()},
        }),
    )
    .await?;
    create(
        client,
        ns,
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "bench-bootstrap", "labels": {"cluster.x-k8s.io/cluster-name": "bench"}},
            "type": "cluster.x-k8s.io/secret",
            "stringData": {"value": "#cloud-config\nruncmd: []\n", "format": "cloud-config"},
        }),
    )
    .await?;
    create(
        client,
        ns,
        json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxCluster",
            "metadata": {"name": "bench"},
            "spec": {
                "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
                "endpoint": sim.url(),
                "credentialsRef": {"name": "pve-credentials"},
                "tls": {"sha256Fingerprint": sim.fingerprint_sha256()},
            },
        }),
    )
    .await?;
    create(client, ns, json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "bench"},
        "spec": {
            "infrastructureRef": {"apiGroup": "infrastructure.banlieue.io", "kind": "ProxmoxCluster", "name": "bench"},
        },
    }))
    .await?;
    create(client, ns, json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachineTemplate",
        "metadata": {"name": "bench-md"},
        "spec": {"template": {"spec": {"source": {"vmid": banlieue_dev::capi::SIM_TEMPLATE_VMID}, "cpu": {"cores": 1}, "memoryMiB": 512}}},
    }))
    .await
}

async fn create_machine_deployment(client: &Client, ns: &str, replicas: usize) -> anyhow::Result<()> {
    create(client, ns, json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
        "metadata": {"name": "bench-md"},
        "spec": {
            "clusterName": "bench",
            "replicas": replicas,
            "selector": {"matchLabels": {}},
            "template": {"spec": {
                "clusterName": "bench",
                "bootstrap": {"dataSecretName": "bench-bootstrap"},
                "infrastructureRef": {"apiGroup": "infrastructure.banlieue.io", "kind": "ProxmoxMachineTemplate", "name": "bench-md"},
            }},
        },
    }))
    .await
}

/// Each Machine's first sight, and when CAPI shows its infrastructure provisioned with the
/// provider ID copied.
async fn observe_machines(client: Client, ns: String, seen: Arc<Mutex<Seen>>) -> anyhow::Result<()> {
    let api = dynamic(&client, &ns, "cluster.x-k8s.io", "v1beta2", "Machine");
    let mut stream = watcher(api, watcher::Config::default()).applied_objects().boxed();
    while let Some(machine) = stream.try_next().await? {
        let now = Instant::now();
        let name = machine.name_any();
        let mut seen = seen.lock().expect("lock");
        seen.first.entry(name.clone()).or_insert(now);
        let provisioned = machine.data["status"]["initialization"]["infrastructureProvisioned"] == true
            && machine.data["spec"]["providerID"].is_string();
        if provisioned {
            seen.done.entry(name).or_insert(now);
        }
    }
    Ok(())
}

/// The provider's writes so far by kind (its `banlieue_kubernetes_writes_total{write}`).
fn provider_writes(metrics_addr: &str) -> anyhow::Result<BTreeMap<String, f64>> {
    let text = get(metrics_addr, "/metrics").context("reading the provider's /metrics")?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("banlieue_kubernetes_writes_total{write=\"") else {
            continue;
        };
        let Some((kind, value)) = rest.split_once("\"} ") else {
            continue;
        };
        out.insert(kind.to_owned(), value.trim().parse::<f64>().unwrap_or(0.0));
    }
    Ok(out)
}
