//! The hypervisor a conformance run drives, as its admin sees it: the Proxmox VE simulator
//! (in process) or govmomi's vcsim (a process). What the run needs from each: the clusterctl
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
use banlieue_vsphere_client::{Client, ClientBuilder, MoRef, TlsVerification, VmPowerState};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::vcsim_support::{PASSWORD, USER, Vcsim};

/// The Proxmox template VM the cluster template clones.
pub const PROXMOX_TEMPLATE_VMID: u32 = 9000;
/// vcsim's model VM, made the template.
const VSPHERE_TEMPLATE: &str = "DC0_C0_RP0_VM0";
/// Extra config key the vSphere provider marks its VMs with (owner UID).
const VSPHERE_OWNER_KEY: &str = "guestinfo.banlieue.owner-uid";
/// Tasks that create, power or delete a Proxmox VM.
const PROXMOX_LIFECYCLE_TASKS: [&str; 5] = ["qmclone", "qmstart", "qmstop", "qmshutdown", "qmdestroy"];

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

/// The hypervisor of a run.
pub enum Hypervisor {
    /// pve-sim, one node `pve1` holding template 9000.
    Proxmox(Arc<SimHandle>),
    /// vcsim's default inventory (datacenter `DC0`), its model VM made the template.
    VSphere(Box<VSphere>),
}

impl Hypervisor {
    /// vcsim, with its model VM powered off and marked as the template.
    pub async fn vcsim() -> Result<Self> {
        let sim = Vcsim::start(&[])?;
        let vc = ClientBuilder::new(&sim.url, USER, PASSWORD)
            .tls(TlsVerification::CaBundle(sim.ca_pem.clone()))
            .build()?;
        let model = vc
            .find_by_inventory_path(&format!("/DC0/vm/{VSPHERE_TEMPLATE}"))
            .await?
            .context("no model VM in vcsim")?;
        vc.wait_task(
            &vc.power_off(&model).await?,
            Duration::from_millis(100),
            Duration::from_secs(30),
        )
        .await?;
        vc.mark_as_template(&model).await?;
        let inventory = vc
            .all_vms(&["name"])
            .await?
            .into_iter()
            .map(|(vm, _)| vm.value)
            .collect();
        Ok(Self::VSphere(Box::new(VSphere { sim, vc, inventory })))
    }

    /// The banlieue provider driving it.
    pub fn infra(&self) -> Infra {
        match self {
            Self::Proxmox(_) => Infra::Proxmox,
            Self::VSphere(_) => Infra::Vsphere,
        }
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
        }
    }

    /// Whether the infra cluster of the default cluster template publishes failure domains
    /// (Proxmox: its nodes; the vSphere template names none).
    pub fn publishes_failure_domains(&self) -> bool {
        matches!(self, Self::Proxmox(_))
    }

    /// The variables of `clusterctl init` (the default credentials Secret of the components).
    pub fn init_variables(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::Proxmox(sim) => vec![
                ("PROXMOX_TOKEN", sim.token_id()),
                ("PROXMOX_SECRET", sim.token_secret()),
            ],
            Self::VSphere(_) => vec![
                ("VSPHERE_USERNAME", USER.to_owned()),
                ("VSPHERE_PASSWORD", PASSWORD.to_owned()),
            ],
        }
    }

    /// The credentials Secret a user creates in the cluster's namespace: name and `stringData`.
    pub fn credentials(&self) -> (&'static str, Value) {
        match self {
            Self::Proxmox(sim) => (
                "pve-sim",
                json!({"tokenID": sim.token_id(), "secret": sim.token_secret()}),
            ),
            Self::VSphere(_) => ("vc-sim", json!({"username": USER, "password": PASSWORD})),
        }
    }

    /// The variables of `clusterctl generate cluster` (besides the control-plane endpoint):
    /// the hypervisor with its certificate pinned, the template, the Secret of
    /// [`Hypervisor::credentials`] in namespace `ns`.
    pub fn template_variables(&self, ns: &str) -> Vec<(&'static str, String)> {
        let (secret, _) = self.credentials();
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
        }
    }

    /// Registers the hypervisor as the cluster-scoped banlieue Provider `name` (its credentials
    /// Secret in `ns`); returns what a VirtualMachine's `spec` needs besides (`source` cloning the
    /// template, networks).
    pub async fn register_provider(&self, client: &kube::Client, name: &str, ns: &str) -> Result<Value> {
        match self {
            Self::Proxmox(sim) => {
                banlieue_dev::register_simulator_as(client, sim, name).await?;
                Ok(json!({
                    "source": {"proxmox": {"vmid": PROXMOX_TEMPLATE_VMID}},
                    "networks": [{"name": "net0", "network": "vmbr0"}],
                }))
            }
            Self::VSphere(v) => {
                let (secret, _) = self.credentials();
                let provider: banlieue_api::banlieue::Provider = serde_json::from_value(json!({
                    "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
                    "metadata": {"name": name},
                    "spec": {
                        "backend": "vsphere",
                        "endpoint": v.sim.url,
                        "credentialsRef": {"name": secret, "namespace": ns},
                        "tls": {"sha256Fingerprint": v.sim.thumbprint},
                        "defaults": {"datacenter": "DC0", "storage": "LocalDS_0", "resourcePool": "DC0_C0/Resources"},
                    }
                }))?;
                kube::Api::<banlieue_api::banlieue::Provider>::all(client.clone())
                    .create(&Default::default(), &provider)
                    .await
                    .context("creating the vSphere Provider")?;
                Ok(json!({"source": {"vsphere": {"template": VSPHERE_TEMPLATE}}}))
            }
        }
    }

    /// The hypervisor id an infra machine's status names (`status.vmid`, `status.vmRef`).
    pub fn vm_id(&self, infra_machine: &Value) -> Option<String> {
        match self {
            Self::Proxmox(_) => infra_machine["status"]["vmid"].as_u64().map(|v| v.to_string()),
            Self::VSphere(_) => infra_machine["status"]["vmRef"].as_str().map(str::to_owned),
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
                    let owner_uid = vm.config.get("tags").and_then(|tags| {
                        tags.split([';', ',', ' '])
                            .find_map(|t| t.strip_prefix("banlieue-uid-"))
                            .map(str::to_owned)
                    });
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
                for (vm, _) in v.vc.all_vms(&["name"]).await? {
                    if v.inventory.contains(&vm.value) {
                        continue;
                    }
                    let Some(info) = v.vc.vm_info(&vm).await? else {
                        continue;
                    };
                    if info.template {
                        continue;
                    }
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
        }
    }

    /// Plays what the guest's agent reports once booted where the hypervisor does not (vcsim
    /// has no VMware Tools: the guest IP is set through `SET.guest.ipAddress`). `n` numbers the
    /// address.
    pub async fn report_address(&self, guest: &Guest, n: u8) -> Result<()> {
        match self {
            Self::Proxmox(_) => Ok(()),
            Self::VSphere(v) => {
                let ip = ConfigSpec {
                    extra_config: vec![("SET.guest.ipAddress".into(), format!("192.0.2.{n}"))],
                    ..ConfigSpec::default()
                };
                let vm = MoRef::new("VirtualMachine", guest.id.clone());
                let task = v.vc.reconfigure(&vm, &ip).await?;
                v.vc.wait_task(&task, Duration::from_millis(50), Duration::from_secs(30))
                    .await?;
                Ok(())
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
            Self::VSphere(_) => None,
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
        }
    }

    /// The last lines of the hypervisor's own log, where it has one.
    pub fn log_tail(&self) -> String {
        match self {
            Self::Proxmox(_) => String::new(),
            Self::VSphere(v) => v.sim.log_tail(20),
        }
    }
}
