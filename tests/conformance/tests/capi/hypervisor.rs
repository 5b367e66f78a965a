//! The hypervisor a conformance run drives, as its admin sees it: the Proxmox VE simulator
//! (in process), govmomi's vcsim (a process) or libvirt's `test:///default` driver (in process:
//! its state lives in the process that opened it, so the libvirt provider's controllers run in
//! the test process, from the provider's library, instead of as the `banlieue-libvirt` binary). What the run needs from each: the clusterctl
//! variables that point the provider and the cluster template at it, its VMs with what their
//! guest would read at boot (user data, meta-data) and the identity a kubelet or cloud provider
//! would put on the Node, and what must be left of it after deletion.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use banlieue_clusterctl::Infra;
use banlieue_pve_sim::SimHandle;
use banlieue_vsphere_client::vim::ConfigSpec;
use banlieue_vsphere_client::{Client, MoRef, VmPowerState};
use base64::Engine as _;
use serde_json::{Value, json};

use banlieue_testenv::guests::Smbios;

use super::guests::AgentView;

use crate::vcsim_support::{PASSWORD, USER, Vcsim};

/// libvirt's in-process test driver, shared by every connection of this process.
const LIBVIRT_URI: &str = "test:///default";
/// The test driver's storage pool.
const LIBVIRT_POOL: &str = "default-pool";
/// The base volume the cluster template clones.
const LIBVIRT_BASE_VOLUME: &str = "base.qcow2";
/// The test driver's own domain (not the run's).
const LIBVIRT_OWN_DOMAIN: &str = "test";

/// The Proxmox template VM the cluster template clones.
pub const PROXMOX_TEMPLATE_VMID: u32 = 9000;
/// The Proxmox template VM of the guest image's next Kubernetes version ([`proxmox_template_for`]).
const PROXMOX_NEXT_TEMPLATE_VMID: u32 = 9001;
/// The tag prefix of a Proxmox template built for a Kubernetes version other than the image's
/// own (`kubernetes-v1.34.4`): PVE copies a template's tags to its clones, so the lab knows which
/// disk a VM boots.
const PROXMOX_KUBERNETES_TAG: &str = "kubernetes-";

/// The value of a Proxmox VM's tag that starts with `prefix` (tags read as PVE stores them, by
/// the client's parser).
fn proxmox_tag(config: &std::collections::BTreeMap<String, String>, prefix: &str) -> Option<String> {
    banlieue_pve_client::config::normalize_tags(config.get("tags")?)
        .ok()?
        .into_iter()
        .find_map(|tag| tag.strip_prefix(prefix).map(str::to_owned))
}

/// A second Proxmox template, as image-builder makes one per Kubernetes version: the simulator's
/// Ubuntu template with its own VMID, name, disks and identity, tagged with `version`.
pub fn proxmox_template_for(version: &str) -> banlieue_pve_sim::TemplateSpec {
    let mut template = banlieue_pve_sim::TemplateSpec::ubuntu("pve1");
    let (old, new) = (
        PROXMOX_TEMPLATE_VMID.to_string(),
        PROXMOX_NEXT_TEMPLATE_VMID.to_string(),
    );
    template.vmid = PROXMOX_NEXT_TEMPLATE_VMID;
    for value in template.config.values_mut() {
        *value = value.replace(&old, &new);
    }
    template.config.insert(
        "name".into(),
        format!("ubuntu-2404-kube-{}", version.replace('.', "-")),
    );
    template
        .config
        .insert("net0".into(), "virtio=BC:24:11:00:90:01,bridge=vmbr0".into());
    let tags = template.config.entry("tags".into()).or_default();
    tags.push_str(&format!(";{PROXMOX_KUBERNETES_TAG}{version}"));
    template
}
/// vcsim's model VM, made the template.
const VSPHERE_TEMPLATE: &str = "DC0_C0_RP0_VM0";
/// Extra config key the vSphere provider marks its VMs with (owner UID).
const VSPHERE_OWNER_KEY: &str = "guestinfo.banlieue.owner-uid";
/// Tasks that create, power or delete a Proxmox VM.
const PROXMOX_LIFECYCLE_TASKS: [&str; 5] = ["qmclone", "qmstart", "qmstop", "qmshutdown", "qmdestroy"];

/// The NIC name of a virtio NIC in slot 18, as Debian and Ubuntu guests of Proxmox name it.
const PROXMOX_NIC: &str = "ens18";
/// The NIC name of a vmxnet3 NIC in slot 192, as Debian and Ubuntu guests of vSphere name it (the
/// vSphere template's `KUBE_VIP_INTERFACE` default).
const VSPHERE_NIC: &str = "ens192";
/// The NIC name of the first NIC of the libvirt provider's domains, which the provider pins to
/// PCI slot 2 (`banlieue_libvirt::xml::nic_pci_slot`), as Debian and Ubuntu guests name it (the
/// libvirt template's `KUBE_VIP_INTERFACE` default: with DHCP only, no seed renames it).
const LIBVIRT_NIC: &str = "ens2";

/// A VM as a lab guest boots it (see [`Hypervisor::lab_vms`]).
#[derive(Clone, Debug)]
pub struct LabVm {
    /// The hypervisor's id (VMID, managed object id).
    pub id: String,
    /// Powered on.
    pub running: bool,
    /// The first NIC's name in the guest.
    pub nic: &'static str,
    /// The first NIC's MAC.
    pub mac: Option<String>,
    /// The seed drive's image (Proxmox: the NoCloud ISO).
    pub seed: Option<Vec<u8>>,
    /// The VM's `guestinfo.*` values (vSphere).
    pub guestinfo: std::collections::BTreeMap<String, String>,
    /// Its firmware's SMBIOS system information.
    pub smbios: Option<Smbios>,
    /// Its configured memory.
    pub memory_mib: Option<u64>,
    /// The Kubernetes version its disk was built for, when not the guest image's own.
    pub kubernetes: Option<String>,
    /// The addresses its guest agent reported (vSphere: VMware Tools' `guest.net`).
    pub guest_ips: Vec<String>,
}

#[test]
fn the_next_minors_template_is_a_template_of_its_own_tagged_with_its_version() {
    let template = proxmox_template_for("v1.34.4");
    assert_eq!(template.vmid, PROXMOX_NEXT_TEMPLATE_VMID);
    assert_eq!(template.config["template"], "1");
    assert_eq!(template.config["tags"], "template;ubuntu;kubernetes-v1.34.4");
    assert_eq!(
        proxmox_tag(&template.config, PROXMOX_KUBERNETES_TAG).as_deref(),
        Some("v1.34.4")
    );
    assert_eq!(template.config["name"], "ubuntu-2404-kube-v1-34-4");
    let first = banlieue_pve_sim::TemplateSpec::ubuntu("pve1");
    assert_ne!(template.config["net0"], first.config["net0"]);
    let own = PROXMOX_TEMPLATE_VMID.to_string();
    let leftovers: Vec<_> = template.config.iter().filter(|(_, v)| v.contains(&own)).collect();
    assert!(
        leftovers.is_empty(),
        "disks and identity of template {own} kept: {leftovers:?}"
    );
}

/// A MAC in VMware's range for generated addresses (`00:50:56:00:00:00`–`00:50:56:3f:ff:ff`),
/// from a VM's BIOS uuid.
fn vmware_generated_mac(bios_uuid: &str) -> String {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(bios_uuid.as_bytes());
    format!("00:50:56:{:02x}:{:02x}:{:02x}", hash[0] & 0x3f, hash[1], hash[2])
}

#[test]
fn vmware_generated_macs_stay_in_the_generated_range_and_differ_per_vm() {
    let a = vmware_generated_mac("b499a21b-f084-5d68-9269-364cef1fa65a");
    let b = vmware_generated_mac("2928ff7a-62f4-5537-abe3-149807643e62");
    assert_ne!(a, b);
    for mac in [a, b] {
        assert!(mac.starts_with("00:50:56:"), "{mac}");
        assert!(u8::from_str_radix(&mac[9..11], 16).unwrap() <= 0x3f, "{mac}");
    }
}

/// A VM as the hypervisor reports it.
#[derive(Clone, Debug)]
pub struct Guest {
    /// The hypervisor's id (VMID, managed object id): what the infra machine's status names.
    pub id: String,
    /// Powered on.
    pub running: bool,
    /// What must not change while the VM lives (SMBIOS / BIOS uuid).
    pub identity: String,
    /// The owner UID the provider marked the VM with.
    pub owner_uid: Option<String>,
    /// The user data the guest reads at boot.
    pub user_data: Option<String>,
    /// The meta-data's `local-hostname`: the Node name kubeadm registers.
    pub hostname: Option<String>,
    /// The `spec.providerID` the kubelet (Proxmox: `--provider-id` from the meta-data's
    /// instance-id) or the cloud provider (vSphere CPI: the BIOS uuid) sets on the Node.
    pub node_provider_id: Option<String>,
    /// The guest has reported an address (VMware Tools; Proxmox's simulator does it itself).
    pub has_address: bool,
}

/// vcsim and a client of it.
pub struct VSphere {
    sim: Vcsim,
    vc: Client,
    /// The VMs of vcsim's default inventory (not the run's).
    inventory: BTreeSet<String>,
}

impl VSphere {
    /// The run's VMs (vcsim's own inventory and templates aside) with their properties.
    async fn run_vms(&self) -> Result<Vec<(MoRef, banlieue_vsphere_client::vim::VmInfo)>> {
        let mut out = Vec::new();
        for (vm, _) in self.vc.all_vms(&["name"]).await? {
            if self.inventory.contains(&vm.value) {
                continue;
            }
            if let Some(info) = self.vc.vm_info(&vm).await?
                && !info.template
            {
                out.push((vm, info));
            }
        }
        Ok(out)
    }

    /// Sets extraConfig values of VM `id` as its guest would (vcsim: `SET.guest.*` for VMware
    /// Tools' view, `guestinfo.*` for what the guest set); nothing to set, no call.
    async fn set_extra_config(&self, id: &str, extra_config: Vec<(String, String)>) -> Result<()> {
        if extra_config.is_empty() {
            return Ok(());
        }
        let spec = ConfigSpec {
            extra_config,
            ..ConfigSpec::default()
        };
        let vm = MoRef::new("VirtualMachine", id.to_owned());
        let task = self.vc.reconfigure(&vm, &spec).await?;
        self.vc
            .wait_task(&task, Duration::from_millis(50), Duration::from_secs(30))
            .await?;
        Ok(())
    }
}

/// libvirt's test driver and the provider's connections to it.
pub struct Libvirt {
    connector: banlieue_libvirt::connection::VirtConnector,
    /// Kept open: the test driver's state lives while a connection does.
    conn: virt::connect::Connect,
    /// This run's turn: the test driver's domains are the whole process's, and a run counts
    /// (and boots) every domain it lists.
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

/// One run at a time uses the process's test driver.
static LIBVIRT_TEST_DRIVER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The hypervisor of a run.
pub enum Hypervisor {
    /// pve-sim, one node `pve1` holding template 9000.
    Proxmox(Arc<SimHandle>),
    /// vcsim's default inventory (datacenter `DC0`), its model VM made the template.
    VSphere(Box<VSphere>),
    /// `test:///default` with a base volume, one host `localhost`.
    Libvirt(Box<Libvirt>),
}

impl Hypervisor {
    /// vcsim, with its model VM powered off and marked as the template.
    pub async fn vcsim() -> Result<Self> {
        let sim = Vcsim::start(&[])?;
        let vc = sim.client()?;
        sim.make_template(&vc, VSPHERE_TEMPLATE).await?;
        let inventory = vc
            .all_vms(&["name"])
            .await?
            .into_iter()
            .map(|(vm, _)| vm.value)
            .collect();
        Ok(Self::VSphere(Box::new(VSphere { sim, vc, inventory })))
    }

    /// libvirt's test driver with the base volume of the cluster template.
    pub async fn libvirt_test_driver() -> Result<Self> {
        use banlieue_libvirt::hypervisor::Hypervisor as _;
        let turn = LIBVIRT_TEST_DRIVER.lock().await;
        let conn = virt::connect::Connect::open(Some(LIBVIRT_URI)).context("opening test:///default")?;
        let connector = banlieue_libvirt::connection::VirtConnector::default();
        let hv = connector.get(LIBVIRT_URI);
        if hv.volume(LIBVIRT_POOL, LIBVIRT_BASE_VOLUME).await?.is_none() {
            hv.create_volume(
                LIBVIRT_POOL,
                &banlieue_libvirt::xml::plain_volume_xml(LIBVIRT_BASE_VOLUME, 1 << 30, "qcow2"),
            )
            .await?;
        }
        Ok(Self::Libvirt(Box::new(Libvirt {
            connector,
            conn,
            _turn: turn,
        })))
    }

    /// The banlieue provider driving it.
    pub fn infra(&self) -> Infra {
        match self {
            Self::Proxmox(_) => Infra::Proxmox,
            Self::VSphere(_) => Infra::Vsphere,
            Self::Libvirt(_) => Infra::Libvirt,
        }
    }

    /// Serves the provider's controllers in this process, as its binary's `main` does, when the
    /// binary cannot run (libvirt's test driver keeps its state in the process that opened it),
    /// its log (this process's `tracing` output, plain text) appended to `log`; `None`: run the
    /// binary.
    pub fn serve_in_process(
        &self,
        client: &kube::Client,
        log: &std::path::Path,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let Self::Libvirt(lv) = self else {
            return None;
        };
        // One subscriber per process: the first in-process provider's log file keeps it.
        if let Ok(file) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
            let _ = tracing_subscriber::fmt()
                .with_writer(std::sync::Mutex::new(file))
                .with_ansi(false)
                .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
                .try_init();
        }
        /// The binary's runtime flags.
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            runtime: banlieue_provider_runtime::flags::RuntimeArgs,
        }
        let flags = <Flags as clap::Parser>::parse_from([
            banlieue_libvirt::NAME,
            "--metrics-bind-address=127.0.0.1:0",
            "--health-probe-bind-address=127.0.0.1:0",
        ]);
        // `--domain-type qemu`: no KVM here.
        let settings = banlieue_libvirt::desired::Settings {
            domain_type: banlieue_libvirt::xml::DomainType::Qemu,
            ..Default::default()
        };
        let provider = banlieue_libvirt::provider(lv.connector.clone(), settings);
        let client = client.clone();
        Some(tokio::spawn(async move {
            if let Err(e) = provider.serve(client, &flags.runtime).await {
                eprintln!("{}: {e}", banlieue_libvirt::NAME);
            }
        }))
    }

    /// The provider's kind `suffix` (`Machine` → `ProxmoxMachine`).
    pub fn kind(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.infra().kind_prefix())
    }

    /// The provider's finalizer on its machines and clusters.
    pub fn finalizer(&self) -> String {
        format!("infrastructure.banlieue.io/{}", self.infra().short())
    }

    /// What every `spec.providerID` of the provider starts with.
    pub fn provider_id_prefix(&self) -> &'static str {
        match self {
            Self::Proxmox(_) => "proxmox://",
            Self::VSphere(_) => "vsphere://",
            Self::Libvirt(_) => "libvirt://localhost/",
        }
    }

    /// Whether the infra cluster of the default cluster template publishes failure domains
    /// (Proxmox: its nodes; libvirt: its host; the vSphere template names none).
    pub fn publishes_failure_domains(&self) -> bool {
        matches!(self, Self::Proxmox(_) | Self::Libvirt(_))
    }

    /// The variables of `clusterctl init` (the default credentials Secret of the components).
    pub fn init_variables(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::Proxmox(sim) => vec![
                ("PROXMOX_TOKEN", sim.token_id()),
                ("PROXMOX_SECRET", sim.token_secret()),
                ("PROXMOX_URL", sim.url()),
            ],
            Self::VSphere(v) => vec![
                ("VSPHERE_USERNAME", USER.to_owned()),
                ("VSPHERE_PASSWORD", PASSWORD.to_owned()),
                ("VSPHERE_SERVER", v.sim.url.clone()),
            ],
            Self::Libvirt(_) => vec![],
        }
    }

    /// The credentials Secret a user creates in the cluster's namespace: name and `stringData`
    /// (none for a local libvirt URI).
    pub fn credentials(&self) -> Option<(&'static str, Value)> {
        match self {
            Self::Proxmox(sim) => Some((
                "pve-sim",
                json!({"tokenID": sim.token_id(), "secret": sim.token_secret()}),
            )),
            Self::VSphere(_) => Some(("vc-sim", json!({"username": USER, "password": PASSWORD}))),
            Self::Libvirt(_) => None,
        }
    }

    /// The variables of `clusterctl generate cluster` (besides the control-plane endpoint):
    /// the hypervisor with its certificate pinned, the template, the Secret of
    /// [`Hypervisor::credentials`] in namespace `ns`.
    pub fn template_variables(&self, ns: &str) -> Vec<(&'static str, String)> {
        let secret = self.credentials().map(|(name, _)| name).unwrap_or_default();
        match self {
            Self::Proxmox(sim) => vec![
                ("PROXMOX_URL", sim.url()),
                ("PROXMOX_TLS_FINGERPRINT", sim.fingerprint_sha256()),
                ("PROXMOX_TEMPLATE_VMID", PROXMOX_TEMPLATE_VMID.to_string()),
                ("PROXMOX_CREDENTIALS_SECRET", secret.to_owned()),
                ("PROXMOX_CREDENTIALS_NAMESPACE", ns.to_owned()),
            ],
            Self::VSphere(v) => vec![
                ("VSPHERE_SERVER", v.sim.url.clone()),
                ("VSPHERE_TLS_FINGERPRINT", v.sim.thumbprint.clone()),
                ("VSPHERE_DATACENTER", "DC0".to_owned()),
                ("VSPHERE_TEMPLATE", VSPHERE_TEMPLATE.to_owned()),
                ("VSPHERE_RESOURCE_POOL", "DC0_C0/Resources".to_owned()),
                ("VSPHERE_DATASTORE", "LocalDS_0".to_owned()),
                ("VSPHERE_CREDENTIALS_SECRET", secret.to_owned()),
                ("VSPHERE_CREDENTIALS_NAMESPACE", ns.to_owned()),
            ],
            // The test driver has no room for the template's default sizes (4 GiB, 32 GiB).
            Self::Libvirt(_) => vec![
                ("LIBVIRT_URI", LIBVIRT_URI.to_owned()),
                ("LIBVIRT_HOST_NAME", "localhost".to_owned()),
                ("LIBVIRT_POOL", LIBVIRT_POOL.to_owned()),
                ("LIBVIRT_BASE_VOLUME", LIBVIRT_BASE_VOLUME.to_owned()),
                ("LIBVIRT_NETWORK", "default".to_owned()),
                ("CONTROL_PLANE_MEMORY_MIB", "256".to_owned()),
                ("WORKER_MEMORY_MIB", "256".to_owned()),
                ("CONTROL_PLANE_DISK_GIB", "1".to_owned()),
                ("WORKER_DISK_GIB", "1".to_owned()),
            ],
        }
    }

    /// Whether the run's infra cluster names a banlieue Provider (`spec.providerRef`, made by
    /// [`Hypervisor::register_provider`] before the cluster) instead of its own endpoint and
    /// Secret: then `clusterctl move` must carry the Provider and the Secret it owns. The vSphere
    /// run does so; the Proxmox runs keep the Secret in the cluster's namespace (moved by its
    /// `clusterctl.cluster.x-k8s.io/move` label).
    pub fn cluster_through_provider(&self) -> bool {
        matches!(self, Self::VSphere(_))
    }

    /// The Secret a Provider of [`Hypervisor::register_provider`] names, when the run creates it:
    /// `(namespace, name)`, in the infrastructure provider's namespace (where `clusterctl move`
    /// looks for Secrets besides the moved namespace), apart from the one `clusterctl init`
    /// created there (the target has its own of that name).
    pub fn provider_secret(&self) -> Option<(String, &'static str)> {
        self.cluster_through_provider()
            .then(|| (self.infra().namespace(), "conformance-provider-credentials"))
    }

    /// Registers the hypervisor as the cluster-scoped banlieue Provider `name` (server-side
    /// apply: a second call changes nothing); returns what a VirtualMachine's `spec` needs
    /// besides (`source` cloning the template, networks).
    pub async fn register_provider(&self, client: &kube::Client, name: &str) -> Result<Value> {
        let apply = kube::api::PatchParams::apply("banlieue-conformance").force();
        let providers = kube::Api::<banlieue_api::banlieue::Provider>::all(client.clone());
        match self {
            Self::Proxmox(sim) => {
                banlieue_dev::register_simulator_as(client, sim, name).await?;
                Ok(json!({
                    "source": {"proxmox": {"vmid": PROXMOX_TEMPLATE_VMID}},
                    "networks": [{"name": "net0", "network": "vmbr0"}],
                }))
            }
            Self::VSphere(v) => {
                let (secret_ns, secret) = self.provider_secret().context("the vSphere Provider's Secret")?;
                let data = self.credentials().map(|(_, data)| data).unwrap_or_default();
                kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &secret_ns)
                    .patch(
                        secret,
                        &apply,
                        &kube::api::Patch::Apply(json!({
                            "apiVersion": "v1", "kind": "Secret",
                            "metadata": {"name": secret, "namespace": secret_ns},
                            "stringData": data,
                        })),
                    )
                    .await
                    .context("applying the vSphere Provider's credentials Secret")?;
                // Labelled for clusterctl move: the run's cluster names it.
                let provider = json!({
                    "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
                    "metadata": {"name": name, "labels": {banlieue_api::banlieue::MOVE_LABEL: ""}},
                    "spec": {
                        "backend": "vsphere",
                        "endpoint": v.sim.url,
                        "credentialsRef": {"name": secret, "namespace": secret_ns},
                        "tls": {"sha256Fingerprint": v.sim.thumbprint},
                        "defaults": {"datacenter": "DC0", "storage": "LocalDS_0", "resourcePool": "DC0_C0/Resources"},
                    }
                });
                providers
                    .patch(name, &apply, &kube::api::Patch::Apply(provider))
                    .await
                    .context("applying the vSphere Provider")?;
                Ok(json!({"source": {"vsphere": {"template": VSPHERE_TEMPLATE}}}))
            }
            Self::Libvirt(_) => {
                let provider = json!({
                    "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
                    "metadata": {"name": name},
                    "spec": {
                        "backend": "libvirt",
                        "endpoint": LIBVIRT_URI,
                        "defaults": {"storage": LIBVIRT_POOL, "network": "default"},
                    }
                });
                providers
                    .patch(name, &apply, &kube::api::Patch::Apply(provider))
                    .await
                    .context("applying the libvirt Provider")?;
                Ok(json!({"source": {"libvirt": {"pool": LIBVIRT_POOL, "volume": LIBVIRT_BASE_VOLUME}}}))
            }
        }
    }

    /// The hypervisor id an infra machine's status names (`status.vmid`, `status.vmRef`).
    pub fn vm_id(&self, infra_machine: &Value) -> Option<String> {
        match self {
            Self::Proxmox(_) => infra_machine["status"]["vmid"].as_u64().map(|v| v.to_string()),
            Self::VSphere(_) => infra_machine["status"]["vmRef"].as_str().map(str::to_owned),
            Self::Libvirt(_) => infra_machine["status"]["domainUuid"].as_str().map(str::to_owned),
        }
    }

    /// Every VM but templates (and vcsim's own inventory).
    pub async fn guests(&self) -> Result<Vec<Guest>> {
        match self {
            Self::Proxmox(sim) => Ok(sim
                .vms()
                .into_iter()
                .filter(|v| !v.template)
                .map(|vm| {
                    let seed = sim.seed(vm.vmid);
                    let meta: Value = seed
                        .as_ref()
                        .and_then(|s| s.meta_data.as_deref())
                        .and_then(|m| serde_yaml::from_str(m).ok())
                        .unwrap_or_default();
                    let owner_uid = proxmox_tag(&vm.config, "banlieue-uid-");
                    Guest {
                        id: vm.vmid.to_string(),
                        running: vm.running,
                        identity: vm.config.get("smbios1").cloned().unwrap_or_default(),
                        owner_uid,
                        user_data: seed.and_then(|s| s.user_data),
                        hostname: meta["local-hostname"].as_str().map(str::to_owned),
                        node_provider_id: meta["instance-id"].as_str().map(|i| format!("proxmox://{i}")),
                        has_address: true,
                    }
                })
                .collect()),
            Self::VSphere(v) => {
                let mut out = Vec::new();
                for (vm, info) in v.run_vms().await? {
                    let decode = |key: &str| {
                        info.extra_config
                            .get(key)
                            .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
                            .and_then(|bytes| String::from_utf8(bytes).ok())
                    };
                    let meta: Value = decode("guestinfo.metadata")
                        .and_then(|m| serde_yaml::from_str(&m).ok())
                        .unwrap_or_default();
                    out.push(Guest {
                        id: vm.value.clone(),
                        running: info.power_state == Some(VmPowerState::PoweredOn),
                        identity: info.bios_uuid.clone().unwrap_or_default(),
                        owner_uid: info.extra_config.get(VSPHERE_OWNER_KEY).cloned(),
                        user_data: decode("guestinfo.userdata"),
                        hostname: meta["local-hostname"].as_str().map(str::to_owned),
                        node_provider_id: info.bios_uuid.as_ref().map(|u| format!("vsphere://{u}")),
                        has_address: info.ip_address.is_some(),
                    });
                }
                Ok(out)
            }
            Self::Libvirt(lv) => {
                use banlieue_libvirt::hypervisor::Hypervisor as _;
                let hv = lv.connector.get(LIBVIRT_URI);
                let mut out = Vec::new();
                for domain in lv.conn.list_all_domains(0)? {
                    let name = domain.name()?;
                    if name == LIBVIRT_OWN_DOMAIN {
                        continue;
                    }
                    let uuid = domain.uuid_string()?;
                    let owner_uid = hv
                        .domain_by_uuid(&uuid)
                        .await?
                        .and_then(|d| d.owner)
                        .map(|o| o.uid);
                    let seed = hv
                        .uploaded(LIBVIRT_POOL, &format!("{name}-seed.iso"))
                        .and_then(|iso| banlieue_cloudinit::SeedFiles::from_iso(&iso).ok())
                        .unwrap_or_default();
                    let meta: Value = seed
                        .meta_data
                        .as_deref()
                        .and_then(|m| serde_yaml::from_str(m).ok())
                        .unwrap_or_default();
                    out.push(Guest {
                        id: uuid.clone(),
                        running: domain.is_active()?,
                        identity: uuid,
                        owner_uid,
                        user_data: seed.user_data.map(|d| String::from_utf8_lossy(&d).into_owned()),
                        hostname: meta["local-hostname"].as_str().map(str::to_owned),
                        node_provider_id: meta["instance-id"]
                            .as_str()
                            .map(|i| format!("libvirt://localhost/{i}")),
                        has_address: true,
                    });
                }
                Ok(out)
            }
        }
    }

    /// Plays what the guest's agent reports once booted where the hypervisor does not (vcsim
    /// has no VMware Tools: the guest IP is set through `SET.guest.ipAddress`, and the emulated
    /// guest publishes a cloud-init that finished). `n` numbers the address.
    pub async fn report_address(&self, guest: &Guest, n: u8) -> Result<()> {
        match self {
            Self::Proxmox(_) | Self::Libvirt(_) => Ok(()),
            Self::VSphere(v) => {
                let extra_config = vec![
                    ("SET.guest.ipAddress".to_owned(), format!("192.0.2.{n}")),
                    banlieue_vsphere::guest_report::published_done(),
                ];
                v.set_extra_config(&guest.id, extra_config).await
            }
        }
    }

    /// How many tasks that create, power or delete a VM ran so far, where the hypervisor keeps
    /// them (the simulator; vcsim's task history is not read).
    pub fn lifecycle_tasks(&self) -> Option<usize> {
        match self {
            Self::Proxmox(sim) => Some(
                sim.tasks()
                    .iter()
                    .filter(|t| PROXMOX_LIFECYCLE_TASKS.contains(&t.kind.as_str()))
                    .count(),
            ),
            Self::VSphere(_) | Self::Libvirt(_) => None,
        }
    }

    /// What a deleted cluster must not leave besides VMs (Proxmox: seed ISOs).
    pub async fn leftovers(&self) -> Result<Vec<String>> {
        match self {
            Self::Proxmox(sim) => {
                let pve = banlieue_pve_client::Client::builder(sim.url())
                    .token(sim.token_id(), sim.token_secret())
                    .tls(banlieue_pve_client::TlsVerification::Fingerprint(
                        sim.fingerprint_sha256(),
                    ))
                    .build()?;
                Ok(pve
                    .storage_content("pve1", "local", Some("iso"))
                    .await?
                    .into_iter()
                    .map(|c| format!("ISO {}", c.volid))
                    .collect())
            }
            Self::VSphere(_) => Ok(Vec::new()),
            Self::Libvirt(lv) => Ok(lv
                .conn
                .lookup_storage_pool_by_name(LIBVIRT_POOL)?
                .list_volumes()?
                .into_iter()
                .filter(|v| v != LIBVIRT_BASE_VOLUME)
                .map(|v| format!("volume {v}"))
                .collect()),
        }
    }

    /// The run's VMs (templates and vcsim's own inventory aside) as lab guests boot them
    /// (`capi/guests.rs`): what their hardware and firmware give the guest.
    pub async fn lab_vms(&self) -> Result<Vec<LabVm>> {
        match self {
            Self::Proxmox(sim) => Ok(sim
                .vms()
                .into_iter()
                .filter(|vm| !vm.template)
                .map(|vm| {
                    let uuid = vm.smbios_uuid().map(str::to_owned);
                    LabVm {
                        id: vm.vmid.to_string(),
                        running: vm.running,
                        nic: PROXMOX_NIC,
                        mac: vm.mac("net0"),
                        seed: sim.seed(vm.vmid).map(|s| s.image).filter(|i| !i.is_empty()),
                        guestinfo: std::collections::BTreeMap::new(),
                        smbios: uuid.map(|uuid| Smbios {
                            vendor: "QEMU".to_owned(),
                            product: "Standard PC (i440FX + PIIX, 1996)".to_owned(),
                            uuid,
                        }),
                        memory_mib: vm.config.get("memory").and_then(|m| m.parse().ok()),
                        guest_ips: Vec::new(),
                        kubernetes: proxmox_tag(&vm.config, PROXMOX_KUBERNETES_TAG),
                    }
                })
                .collect()),
            Self::VSphere(v) => {
                let mut out = Vec::new();
                for (vm, info) in v.run_vms().await? {
                    out.push(LabVm {
                        id: vm.value.clone(),
                        running: info.power_state == Some(VmPowerState::PoweredOn),
                        nic: VSPHERE_NIC,
                        // vCenter generates a new MAC for each clone's NIC; vcsim copies the
                        // template's, and guests sharing a MAC on one network cannot work. The
                        // lab gives each guest a MAC in VMware's generated range from the VM's
                        // BIOS uuid instead (nothing of the provider's reads it back: the
                        // default seed has DHCP on the first NIC).
                        mac: info
                            .bios_uuid
                            .as_deref()
                            .map(vmware_generated_mac)
                            .or_else(|| info.hardware.nics.first().and_then(|n| n.mac.clone())),
                        seed: None,
                        guestinfo: info
                            .extra_config
                            .iter()
                            .filter(|(key, _)| key.starts_with("guestinfo."))
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect(),
                        smbios: info.bios_uuid.clone().map(|uuid| Smbios {
                            vendor: "VMware, Inc.".to_owned(),
                            product: "VMware7,1".to_owned(),
                            uuid,
                        }),
                        memory_mib: info.memory_mb,
                        guest_ips: info.ip_address.iter().chain(&info.guest_ips).cloned().collect(),
                        kubernetes: None,
                    });
                }
                Ok(out)
            }
            Self::Libvirt(lv) => {
                use banlieue_libvirt::hypervisor::Hypervisor as _;
                let hv = lv.connector.get(LIBVIRT_URI);
                let mut out = Vec::new();
                for domain in lv.conn.list_all_domains(0)? {
                    if domain.name()? == LIBVIRT_OWN_DOMAIN {
                        continue;
                    }
                    let Some(info) = hv.domain_by_uuid(&domain.uuid_string()?).await? else {
                        continue;
                    };
                    out.push(LabVm {
                        running: info.state == banlieue_libvirt::hypervisor::RunState::Running,
                        nic: LIBVIRT_NIC,
                        mac: info.macs.first().cloned(),
                        // The test driver keeps no volume contents: the seed ISO as uploaded.
                        seed: hv.uploaded(LIBVIRT_POOL, &format!("{}-seed.iso", info.name)),
                        guestinfo: std::collections::BTreeMap::new(),
                        // The domain's `<sysinfo type='smbios'>`, as the provider writes it.
                        smbios: Some(Smbios {
                            vendor: "banlieue".to_owned(),
                            product: "libvirt".to_owned(),
                            uuid: info.uuid.clone(),
                        }),
                        memory_mib: info.sizing.map(|s| s.memory_mib),
                        guest_ips: Vec::new(),
                        kubernetes: None,
                        id: info.uuid,
                    });
                }
                Ok(out)
            }
        }
    }

    /// A machine template's `source` for VMs that boot Kubernetes `version` (the template of
    /// [`proxmox_template_for`]; a second template exists on Proxmox only).
    pub fn template_source_for(&self, version: &str) -> Result<Value> {
        match self {
            Self::Proxmox(sim) => {
                anyhow::ensure!(
                    sim.vm(PROXMOX_NEXT_TEMPLATE_VMID).is_some_and(|vm| {
                        proxmox_tag(&vm.config, PROXMOX_KUBERNETES_TAG).as_deref() == Some(version)
                    }),
                    "the simulator has no template {PROXMOX_NEXT_TEMPLATE_VMID} for Kubernetes {version}"
                );
                Ok(serde_json::json!({"vmid": PROXMOX_NEXT_TEMPLATE_VMID}))
            }
            Self::VSphere(_) | Self::Libvirt(_) => {
                anyhow::bail!("the upgrade runs on Proxmox only: only its simulator has a second template")
            }
        }
    }

    /// What a booted guest's agent reports (Proxmox: QEMU's guest agent, through
    /// `report_guest_interfaces`, and the cloud-init report its `file-read` serves; vSphere:
    /// VMware Tools' primary address, set in vcsim through `SET.guest.ipAddress`; libvirt: the
    /// DHCP leases its network would report, and the cloud-init report its guest agent reads).
    pub async fn report_guest(&self, id: &str, view: &AgentView) -> Result<()> {
        let nics = &view.nics;
        match self {
            Self::Proxmox(sim) => {
                let vmid: u32 = id.parse().context("a Proxmox VM id")?;
                let interfaces = nics
                    .iter()
                    .map(|nic| banlieue_pve_sim::GuestInterface {
                        name: nic.name.clone(),
                        mac: nic.mac.clone(),
                        addresses: nic.addresses.clone(),
                    })
                    .collect();
                sim.report_guest_interfaces(vmid, interfaces)
                    .map_err(|e| anyhow::anyhow!(e))?;
                if let Some(result) = &view.cloud_init {
                    sim.report_guest_file(vmid, "/run/cloud-init/result.json", result.clone())
                        .map_err(|e| anyhow::anyhow!(e))?;
                }
                Ok(())
            }
            // VMware Tools' primary address, and what the guest published in its guestinfo
            // (cloud-init's report, once the vendor data's script sent it).
            Self::VSphere(v) => {
                let mut extra_config: Vec<(String, String)> = nics
                    .iter()
                    .flat_map(|n| &n.addresses)
                    .find(|(ip, _)| ip.is_ipv4())
                    .map(|(ip, _)| ("SET.guest.ipAddress".to_owned(), ip.to_string()))
                    .into_iter()
                    .collect();
                if let Some(published) = &view.published {
                    extra_config.push((
                        banlieue_vsphere::guest_report::REPORT_KEY.to_owned(),
                        published.clone(),
                    ));
                }
                v.set_extra_config(id, extra_config).await
            }
            // What libvirt's network reports for a real domain: the DHCP leases of its NICs.
            Self::Libvirt(lv) => {
                use banlieue_libvirt::hypervisor::Hypervisor as _;
                let hv = lv.connector.get(LIBVIRT_URI);
                // A lease is the one address DHCP gave a NIC of the domain: its first IPv4
                // address (not a VIP added after it, not the CNI's bridges).
                let macs = hv.domain_by_uuid(id).await?.map(|d| d.macs).unwrap_or_default();
                let leases = nics
                    .iter()
                    .filter(|nic| macs.iter().any(|m| m.eq_ignore_ascii_case(&nic.mac)))
                    .filter_map(|nic| {
                        let (ip, _) = nic.addresses.iter().find(|(ip, _)| ip.is_ipv4())?;
                        Some(banlieue_libvirt::hypervisor::GuestAddress {
                            mac: nic.mac.to_ascii_lowercase(),
                            ip: ip.to_string(),
                        })
                    })
                    .collect();
                hv.report_leases(id, leases);
                // And what its guest agent reads from cloud-init's report.
                hv.report_cloud_init(id, view.cloud_init.clone());
                Ok(())
            }
        }
    }

    /// The last lines of the hypervisor's own log, where it has one.
    pub fn log_tail(&self) -> String {
        match self {
            Self::Proxmox(_) | Self::Libvirt(_) => String::new(),
            Self::VSphere(v) => v.sim.log_tail(20),
        }
    }
}
