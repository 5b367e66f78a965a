//! Scenario tests beyond first provisioning, against a real vcsim on the real kube-apiserver of
//! banlieue-testenv (standalone setup: Provider → VSphereCluster `banlieue-<provider>` →
//! VirtualMachine owning the VSphereMachine): virtual hardware (CPU, memory, disks, NICs) during
//! provisioning and as drift afterwards, VSphereMachineTemplate capacity, VSphereCluster
//! deletion waiting for its machines, and a fault injected in the clone step.

#[path = "../../client/tests/support/vcsim.rs"]
mod vcsim_support;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use banlieue_api::banlieue::{Provider, VirtualMachine};
use banlieue_api::infrastructure::{VSphereCluster, VSphereMachine, VSphereMachineTemplate};
use banlieue_api::standalone::infra_cluster_name;
use banlieue_provider_kit::template::{self as template_controller, TemplateContext};
use banlieue_testenv::TestEnv;
use banlieue_vsphere::machine_controller;
use banlieue_vsphere::provision::OWNER_KEY;
use banlieue_vsphere_client::{
    Client, ClientBuilder, MoRef, NetworkBacking, TlsVerification, VmInfo, VmPowerState,
};
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use vcsim_support::{PASSWORD, USER, Vcsim};

const TIMEOUT: Duration = Duration::from_secs(90);
const TEMPLATE: &str = "DC0_C0_RP0_VM0";

async fn env() -> Result<&'static TestEnv> {
    Ok(TestEnv::shared_with(|b| b.crds(banlieue_api::crds::all())).await?)
}

/// A namespace with a credentials Secret, a Provider (pinned thumbprint, `endpoint`) and its
/// standalone VSphereCluster, and the three controllers running for that namespace.
struct Scenario {
    kube: kube::Client,
    ns: String,
    _ns_guard: banlieue_testenv::TestNamespace,
    provider: String,
    controllers: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Scenario {
    fn drop(&mut self) {
        for c in &self.controllers {
            c.abort();
        }
    }
}

async fn scenario(endpoint: &str, thumbprint: &str, prefix: &str) -> Result<Scenario> {
    let env = env().await?;
    let ns_guard = env.namespace(prefix).await?;
    let ns = ns_guard.to_string();
    let kube = env.client().await?;
    let provider = format!("{ns}-vc");
    Api::<Secret>::namespaced(kube.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "vc-creds"},
                "stringData": {"username": USER, "password": PASSWORD},
            }))?,
        )
        .await?;
    let p = Api::<Provider>::all(kube.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
                "metadata": {"name": provider},
                "spec": {
                    "backend": "vsphere",
                    "endpoint": endpoint,
                    "credentialsRef": {"name": "vc-creds", "namespace": ns},
                    "tls": {"sha256Fingerprint": thumbprint},
                },
            }))?,
        )
        .await?;
    Api::<VSphereCluster>::namespaced(kube.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "VSphereCluster",
                "metadata": {
                    "name": infra_cluster_name(&provider),
                    "ownerReferences": [{
                        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "name": provider,
                        "uid": p.uid().unwrap_or_default(), "controller": true,
                    }],
                },
                "spec": {"providerRef": {"name": provider}, "datacenter": "DC0"},
            }))?,
        )
        .await?;
    let spawned = banlieue_vsphere::provider("banlieue-vsphere-test").spawn(kube.clone(), &ns, (0, 0));
    let [machines, clusters] = spawned.tasks;
    let controllers = vec![
        machines,
        clusters,
        tokio::spawn({
            let ns = ns.clone();
            let templates = Arc::new(TemplateContext {
                client: kube.clone(),
                field_manager: machine_controller::FIELD_MANAGER,
                watch_filter: None,
                metrics: spawned.metrics.clone(),
            });
            async move {
                template_controller::run::<VSphereMachineTemplate>(
                    templates,
                    Some(&ns),
                    std::future::pending(),
                )
                .await
            }
        }),
    ];
    Ok(Scenario {
        kube,
        ns,
        _ns_guard: ns_guard,
        provider,
        controllers,
    })
}

impl Scenario {
    /// A VirtualMachine and the VSphereMachine it owns, with `spec` merged into the
    /// VSphereMachine's spec (CPU, memory, disks, networks, readiness checks …).
    async fn machine(&self, name: &str, spec: serde_json::Value) -> Result<()> {
        let bvm = Api::<VirtualMachine>::namespaced(self.kube.clone(), &self.ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                    "metadata": {"name": name},
                    "spec": {
                        "providerRef": {"name": self.provider},
                        "source": {"vsphere": {"template": TEMPLATE}},
                        "cpu": {"cores": 1},
                        "memoryMiB": 1024,
                    },
                }))?,
            )
            .await?;
        let mut full = json!({
            "providerRef": {"name": self.provider},
            "source": {"template": TEMPLATE},
            "resourcePool": "DC0_C0/Resources",
            "datastore": "LocalDS_0",
            "cpu": {"cores": 1},
            "memoryMiB": 1024,
        });
        for (k, v) in spec.as_object().context("spec is an object")? {
            full[k] = v.clone();
        }
        self.machines()
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "VSphereMachine",
                    "metadata": {
                        "name": name,
                        "ownerReferences": [{
                            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "name": name,
                            "uid": bvm.uid().unwrap_or_default(), "controller": true,
                        }],
                    },
                    "spec": full,
                }))?,
            )
            .await?;
        Ok(())
    }

    fn machines(&self) -> Api<VSphereMachine> {
        Api::namespaced(self.kube.clone(), &self.ns)
    }

    fn cluster(&self) -> Api<VSphereCluster> {
        Api::namespaced(self.kube.clone(), &self.ns)
    }

    /// Polls the machine until `done` says so.
    async fn wait_machine(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&VSphereMachine) -> bool,
    ) -> Result<VSphereMachine> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let m = self.machines().get(name).await?;
            if done(&m) {
                return Ok(m);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("timed out waiting for {what}; last status: {:?}", m.status);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn ready(m: &VSphereMachine) -> Option<(String, String, String)> {
    let c = m
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// `Ready=True` for the current generation.
fn is_ready(m: &VSphereMachine) -> bool {
    ready(m).is_some_and(|r| r.0 == "True")
        && m.status.as_ref().and_then(|s| s.observed_generation) == m.metadata.generation
}

/// Every VM in vcsim carrying `uid` in its owner extraConfig key.
async fn vms_owned_by(vc: &Client, uid: &str) -> Result<Vec<MoRef>> {
    Ok(vc.find_vms_by_extra_config(OWNER_KEY, uid).await?)
}

async fn info(vc: &Client, vm: &MoRef) -> Result<VmInfo> {
    vc.vm_info(vm).await?.context("VM not in vcsim")
}

/// Event reasons about `name`.
async fn events(kube: &kube::Client, ns: &str, name: &str) -> Result<Vec<String>> {
    Ok(Api::<Event>::namespaced(kube.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .filter_map(|e| e.reason)
        .collect())
}

/// (CPUs, memory MiB, disk GiB of each disk, network of each NIC, powered on) as vcsim has it.
type Hw = (Option<u32>, Option<u64>, Vec<u64>, Vec<String>, bool);

fn hw(i: &VmInfo) -> Hw {
    let mut nets: Vec<String> = i
        .hardware
        .nics
        .iter()
        .map(|n| match &n.backing {
            NetworkBacking::Standard { name, .. } => name.clone(),
            NetworkBacking::Distributed { portgroup_key, .. } => portgroup_key.clone(),
            NetworkBacking::Other(t) => t.clone(),
        })
        .collect();
    nets.sort();
    (
        i.num_cpu,
        i.memory_mb,
        i.hardware
            .disks
            .iter()
            .map(|d| d.capacity_kb / (1024 * 1024))
            .collect(),
        nets,
        i.power_state == Some(VmPowerState::PoweredOn),
    )
}

fn vm_of(m: &VSphereMachine) -> Result<MoRef> {
    Ok(MoRef::new(
        "VirtualMachine",
        m.status
            .as_ref()
            .and_then(|s| s.vm_ref.clone())
            .context("no vmRef")?,
    ))
}

#[tokio::test]
async fn a_machine_template_publishes_its_capacity() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let s = scenario(&sim.url, &sim.thumbprint, "vs-template").await?;
    let templates: Api<VSphereMachineTemplate> = Api::namespaced(s.kube.clone(), &s.ns);
    templates
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "VSphereMachineTemplate",
                "metadata": {"name": "workers"},
                "spec": {"template": {"spec": {
                    "source": {"template": TEMPLATE},
                    "cpu": {"cores": 2, "sockets": 2},
                    "memoryMiB": 6144,
                }}},
            }))?,
        )
        .await?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let t = templates.get("workers").await?;
        if let Some(status) = &t.status {
            let cap: Vec<(String, String)> = status
                .capacity
                .iter()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect();
            ensure!(
                cap == [
                    ("cpu".to_owned(), "4".to_owned()),
                    ("memory".to_owned(), "6144Mi".to_owned())
                ],
                "{cap:?}"
            );
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("no status.capacity on the VSphereMachineTemplate");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn cluster_deletion_waits_for_its_machines() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let vc = sim.client()?;
    sim.make_template(&vc, TEMPLATE).await?;
    let s = scenario(&sim.url, &sim.thumbprint, "vs-cluster-del").await?;
    s.machine("db-1", json!({})).await?;
    let m = s
        .wait_machine("db-1", "a VM", |m| {
            m.status.as_ref().and_then(|s| s.vm_ref.as_ref()).is_some()
        })
        .await?;
    let vm = vm_of(&m)?;
    let cluster_name = infra_cluster_name(&s.provider);
    s.cluster()
        .delete(&cluster_name, &DeleteParams::default())
        .await?;

    // The cluster stays (finalizer held) and says what it waits for; the VM is untouched.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let c = s.cluster().get(&cluster_name).await?;
        let cond = c
            .status
            .as_ref()
            .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Ready").cloned());
        if let Some(cond) = cond
            && cond.reason == "WaitingForMachines"
        {
            ensure!(cond.status == "False", "{cond:?}");
            ensure!(
                cond.message == "deleting: waiting for 1 VSphereMachine(s) to delete their VMs: db-1",
                "{}",
                cond.message
            );
            ensure!(c.metadata.deletion_timestamp.is_some());
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("VSphereCluster never waited for its machine: {:?}", c.status);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(vc.vm_info(&vm).await?.is_some(), "the VM went away early");

    // Once the machine has destroyed its VM, the cluster is released.
    s.machines().delete("db-1", &DeleteParams::default()).await?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while s.cluster().get_opt(&cluster_name).await?.is_some() {
        if tokio::time::Instant::now() > deadline {
            bail!("VSphereCluster not released after its machine went away");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(s.machines().get_opt("db-1").await?.is_none());
    ensure!(vc.vm_info(&vm).await?.is_none(), "VM still in vcsim");
    Ok(())
}

#[tokio::test]
async fn hardware_follows_the_spec_when_provisioning_and_as_drift() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let vc = sim.client()?;
    sim.make_template(&vc, TEMPLATE).await?;
    let template = vc
        .find_by_inventory_path(&format!("/DC0/vm/{TEMPLATE}"))
        .await?
        .context("no template")?;
    let t = info(&vc, &template).await?;
    // The model template: 1 CPU, 32 MiB, one 10 GiB disk, one E1000 on the distributed port
    // group DC0_DVPG0 (dvportgroup-12).
    ensure!(
        hw(&t)
            == (
                Some(1),
                Some(32),
                vec![10],
                vec!["dvportgroup-12".to_owned()],
                false
            ),
        "{:?}",
        hw(&t)
    );
    let s = scenario(&sim.url, &sim.thumbprint, "vs-hardware").await?;
    s.machine(
        "app-1",
        json!({
            "cpu": {"cores": 2},
            "memoryMiB": 2048,
            "disks": [{"name": "root", "sizeGiB": 20}],
            "networks": [
                {"name": "eth0", "network": "VM Network"},
                {"name": "eth1", "network": "DC0_DVPG0"},
            ],
            "readinessChecks": {"skipGuestAgent": true},
        }),
    )
    .await?;

    // Provisioning: CPU, memory, the boot disk grown, a NIC added on "VM Network" next to the
    // template's (already on DC0_DVPG0), then powered on.
    let m = s.wait_machine("app-1", "Ready", is_ready).await?;
    let vm = vm_of(&m)?;
    let uid = m.uid().context("no uid")?;
    ensure!(
        hw(&info(&vc, &vm).await?)
            == (
                Some(2),
                Some(2048),
                vec![20],
                vec!["VM Network".to_owned(), "dvportgroup-12".to_owned()],
                true
            ),
        "{:?}",
        hw(&info(&vc, &vm).await?)
    );

    // Drift: more CPU and memory (cold: power off, reconfigure, power on, once the restart policy
    // allows it), a bigger disk, a new data disk and one network less (hot), all on the same VM.
    s.machines()
        .patch(
            "app-1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {
                "cpu": {"cores": 4},
                "memoryMiB": 4096,
                "disks": [{"name": "root", "sizeGiB": 30}, {"name": "data", "sizeGiB": 5}],
                "networks": [{"name": "eth0", "network": "VM Network"}],
            }})),
        )
        .await?;
    // No surprise reboots: under the default restart policy (Manual) the hot changes are made,
    // the CPU and memory wait with VMUpToDate RestartRequired, the VM keeps running.
    let up_to_date = |m: &VSphereMachine| {
        m.status
            .as_ref()
            .and_then(|st| st.conditions.iter().find(|c| c.type_ == "VMUpToDate"))
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let m = s.machines().get("app-1").await?;
        let now = hw(&info(&vc, &vm).await?);
        if up_to_date(&m) == Some(("False".into(), "RestartRequired".into())) && now.2 == [30, 5] {
            ensure!(
                now.0 != Some(4) && now.4,
                "restarted without being allowed: {now:?}"
            );
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("no RestartRequired: vcsim {now:?}, status {:?}", m.status);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let reasons = events(&s.kube, &s.ns, "app-1").await?;
    ensure!(
        reasons.iter().any(|e| e == "RestartRequired") && !reasons.iter().any(|e| e == "PoweringOff"),
        "a RestartRequired Warning and no PoweringOff: {reasons:?}"
    );
    // Allowed: powered off, reconfigured, powered on.
    s.machines()
        .patch(
            "app-1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"restartPolicy": "Automatic"}})),
        )
        .await?;
    let want: Hw = (
        Some(4),
        Some(4096),
        vec![30, 5],
        vec!["VM Network".to_owned()],
        true,
    );
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let m = s.machines().get("app-1").await?;
        let now = hw(&info(&vc, &vm).await?);
        if is_ready(&m) && now == want && up_to_date(&m) == Some(("True".into(), "UpToDate".into())) {
            ensure!(vm_of(&m)? == vm, "the machine moved to another VM");
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("drift not corrected: vcsim {now:?}, status {:?}", m.status);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(
        vms_owned_by(&vc, &uid).await? == [vm.clone()],
        "a second VM appeared"
    );
    let reasons = events(&s.kube, &s.ns, "app-1").await?;
    for r in ["Reconfiguring", "PoweringOff", "PoweringOn"] {
        ensure!(reasons.iter().any(|e| e == r), "no {r} event in {reasons:?}");
    }
    let clones = reasons.iter().filter(|e| *e == "CloneStarted").count();
    ensure!(clones == 1, "{clones} clones: {reasons:?}");
    Ok(())
}

/// A TLS front for a plain-HTTP vcsim that forwards every call and drops the answer of the
/// first `drops` calls of one SOAP method: the call takes effect in vcsim, the caller never
/// hears back (a connection lost mid-call). vcsim's own fault-injection rules are a Go API; the
/// vcsim binary built here has no flag for them.
mod fault_proxy {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use anyhow::Result;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::body::Incoming;
    use hyper::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
    use hyper::service::service_fn;
    use hyper::{Request, Response};
    use hyper_util::client::legacy::Client as HttpClient;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio::net::TcpListener;
    use tokio_rustls::TlsAcceptor;

    /// The running proxy.
    pub struct FaultProxy {
        /// `https://127.0.0.1:<port>`.
        pub url: String,
        /// How many answers were dropped so far.
        pub dropped: Arc<AtomicUsize>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for FaultProxy {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    struct Rule {
        upstream: String,
        method_tag: String,
        remaining: AtomicUsize,
        dropped: Arc<AtomicUsize>,
        http: HttpClient<HttpConnector, Full<Bytes>>,
    }

    /// Serves TLS with `cert_der`/`key_der` on loopback and forwards to `http://<upstream>/sdk`.
    pub async fn start(
        upstream: &str,
        cert_der: &[u8],
        key_der: &[u8],
        method: &str,
        drops: usize,
    ) -> Result<FaultProxy> {
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_no_client_auth()
                .with_single_cert(
                    vec![CertificateDer::from(cert_der.to_vec())],
                    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_der.to_vec())),
                )?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("https://{}", listener.local_addr()?);
        let dropped = Arc::new(AtomicUsize::new(0));
        let rule = Arc::new(Rule {
            upstream: format!("http://{upstream}/sdk"),
            method_tag: format!("<{method} "),
            remaining: AtomicUsize::new(drops),
            dropped: dropped.clone(),
            http: HttpClient::builder(TokioExecutor::new()).build_http(),
        });
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, rule) = (acceptor.clone(), rule.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(move |req| forward(rule.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        Ok(FaultProxy { url, dropped, task })
    }

    async fn forward(
        rule: Arc<Rule>,
        req: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, std::io::Error> {
        let (parts, body) = req.into_parts();
        let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
        let targeted = body
            .windows(rule.method_tag.len())
            .any(|w| w == rule.method_tag.as_bytes());
        let mut fwd = Request::builder().method(parts.method).uri(&rule.upstream);
        for (k, v) in &parts.headers {
            if k != HOST {
                fwd = fwd.header(k, v);
            }
        }
        let resp = rule
            .http
            .request(fwd.body(Full::new(body)).map_err(std::io::Error::other)?)
            .await
            .map_err(std::io::Error::other)?;
        let (rparts, rbody) = resp.into_parts();
        let rbytes = rbody.collect().await.map_err(std::io::Error::other)?.to_bytes();
        if targeted
            && rule
                .remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            rule.dropped.fetch_add(1, Ordering::SeqCst);
            // hyper closes the connection without an answer.
            return Err(std::io::Error::other("answer dropped by the fault proxy"));
        }
        let mut out = Response::builder().status(rparts.status);
        for (k, v) in &rparts.headers {
            if k != CONTENT_LENGTH && k != TRANSFER_ENCODING {
                out = out.header(k, v);
            }
        }
        out.body(Full::new(rbytes)).map_err(std::io::Error::other)
    }
}

#[tokio::test]
async fn a_clone_whose_answer_is_lost_is_adopted_not_repeated() -> Result<()> {
    // vcsim without TLS behind the fault proxy, which serves vcsim's test certificate.
    let sim = Vcsim::start(&["-tls=false"])?;
    let proxy = fault_proxy::start(&sim.host, &sim.cert_der, &sim.key_der, "CloneVM_Task", 1).await?;
    // Through the proxy: the fault it injects is what this test is about.
    let vc = ClientBuilder::new(&proxy.url, USER, PASSWORD)
        .tls(TlsVerification::CaBundle(sim.ca_pem.clone()))
        .build()?;
    sim.make_template(&vc, TEMPLATE).await?;
    let s = scenario(&proxy.url, &sim.thumbprint, "vs-fault").await?;
    s.machine("lost-1", json!({"readinessChecks": {"skipGuestAgent": true}}))
        .await?;

    // The clone ran in vcsim but its answer was lost: the controller reports the outage, then
    // finds the VM by the machine's UID and adopts it instead of cloning again.
    let m = s.wait_machine("lost-1", "Ready", is_ready).await?;
    ensure!(
        proxy.dropped.load(std::sync::atomic::Ordering::SeqCst) == 1,
        "the fault was not injected"
    );
    let uid = m.uid().context("no uid")?;
    let owned = vms_owned_by(&vc, &uid).await?;
    ensure!(owned == [vm_of(&m)?], "VMs carrying the machine's UID: {owned:?}");
    let all = vc.all_vms(&["name"]).await?;
    let named = all
        .iter()
        .filter(|(_, p)| p.get("name").is_some_and(|n| n.text.trim() == "lost-1"))
        .count();
    ensure!(named == 1, "{named} VMs named lost-1");
    let reasons = events(&s.kube, &s.ns, "lost-1").await?;
    for r in ["VCenterUnreachable", "Adopted"] {
        ensure!(reasons.iter().any(|e| e == r), "no {r} event in {reasons:?}");
    }
    Ok(())
}

/// `firmware: UEFI`, `secureBoot: true`, a TPM and PCI devices (Dynamic DirectPath, a vGPU): the
/// new VM gets them while it is off, before its first power-on; vcsim refuses Secure Boot on BIOS as vSphere does, so the
/// order matters.
#[tokio::test]
async fn firmware_secure_boot_tpm_and_pci_devices_are_set_before_the_first_power_on() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let vc = sim.client()?;
    sim.make_template(&vc, TEMPLATE).await?;
    let s = scenario(&sim.url, &sim.thumbprint, "vs-firmware").await?;
    s.machine(
        "uefi-1",
        json!({
            "cpu": {"cores": 1},
            "memoryMiB": 512,
            "firmware": "UEFI",
            "secureBoot": true,
            "tpm": true,
            "pciDevices": [
                {"vendorId": 4318, "deviceId": 7864, "customLabel": "gpu-a"},
                {"vgpuProfile": "grid_a100-4c"},
            ],
            "readinessChecks": {"skipGuestAgent": true},
        }),
    )
    .await?;
    let m = s.wait_machine("uefi-1", "Ready", is_ready).await?;
    let vm = info(&vc, &vm_of(&m)?).await?;
    ensure!(vm.firmware.as_deref() == Some("efi"), "{:?}", vm.firmware);
    ensure!(vm.secure_boot, "Secure Boot enabled");
    ensure!(vm.hardware.tpm, "a virtual TPM added");
    ensure!(
        vm.hardware.pci_devices
            == [
                banlieue_vsphere_client::PciPassthrough::Dynamic {
                    vendor_id: 4318,
                    device_id: 7864,
                    custom_label: Some("gpu-a".into()),
                },
                banlieue_vsphere_client::PciPassthrough::Vgpu {
                    profile: "grid_a100-4c".into(),
                },
            ],
        "{:?}",
        vm.hardware.pci_devices
    );
    ensure!(
        vm.power_state == Some(banlieue_vsphere_client::VmPowerState::PoweredOn),
        "{:?}",
        vm.power_state
    );
    Ok(())
}

/// The VM's tags as `category name=tag name`.
async fn vm_tags(vc: &Client, vm: &MoRef) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for id in vc.attached_tags(vm).await? {
        let tag = vc.tag(&id).await?.context("an attached tag")?;
        let category = vc
            .rest(
                http::Method::GET,
                &format!("/com/vmware/cis/tagging/category/id:{}", tag.category_id),
                None,
            )
            .await?
            .and_then(|c| c.get("name").and_then(|n| n.as_str()).map(str::to_owned))
            .unwrap_or_default();
        out.push(format!("{category}={}", tag.name));
    }
    out.sort();
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_labels_a_machine_lists_become_vsphere_tags_and_follow_them() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let vc = sim.client()?;
    sim.make_template(&vc, TEMPLATE).await?;
    let s = scenario(&sim.url, &sim.thumbprint, "vs-tags").await?;
    s.machine(
        "tagged",
        json!({
            "tagsFromLabels": ["cluster.x-k8s.io/cluster-name", "node-role.kubernetes.io/control-plane"],
            "readinessChecks": {"skipGuestAgent": true},
        }),
    )
    .await?;
    let labels = |labels: serde_json::Value| json!({"metadata": {"labels": labels}});
    s.machines()
        .patch(
            "tagged",
            &PatchParams::default(),
            &Patch::Merge(&labels(json!({
                "cluster.x-k8s.io/cluster-name": "prod",
                "node-role.kubernetes.io/control-plane": "",
                "not-listed": "x",
            }))),
        )
        .await?;
    let m = s.wait_machine("tagged", "Ready", is_ready).await?;
    let vm = vm_of(&m)?;
    let wait_tags = |want: Vec<&'static str>| {
        let (vc, vm) = (vc.clone(), vm.clone());
        async move {
            let deadline = tokio::time::Instant::now() + TIMEOUT;
            loop {
                let tags = vm_tags(&vc, &vm).await?;
                if tags == want {
                    return Ok::<_, anyhow::Error>(());
                }
                if tokio::time::Instant::now() > deadline {
                    bail!("VM tags {tags:?}, want {want:?}");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    wait_tags(vec![
        "cluster.x-k8s.io/cluster-name=prod",
        "node-role.kubernetes.io/control-plane=control-plane",
    ])
    .await?;
    // A changed value moves the VM to the other tag; a removed label detaches its tag.
    s.machines()
        .patch(
            "tagged",
            &PatchParams::default(),
            &Patch::Merge(&labels(json!({
                "cluster.x-k8s.io/cluster-name": "staging",
                "node-role.kubernetes.io/control-plane": null,
            }))),
        )
        .await?;
    wait_tags(vec!["cluster.x-k8s.io/cluster-name=staging"]).await?;
    let events = events(&s.kube, &s.ns, "tagged").await?;
    ensure!(events.iter().any(|e| e.contains("TagsChanged")), "{events:?}");
    Ok(())
}
