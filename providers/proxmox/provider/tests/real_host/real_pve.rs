//! The Proxmox provider under the shared scenario suite on a **real Proxmox VE**, given by
//! environment variables (see [`RealHost::from_env`]): the ProxmoxCluster and ProxmoxMachine
//! controllers run in-process against it, and the test looks at the cluster through its API as
//! an admin would. What a scenario creates is tracked; what is still there when it ends (it
//! kept its machines, or failed half-way) is stopped and deleted; both lists are printed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use banlieue_proxmox::hypervisor::Hypervisor;
use banlieue_pve_client::{Client, TaskOutcome, TlsVerification};
use banlieue_scenarios::{Access, Controllers, MachineHint, ProviderUnderTest, Template, Vm};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

/// Where a Proxmox VM's owner is written: a tag `banlieue-uid-<uid>`.
const OWNER_TAG: &str = "banlieue-uid-";
/// Where cloud-init keeps the user data the guest booted with (read through the guest agent).
const USER_DATA_FILE: &str = "/var/lib/cloud/instance/user-data.txt";
const WRONG_SECRET: &str = "00000000-dead-beef-0000-000000000000";

/// A Proxmox VE cluster to run the scenarios on.
#[derive(Clone, Debug)]
pub struct RealHost {
    /// `https://host:8006`.
    pub endpoint: String,
    /// `user@realm!token`.
    pub token_id: String,
    /// The token's secret.
    pub token_secret: String,
    /// SHA-256 fingerprint of the API certificate (`None`: verified against the web PKI).
    pub fingerprint: Option<String>,
    /// The template the machines are cloned from (cloud-init and qemu-guest-agent inside, on
    /// storage every used node reaches).
    pub template_vmid: u32,
    /// The nodes used as failure domains (`None`: every online node).
    pub nodes: Option<Vec<String>>,
    /// Storage (content `iso`) for the seed ISOs.
    pub seed_storage: String,
}

impl RealHost {
    /// The cluster named by `BANLIEUE_PVE_ENDPOINT`, `BANLIEUE_PVE_TOKEN_ID`,
    /// `BANLIEUE_PVE_TOKEN_SECRET` and `BANLIEUE_PVE_TEMPLATE_VMID` (required), with
    /// `BANLIEUE_PVE_FINGERPRINT`, `BANLIEUE_PVE_NODES` (comma-separated) and
    /// `BANLIEUE_PVE_SEED_STORAGE` (default `local`); `None` when no endpoint is set.
    pub fn from_env() -> Result<Option<Self>> {
        let Ok(endpoint) = std::env::var("BANLIEUE_PVE_ENDPOINT") else {
            return Ok(None);
        };
        let var = |name: &str| std::env::var(name).with_context(|| format!("{name} is not set"));
        let opt = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Ok(Some(Self {
            endpoint,
            token_id: var("BANLIEUE_PVE_TOKEN_ID")?,
            token_secret: var("BANLIEUE_PVE_TOKEN_SECRET")?,
            fingerprint: opt("BANLIEUE_PVE_FINGERPRINT"),
            template_vmid: var("BANLIEUE_PVE_TEMPLATE_VMID")?
                .parse()
                .context("BANLIEUE_PVE_TEMPLATE_VMID is not a VMID")?,
            nodes: opt("BANLIEUE_PVE_NODES").map(|n| n.split(',').map(|s| s.trim().to_owned()).collect()),
            seed_storage: opt("BANLIEUE_PVE_SEED_STORAGE").unwrap_or_else(|| "local".to_owned()),
        }))
    }

    fn client(&self) -> Result<Client> {
        let tls = match &self.fingerprint {
            Some(f) => TlsVerification::Fingerprint(f.clone()),
            None => TlsVerification::WebPki,
        };
        Ok(Client::builder(&self.endpoint)
            .token(self.token_id.as_str(), self.token_secret.as_str())
            .tls(tls)
            .timeout(Duration::from_secs(30))
            .build()?)
    }
}

/// A VM a scenario made: `(name, node)` by VMID.
type Seen = Arc<Mutex<BTreeMap<u32, (String, String)>>>;

/// The provider on a real Proxmox VE (one value per scenario).
pub struct RealPve {
    kube: kube::Client,
    ns: String,
    host: RealHost,
    client: Client,
    nodes: Vec<String>,
    controllers: Controllers,
    seen: Seen,
}

impl RealPve {
    /// Connects to `host` and finds its nodes.
    pub async fn with_host(kube: kube::Client, ns: &str, host: RealHost) -> Result<Self> {
        let client = host.client()?;
        let nodes = match &host.nodes {
            Some(nodes) => nodes.clone(),
            None => {
                let mut nodes: Vec<String> = client
                    .nodes()
                    .await
                    .context("listing the Proxmox VE nodes")?
                    .into_iter()
                    .filter(|n| n.status == "online")
                    .map(|n| n.node)
                    .collect();
                nodes.sort();
                nodes
            }
        };
        anyhow::ensure!(!nodes.is_empty(), "no online Proxmox VE node");
        Ok(Self {
            kube,
            ns: ns.to_owned(),
            host,
            client,
            nodes,
            controllers: Controllers::default(),
            seen: Seen::default(),
        })
    }
}

impl ProviderUnderTest for RealPve {
    const NAME: &'static str = "pve";
    const CLUSTER_KIND: &'static str = "ProxmoxCluster";
    const MACHINE_KIND: &'static str = "ProxmoxMachine";
    const PROVIDER_ID_PREFIX: &'static str = "proxmox://";
    const BAD_TEMPLATE_REASON: &'static str = "TemplateNotFound";
    const MISSING_TEMPLATE: &'static str = "banlieue-no-such-template";
    const BAD_ACCESS_REASONS: &'static [&'static str] = &["AuthenticationFailed"];
    const OUTAGE_MESSAGE: &'static str = "transport error";
    // A real cluster takes its time: tasks and the guest agent are polled (no write while they run).
    const PROVISIONING_WRITES: usize = 100;
    const NETWORK: &'static str = "vmbr0";

    async fn setup(kube: kube::Client, ns: &str) -> Result<Self> {
        let host = RealHost::from_env()?.context("BANLIEUE_PVE_ENDPOINT is not set")?;
        Self::with_host(kube, ns, host).await
    }

    fn failure_domains(&self) -> Vec<String> {
        self.nodes.clone()
    }

    async fn cluster_spec(&self, access: Access) -> Result<Value> {
        let secret = match access {
            Access::Valid => self.host.token_secret.clone(),
            Access::Bad => WRONG_SECRET.to_owned(),
        };
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "pve-credentials"},
            "stringData": {"tokenID": self.host.token_id, "secret": secret},
        }))?;
        Api::<Secret>::namespaced(self.kube.clone(), &self.ns)
            .create(&PostParams::default(), &secret)
            .await?;
        let mut spec = json!({
            "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
            "endpoint": self.host.endpoint,
            "credentialsRef": {"name": "pve-credentials"},
            "allowedNodes": self.nodes,
        });
        if let Some(f) = &self.host.fingerprint {
            spec["tls"] = json!({"sha256Fingerprint": f});
        }
        Ok(spec)
    }

    fn machine_spec(&self, template: Template) -> Value {
        let source = match template {
            Template::Valid => json!({"vmid": self.host.template_vmid}),
            Template::Missing => json!({"name": Self::MISSING_TEMPLATE}),
        };
        json!({"source": source, "cpu": {"cores": 1}, "memoryMiB": 1024})
    }

    fn start(&mut self) {
        let provider = banlieue_proxmox::provider("banlieue-proxmox-real-host", &self.host.seed_storage);
        let spawned = provider.spawn(self.kube.clone(), &self.ns, (4, 2));
        self.controllers.extend(spawned.tasks);
    }

    async fn stop(&mut self) {
        self.controllers.stop().await;
    }

    async fn vms(&self, machines: &[MachineHint]) -> Result<Vec<Vm>> {
        let mut out = Vec::new();
        for guest in Hypervisor::guests(&self.client)
            .await?
            .into_iter()
            .filter(|g| !g.template)
        {
            // The owner tag is in the listing; anything without one of this scenario's machines
            // is someone else's and never looked at.
            let Some(owner) = guest
                .tags
                .iter()
                .find_map(|t| t.strip_prefix(OWNER_TAG))
                .filter(|uid| machines.iter().any(|m| m.uid == *uid))
                .map(str::to_owned)
            else {
                continue;
            };
            self.seen.lock().unwrap_or_else(|e| e.into_inner()).insert(
                guest.vmid,
                (guest.name.clone().unwrap_or_default(), guest.node.clone()),
            );
            let user_data = if guest.running {
                self.client
                    .agent_file_read(&guest.node, guest.vmid, USER_DATA_FILE)
                    .await
                    .ok()
                    .map(String::into_bytes)
            } else {
                None
            };
            out.push(Vm {
                id: guest.vmid.to_string(),
                owner_uid: Some(owner),
                failure_domain: Some(guest.node.clone()),
                user_data,
                network_config: None,
            });
        }
        Ok(out)
    }

    async fn slow_down(&self) -> Result<()> {
        // A real Proxmox VE is slow enough: clones and starts take seconds.
        Ok(())
    }

    async fn outage(&self, _down: bool) -> Result<()> {
        bail!("an outage cannot be staged on a real Proxmox VE")
    }

    fn secrets(&self) -> Vec<String> {
        vec![self.host.token_secret.clone(), WRONG_SECRET.to_owned()]
    }
}

impl Drop for RealPve {
    /// Prints what the scenario created; stops and deletes what is still there.
    fn drop(&mut self) {
        // The controllers first, so none acts on what is removed below.
        drop(std::mem::take(&mut self.controllers));
        let seen = std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()));
        let client = self.client.clone();
        let ns = self.ns.clone();
        let report = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(clean_up(&client, &ns, seen))
        })
        .join();
        match report {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("[{}] cleaning up failed: {e:#}", self.ns),
            Err(_) => eprintln!("[{}] cleaning up panicked", self.ns),
        }
    }
}

/// Reports the VMs a scenario made and deletes those still there.
async fn clean_up(client: &Client, ns: &str, seen: BTreeMap<u32, (String, String)>) -> Result<()> {
    let left: BTreeMap<u32, String> = Hypervisor::guests(client)
        .await?
        .into_iter()
        .filter(|g| seen.contains_key(&g.vmid) && !g.template)
        .map(|g| (g.vmid, g.node))
        .collect();
    for (vmid, (name, node)) in &seen {
        let fate = if left.contains_key(vmid) {
            "still there at the end"
        } else {
            "deleted by the scenario"
        };
        eprintln!("[{ns}] created VM {vmid} ({name}) on {node}: {fate}");
    }
    for (vmid, node) in left {
        if Hypervisor::vm_running(client, &node, vmid).await? == Some(true) {
            wait(client, &Hypervisor::stop_vm(client, &node, vmid).await?).await?;
        }
        wait(client, &Hypervisor::delete_vm(client, &node, vmid).await?).await?;
        eprintln!("[{ns}] removed VM {vmid} on {node}");
    }
    Ok(())
}

/// Waits (at most 5 min) for a task to end.
async fn wait(client: &Client, upid: &banlieue_pve_client::Upid) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        match Hypervisor::task(client, upid).await? {
            TaskOutcome::Running if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            TaskOutcome::Running => bail!("task {upid} still running after 5 min"),
            TaskOutcome::Failed(text) => bail!("task {upid} failed: {text}"),
            _ => return Ok(()),
        }
    }
}
