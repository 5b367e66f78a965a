//! The vSphere provider under the shared scenario suite: govmomi's vcsim (one per scenario,
//! three compute clusters, each a failure domain) reached through a byte-transparent TCP proxy
//! that can delay every request, and the VSphereCluster and VSphereMachine controllers running
//! in-process for the scenario's namespace. vcsim has no guest OS: [`ProviderUnderTest::boot_guests`]
//! plays VMware Tools by reporting an IP for every powered-on VM.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use banlieue_scenarios::{Access, Controllers, MachineHint, ProviderUnderTest, Template, Vm};
use banlieue_vsphere::provision::OWNER_KEY;
use banlieue_vsphere_client::{Client, ConfigSpec, MoRef, VmPowerState};
use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::vcsim_support::{PASSWORD, Vcsim};

const TEMPLATE: &str = "DC0_C0_RP0_VM0";
const CLUSTERS: usize = 3;
const WRONG_PASSWORD: &str = "not-the-password-7f3a";
/// The provider's account: only the role of [`crate::privileges::ROLE`].
const ROLE_USER: &str = "banlieue-provider";
const ROLE_PASSWORD: &str = "r0le-p4ss-5d1e";

/// vcsim with clusters `DC0_C0..2` (failure domains `az0..2`) and template `DC0_C0_RP0_VM0`.
pub struct VcSim {
    kube: kube::Client,
    ns: String,
    sim: Vcsim,
    vc: Client,
    proxy: Proxy,
    controllers: Controllers,
}

fn fd_name(i: usize) -> String {
    format!("az{i}")
}

impl ProviderUnderTest for VcSim {
    const NAME: &'static str = "vs";
    const CLUSTER_KIND: &'static str = "VSphereCluster";
    const MACHINE_KIND: &'static str = "VSphereMachine";
    const PROVIDER_ID_PREFIX: &'static str = "vsphere://";
    const BAD_TEMPLATE_REASON: &'static str = "TemplateNotFound";
    const MISSING_TEMPLATE: &'static str = "no-such-template";
    const BAD_ACCESS_REASONS: &'static [&'static str] = &["AuthenticationFailed"];
    // The proxy accepts and closes: the connection breaks during the TLS handshake, an
    // unreachable endpoint (`VCenterUnreachable`), said with its address.
    const OUTAGE_MESSAGE: &'static str = "cannot connect to 127.0.0.1:";
    // Each vCenter task still running at its first poll is recorded once (clone, hardware
    // reconfigure, guest metadata, power on: up to 4, usually 2 or 3 with vcsim, depending on
    // the machine's load), plus the finalizer, WaitingForGuest, the providerID and Ready:
    // at most 8 (10 before steps were chained, 7 seen once on a loaded CI machine).
    const PROVISIONING_WRITES: usize = 8;
    const NETWORK: &'static str = "VM Network";

    async fn setup(kube: kube::Client, ns: &str) -> Result<Self> {
        let (sim, vc, proxy) = start_vcenter(CLUSTERS).await?;
        Ok(Self {
            kube,
            ns: ns.to_owned(),
            sim,
            vc,
            proxy,
            controllers: Controllers::default(),
        })
    }

    fn failure_domains(&self) -> Vec<String> {
        (0..CLUSTERS).map(fd_name).collect()
    }

    async fn cluster_spec(&self, access: Access) -> Result<Value> {
        credentials_secret(&self.kube, &self.ns, "vc-creds", access).await?;
        let domains: Vec<Value> = (0..CLUSTERS)
            .map(|i| json!({"name": fd_name(i), "computeCluster": format!("DC0_C{i}"), "datastore": "LocalDS_0"}))
            .collect();
        Ok(json!({
            "server": self.proxy.addr,
            "credentialsRef": {"name": "vc-creds"},
            "tls": {"sha256Fingerprint": self.sim.thumbprint},
            "datacenter": "DC0",
            "failureDomains": domains,
        }))
    }

    fn machine_spec(&self, template: Template) -> Value {
        machine_spec(template)
    }

    fn start(&mut self) {
        start_controllers(&self.kube, &self.ns, &mut self.controllers);
    }

    async fn stop(&mut self) {
        self.controllers.stop().await;
    }

    async fn vms(&self, machines: &[MachineHint]) -> Result<Vec<Vm>> {
        let mut vms = Vec::new();
        for (vm, info) in owned_vms(&self.vc, machines).await? {
            let failure_domain = compute_cluster(&self.vc, &vm)
                .await?
                .and_then(|c| (0..CLUSTERS).find(|i| c == format!("DC0_C{i}")).map(fd_name));
            vms.push(vm_of(vm, &info, failure_domain));
        }
        Ok(vms)
    }

    async fn boot_guests(&self, machines: &[MachineHint]) -> Result<()> {
        boot_guests(&self.vc, machines).await
    }

    async fn slow_down(&self) -> Result<()> {
        self.proxy.delay_ms.store(40, Ordering::Relaxed);
        Ok(())
    }

    async fn outage(&self, down: bool) -> Result<()> {
        self.proxy.down.store(down, Ordering::Relaxed);
        Ok(())
    }

    fn secrets(&self) -> Vec<String> {
        vec![
            PASSWORD.to_owned(),
            ROLE_PASSWORD.to_owned(),
            WRONG_PASSWORD.to_owned(),
        ]
    }

    fn unsupported_field(&self) -> Option<(Value, &'static str)> {
        // A VLAN belongs to the port group on vSphere.
        Some((
            json!({"networks": [{"name": "eth0", "network": Self::NETWORK, "vlan": 42}]}),
            "spec.networks[0].vlan",
        ))
    }
}

/// vcsim with `clusters` compute clusters `DC0_C<i>` (one host each) and the template
/// `DC0_C0_RP0_VM0`, and the proxy in front of it.
async fn start_vcenter(clusters: usize) -> Result<(Vcsim, Client, Proxy)> {
    let clusters = clusters.to_string();
    // The provider's account holds exactly the documented role, which this vcsim checks as
    // vCenter does; the harness's own account is unrestricted.
    let privileges = crate::privileges::role_privileges();
    let sim = Vcsim::start(&[
        "-cluster",
        &clusters,
        "-host",
        "1",
        "-vm",
        "1",
        "-standalone-host",
        "0",
        "-role-user",
        ROLE_USER,
        "-role-password",
        ROLE_PASSWORD,
        "-role-privileges",
        &privileges,
    ])?;
    let vc = sim.client()?;
    sim.make_template(&vc, TEMPLATE).await?;
    let proxy = Proxy::start(sim.host.clone()).await?;
    Ok((sim, vc, proxy))
}

/// The credentials Secret `name` (a wrong password for [`Access::Bad`]).
async fn credentials_secret(kube: &kube::Client, ns: &str, name: &str, access: Access) -> Result<()> {
    let password = match access {
        Access::Valid => ROLE_PASSWORD,
        Access::Bad => WRONG_PASSWORD,
    };
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {"username": ROLE_USER, "password": password},
    }))?;
    Api::<Secret>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

fn machine_spec(template: Template) -> Value {
    let template = match template {
        Template::Valid => TEMPLATE,
        Template::Missing => VcSim::MISSING_TEMPLATE,
    };
    json!({"source": {"template": template}, "cpu": {"cores": 2}, "memoryMiB": 2048})
}

fn start_controllers(kube: &kube::Client, ns: &str, controllers: &mut Controllers) {
    let spawned = banlieue_vsphere::provider("banlieue-vsphere-test").spawn(kube.clone(), ns, (0, 0));
    controllers.extend(spawned.tasks);
}

/// The VMs of `vc` carrying the UID of one of `machines`, with what vCenter says of them.
async fn owned_vms(
    vc: &Client,
    machines: &[MachineHint],
) -> Result<Vec<(MoRef, banlieue_vsphere_client::VmInfo)>> {
    let mut found = Vec::new();
    for m in machines {
        for vm in vc.find_vms_by_extra_config(OWNER_KEY, &m.uid).await? {
            if let Some(info) = vc.vm_info(&vm).await? {
                found.push((vm, info));
            }
        }
    }
    Ok(found)
}

/// The scenario's view of a VM: owner, user data and network config from its extraConfig.
fn vm_of(vm: MoRef, info: &banlieue_vsphere_client::VmInfo, failure_domain: Option<String>) -> Vm {
    let decode = |b64: &str| base64::engine::general_purpose::STANDARD.decode(b64).ok();
    let user_data = info
        .extra_config
        .get("guestinfo.userdata")
        .and_then(|b| decode(b));
    // cloud-init's VMware datasource: the meta-data's `network`, base64.
    let network_config = info
        .extra_config
        .get("guestinfo.metadata")
        .and_then(|b| decode(b))
        .and_then(|meta| serde_yaml::from_slice::<Value>(&meta).ok())
        .and_then(|meta| meta["network"].as_str().and_then(decode))
        .and_then(|config| String::from_utf8(config).ok());
    Vm {
        id: vm.value.clone(),
        owner_uid: info.extra_config.get(OWNER_KEY).cloned(),
        failure_domain,
        user_data,
        network_config,
    }
}

/// Plays VMware Tools: every powered-on VM of `machines` without an IP reports one.
async fn boot_guests(vc: &Client, machines: &[MachineHint]) -> Result<()> {
    for (i, m) in machines.iter().enumerate() {
        for vm in vc.find_vms_by_extra_config(OWNER_KEY, &m.uid).await? {
            let Some(info) = vc.vm_info(&vm).await? else {
                continue;
            };
            if info.power_state == Some(VmPowerState::PoweredOn) && info.ip_address.is_none() {
                let ip = ConfigSpec {
                    extra_config: vec![
                        ("SET.guest.ipAddress".into(), format!("192.0.2.{}", 10 + i)),
                        banlieue_vsphere::guest_report::published_done(),
                    ],
                    ..ConfigSpec::default()
                };
                let task = vc.reconfigure(&vm, &ip).await?;
                vc.wait_task(&task, Duration::from_millis(50), Duration::from_secs(30))
                    .await?;
            }
        }
    }
    Ok(())
}

/// The compute cluster whose resource pool holds the VM (vcsim keeps a clone on the template's
/// host, so the pool, not the host, tells where the VM was placed).
async fn compute_cluster(vc: &Client, vm: &MoRef) -> Result<Option<String>> {
    let Some(pool) = vc.property_text(vm, "resourcePool").await? else {
        return Ok(None);
    };
    let pool = MoRef::new("ResourcePool", pool);
    let Some(parent) = vc.property_text(&pool, "parent").await? else {
        return Ok(None);
    };
    Ok(vc
        .property_text(&MoRef::new("ClusterComputeResource", parent), "name")
        .await?)
}

/// One workload cluster over two vCenters (a vcsim each, one compute cluster `DC0_C0`): the
/// VSphereCluster's `server` is `home`'s, and failure domain `remote` names its own `server`,
/// credentials and trust.
pub struct VcSimSpread {
    kube: kube::Client,
    ns: String,
    /// Failure domain, vcsim, its client, its proxy.
    pub sites: Vec<(&'static str, Vcsim, Client, Proxy)>,
    controllers: Controllers,
}

impl ProviderUnderTest for VcSimSpread {
    const NAME: &'static str = "vss";
    const CLUSTER_KIND: &'static str = VcSim::CLUSTER_KIND;
    const MACHINE_KIND: &'static str = VcSim::MACHINE_KIND;
    const PROVIDER_ID_PREFIX: &'static str = VcSim::PROVIDER_ID_PREFIX;
    const BAD_TEMPLATE_REASON: &'static str = VcSim::BAD_TEMPLATE_REASON;
    const MISSING_TEMPLATE: &'static str = VcSim::MISSING_TEMPLATE;
    const BAD_ACCESS_REASONS: &'static [&'static str] = VcSim::BAD_ACCESS_REASONS;
    const OUTAGE_MESSAGE: &'static str = VcSim::OUTAGE_MESSAGE;
    const PROVISIONING_WRITES: usize = VcSim::PROVISIONING_WRITES;
    const NETWORK: &'static str = VcSim::NETWORK;

    async fn setup(kube: kube::Client, ns: &str) -> Result<Self> {
        // `remote` first: scenarios send their first machine to the first failure domain.
        let mut sites = Vec::new();
        for name in ["remote", "home"] {
            let (sim, vc, proxy) = start_vcenter(1).await?;
            sites.push((name, sim, vc, proxy));
        }
        Ok(Self {
            kube,
            ns: ns.to_owned(),
            sites,
            controllers: Controllers::default(),
        })
    }

    fn failure_domains(&self) -> Vec<String> {
        self.sites.iter().map(|(name, ..)| (*name).to_owned()).collect()
    }

    async fn cluster_spec(&self, access: Access) -> Result<Value> {
        let (mut spec, mut domains) = (json!({}), Vec::new());
        for (name, sim, _, proxy) in &self.sites {
            let secret = format!("vc-{name}");
            credentials_secret(&self.kube, &self.ns, &secret, access).await?;
            let mut domain = json!({"name": name, "computeCluster": "DC0_C0", "datastore": "LocalDS_0"});
            let connection = json!({
                "server": proxy.addr,
                "credentialsRef": {"name": secret},
                "tls": {"sha256Fingerprint": sim.thumbprint},
            });
            let target = if *name == "home" { &mut spec } else { &mut domain };
            for (key, value) in connection.as_object().into_iter().flatten() {
                target[key] = value.clone();
            }
            if *name == "remote" {
                domain["datacenter"] = json!("DC0");
            }
            domains.push(domain);
        }
        spec["datacenter"] = json!("DC0");
        spec["failureDomains"] = json!(domains);
        Ok(spec)
    }

    fn machine_spec(&self, template: Template) -> Value {
        machine_spec(template)
    }

    fn start(&mut self) {
        start_controllers(&self.kube, &self.ns, &mut self.controllers);
    }

    async fn stop(&mut self) {
        self.controllers.stop().await;
    }

    async fn vms(&self, machines: &[MachineHint]) -> Result<Vec<Vm>> {
        let mut vms = Vec::new();
        for (name, _, vc, _) in &self.sites {
            for (vm, info) in owned_vms(vc, machines).await? {
                let cluster = compute_cluster(vc, &vm).await?;
                anyhow::ensure!(
                    cluster.as_deref() == Some("DC0_C0"),
                    "VM {} of {name} in {cluster:?}",
                    vm.value
                );
                vms.push(vm_of(
                    MoRef::new("VirtualMachine", format!("{name}/{}", vm.value)),
                    &info,
                    Some((*name).to_owned()),
                ));
            }
        }
        Ok(vms)
    }

    async fn boot_guests(&self, machines: &[MachineHint]) -> Result<()> {
        for (_, _, vc, _) in &self.sites {
            boot_guests(vc, machines).await?;
        }
        Ok(())
    }

    async fn slow_down(&self) -> Result<()> {
        for (.., proxy) in &self.sites {
            proxy.delay_ms.store(40, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn outage(&self, down: bool) -> Result<()> {
        for (.., proxy) in &self.sites {
            proxy.down.store(down, Ordering::Relaxed);
        }
        Ok(())
    }

    fn secrets(&self) -> Vec<String> {
        vec![
            PASSWORD.to_owned(),
            ROLE_PASSWORD.to_owned(),
            WRONG_PASSWORD.to_owned(),
        ]
    }
}

/// A TCP proxy on loopback in front of vcsim (TLS passes through untouched) that holds every
/// client-to-server chunk for `delay_ms`, and while `down` closes every connection.
pub struct Proxy {
    addr: String,
    delay_ms: Arc<AtomicU64>,
    down: Arc<AtomicBool>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(target: String) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let delay_ms = Arc::new(AtomicU64::new(0));
        let down = Arc::new(AtomicBool::new(false));
        let (delay, cut) = (delay_ms.clone(), down.clone());
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if cut.load(Ordering::Relaxed) {
                    drop(inbound);
                    continue;
                }
                let (target, delay, cut) = (target.clone(), delay.clone(), cut.clone());
                tokio::spawn(async move {
                    let outbound = match TcpStream::connect(&target).await {
                        Ok(outbound) => outbound,
                        Err(e) => {
                            // Seen by the provider as a closed handshake, like an outage: say why.
                            eprintln!("test proxy: cannot reach vcsim at {target}: {e}");
                            return;
                        }
                    };
                    let (mut from_client, mut to_client) = inbound.into_split();
                    let (mut from_server, mut to_server) = outbound.into_split();
                    let upstream = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        while let Ok(n @ 1..) = from_client.read(&mut buf).await {
                            let ms = delay.load(Ordering::Relaxed);
                            if ms > 0 {
                                tokio::time::sleep(Duration::from_millis(ms)).await;
                            }
                            if cut.load(Ordering::Relaxed) || to_server.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = to_server.shutdown().await;
                    };
                    let downstream = async {
                        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                        let _ = to_client.shutdown().await;
                    };
                    // Either side ending (or an outage) ends the connection.
                    tokio::select! {
                        () = upstream => {}
                        () = downstream => {}
                    }
                });
            }
        });
        Ok(Self {
            addr,
            delay_ms,
            down,
            accept,
        })
    }
}

impl Proxy {
    /// Cuts (or restores) every connection through this proxy.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
