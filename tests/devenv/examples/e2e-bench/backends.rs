//! The standalone scenario on the other backends (`BENCH_BACKEND=vsphere` or `libvirt`): N
//! VirtualMachines through the banlieue controller and the real provider (`banlieue-vsphere`,
//! `banlieue-libvirt`), both as processes, as with Proxmox.
//!
//! - vSphere: govmomi's vcsim (built by `tests/controlplane/build.sh`), its model VM as template.
//!   vcsim boots no guest and has no VMware Tools, so the bench plays them: once a clone waits
//!   for its guest (`WaitingForGuest`, its `vmRef` known), it sets the guest's address and
//!   cloud-init's report (`SET.guest.ipAddress`, as `tests/devenv/tests/e2e_backends.rs` does for
//!   one VM); the time from that reconfigure's end to the VirtualMachine's Ready is the polling
//!   cost.
//! - libvirt: libvirt's test driver, from a node file the bench writes (a pool with the base
//!   volume, the `default` network: `test:///<file>`); the provider process keeps one
//!   connection, whose state the driver holds. Its domains run at once and it makes up their
//!   addresses; the VMs skip the cloud-init check (no guest runs).
//!
//! Neither simulator counts calls, so hypervisor calls are not reported.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use banlieue_api::infrastructure::VSphereMachine;
use banlieue_testenv::TestEnv;
use banlieue_vsphere_client::MoRef;
use banlieue_vsphere_client::vim::ConfigSpec;
use futures::TryStreamExt;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

#[path = "../../../../providers/vsphere/client/tests/support/vcsim.rs"]
mod vcsim_support;

use crate::{
    CREATES_IN_FLIGHT, Options, Stamps, WRITE_VERBS, apiserver_requests, cpu_seconds, diff, floor_rate,
    observe_vms, of_verbs, peak_rss_kib, percentile, show_rss, write_json,
};

/// vcsim's model VM, made the template every VM clones.
const TEMPLATE: &str = "DC0_C0_RP0_VM0";
/// The guest address the bench plays for every clone.
const GUEST_IP: &str = "192.0.2.41";
/// Guests played at once.
const PLAYERS: usize = 8;
/// The test driver's pool and base volume (as [`TEST_NODE`] has them).
const POOL: &str = "bench-pool";
const BASE: &str = "base.qcow2";

/// The backend of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Vsphere,
    Libvirt,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Self::Vsphere => "vsphere (vcsim)",
            Self::Libvirt => "libvirt (test driver)",
        }
    }
}

/// The running simulator.
enum Hypervisor {
    Vcsim(Box<vcsim_support::Vcsim>, banlieue_vsphere_client::Client),
    /// The test driver's node file is in this directory.
    TestDriver(tempfile::TempDir),
}

impl Hypervisor {
    async fn start(backend: Backend) -> anyhow::Result<Self> {
        Ok(match backend {
            Backend::Vsphere => {
                let vcsim = vcsim_support::Vcsim::start(&[])?;
                let vc = vcsim.client()?;
                vcsim.make_template(&vc, TEMPLATE).await?;
                Self::Vcsim(Box::new(vcsim), vc)
            }
            Backend::Libvirt => {
                let dir = tempfile::tempdir()?;
                std::fs::write(dir.path().join("node.xml"), TEST_NODE)
                    .context("writing the test driver's node file")?;
                Self::TestDriver(dir)
            }
        })
    }

    /// The Provider's spec (its credentials Secret created in `ns` when it needs one).
    async fn provider_spec(&self, client: &Client, ns: &str) -> anyhow::Result<Value> {
        Ok(match self {
            Self::Vcsim(vcsim, _) => {
                let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
                    "metadata": {"name": "vc-creds"},
                    "stringData": {"username": vcsim_support::USER, "password": vcsim_support::PASSWORD},
                }))?;
                Api::namespaced(client.clone(), ns)
                    .create(&PostParams::default(), &secret)
                    .await
                    .context("creating the vcsim credentials Secret")?;
                json!({
                    "backend": "vsphere",
                    "endpoint": vcsim.url,
                    "credentialsRef": {"name": "vc-creds", "namespace": ns},
                    "tls": {"sha256Fingerprint": vcsim.thumbprint},
                    "defaults": {"datacenter": "DC0", "storage": "LocalDS_0", "resourcePool": "DC0_C0/Resources"},
                })
            }
            Self::TestDriver(dir) => json!({
                "backend": "libvirt",
                "endpoint": format!("test://{}", dir.path().join("node.xml").display()),
                "defaults": {"storage": POOL, "network": "default"},
            }),
        })
    }

    fn provider_binary(&self) -> &'static str {
        match self {
            Self::Vcsim(..) => "banlieue-vsphere",
            Self::TestDriver(_) => "banlieue-libvirt",
        }
    }

    fn provider_args(&self) -> &'static [&'static str] {
        match self {
            Self::Vcsim(..) => &[],
            Self::TestDriver(_) => &["--domain-type", "qemu"],
        }
    }

    fn vm_spec(&self) -> Value {
        match self {
            Self::Vcsim(..) => {
                json!({"source": {"vsphere": {"template": TEMPLATE}}, "cpu": {"cores": 1}, "memoryMiB": 512})
            }
            Self::TestDriver(_) => json!({
                "source": {"libvirt": {"pool": POOL, "volume": BASE}}, "cpu": {"cores": 1}, "memoryMiB": 256,
                "readinessChecks": {"skipCloudInit": true},
            }),
        }
    }
}

/// libvirt's test driver node: one host (its pool refuses root volumes beyond about 98 VMs, "Not
/// enough free space"; the sizes here, raised from 1 TiB, did not lift that), the
/// `default` network and a pool holding the base
/// volume every VM's disk is made from.
const TEST_NODE: &str = r#"<node>
  <cpu><mhz>3000</mhz><model>bench</model><active>2</active><nodes>1</nodes><sockets>1</sockets><cores>2</cores><threads>1</threads></cpu>
  <memory>1073741824</memory>
  <network>
    <name>default</name>
    <bridge name="virbr0"/>
    <forward/>
    <ip address="192.168.122.1" netmask="255.255.255.0">
      <dhcp><range start="192.168.122.2" end="192.168.122.254"/></dhcp>
    </ip>
  </network>
  <pool type="dir">
    <name>bench-pool</name>
    <capacity unit="TiB">100</capacity>
    <allocation unit="GiB">1</allocation>
    <available unit="TiB">99</available>
    <target><path>/bench-pool</path></target>
    <volume type="file">
      <name>base.qcow2</name>
      <capacity unit="GiB">1</capacity>
      <allocation unit="GiB">1</allocation>
      <target><path>/bench-pool/base.qcow2</path><format type="qcow2"/></target>
    </volume>
  </pool>
</node>
"#;

pub async fn run(options: Options, backend: Backend) -> anyhow::Result<()> {
    let n = options.n;
    let env = TestEnv::builder().allow_external(false).start().await?;
    env.install_crds(&banlieue_api::crds::all()).await?;
    let client = env.client().await?;
    let hypervisor = Hypervisor::start(backend).await?;
    let namespace = env.namespace("bench").await?;
    let ns = namespace.to_string();
    let provider_spec = hypervisor.provider_spec(&client, &ns).await?;
    let provider_object: banlieue_api::banlieue::Provider = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
        "metadata": {"name": "bench-hv"}, "spec": provider_spec,
    }))?;
    Api::all(client.clone())
        .create(&PostParams::default(), &provider_object)
        .await
        .context("creating the Provider")?;

    let bin_dir = banlieue_dev::binary_dir()?;
    let logs = env.workdir().join("bench-logs");
    let mut provider_args = vec![
        "--namespace",
        &ns,
        "--concurrency",
        &options.concurrency,
        "--metrics-bind-address=127.0.0.1:0",
        "--health-probe-bind-address=127.0.0.1:0",
        "--log-format=text",
    ];
    provider_args.extend(hypervisor.provider_args());
    let provider = banlieue_dev::start_controller(
        &bin_dir,
        hypervisor.provider_binary(),
        &provider_args,
        env.admin().path(),
        &logs,
    )?;
    let (mut controller, _) = crate::start_banlieue_controller(&env, &ns, &logs).await?;

    let guests_up: Stamps = Arc::default();
    let vm_done: Stamps = Arc::default();
    let mut players = match &hypervisor {
        Hypervisor::Vcsim(_, vc) => Some(tokio::spawn(play_guests(
            client.clone(),
            ns.clone(),
            vc.clone(),
            guests_up.clone(),
        ))),
        Hypervisor::TestDriver(_) => None,
    };
    let vms_task = tokio::spawn(observe_vms(client.clone(), ns.clone(), vm_done.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (requests_before, apiserver_cpu_before) = apiserver_requests(&client).await?;
    eprintln!("creating {n} VirtualMachines on {}", backend.name());
    let start = Instant::now();
    let created_at = crate::create_vms(&client, &ns, n, "bench-hv", &hypervisor.vm_spec()).await?;
    let deadline = start + Duration::from_secs(1800);
    let mut last_report = Instant::now();
    loop {
        let done = vm_done.lock().expect("lock").len();
        if done >= n {
            break;
        }
        controller.check_running()?;
        if let Some(players) = players.as_mut()
            && players.is_finished()
        {
            bail!("the guest players stopped: {:?}", players.await);
        }
        if Instant::now() > deadline {
            bail!("only {done} of {n} VirtualMachines Ready after 1800 s");
        }
        if last_report.elapsed() > Duration::from_secs(15) {
            eprintln!(
                "  {:>6.1}s: {} guests up, {done} Ready",
                start.elapsed().as_secs_f64(),
                guests_up.lock().expect("lock").len()
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let wall = start.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (requests_ready, apiserver_cpu_ready) = apiserver_requests(&client).await?;
    let writes_ready = of_verbs(&requests_ready, WRITE_VERBS);
    let cpu_ready = [cpu_seconds(provider.id()), cpu_seconds(controller.id())];
    eprintln!("all Ready; watching {} s of idle", options.idle_secs);
    tokio::time::sleep(Duration::from_secs(options.idle_secs)).await;
    let writes_idle = of_verbs(&apiserver_requests(&client).await?.0, WRITE_VERBS);
    if let Some(players) = players {
        players.abort();
    }
    vms_task.abort();

    let per_vm = |v: f64| v / n as f64;
    let (by_kind, reads) =
        crate::served_between(&requests_ready, &requests_before, ("virtualmachines", n as f64));
    let managers_writes: f64 = by_kind.values().sum();
    let since = |from: &Stamps| -> Vec<Duration> {
        let (from, done) = (from.lock().expect("lock"), vm_done.lock().expect("lock"));
        let mut v: Vec<Duration> = done
            .iter()
            .filter_map(|(name, d)| from.get(name).map(|f| d.saturating_duration_since(*f)))
            .collect();
        v.sort();
        v
    };
    let to_ready = since(&created_at);
    let guest_to_ready = since(&guests_up);
    let idle_writes: f64 = diff(&writes_idle, &writes_ready).values().sum();
    let per_minute = |v: f64| v * 60.0 / options.idle_secs.max(1) as f64;
    let rss = [peak_rss_kib(provider.id()), peak_rss_kib(controller.id())];
    let floor = floor_rate(&client, &ns, managers_writes.round() as usize).await?;
    let spread = |v: &[Duration]| {
        (!v.is_empty()).then(|| {
            (
                percentile(v, 0.5).as_secs_f64(),
                percentile(v, 0.95).as_secs_f64(),
                v[v.len() - 1].as_secs_f64(),
            )
        })
    };

    println!(
        "N = {n} VirtualMachines on {}, {} --concurrency {}{}",
        backend.name(),
        hypervisor.provider_binary(),
        options.concurrency,
        if backend == Backend::Vsphere {
            format!(", guests played {PLAYERS} at once")
        } else {
            String::new()
        },
    );
    println!("all Running and Ready after {:.1} s", wall.as_secs_f64());
    if let Some((p50, p95, max)) = spread(&to_ready) {
        println!("create → Running and Ready: p50 {p50:.1} s, p95 {p95:.1} s, max {max:.1} s");
    }
    if let Some((p50, p95, max)) = spread(&guest_to_ready) {
        println!("guest address set → Running and Ready: p50 {p50:.2} s, p95 {p95:.2} s, max {max:.2} s");
    }
    println!(
        "API server writes per VM (both managers, the bench's creates apart): {:.2}",
        per_vm(managers_writes)
    );
    for ((verb, resource), count) in &by_kind {
        println!("  {verb:<8} {resource:<36} {:>9.2}", per_vm(*count));
    }
    println!(
        "API server reads per VM: {:.2}; its CPU until Ready: {:.1} s",
        per_vm(reads.values().sum()),
        apiserver_cpu_ready - apiserver_cpu_before
    );
    let show_cpu = |c: Option<f64>| c.map_or_else(|| "?".to_owned(), |c| format!("{c:.1} s"));
    println!(
        "provider: peak RSS {}, CPU {} until Ready; controller: peak RSS {}, CPU {} until Ready",
        show_rss(rss[0]),
        show_cpu(cpu_ready[0]),
        show_rss(rss[1]),
        show_cpu(cpu_ready[1]),
    );
    println!(
        "idle after Ready ({} s): {:.1} API writes/min (the simulator counts no calls)",
        options.idle_secs,
        per_minute(idle_writes)
    );
    println!(
        "floor: {} writes from a plain client ({CREATES_IN_FLIGHT} in flight) took {:.1} s; the VMs took {:.1} s: {:.1}× the floor",
        floor.0,
        floor.1.as_secs_f64(),
        wall.as_secs_f64(),
        wall.as_secs_f64() / floor.1.as_secs_f64().max(1e-9),
    );
    let spread_json =
        |v: &[Duration]| spread(v).map(|(p50, p95, max)| json!({"p50": p50, "p95": p95, "max": max}));
    write_json(json!({
        "scenario": "standalone",
        "backend": backend.name(),
        "n": n,
        "provider_concurrency": options.concurrency,
        "wall_seconds": wall.as_secs_f64(),
        "to_ready_seconds": spread_json(&to_ready),
        "guest_to_ready_seconds": spread_json(&guest_to_ready),
        "api_writes_per_vm": per_vm(managers_writes),
        "api_writes_per_vm_by_verb_and_resource": by_kind.iter()
            .map(|((verb, resource), c)| json!({"verb": verb, "resource": resource, "per_vm": per_vm(*c)}))
            .collect::<Vec<_>>(),
        "api_reads_per_vm": per_vm(reads.values().sum()),
        "apiserver_cpu_seconds_until_ready": apiserver_cpu_ready - apiserver_cpu_before,
        "provider": {"peak_rss_mib": rss[0].map(|k| k as f64 / 1024.0), "cpu_seconds_until_ready": cpu_ready[0]},
        "controller": {"peak_rss_mib": rss[1].map(|k| k as f64 / 1024.0), "cpu_seconds_until_ready": cpu_ready[1]},
        "idle": {"seconds": options.idle_secs, "api_writes_per_minute": per_minute(idle_writes)},
        "floor": {"writes": floor.0, "seconds": floor.1.as_secs_f64()},
    }))?;
    drop(controller);
    drop(provider);
    drop(hypervisor);
    Ok(())
}

/// Plays VMware Tools and cloud-init for every clone that waits for its guest: sets its address
/// and a finished cloud-init report, `PLAYERS` at once; records when each guest was up.
async fn play_guests(
    client: Client,
    ns: String,
    vc: banlieue_vsphere_client::Client,
    up: Stamps,
) -> anyhow::Result<()> {
    let api: Api<VSphereMachine> = Api::namespaced(client, &ns);
    let played: Arc<Mutex<HashMap<String, ()>>> = Arc::default();
    let waiting = watcher(api, watcher::Config::default())
        .applied_objects()
        .try_filter_map(|m| {
            let vm_ref = m
                .status
                .as_ref()
                .filter(|s| {
                    s.provisioning
                        .as_ref()
                        .is_some_and(|p| p.state.as_str() == "WaitingForGuest")
                })
                .and_then(|s| s.vm_ref.clone());
            futures::future::ok(vm_ref.map(|r| (m.name_any(), r)))
        })
        .try_filter(|(name, _)| {
            let first = played.lock().expect("lock").insert(name.clone(), ()).is_none();
            futures::future::ready(first)
        });
    waiting
        .map_err(anyhow::Error::from)
        .try_for_each_concurrent(PLAYERS, |(name, vm_ref)| {
            let (vc, up) = (vc.clone(), up.clone());
            async move {
                let spec = ConfigSpec {
                    extra_config: vec![
                        ("SET.guest.ipAddress".into(), GUEST_IP.into()),
                        banlieue_vsphere::guest_report::published_done(),
                    ],
                    ..ConfigSpec::default()
                };
                let vm = MoRef::new("VirtualMachine", vm_ref);
                let task = vc.reconfigure(&vm, &spec).await?;
                vc.wait_task(&task, Duration::from_millis(50), Duration::from_secs(60))
                    .await?;
                up.lock().expect("lock").insert(name, Instant::now());
                anyhow::Ok(())
            }
        })
        .await
}
