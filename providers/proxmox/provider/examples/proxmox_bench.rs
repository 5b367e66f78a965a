//! Provisioning benchmark: N machines (default 200, `BENCH_MACHINES`) through the real
//! ProxmoxMachine controller, on the real control plane harness, against the PVE simulator with
//! zero-delay tasks and the real client. Reports wall time, Kubernetes writes and PVE API calls
//! per machine, peak RSS of this process (controller + in-process simulator), and the writes of
//! one full resync with nothing changed (target 0).
//!
//! `cargo run --release -p banlieue-proxmox --example proxmox_bench`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use banlieue_api::common::{ApiEndpoint, Cpu, SecretReference, TlsTrust};
use banlieue_api::infrastructure::{
    ProxmoxCluster, ProxmoxClusterSpec, ProxmoxMachine, ProxmoxMachineSpec, ProxmoxTemplateSource,
};
use banlieue_capi::contract::{CLUSTER_NAME_LABEL, ContractRef};
use banlieue_capi::generated::cluster::ClusterSpec;
use banlieue_capi::generated::machine::{MachineBootstrap, MachineSpec};
use banlieue_capi::{Cluster, Machine};
use banlieue_proxmox::credentials::{Connection, Connector};
use banlieue_proxmox::machine_controller::ProxmoxMachines;
use banlieue_pve_client::Client;
use banlieue_testenv::{TestEnv, crds_from_files};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

/// Builds one real client per settings, counting every PVE request.
struct CountingConnector {
    calls: Arc<AtomicU64>,
    client: std::sync::Mutex<Option<Client>>,
}

impl Connector for CountingConnector {
    type Hv = Client;

    fn connect(&self, _key: &str, c: &Connection) -> Result<Client, String> {
        let mut cached = self.client.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = cached.as_ref() {
            return Ok(client.clone());
        }
        let calls = self.calls.clone();
        let client = Client::builder(c.endpoint.clone())
            .auth(c.auth.clone())
            .tls(c.tls.clone())
            .on_request(move |_| {
                calls.fetch_add(1, Ordering::Relaxed);
            })
            .build()
            .map_err(|e| e.to_string())?;
        *cached = Some(client.clone());
        Ok(client)
    }
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::main]
async fn main() -> Result<()> {
    let n: usize = std::env::var("BENCH_MACHINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let concurrency: u16 = std::env::var("BENCH_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let mut crds = banlieue_api::crds::all();
    crds.extend(crds_from_files([
        banlieue_capi::crds::file("cluster.x-k8s.io_clusters.yaml"),
        banlieue_capi::crds::file("cluster.x-k8s.io_machines.yaml"),
    ])?);
    let env = TestEnv::builder().crds(crds).start().await?;
    let sim = banlieue_pve_sim::start(banlieue_pve_sim::SimConfig::fast()).await?;
    let client = env.client().await?;
    let ns = env.namespace("bench").await?;
    let ns = ns.name().to_owned();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    let pxcs: Api<ProxmoxCluster> = Api::namespaced(client.clone(), &ns);
    let machines: Api<Machine> = Api::namespaced(client.clone(), &ns);
    let pms: Api<ProxmoxMachine> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    secrets
        .create(
            &pp,
            &Secret {
                metadata: ObjectMeta {
                    name: Some("pve".into()),
                    ..Default::default()
                },
                string_data: Some(
                    [
                        ("tokenID".to_owned(), sim.token_id()),
                        ("secret".to_owned(), sim.token_secret()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
        )
        .await?;
    pxcs.create(
        &pp,
        &ProxmoxCluster::new(
            "c1",
            ProxmoxClusterSpec {
                control_plane_endpoint: Some(ApiEndpoint {
                    host: "10.0.0.100".into(),
                    port: 6443,
                }),
                endpoint: Some(sim.url()),
                credentials_ref: Some(SecretReference {
                    name: "pve".into(),
                    namespace: None,
                }),
                tls: Some(TlsTrust {
                    sha256_fingerprint: Some(sim.fingerprint_sha256()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ),
    )
    .await?;
    clusters
        .create(
            &pp,
            &Cluster::new(
                "c1",
                ClusterSpec {
                    infrastructure_ref: Some(
                        ContractRef::new("infrastructure.banlieue.io", "ProxmoxCluster", "c1").into(),
                    ),
                    ..Default::default()
                },
            ),
        )
        .await?;
    clusters
        .patch_status(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"status": {"initialization": {"infrastructureProvisioned": true}}}),
            ),
        )
        .await?;

    let calls = Arc::new(AtomicU64::new(0));
    let connector = CountingConnector {
        calls: calls.clone(),
        client: Default::default(),
    };
    let ctx = Arc::new(banlieue_provider_kit::machine::MachineContext::new(
        client.clone(),
        ProxmoxMachines {
            connector,
            reservations: Default::default(),
            seed_storage: "local".into(),
        },
        "bench",
    ));
    let run_ctx = ctx.clone();
    let run_ns = ns.clone();
    let controller = tokio::spawn(async move {
        banlieue_provider_kit::machine::run(run_ctx, Some(&run_ns), concurrency, std::future::pending())
            .await;
    });

    let started = Instant::now();
    for i in 0..n {
        let name = format!("m{i:04}");
        secrets
            .create(
                &pp,
                &Secret {
                    metadata: ObjectMeta {
                        name: Some(format!("{name}-bootstrap")),
                        ..Default::default()
                    },
                    data: Some([("value".to_owned(), ByteString(b"#cloud-config\n".to_vec()))].into()),
                    ..Default::default()
                },
            )
            .await?;
        let machine = machines
            .create(
                &pp,
                &Machine::new(
                    &name,
                    MachineSpec {
                        cluster_name: "c1".into(),
                        bootstrap: MachineBootstrap {
                            data_secret_name: Some(format!("{name}-bootstrap")),
                            ..Default::default()
                        },
                        infrastructure_ref: ContractRef::new(
                            "infrastructure.banlieue.io",
                            "ProxmoxMachine",
                            &name,
                        )
                        .into(),
                        ..Default::default()
                    },
                ),
            )
            .await?;
        let mut pm = ProxmoxMachine::new(
            &name,
            ProxmoxMachineSpec::new(
                ProxmoxTemplateSource {
                    vmid: Some(9000),
                    ..Default::default()
                },
                Cpu::cores(1),
                1024,
            ),
        );
        pm.metadata.labels = Some([(CLUSTER_NAME_LABEL.to_owned(), "c1".to_owned())].into());
        pm.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Machine".into(),
            name: name.clone(),
            uid: machine.uid().context("uid")?,
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        pms.create(&pp, &pm).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let list = pms.list(&ListParams::default()).await?;
        let done = list
            .items
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.initialization.as_ref())
                    .and_then(|i| i.provisioned)
                    .unwrap_or(false)
            })
            .count();
        if done == n {
            break;
        }
        if Instant::now() > deadline {
            bail!("only {done}/{n} provisioned");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let wall = started.elapsed();
    let vms = sim.vms().into_iter().filter(|v| !v.template).count();
    let writes = ctx.metrics.writes();
    let pve_calls = calls.load(Ordering::Relaxed);

    // Full resync with nothing changed: a fresh controller reconciles every object once.
    controller.abort();
    let _ = controller.await;
    let resync_calls_before = calls.load(Ordering::Relaxed);
    let connector = CountingConnector {
        calls: calls.clone(),
        client: Default::default(),
    };
    let fresh = Arc::new(banlieue_provider_kit::machine::MachineContext::new(
        client.clone(),
        ProxmoxMachines {
            connector,
            reservations: Default::default(),
            seed_storage: "local".into(),
        },
        "bench",
    ));
    let fresh_ctx = fresh.clone();
    let fresh_ns = ns.clone();
    let resync = tokio::spawn(async move {
        banlieue_provider_kit::machine::run(fresh_ctx, Some(&fresh_ns), concurrency, std::future::pending())
            .await;
    });
    let resync_started = Instant::now();
    while fresh.metrics.total("proxmoxmachine") < n as u64
        && resync_started.elapsed() < Duration::from_secs(600)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resync_took = resync_started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    resync.abort();

    println!("machines:                         {n} (concurrency {concurrency})");
    println!("VMs on the simulator:             {vms}");
    println!("wall time to all provisioned:     {:.1} s", wall.as_secs_f64());
    println!(
        "Kubernetes writes per machine:    {:.2}",
        writes as f64 / n as f64
    );
    println!(
        "PVE API calls per machine:        {:.2}",
        pve_calls as f64 / n as f64
    );
    println!("peak RSS (controller + sim):      {} MiB", peak_rss_kib() / 1024);
    println!(
        "full resync: reconciles {} in {:.1} s, writes {}, PVE calls {}",
        fresh.metrics.total("proxmoxmachine"),
        resync_took.as_secs_f64(),
        fresh.metrics.writes(),
        calls.load(Ordering::Relaxed) - resync_calls_before
    );
    sim.shutdown().await;
    Ok(())
}
