//! What a provider supplies to the shared scenarios.

use anyhow::Result;
use serde_json::Value;

/// A VM as the hypervisor reports it (not as the provider's status claims it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vm {
    /// The hypervisor's id for it (VMID, domain uuid, managed object id).
    pub id: String,
    /// The UID of the infra machine it belongs to, from the owner mark the provider writes on
    /// the VM (Proxmox tag, libvirt domain metadata, vSphere extraConfig).
    pub owner_uid: Option<String>,
    /// The failure domain it runs in, when the hypervisor tells.
    pub failure_domain: Option<String>,
    /// The bootstrap data the guest would see (seed ISO user-data, `guestinfo.userdata`).
    pub user_data: Option<Vec<u8>>,
    /// The cloud-init `network-config` the guest would see (seed ISO `network-config`, the
    /// meta-data's `network`), YAML.
    pub network_config: Option<String>,
}

/// A machine the scenario created, so providers that cannot list every VM (libvirt looks
/// domains up by name and uuid) know what to look for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineHint {
    /// Infra machine name.
    pub name: String,
    /// Infra machine UID.
    pub uid: String,
}

/// Which access the infra cluster is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Working credentials and endpoint.
    Valid,
    /// Credentials the hypervisor rejects (or, for a provider without credentials, an endpoint
    /// it cannot connect to).
    Bad,
}

/// Which template (base image) a machine is cloned from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Template {
    /// One that exists.
    Valid,
    /// One that does not exist; its name is [`ProviderUnderTest::MISSING_TEMPLATE`].
    Missing,
}

/// A provider under test: its hypervisor double, its controllers and its object shapes.
///
/// One value per scenario: [`ProviderUnderTest::setup`] starts a private hypervisor double
/// (or reuses a shared one, scoped by namespace) for the scenario's namespace.
#[allow(async_fn_in_trait)] // test code on one runtime; no Send bound needed by callers
pub trait ProviderUnderTest: Sized + 'static {
    /// Short name, the prefix of the scenario namespaces (`pxm`, `lv`, `vs`).
    const NAME: &'static str;
    /// Infra cluster kind (group `infrastructure.banlieue.io`).
    const CLUSTER_KIND: &'static str;
    /// Infra machine kind.
    const MACHINE_KIND: &'static str;
    /// What every `spec.providerID` of this provider starts with (`proxmox://`).
    const PROVIDER_ID_PREFIX: &'static str;
    /// The `Ready=False` reason of a machine whose template does not exist.
    const BAD_TEMPLATE_REASON: &'static str;
    /// The name of the missing template (expected in the condition message).
    const MISSING_TEMPLATE: &'static str;
    /// Reasons any condition of the infra cluster may carry for [`Access::Bad`].
    const BAD_ACCESS_REASONS: &'static [&'static str];

    /// A part of a machine's `Ready=False` message while the hypervisor is unreachable (the
    /// connection error the provider surfaces).
    const OUTAGE_MESSAGE: &'static str;
    /// At most this many writes of an infra machine by the provider from its creation to
    /// provisioned on an instant hypervisor double (finalizer, `spec.providerID`, status
    /// writes): scenario `few_writes`.
    const PROVISIONING_WRITES: usize;

    /// Starts the hypervisor double for a scenario in namespace `ns` (controllers not yet).
    async fn setup(kube: kube::Client, ns: &str) -> Result<Self>;

    /// The failure domains the infra cluster of [`ProviderUnderTest::cluster_spec`] publishes
    /// (at least one); scenarios spread machines over them in this order.
    fn failure_domains(&self) -> Vec<String>;

    /// Creates what the infra cluster needs in the namespace (credentials Secret) and returns
    /// its `spec`.
    async fn cluster_spec(&self, access: Access) -> Result<Value>;

    /// The infra machine `spec` (without providerID).
    fn machine_spec(&self, template: Template) -> Value;

    /// What an interface of `spec.networks` attaches to (bridge, network, port group).
    const NETWORK: &'static str;

    /// Starts the provider's cluster and machine controllers for the namespace.
    fn start(&mut self);

    /// Stops them (a crash: nothing is cleaned up, in-flight work is lost).
    async fn stop(&mut self);

    /// Every VM of this scenario on the hypervisor. `machines` lists what the scenario created
    /// (for providers that look VMs up rather than list them).
    async fn vms(&self, machines: &[MachineHint]) -> Result<Vec<Vm>>;

    /// Plays the guests: makes started VMs report what a booted guest would (vcsim: an IP
    /// through VMware Tools). Called while scenarios wait; a no-op where the double does it.
    async fn boot_guests(&self, _machines: &[MachineHint]) -> Result<()> {
        Ok(())
    }

    /// Makes every hypervisor call or task take long enough (tens of ms) that a controller can
    /// be killed between any two steps of provisioning.
    async fn slow_down(&self) -> Result<()>;

    /// Cuts the provider's connections to the hypervisor (`down`) or restores them; the
    /// hypervisor's state survives.
    async fn outage(&self, down: bool) -> Result<()>;

    /// Values that must never appear in a condition message or Event (passwords, tokens).
    fn secrets(&self) -> Vec<String>;

    /// A field the provider refuses (`banlieue_api::support`): the top-level spec field to
    /// merge into a valid machine spec, and the refused field's path as the condition names it
    /// (`spec.networks[0].vlan`). `None` where the backend refuses no machine field (scenario
    /// `unsupported_field` is not run for it).
    fn unsupported_field(&self) -> Option<(Value, &'static str)> {
        None
    }

    /// A field that acts only when the VM is created (`banlieue_api::support`, *at creation*)
    /// and a new value for it: the top-level spec field to merge into the provisioned machine's
    /// spec, and the field's path as the condition names it (`spec.pool`). Scenario
    /// `creation_only_change`. By default one per machine kind (Proxmox `pool`, libvirt
    /// `firmware`, vSphere `folder`).
    fn creation_only_change(&self) -> (Value, &'static str) {
        match Self::MACHINE_KIND {
            "ProxmoxMachine" => (serde_json::json!({"pool": "elsewhere"}), "spec.pool"),
            "VSphereMachine" => (serde_json::json!({"folder": "elsewhere"}), "spec.folder"),
            _ => (serde_json::json!({"firmware": "UEFI"}), "spec.firmware"),
        }
    }
}

/// In-process controller tasks, aborted on drop.
#[derive(Default)]
pub struct Controllers(Vec<tokio::task::JoinHandle<()>>);

impl Controllers {
    /// Adds a running controller.
    pub fn push(&mut self, task: tokio::task::JoinHandle<()>) {
        self.0.push(task);
    }

    /// Aborts every controller and waits until each has stopped.
    pub async fn stop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
        for t in self.0.drain(..) {
            let _ = t.await;
        }
    }
}

impl Extend<tokio::task::JoinHandle<()>> for Controllers {
    fn extend<I: IntoIterator<Item = tokio::task::JoinHandle<()>>>(&mut self, tasks: I) {
        self.0.extend(tasks);
    }
}

impl Drop for Controllers {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}
