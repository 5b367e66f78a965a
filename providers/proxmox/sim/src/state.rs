//! The simulated cluster: nodes, storages, pools, VMs, tasks, and the endpoint handlers.
//!
//! Time advances lazily: every request (and every inspection through the handle) first calls
//! [`State::advance`], which finishes the tasks whose end time has passed, in order.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::config::{SimConfig, StorageSpec};
use crate::iso;
use crate::schema::{ApiSchema, ParamErrors, split_list};

/// An error answer: HTTP status, PVE message, optional per-parameter errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status code.
    pub status: u16,
    /// The message (without the trailing newline PVE adds).
    pub message: String,
    /// The `errors` map of a 400.
    pub errors: Option<ParamErrors>,
}

impl ApiError {
    /// A plain error with a status.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            errors: None,
        }
    }
    /// A 500 (what PVE answers for a `die` in a handler).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, message)
    }
    /// `400 Parameter verification failed.` with errors.
    pub fn params(errors: ParamErrors) -> Self {
        Self {
            status: 400,
            message: "Parameter verification failed.".into(),
            errors: Some(errors),
        }
    }
    /// `400 Parameter verification failed.` with one error.
    pub fn param(key: &str, message: impl Into<String>) -> Self {
        Self::params(BTreeMap::from([(key.to_owned(), message.into())]))
    }
}

type ApiResult<T = Value> = Result<T, ApiError>;

/// The decoded NoCloud seed a VM has (or booted with).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SeedData {
    /// Volume id of the ISO it came from (`local:iso/seed-101.iso`).
    pub volid: String,
    /// ISO volume label (`cidata`).
    pub volume_label: String,
    /// `user-data` file.
    pub user_data: Option<String>,
    /// `meta-data` file.
    pub meta_data: Option<String>,
    /// `network-config` file.
    pub network_config: Option<String>,
    /// The ISO image as uploaded, byte for byte (what a guest's drive holds).
    #[serde(skip)]
    pub image: Vec<u8>,
}

/// One network interface of a real guest, as its guest agent reports it
/// ([`crate::SimConfig::external_guests`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestInterface {
    /// The guest's name for it (`ens18`).
    pub name: String,
    /// Its MAC address.
    pub mac: String,
    /// Its addresses with their prefix lengths.
    pub addresses: Vec<(std::net::IpAddr, u8)>,
}

/// A VM as tests see it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VmInfo {
    /// VMID.
    pub vmid: u32,
    /// Node.
    pub node: String,
    /// Name (from config).
    pub name: Option<String>,
    /// Config as stored (strings).
    pub config: BTreeMap<String, String>,
    /// Power state.
    pub running: bool,
    /// `template: 1`.
    pub template: bool,
    /// Current lock (`clone`, ...).
    pub lock: Option<String>,
    /// Pool membership.
    pub pool: Option<String>,
    /// Address the guest agent reports (once assigned at start).
    pub ip: Option<Ipv4Addr>,
    /// Changes PVE keeps pending until the VM starts again (`None`: a deletion); `config`
    /// holds the values in effect.
    pub pending: BTreeMap<String, Option<String>>,
}

impl VmInfo {
    /// The MAC of NIC `net` (`net0`, …) as its configuration holds it (`virtio=BC:24:11:…` or
    /// `macaddr=`), lowercase as a guest reports it.
    pub fn mac(&self, net: &str) -> Option<String> {
        self.config
            .get(net)
            .and_then(|v| net_mac(v))
            .map(|m| m.to_lowercase())
    }

    /// The VM's SMBIOS uuid (`smbios1`'s `uuid=`), what its firmware reports as
    /// `product_uuid`.
    pub fn smbios_uuid(&self) -> Option<&str> {
        self.config
            .get("smbios1")?
            .split(',')
            .find_map(|p| p.strip_prefix("uuid="))
    }
}

/// A task as tests see it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TaskInfo {
    /// The UPID.
    pub upid: String,
    /// Node.
    pub node: String,
    /// Task type (`qmclone`, ...).
    pub kind: String,
    /// Task id (usually the vmid).
    pub id: String,
    /// `None` while running, else the exit status (`OK` or the error).
    pub exitstatus: Option<String>,
}

#[derive(Debug, Clone)]
struct Volume {
    size: u64,
    content: String,
    format: String,
    ctime: u64,
    seed: Option<iso::IsoImage>,
}

#[derive(Debug, Clone)]
struct Vm {
    node: String,
    config: BTreeMap<String, String>,
    running: bool,
    started_at: Option<Instant>,
    created_at: Instant,
    pool: Option<String>,
    ip: Option<Ipv4Addr>,
    boot_seed: Option<SeedData>,
    /// What a real guest's agent reported ([`crate::SimConfig::external_guests`]); cleared when
    /// the VM stops or reboots.
    guest_interfaces: Option<Vec<GuestInterface>>,
    /// Files a real guest's agent would read ([`crate::SimConfig::external_guests`], e.g.
    /// cloud-init's report); cleared when the VM starts, stops or reboots.
    guest_files: BTreeMap<String, String>,
    /// Changes written while the VM ran that PVE applies at its next start (`None`: a deletion).
    pending: BTreeMap<String, Option<String>>,
}

#[derive(Debug)]
enum Action {
    CloneDone {
        newid: u32,
        config: BTreeMap<String, String>,
    },
    Start {
        vmid: u32,
    },
    Stop {
        vmid: u32,
    },
    Shutdown {
        vmid: u32,
    },
    Reboot {
        vmid: u32,
    },
    Destroy {
        vmid: u32,
    },
    Migrate {
        vmid: u32,
        target: String,
    },
    Config {
        vmid: u32,
        updates: Vec<(String, Option<String>)>,
    },
    StoreVolume {
        node: String,
        storage: String,
        name: String,
        volume: Volume,
    },
    DeleteVolume {
        node: String,
        storage: String,
        name: String,
    },
}

#[derive(Debug)]
struct Task {
    upid: String,
    node: String,
    kind: String,
    id: String,
    user: String,
    pid: u32,
    pstart: u32,
    starttime: u64,
    end: Instant,
    forced_failure: Option<String>,
    action: Option<Action>,
    log: Vec<String>,
    exitstatus: Option<String>,
}

/// A parsed request, as handlers see it.
#[derive(Debug)]
pub(crate) struct Request {
    pub template: String,
    pub path: String,
    pub method: String,
    pub params: BTreeMap<String, Value>,
    pub user: String,
    pub task_failure: Option<String>,
    pub upload: Option<Vec<u8>>,
}

impl Request {
    fn opt(&self, key: &str) -> Option<String> {
        self.params.get(key).map(value_text)
    }
    fn req(&self, key: &str) -> ApiResult<String> {
        self.opt(key)
            .ok_or_else(|| ApiError::param(key, crate::schema::MISSING))
    }
    fn vmid(&self, key: &str) -> ApiResult<u32> {
        self.req(key)?
            .parse()
            .map_err(|_| ApiError::param(key, "value does not look like a valid VM ID"))
    }
    fn flag(&self, key: &str) -> Option<bool> {
        self.params.get(key).and_then(crate::schema::as_bool)
    }
}

/// Renders a parameter value as PVE stores it: booleans as 0/1, numbers as decimal text.
pub(crate) fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => u8::from(*b).to_string(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Every simulated node's memory (bytes).
/// cloud-init's report of a finished boot, read through `agent/file-read`.
const CLOUD_INIT_RESULT: &str = "/run/cloud-init/result.json";
/// The report of a simulated guest, whose cloud-init always finishes without errors.
const CLOUD_INIT_DONE: &str = r#"{"v1": {"datasource": "DataSourceNoCloud [seed=/dev/sr0]", "errors": []}}"#;

const NODE_MEMORY: u64 = 64 << 30;
/// CPUs of each simulated node.
const NODE_CPUS: u64 = 16;
/// Memory a simulated node uses for itself, before any VM.
const HOST_MEMORY_USED: u64 = 8 << 30;

const DISK_PREFIXES: [&str; 6] = ["scsi", "virtio", "sata", "ide", "efidisk", "tpmstate"];

fn is_disk_key(key: &str) -> bool {
    DISK_PREFIXES.iter().any(|p| {
        key.strip_prefix(p)
            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
    })
}

fn is_net_key(key: &str) -> bool {
    key.strip_prefix("net")
        .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
}

fn is_cdrom(value: &str) -> bool {
    value.split(',').any(|p| p == "media=cdrom")
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Parses `32G`, `+10G`, `512M`, `1024` (bytes) → (relative, bytes).
fn parse_size(text: &str) -> Option<(bool, u64)> {
    let (plus, rest) = match text.strip_prefix('+') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (num, mult) = match rest.char_indices().last()? {
        (i, 'K' | 'k') => (&rest[..i], 1u64 << 10),
        (i, 'M' | 'm') => (&rest[..i], 1 << 20),
        (i, 'G' | 'g') => (&rest[..i], 1 << 30),
        (i, 'T' | 't') => (&rest[..i], 1 << 40),
        _ => (rest, 1),
    };
    let n: f64 = num.parse().ok()?;
    (n >= 0.0).then_some((plus, (n * mult as f64) as u64))
}

/// Formats a byte size the way PVE writes `size=` (largest exact unit).
fn format_size(bytes: u64) -> String {
    for (unit, mult) in [("T", 1u64 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)] {
        if bytes >= mult && bytes.is_multiple_of(mult) {
            return format!("{}{unit}", bytes / mult);
        }
    }
    bytes.to_string()
}

fn disk_size(value: &str) -> u64 {
    value
        .split(',')
        .find_map(|p| p.strip_prefix("size="))
        .and_then(parse_size)
        .map(|(_, b)| b)
        .unwrap_or(0)
}

fn with_size(value: &str, bytes: u64) -> String {
    let mut parts: Vec<String> = value
        .split(',')
        .filter(|p| !p.starts_with("size="))
        .map(str::to_owned)
        .collect();
    parts.push(format!("size={}", format_size(bytes)));
    parts.join(",")
}

/// Normalises a tag list: split on `,; `, lower-case, sort, de-duplicate, join with `;`.
pub fn normalize_tags(text: &str) -> String {
    let set: BTreeSet<String> = split_list(text).map(str::to_lowercase).collect();
    set.into_iter().collect::<Vec<_>>().join(";")
}

mod authorize;
mod ha;
mod images;

pub(crate) use images::Fetch;

/// Request parameters of `…/config` that are not VM options.
const NOT_OPTIONS: [&str; 8] = [
    "node",
    "vmid",
    "digest",
    "delete",
    "background_delay",
    "skiplock",
    "force",
    "revert",
];

/// The simulated cluster.
pub(crate) struct State {
    cfg: Arc<SimConfig>,
    schema: Arc<ApiSchema>,
    vms: BTreeMap<u32, Vm>,
    volumes: BTreeMap<(String, String), BTreeMap<String, Volume>>,
    pools: BTreeMap<String, String>,
    tasks: BTreeMap<String, Task>,
    pending: Vec<String>,
    finished: VecDeque<String>,
    /// Downloads (`download-url`) the server has yet to fetch.
    fetches: Vec<Fetch>,
    rng: ChaCha8Rng,
    macs: HashSet<String>,
    next_pid: u32,
    next_ip: u32,
    boot: Instant,
    fingerprint: String,
    /// VMIDs the token lacks VM.Audit on (see [`State::hide`]).
    hidden: HashSet<u32>,
    /// Since when pvestatd reports (see [`State::restart_pvestatd`]).
    stats_since: Instant,
    /// The token's privileges (`None`: root's, everything).
    acl: Option<crate::acl::Acl>,
    /// HA resources and rules.
    ha: ha::Ha,
}

impl State {
    pub(crate) fn new(cfg: Arc<SimConfig>, schema: Arc<ApiSchema>, fingerprint: String) -> Self {
        let now = Instant::now();
        let mut state = Self {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5157_a7e5),
            schema,
            vms: BTreeMap::new(),
            volumes: BTreeMap::new(),
            pools: cfg.pools.iter().map(|p| (p.clone(), String::new())).collect(),
            tasks: BTreeMap::new(),
            pending: Vec::new(),
            fetches: Vec::new(),
            finished: VecDeque::new(),
            macs: HashSet::new(),
            next_pid: 0x1000 + (cfg.seed % 0x1000) as u32,
            next_ip: u32::from(cfg.address_pool_start),
            boot: now,
            fingerprint,
            hidden: HashSet::new(),
            acl: None,
            ha: ha::Ha::default(),
            stats_since: now.checked_sub(cfg.resources_lag).unwrap_or(now),
            cfg,
        };
        for node in state.cfg.nodes.clone() {
            for s in state.cfg.storages.clone() {
                state
                    .volumes
                    .insert((node.clone(), s.id.clone()), BTreeMap::new());
            }
        }
        for t in state.cfg.templates.clone() {
            for (k, v) in &t.config {
                if is_net_key(k)
                    && let Some(mac) = net_mac(v)
                {
                    state.macs.insert(mac);
                }
            }
            state.vms.insert(
                t.vmid,
                Vm {
                    node: t.node.clone(),
                    config: t.config.clone(),
                    running: false,
                    started_at: None,
                    created_at: now - state.cfg.resources_lag,
                    pool: t.pool.clone(),
                    ip: None,
                    boot_seed: None,
                    guest_interfaces: None,
                    guest_files: BTreeMap::new(),
                    pending: BTreeMap::new(),
                },
            );
        }
        state
    }

    fn storage(&self, id: &str) -> Option<&StorageSpec> {
        self.cfg.storages.iter().find(|s| s.id == id)
    }

    /// Finishes every task whose end time is at or before `now`, in end-time order.
    pub(crate) fn advance(&mut self, now: Instant) {
        if self.pending.is_empty() {
            return;
        }
        let mut due: Vec<(Instant, String)> = self
            .pending
            .iter()
            .filter_map(|u| {
                self.tasks
                    .get(u)
                    .filter(|t| t.end <= now)
                    .map(|t| (t.end, u.clone()))
            })
            .collect();
        if due.is_empty() {
            return;
        }
        due.sort();
        for (_, upid) in due {
            self.finish_task(&upid, now);
        }
    }

    fn finish_task(&mut self, upid: &str, now: Instant) {
        self.pending.retain(|u| u != upid);
        let Some(task) = self.tasks.get_mut(upid) else {
            return;
        };
        let action = task.action.take();
        let forced = task.forced_failure.take();
        let result = match (forced, action) {
            (Some(msg), action) => {
                // A failed clone leaves no VM behind; a failed migration leaves the VM where
                // it was, unlocked; other failed tasks change nothing.
                match action {
                    Some(Action::CloneDone { newid, .. }) => {
                        self.vms.remove(&newid);
                    }
                    Some(Action::Migrate { vmid, .. }) => {
                        if let Some(vm) = self.vms.get_mut(&vmid) {
                            vm.config.remove("lock");
                        }
                    }
                    _ => {}
                }
                Err(msg)
            }
            (None, Some(action)) => self.apply(action, now),
            (None, None) => Ok(()),
        };
        let Some(task) = self.tasks.get_mut(upid) else {
            return;
        };
        match result {
            Ok(()) => {
                task.log.push("TASK OK".into());
                task.exitstatus = Some("OK".into());
            }
            Err(msg) => {
                task.log.push(format!("TASK ERROR: {msg}"));
                task.exitstatus = Some(msg);
            }
        }
        self.finished.push_back(upid.to_owned());
        while self.finished.len() > self.cfg.max_finished_tasks {
            if let Some(old) = self.finished.pop_front() {
                self.tasks.remove(&old);
            }
        }
    }

    fn apply(&mut self, action: Action, now: Instant) -> Result<(), String> {
        match action {
            Action::CloneDone { newid, config } => {
                let vm = self
                    .vms
                    .get_mut(&newid)
                    .ok_or_else(|| format!("VM {newid} vanished during clone"))?;
                vm.config = config;
                Ok(())
            }
            Action::Start { vmid } => {
                let seed = self.attached_seed(vmid);
                let pool_ip = self.peek_ip();
                let external_guests = self.cfg.external_guests;
                let pci_mappings = self.cfg.pci_mappings.clone();
                let vm = self.vm_mut(vmid)?;
                if vm.config.get("template").is_some_and(|t| t == "1") {
                    return Err("you can't start a vm if it's a template".into());
                }
                if vm.running {
                    return Err(format!("VM {vmid} already running"));
                }
                // A mapped PCI device must exist on the VM's node (checked when QEMU starts).
                if let Some(missing) = vm
                    .config
                    .iter()
                    .filter(|(k, _)| k.starts_with("hostpci"))
                    .filter_map(|(_, v)| v.split(',').find_map(|p| p.strip_prefix("mapping=")))
                    .find(|m| !pci_mappings.iter().any(|known| known == m))
                {
                    return Err(format!("PCI device mapping not found for '{missing}'"));
                }
                vm.running = true;
                vm.started_at = Some(now);
                vm.boot_seed = seed;
                vm.guest_interfaces = None;
                vm.guest_files.clear();
                for (k, v) in std::mem::take(&mut vm.pending) {
                    match v {
                        Some(v) => vm.config.insert(k, v),
                        None => vm.config.remove(&k),
                    };
                }
                let static_ip = vm.config.get("ipconfig0").and_then(|c| static_ip(c));
                let used_pool = vm.ip.is_none() && static_ip.is_none() && !external_guests;
                vm.ip = static_ip.or(vm.ip).or((!external_guests).then_some(pool_ip));
                if used_pool {
                    self.next_ip = self.next_ip.wrapping_add(1);
                }
                Ok(())
            }
            Action::Stop { vmid } => {
                let vm = self.vm_mut(vmid)?;
                vm.running = false;
                vm.started_at = None;
                vm.guest_interfaces = None;
                vm.guest_files.clear();
                Ok(())
            }
            Action::Shutdown { vmid } | Action::Reboot { vmid } if !self.vm_mut(vmid)?.running => {
                Err(format!("VM {vmid} not running"))
            }
            Action::Shutdown { vmid } => {
                let vm = self.vm_mut(vmid)?;
                vm.running = false;
                vm.started_at = None;
                vm.guest_interfaces = None;
                vm.guest_files.clear();
                Ok(())
            }
            Action::Reboot { vmid } => {
                let vm = self.vm_mut(vmid)?;
                vm.started_at = Some(now);
                vm.guest_interfaces = None;
                vm.guest_files.clear();
                Ok(())
            }
            Action::Destroy { vmid } => {
                self.vms
                    .remove(&vmid)
                    .ok_or_else(|| format!("VM {vmid} does not exist"))?;
                Ok(())
            }
            Action::Migrate { vmid, target } => {
                let vm = self.vm_mut(vmid)?;
                vm.config.remove("lock");
                vm.node = target;
                Ok(())
            }
            Action::Config { vmid, updates } => {
                let vm = self.vm_mut(vmid)?;
                for (k, v) in updates {
                    match v {
                        Some(v) => vm.config.insert(k, v),
                        None => vm.config.remove(&k),
                    };
                }
                Ok(())
            }
            Action::StoreVolume {
                node,
                storage,
                name,
                volume,
            } => {
                self.volumes
                    .entry((node, storage))
                    .or_default()
                    .insert(name, volume);
                Ok(())
            }
            Action::DeleteVolume { node, storage, name } => {
                let vols = self.volumes.entry((node, storage.clone())).or_default();
                vols.remove(&name)
                    .map(|_| ())
                    .ok_or_else(|| format!("volume '{storage}:{name}' does not exist"))
            }
        }
    }

    fn vm_mut(&mut self, vmid: u32) -> Result<&mut Vm, String> {
        self.vms
            .get_mut(&vmid)
            .ok_or_else(|| format!("VM {vmid} does not exist"))
    }

    fn peek_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.next_ip)
    }

    /// The seed ISO attached as a cdrom on ide0..ide3 / sata0..5, decoded.
    fn attached_seed(&self, vmid: u32) -> Option<SeedData> {
        let vm = self.vms.get(&vmid)?;
        for (key, value) in &vm.config {
            if !["ide", "sata", "scsi"].iter().any(|bus| key.starts_with(bus)) || !is_cdrom(value) {
                continue;
            }
            let volid = value.split(',').next().unwrap_or_default();
            let Some((storage, name)) = volid.split_once(':') else {
                continue;
            };
            let Some(vol) = self
                .volumes
                .get(&(vm.node.clone(), storage.to_owned()))
                .and_then(|v| v.get(name))
            else {
                continue;
            };
            let Some(image) = &vol.seed else { continue };
            let text = |n: &str| {
                image
                    .files
                    .get(n)
                    .map(|b| String::from_utf8_lossy(b).into_owned())
            };
            return Some(SeedData {
                volid: volid.to_owned(),
                volume_label: image.volume_id.clone(),
                user_data: text("user-data"),
                meta_data: text("meta-data"),
                network_config: text("network-config"),
                image: image.image.clone(),
            });
        }
        None
    }

    fn new_mac(&mut self) -> String {
        loop {
            let b: [u8; 3] = self.rng.random();
            let mac = format!("BC:24:11:{:02X}:{:02X}:{:02X}", b[0], b[1], b[2]);
            if self.macs.insert(mac.clone()) {
                return mac;
            }
        }
    }

    fn new_uuid(&mut self) -> String {
        uuid::Builder::from_random_bytes(self.rng.random())
            .into_uuid()
            .to_string()
    }

    fn new_task(
        &mut self,
        req: &Request,
        node: &str,
        kind: &str,
        id: &str,
        action: Option<Action>,
        log: Vec<String>,
    ) -> String {
        let now = Instant::now();
        self.next_pid = self.next_pid.wrapping_add(1);
        let pid = self.next_pid;
        let pstart = (now.duration_since(self.boot).as_millis() / 10) as u32 + 100_000;
        let starttime = unix_now();
        let upid = format!(
            "UPID:{node}:{pid:08X}:{pstart:08X}:{starttime:08X}:{kind}:{id}:{}:",
            req.user
        );
        let task = Task {
            upid: upid.clone(),
            node: node.to_owned(),
            kind: kind.to_owned(),
            id: id.to_owned(),
            user: req.user.clone(),
            pid,
            pstart,
            starttime,
            // A download runs until the server has fetched the file (images::State::fetched).
            end: if kind == "download" && req.task_failure.is_none() {
                now + images::FETCH_DEADLINE
            } else {
                now + self.cfg.duration_for(kind)
            },
            forced_failure: req.task_failure.clone(),
            action,
            log,
            exitstatus: None,
        };
        self.tasks.insert(upid.clone(), task);
        self.pending.push(upid.clone());
        self.advance(now);
        upid
    }

    // ----- inspection -----

    /// Every uploaded or allocated volume: `(node, storage, volume id)`.
    pub(crate) fn volume_ids(&self) -> Vec<(String, String, String)> {
        self.volumes
            .iter()
            .flat_map(|((node, storage), volumes)| {
                volumes
                    .keys()
                    .map(move |id| (node.clone(), storage.clone(), id.clone()))
            })
            .collect()
    }

    pub(crate) fn vm_infos(&self) -> Vec<VmInfo> {
        self.vms.iter().map(|(id, vm)| vm_info(*id, vm)).collect()
    }

    /// When each running VM's guest agent started answering (its start plus the configured
    /// agent delay), by VM name.
    pub(crate) fn agents_answering_since(&self) -> Vec<(String, std::time::Instant)> {
        self.vms
            .values()
            .filter(|vm| vm.running)
            .filter_map(|vm| {
                Some((
                    vm.config.get("name")?.clone(),
                    vm.started_at? + self.cfg.agent_delay,
                ))
            })
            .collect()
    }

    pub(crate) fn task_infos(&self) -> Vec<TaskInfo> {
        self.tasks
            .values()
            .map(|t| TaskInfo {
                upid: t.upid.clone(),
                node: t.node.clone(),
                kind: t.kind.clone(),
                id: t.id.clone(),
                exitstatus: t.exitstatus.clone(),
            })
            .collect()
    }

    pub(crate) fn report_guest_interfaces(
        &mut self,
        vmid: u32,
        interfaces: Vec<GuestInterface>,
    ) -> Result<(), String> {
        match self.vms.get_mut(&vmid) {
            Some(vm) if vm.running => {
                vm.guest_interfaces = Some(interfaces);
                Ok(())
            }
            Some(_) => Err(format!("VM {vmid} is not running")),
            None => Err(format!("VM {vmid} does not exist")),
        }
    }

    pub(crate) fn report_guest_file(&mut self, vmid: u32, path: &str, content: String) -> Result<(), String> {
        match self.vms.get_mut(&vmid) {
            Some(vm) if vm.running => {
                vm.guest_files.insert(path.to_owned(), content);
                Ok(())
            }
            Some(_) => Err(format!("VM {vmid} is not running")),
            None => Err(format!("VM {vmid} does not exist")),
        }
    }

    pub(crate) fn seed(&self, vmid: u32) -> Option<SeedData> {
        self.vms
            .get(&vmid)
            .and_then(|vm| vm.boot_seed.clone())
            .or_else(|| self.attached_seed(vmid))
    }

    // ----- dispatch -----

    pub(crate) fn handle(&mut self, req: &Request) -> ApiResult {
        if let Some(node) = req.params.get("node").map(value_text)
            && req.template.starts_with("/nodes/{node}")
            && !self.cfg.nodes.contains(&node)
        {
            return Err(ApiError::internal(format!(
                "hostname lookup '{node}' failed - failed to get address info for: {node}: Name or service not known"
            )));
        }
        if let Some(answer) = self.ha_dispatch(req) {
            return answer;
        }
        match (req.method.as_str(), req.template.as_str()) {
            ("GET", "/version") => {
                Ok(json!({"version": "9.1.1", "release": "9.1", "repoid": "5b1c7e7f0c8d3b11"}))
            }
            ("GET", "/nodes") => Ok(self.nodes_list()),
            ("GET", "/nodes/{node}/status") => Ok(self.node_status(&req.req("node")?)),
            ("GET", "/cluster/resources") => Ok(self.resources(req.opt("type").as_deref())),
            ("GET", "/cluster/status") => Ok(self.cluster_status()),
            ("GET", "/nodes/{node}/storage/{storage}/status") => self.storage_status(req),
            ("GET", "/cluster/nextid") => self.nextid(req),
            ("GET", "/nodes/{node}/qemu") => Ok(self.qemu_list(&req.req("node")?)),
            ("GET", "/nodes/{node}/qemu/{vmid}/status/current") => self.status_current(req),
            ("GET", "/nodes/{node}/qemu/{vmid}/config") => self.config_get(req),
            ("GET", "/nodes/{node}/qemu/{vmid}/pending") => self.pending_get(req),
            ("POST", "/nodes/{node}/qemu/{vmid}/config") => self.config_set(req, true),
            ("PUT", "/nodes/{node}/qemu/{vmid}/config") => self.config_set(req, false),
            ("POST", "/nodes/{node}/qemu/{vmid}/clone") => self.clone_vm(req),
            ("PUT", "/nodes/{node}/qemu/{vmid}/resize") => self.resize(req),
            ("POST", "/nodes/{node}/qemu/{vmid}/status/start") => self.power(req, "qmstart"),
            ("POST", "/nodes/{node}/qemu/{vmid}/status/stop") => self.power(req, "qmstop"),
            ("POST", "/nodes/{node}/qemu/{vmid}/status/shutdown") => self.power(req, "qmshutdown"),
            ("POST", "/nodes/{node}/qemu/{vmid}/status/reboot") => self.power(req, "qmreboot"),
            ("DELETE", "/nodes/{node}/qemu/{vmid}") => self.destroy(req),
            ("POST", "/nodes/{node}/qemu/{vmid}/migrate") => self.migrate(req),
            ("GET", "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces") => self.agent_interfaces(req),
            ("GET", "/nodes/{node}/qemu/{vmid}/agent/get-osinfo") => self.agent_osinfo(req),
            ("GET", "/nodes/{node}/qemu/{vmid}/agent/file-read") => self.agent_file_read(req),
            ("GET", "/nodes/{node}/tasks/{upid}/status") => self.task_status(req),
            ("GET", "/nodes/{node}/tasks/{upid}/log") => self.task_log(req),
            ("GET", "/nodes/{node}/storage") => Ok(self.storage_list(req)),
            ("GET", "/nodes/{node}/storage/{storage}/content") => self.content_list(req),
            ("POST", "/nodes/{node}/storage/{storage}/upload") => self.upload(req),
            ("POST", "/nodes/{node}/storage/{storage}/download-url") => self.download_url(req),
            ("POST", "/nodes/{node}/qemu") => self.create_vm(req),
            ("POST", "/nodes/{node}/qemu/{vmid}/template") => self.make_template(req),
            ("DELETE", "/nodes/{node}/storage/{storage}/content/{volume}") => self.delete_volume(req),
            ("GET", "/pools") => self.pools_get(req.opt("poolid").as_deref()),
            ("GET", "/pools/{poolid}") => self.pool_get(&req.req("poolid")?),
            ("POST", "/pools") => self.pool_create(req),
            ("PUT", "/pools") | ("PUT", "/pools/{poolid}") => self.pool_update(req),
            ("DELETE", "/pools") | ("DELETE", "/pools/{poolid}") => self.pool_delete(req),
            (m, _) => Err(ApiError::new(
                501,
                format!("Method '{m} {}' not implemented", req.path),
            )),
        }
    }

    /// The token loses VM.Audit (and every other privilege) on `vmid`: listings leave it out,
    /// as `/cluster/resources` does, and any call on it is refused with a 403 naming the
    /// privilege.
    pub(crate) fn hide(&mut self, vmid: u32) {
        self.hidden.insert(vmid);
    }

    /// pvestatd restarts (or the node boots): for the resources lag, every guest is listed
    /// without the fields PVE takes from its statistics.
    pub(crate) fn restart_pvestatd(&mut self) {
        self.stats_since = Instant::now();
    }

    fn vm_on_node(&self, req: &Request) -> ApiResult<u32> {
        let node = req.req("node")?;
        let vmid = req.vmid("vmid")?;
        if self.hidden.contains(&vmid) {
            return Err(ApiError::new(
                403,
                format!("Permission check failed (/vms/{vmid}, VM.Audit)"),
            ));
        }
        match self.vms.get(&vmid) {
            Some(vm) if vm.node == node => Ok(vmid),
            _ => Err(ApiError::internal(format!(
                "Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist"
            ))),
        }
    }

    fn check_unlocked(&self, vmid: u32) -> ApiResult<()> {
        match self.vms.get(&vmid).and_then(|vm| vm.config.get("lock")) {
            Some(lock) => Err(ApiError::internal(format!("VM {vmid} is locked ({lock})"))),
            None => Ok(()),
        }
    }

    fn nodes_list(&self) -> Value {
        let now = Instant::now();
        let uptime = now.duration_since(self.boot).as_secs() + 86_400;
        Value::Array(
            self.cfg
                .nodes
                .iter()
                .map(|n| {
                    let mut node = json!({"node": n, "id": format!("node/{n}"), "type": "node", "status": "online",
                        "cpu": self.node_cpu(n), "maxcpu": NODE_CPUS, "mem": self.node_memory_used(n), "maxmem": NODE_MEMORY,
                        "disk": 10u64 << 30, "maxdisk": 100u64 << 30, "uptime": uptime, "level": "",
                        "ssl_fingerprint": self.fingerprint});
                    // Without Sys.Audit on the node PVE lists it without its statistics.
                    if !self.sees_node_stats(n)
                        && let Some(m) = node.as_object_mut()
                    {
                        for key in ["cpu", "maxcpu", "mem", "maxmem", "disk", "maxdisk", "uptime"] {
                            m.remove(key);
                        }
                    }
                    node
                })
                .collect(),
        )
    }

    /// Memory in use on `node`: the host's own plus what its running VMs use (as
    /// [`Self::vm_summary`] reports it), so placement by free memory sees the VMs a node runs.
    fn node_memory_used(&self, node: &str) -> u64 {
        let vms: u64 = self
            .vms
            .iter()
            .filter(|(_, vm)| vm.node == node && vm.running)
            .filter_map(|(vmid, vm)| self.vm_summary(*vmid, vm).get("mem").and_then(Value::as_u64))
            .sum();
        (HOST_MEMORY_USED + vms).min(NODE_MEMORY)
    }

    /// CPU load of `node` (0..1): the host's own 3 %, plus a quarter of each running VM's cores.
    fn node_cpu(&self, node: &str) -> f64 {
        let cores: u64 = self
            .vms
            .values()
            .filter(|vm| vm.node == node && vm.running)
            .map(|vm| {
                let n = |k: &str| vm.config.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(1);
                n("cores") * n("sockets")
            })
            .sum();
        (0.03 + cores as f64 / 4.0 / NODE_CPUS as f64).min(1.0)
    }

    /// Bytes used on `storage` as `node` sees it: uploaded volumes, plus the disks of the VMs
    /// on it (every node's, for shared storage).
    fn storage_used(&self, node: &str, storage: &StorageSpec) -> u64 {
        let volumes: u64 = self
            .volumes
            .get(&(node.to_owned(), storage.id.clone()))
            .map(|v| v.values().map(|v| v.size).sum())
            .unwrap_or(0);
        let prefix = format!("{}:", storage.id);
        let disks: u64 = self
            .vms
            .values()
            .filter(|vm| storage.shared || vm.node == node)
            .flat_map(|vm| vm.config.iter())
            .filter(|(k, v)| is_disk_key(k) && !is_cdrom(v) && v.starts_with(&prefix))
            .map(|(_, v)| disk_size(v))
            .sum();
        volumes + disks
    }

    /// `GET /nodes/{node}/storage/{storage}/status`.
    fn storage_status(&self, req: &Request) -> ApiResult {
        let node = req.req("node")?;
        let id = req.req("storage")?;
        let storage = self
            .storage(&id)
            .ok_or_else(|| ApiError::internal(format!("storage '{id}' does not exist")))?;
        let used = self.storage_used(&node, storage);
        Ok(
            json!({"type": storage.kind, "content": storage.content.join(","), "active": 1, "enabled": 1,
            "shared": u8::from(storage.shared), "total": storage.total, "used": used,
            "avail": storage.total.saturating_sub(used)}),
        )
    }

    /// `GET /cluster/status`: one quorate cluster of the configured nodes, all online.
    fn cluster_status(&self) -> Value {
        let mut out = vec![
            json!({"type": "cluster", "id": "cluster", "name": "sim", "nodes": self.cfg.nodes.len(),
            "quorate": 1, "version": self.cfg.nodes.len()}),
        ];
        for (i, n) in self.cfg.nodes.iter().enumerate() {
            out.push(
                json!({"type": "node", "id": format!("node/{n}"), "name": n, "online": 1,
                "local": u8::from(i == 0), "nodeid": i + 1, "ip": format!("127.0.0.{}", i + 1), "level": ""}),
            );
        }
        Value::Array(out)
    }

    fn node_status(&self, node: &str) -> Value {
        let uptime = Instant::now().duration_since(self.boot).as_secs() + 86_400;
        let used = self.node_memory_used(node);
        let free = NODE_MEMORY - used;
        json!({
            "uptime": uptime, "cpu": self.node_cpu(node), "wait": 0.0, "idle": 0,
            "loadavg": ["0.10", "0.05", "0.01"],
            "memory": {"total": NODE_MEMORY, "used": used, "free": free, "available": free},
            "swap": {"total": 0, "used": 0, "free": 0},
            "rootfs": {"total": 100u64 << 30, "used": 10u64 << 30, "free": 90u64 << 30, "avail": 90u64 << 30},
            "ksm": {"shared": 0},
            "cpuinfo": {"cpus": 16, "cores": 8, "sockets": 1, "model": "Simulated CPU", "mhz": "3000.000",
                "hvm": "1", "user_hz": 100, "flags": ""},
            "kversion": "Linux 6.14.8-2-pve #1 SMP PREEMPT_DYNAMIC PMX 6.14.8-2 x86_64",
            "pveversion": "pve-manager/9.1.1/5b1c7e7f0c8d3b11",
            "current-kernel": {"sysname": "Linux", "release": "6.14.8-2-pve", "version": "#1 SMP", "machine": "x86_64"},
            "boot-info": {"mode": "efi", "secureboot": 0},
        })
    }

    fn vm_summary(&self, vmid: u32, vm: &Vm) -> Map<String, Value> {
        let c = &vm.config;
        let mem_mb: u64 = c
            .get("memory")
            .and_then(|m| m.split(',').next()?.trim_start_matches("current=").parse().ok())
            .unwrap_or(512);
        let cores: u64 = c.get("cores").and_then(|v| v.parse().ok()).unwrap_or(1);
        let sockets: u64 = c.get("sockets").and_then(|v| v.parse().ok()).unwrap_or(1);
        let maxdisk: u64 = c
            .iter()
            .filter(|(k, v)| is_disk_key(k) && !is_cdrom(v))
            .map(|(_, v)| disk_size(v))
            .next()
            .unwrap_or(0);
        let status = if vm.running { "running" } else { "stopped" };
        let uptime = vm.started_at.map(|s| s.elapsed().as_secs()).unwrap_or(0);
        let mut m = Map::new();
        m.insert("vmid".into(), json!(vmid));
        m.insert("status".into(), json!(status));
        if let Some(name) = c.get("name") {
            m.insert("name".into(), json!(name));
        }
        m.insert("cpus".into(), json!(cores * sockets));
        m.insert("maxmem".into(), json!(mem_mb << 20));
        m.insert(
            "mem".into(),
            json!(if vm.running { (mem_mb << 20) / 4 } else { 0 }),
        );
        m.insert("maxdisk".into(), json!(maxdisk));
        m.insert("disk".into(), json!(0));
        m.insert("cpu".into(), json!(0));
        m.insert("uptime".into(), json!(uptime));
        for k in ["netin", "netout", "diskread", "diskwrite"] {
            m.insert(k.into(), json!(0));
        }
        if vm.running {
            m.insert("pid".into(), json!(10_000 + vmid));
        }
        if c.get("template").is_some_and(|t| t == "1") {
            m.insert("template".into(), json!(1));
        }
        if let Some(tags) = c.get("tags") {
            m.insert("tags".into(), json!(tags));
        }
        if let Some(lock) = c.get("lock") {
            m.insert("lock".into(), json!(lock));
        }
        m
    }

    fn resources(&self, kind: Option<&str>) -> Value {
        let now = Instant::now();
        let mut out = Vec::new();
        if (kind.is_none() || kind == Some("node"))
            && let Value::Array(nodes) = self.nodes_list()
        {
            out.extend(nodes);
        }
        if kind.is_none() || kind == Some("storage") {
            for n in &self.cfg.nodes {
                for s in self.cfg.storages.iter().filter(|s| self.sees_storage(&s.id)) {
                    out.push(json!({"id": format!("storage/{n}/{}", s.id), "type": "storage", "storage": s.id,
                        "node": n, "status": "available", "content": s.content.join(","), "plugintype": s.kind,
                        "shared": u8::from(s.shared), "disk": self.storage_used(n, s), "maxdisk": s.total}));
                }
            }
        }
        if kind.is_none() || kind == Some("vm") {
            for (vmid, vm) in self.vms.iter().filter(|(id, _)| self.sees_vm(**id)) {
                let mut m = self.vm_summary(*vmid, vm);
                m.insert("id".into(), json!(format!("qemu/{vmid}")));
                m.insert("type".into(), json!("qemu"));
                m.insert("node".into(), json!(vm.node));
                m.insert("maxcpu".into(), m.get("cpus").cloned().unwrap_or(json!(1)));
                m.remove("cpus");
                m.remove("pid");
                let template = vm.config.get("template").is_some_and(|t| t == "1");
                m.insert("template".into(), json!(u8::from(template)));
                if let Some(pool) = &vm.pool {
                    m.insert("pool".into(), json!(pool));
                }
                // PVE takes name, template, status, maxmem and uptime from pvestatd's
                // statistics: absent until it has reported the guest.
                if now.duration_since(vm.created_at.max(self.stats_since)) < self.cfg.resources_lag {
                    m.insert("status".into(), json!("unknown"));
                    for key in ["name", "template", "maxmem", "uptime"] {
                        m.remove(key);
                    }
                }
                out.push(Value::Object(m));
            }
        }
        if kind.is_none() || kind == Some("pool") {
            for p in self.pools.keys().filter(|p| self.sees_pool(p)) {
                out.push(json!({"id": format!("pool/{p}"), "type": "pool", "pool": p}));
            }
        }
        Value::Array(out)
    }

    fn nextid(&self, req: &Request) -> ApiResult {
        if let Some(vmid) = req.opt("vmid") {
            let id: u32 = vmid.parse().unwrap_or(0);
            if self.vms.contains_key(&id) {
                return Err(ApiError::param("vmid", format!("VM {id} already exists")));
            }
            return Ok(json!(vmid));
        }
        let id = (100..).find(|id| !self.vms.contains_key(id)).unwrap_or(100);
        Ok(json!(id.to_string()))
    }

    fn qemu_list(&self, node: &str) -> Value {
        Value::Array(
            self.vms
                .iter()
                .filter(|(id, vm)| vm.node == node && self.sees_vm(**id))
                .map(|(id, vm)| Value::Object(self.vm_summary(*id, vm)))
                .collect(),
        )
    }

    fn status_current(&self, req: &Request) -> ApiResult {
        let vmid = self.vm_on_node(req)?;
        let vm = &self.vms[&vmid];
        let mut m = self.vm_summary(vmid, vm);
        m.insert("qmpstatus".into(), m["status"].clone());
        m.insert(
            "ha".into(),
            match self.ha.state_of(vmid) {
                Some(state) => json!({"managed": 1, "state": state}),
                None => json!({"managed": 0}),
            },
        );
        if vm.config.get("agent").is_some_and(|a| agent_enabled(a)) {
            m.insert("agent".into(), json!(1));
        }
        Ok(Value::Object(m))
    }

    /// `GET …/config`: pending changes applied unless `current=1`, as PVE does.
    fn config_get(&self, req: &Request) -> ApiResult {
        let vmid = self.vm_on_node(req)?;
        let vm = &self.vms[&vmid];
        if req.flag("current") == Some(true) {
            return Ok(Value::Object(self.typed_config(&vm.config)));
        }
        Ok(Value::Object(self.typed_config(&with_pending(vm))))
    }

    /// `GET …/pending`: every key with its current value, its pending value or deletion.
    fn pending_get(&self, req: &Request) -> ApiResult {
        let vmid = self.vm_on_node(req)?;
        let vm = &self.vms[&vmid];
        let current = self.typed_config(&vm.config);
        let mut keys: Vec<&String> = vm.config.keys().chain(vm.pending.keys()).collect();
        keys.sort();
        keys.dedup();
        let items: Vec<Value> = keys
            .into_iter()
            .map(|key| {
                let mut item = serde_json::Map::new();
                item.insert("key".into(), json!(key));
                if let Some(value) = current.get(key.as_str()) {
                    item.insert("value".into(), value.clone());
                }
                match vm.pending.get(key) {
                    Some(Some(pending)) => {
                        item.insert("pending".into(), json!(pending));
                    }
                    Some(None) => {
                        item.insert("delete".into(), json!(1));
                    }
                    None => {}
                }
                Value::Object(item)
            })
            .collect();
        Ok(Value::Array(items))
    }

    /// Config values typed the way PVE's Perl emits them: integers/numbers as numbers (per the
    /// schema), booleans as 0/1, everything else (including `memory`) as strings; plus `digest`.
    fn typed_config(&self, config: &BTreeMap<String, String>) -> Map<String, Value> {
        let returns = self
            .schema
            .find("GET", "/nodes/n/qemu/100/config")
            .ok()
            .and_then(|e| e.returns().get("properties").cloned());
        let mut out = Map::new();
        for (k, v) in config {
            let stem = k.trim_end_matches(|c: char| c.is_ascii_digit());
            let ty = returns
                .as_ref()
                .and_then(|p| p.get(k).or_else(|| p.get(format!("{stem}[n]"))))
                .and_then(|s| s.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("string");
            let typed = match ty {
                "integer" | "boolean" => v.parse::<i64>().map(Value::from).unwrap_or_else(|_| json!(v)),
                "number" => v
                    .parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
                    .unwrap_or_else(|| json!(v)),
                _ => json!(v),
            };
            out.insert(k.clone(), typed);
        }
        out.insert("digest".into(), json!(config_digest(config)));
        out
    }

    fn config_set(&mut self, req: &Request, async_task: bool) -> ApiResult {
        let vmid = self.vm_on_node(req)?;
        let node = req.req("node")?;
        let current = self.vms[&vmid].config.clone();
        if let Some(digest) = req.opt("digest")
            && digest != config_digest(&current)
        {
            return Err(ApiError::internal(
                "detected modified configuration - file changed by other user? Try again.",
            ));
        }
        if req.flag("skiplock") != Some(true) {
            self.check_unlocked(vmid)?;
        }
        let skip = NOT_OPTIONS;
        let mut updates = Vec::new();
        let mut disk_index = next_disk_index(&current, vmid);
        for (key, value) in &req.params {
            if skip.contains(&key.as_str()) {
                continue;
            }
            let text = value_text(value);
            let stored = if key == "tags" {
                normalize_tags(&text)
            } else if is_net_key(key) {
                self.canonical_net(&text)
            } else if is_disk_key(key) {
                self.allocate_disk(key, &text, vmid, &mut disk_index)?
            } else if key == "template" {
                return Err(ApiError::param(
                    key,
                    "you can't convert a VM to template via the config API",
                ));
            } else {
                text
            };
            updates.push((key.clone(), Some(stored)));
        }
        if let Some(delete) = req.opt("delete") {
            for key in split_list(&delete) {
                if req.params.contains_key(key) {
                    return Err(ApiError::param(
                        key,
                        format!("unable to delete '{key}' - option is also set"),
                    ));
                }
                updates.push((key.to_owned(), None));
            }
        }
        // On a running VM, what cannot be hot-plugged is only recorded as pending.
        let vm = self
            .vms
            .get_mut(&vmid)
            .ok_or_else(|| ApiError::internal("VM vanished"))?;
        let (updates, pending): (Vec<_>, Vec<_>) = updates
            .into_iter()
            .partition(|(k, v)| !vm.running || hot_pluggable(&vm.config, k, v.is_none()));
        for (k, v) in pending {
            vm.pending.insert(k, v);
        }
        if !async_task {
            for (k, v) in updates {
                match v {
                    Some(v) => vm.config.insert(k, v),
                    None => vm.config.remove(&k),
                };
            }
            return Ok(Value::Null);
        }
        let upid = self.new_task(
            req,
            &node,
            "qmconfig",
            &vmid.to_string(),
            Some(Action::Config { vmid, updates }),
            vec![format!("update VM {vmid}: {}", describe_params(&req.params))],
        );
        if let Some(delay) = req.opt("background_delay").and_then(|d| d.parse::<u64>().ok())
            && self.cfg.duration_for("qmconfig") <= Duration::from_secs(delay)
        {
            self.advance(Instant::now() + self.cfg.duration_for("qmconfig"));
            return Ok(Value::Null);
        }
        Ok(json!(upid))
    }

    /// `virtio,bridge=vmbr0` → `virtio=BC:24:11:…,bridge=vmbr0` (model=MAC first, other keys sorted).
    fn canonical_net(&mut self, text: &str) -> String {
        let mut model = None;
        let mut mac = None;
        let mut rest = BTreeMap::new();
        for part in text.split(',').filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                Some(("model", m)) => model = Some(m.to_owned()),
                Some(("macaddr", m)) => mac = Some(m.to_uppercase()),
                Some((k, v)) if model.is_none() && is_nic_model(k) => {
                    model = Some(k.to_owned());
                    mac = Some(v.to_uppercase());
                }
                Some((k, v)) => {
                    rest.insert(k.to_owned(), v.to_owned());
                }
                None if model.is_none() => model = Some(part.to_owned()),
                None => {}
            }
        }
        let mac = match mac {
            Some(m) => {
                self.macs.insert(m.clone());
                m
            }
            None => self.new_mac(),
        };
        let mut out = vec![format!("{}={mac}", model.unwrap_or_else(|| "virtio".into()))];
        out.extend(rest.into_iter().map(|(k, v)| format!("{k}={v}")));
        out.join(",")
    }

    /// `local-lvm:32,discard=on` → `local-lvm:vm-101-disk-1,discard=on,size=32G`.
    fn allocate_disk(&self, key: &str, text: &str, vmid: u32, index: &mut u32) -> ApiResult<String> {
        let mut parts = text.split(',');
        let file = parts.next().unwrap_or_default();
        let rest: Vec<&str> = parts.collect();
        if is_cdrom(text) || file == "none" {
            return Ok(text.to_owned());
        }
        let Some((storage, vol)) = file.split_once(':') else {
            return Ok(text.to_owned());
        };
        if self.storage(storage).is_none() {
            return Err(ApiError::internal(format!("storage '{storage}' does not exist")));
        }
        let Ok(gib) = vol.parse::<f64>() else {
            return Ok(text.to_owned());
        };
        let name = format!("vm-{vmid}-disk-{index}");
        *index += 1;
        let mut out = vec![format!("{storage}:{name}")];
        out.extend(
            rest.iter()
                .filter(|p| !p.starts_with("size="))
                .map(|p| (*p).to_owned()),
        );
        // PVE sizes an EFI variables disk and a TPM state volume itself, whatever is asked.
        let bytes = if key.starts_with("efidisk") || key.starts_with("tpmstate") {
            4 << 20
        } else {
            (gib * (1u64 << 30) as f64) as u64
        };
        out.push(format!("size={}", format_size(bytes)));
        Ok(out.join(","))
    }

    fn clone_vm(&mut self, req: &Request) -> ApiResult {
        let vmid = self.vm_on_node(req)?;
        let node = req.req("node")?;
        let newid = req.vmid("newid")?;
        let target = req.opt("target").unwrap_or_else(|| node.clone());
        if !self.cfg.nodes.contains(&target) {
            return Err(ApiError::param(
                "target",
                format!("no such cluster node '{target}'"),
            ));
        }
        if let Some(existing) = self.vms.get(&newid) {
            return Err(ApiError::internal(format!(
                "VM {newid} already exists on node '{}'",
                existing.node
            )));
        }
        let source = self.vms[&vmid].clone();
        let template = source.config.get("template").is_some_and(|t| t == "1");
        let full = req.flag("full").unwrap_or(!template);
        if !full && !template {
            return Err(ApiError::internal(
                "Linked clone feature is not supported for this VM - it is not a template",
            ));
        }
        if !full && (req.opt("storage").is_some() || req.opt("format").is_some()) {
            return Err(ApiError::param(
                "storage",
                "Storage and format options are only allowed for full clones",
            ));
        }
        if let Some(lock) = source.config.get("lock") {
            return Err(ApiError::internal(format!("VM {vmid} is locked ({lock})")));
        }
        let pool = req.opt("pool");
        if let Some(p) = &pool
            && !self.pools.contains_key(p)
        {
            return Err(ApiError::internal(format!("pool '{p}' does not exist")));
        }
        if let Some(s) = req.opt("storage")
            && self.storage(&s).is_none()
        {
            return Err(ApiError::internal(format!("storage '{s}' does not exist")));
        }
        // Disks on non-shared storage cannot move to another node.
        if target != node {
            let local = source
                .config
                .iter()
                .filter(|(k, v)| is_disk_key(k) && !is_cdrom(v))
                .any(|(_, v)| {
                    v.split(':')
                        .next()
                        .and_then(|s| self.storage(s))
                        .is_some_and(|s| !s.shared)
                });
            if local {
                return Err(ApiError::internal(format!(
                    "can't clone VM to node '{target}' (VM uses local storage)"
                )));
            }
        }
        let mut config = BTreeMap::new();
        let mut log = vec![format!(
            "create {} clone of VM {vmid}",
            if full { "full" } else { "linked" }
        )];
        let mut disk_index = 0;
        for (k, v) in &source.config {
            let value = if matches!(k.as_str(), "template" | "lock") {
                continue;
            } else if is_net_key(k) {
                self.canonical_net(&strip_mac(v))
            } else if k == "smbios1" {
                let mut parts: Vec<String> = v
                    .split(',')
                    .filter(|p| !p.starts_with("uuid="))
                    .map(str::to_owned)
                    .collect();
                parts.insert(0, format!("uuid={}", self.new_uuid()));
                parts.join(",")
            } else if k == "vmgenid" {
                self.new_uuid()
            } else if is_disk_key(k) {
                let (file, opts) = v.split_once(',').unwrap_or((v.as_str(), ""));
                let Some((storage, vol)) = file.split_once(':') else {
                    config.insert(k.clone(), v.clone());
                    continue;
                };
                let suffix = if opts.is_empty() {
                    String::new()
                } else {
                    format!(",{opts}")
                };
                if vol.ends_with("-cloudinit") {
                    format!("{storage}:vm-{newid}-cloudinit{suffix}")
                } else if is_cdrom(v) {
                    v.clone()
                } else {
                    let name = format!("vm-{newid}-disk-{disk_index}");
                    disk_index += 1;
                    if full {
                        let dest = req.opt("storage").unwrap_or_else(|| storage.to_owned());
                        log.push(format!(
                            "drive-{k}: transferred {} of {}",
                            format_size(disk_size(v)),
                            format_size(disk_size(v))
                        ));
                        format!("{dest}:{name}{suffix}")
                    } else {
                        log.push(format!("create linked clone of drive {k} ({storage}:{vol})"));
                        format!("{storage}:{vol}/{name}{suffix}")
                    }
                }
            } else {
                v.clone()
            };
            config.insert(k.clone(), value);
        }
        let name = req.opt("name").unwrap_or_else(|| {
            format!(
                "Copy-of-VM-{}",
                source.config.get("name").cloned().unwrap_or_default()
            )
        });
        config.insert("name".into(), name);
        if let Some(d) = req.opt("description") {
            config.insert("description".into(), d);
        }
        let now = Instant::now();
        self.vms.insert(
            newid,
            Vm {
                node: target,
                config: BTreeMap::from([("lock".to_owned(), "clone".to_owned())]),
                running: false,
                started_at: None,
                created_at: now,
                pool,
                ip: None,
                boot_seed: None,
                guest_interfaces: None,
                guest_files: BTreeMap::new(),
                pending: BTreeMap::new(),
            },
        );
        let upid = self.new_task(
            req,
            &node,
            "qmclone",
            &vmid.to_string(),
            Some(Action::CloneDone { newid, config }),
            log,
        );
        Ok(json!(upid))
    }

    fn resize(&mut self, req: &Request) -> ApiResult {
        let vmid = self.vm_on_node(req)?;
        let node = req.req("node")?;
        if req.flag("skiplock") != Some(true) {
            self.check_unlocked(vmid)?;
        }
        let disk = req.req("disk")?;
        let size = req.req("size")?;
        let current = self.vms[&vmid]
            .config
            .get(&disk)
            .cloned()
            .ok_or_else(|| ApiError::internal(format!("disk '{disk}' does not exist")))?;
        if is_cdrom(&current) {
            return Err(ApiError::internal(format!("disk '{disk}' is a cdrom")));
        }
        let (relative, bytes) = parse_size(&size)
            .ok_or_else(|| ApiError::param("size", "value does not match the regex pattern"))?;
        let old = disk_size(&current);
        let new = if relative { old + bytes } else { bytes };
        if new < old {
            return Err(ApiError::internal(format!(
                "shrinking disks is not supported (request {new} bytes, current size {old} bytes)"
            )));
        }
        let value = with_size(&current, new);
        let upid = self.new_task(
            req,
            &node,
            "resize",
            &vmid.to_string(),
            Some(Action::Config {
                vmid,
                updates: vec![(disk.clone(), Some(value))],
            }),
            vec![format!(
                "resize {disk} from {} to {}",
                format_size(old),
                format_size(new)
            )],
        );
        Ok(json!(upid))
    }

    fn power(&mut self, req: &Request, kind: &str) -> ApiResult {
        let vmid = self.vm_on_node(req)?;
        let node = req.req("node")?;
        if req.flag("skiplock") != Some(true) {
            self.check_unlocked(vmid)?;
        }
        let action = match kind {
            "qmstart" => Action::Start { vmid },
            "qmstop" => Action::Stop { vmid },
            "qmshutdown" => Action::Shutdown { vmid },
            _ => Action::Reboot { vmid },
        };
        // An HA resource's start or stop is a request to the HA manager (which then acts).
        let kind = match (kind, self.ha.manages(vmid)) {
            ("qmstart", true) => {
                self.ha.request(vmid, "started");
                "hastart"
            }
            ("qmstop" | "qmshutdown", true) => {
                self.ha.request(vmid, "stopped");
                "hastop"
            }
            (kind, _) => kind,
        };
        let log = vec![format!("{kind} VM {vmid}")];
        Ok(json!(self.new_task(
            req,
            &node,
            kind,
            &vmid.to_string(),
            Some(action),
            log
        )))
    }

    /// `qm migrate`: the VM is locked (`migrate`) while the task runs, then lives on `target`
    /// with the same VMID and config (what a user's migration, node maintenance or HA does).
    /// A running VM needs `online`; local disks are not checked (see the README).
    fn migrate(&mut self, req: &Request) -> ApiResult {
        let vmid = self.vm_on_node(req)?;
        let node = req.req("node")?;
        let target = req.req("target")?;
        if !self.cfg.nodes.contains(&target) {
            return Err(ApiError::internal(format!("no such cluster node '{target}'")));
        }
        if target == node {
            return Err(ApiError::internal("target is local node."));
        }
        self.check_unlocked(vmid)?;
        if self.vms[&vmid].running && req.flag("online") != Some(true) {
            return Err(ApiError::internal("can't migrate running VM without --online"));
        }
        if let Some(vm) = self.vms.get_mut(&vmid) {
            vm.config.insert("lock".into(), "migrate".into());
        }
        let log = vec![format!("starting migration of VM {vmid} to node '{target}'")];
        Ok(json!(self.new_task(
            req,
            &node,
            "qmigrate",
            &vmid.to_string(),
            Some(Action::Migrate { vmid, target }),
            log
        )))
    }

    fn destroy(&mut self, req: &Request) -> ApiResult {
        let vmid = self.vm_on_node(req)?;
        let node = req.req("node")?;
        if req.flag("skiplock") != Some(true) {
            self.check_unlocked(vmid)?;
        }
        if self.vms[&vmid].running {
            return Err(ApiError::internal(format!(
                "VM {vmid} is running - destroy failed"
            )));
        }
        if self.ha.manages(vmid) {
            if req.flag("purge") != Some(true) {
                return Err(ApiError::internal(format!(
                    "unable to remove VM {vmid} - used in HA resources and purge parameter not set.\n"
                )));
            }
            self.ha.purge(vmid);
        }
        let log = vec![format!("destroy VM {vmid}")];
        Ok(json!(self.new_task(
            req,
            &node,
            "qmdestroy",
            &vmid.to_string(),
            Some(Action::Destroy { vmid }),
            log
        )))
    }

    /// The VM of an `agent/*` request, once its guest agent answers (as PVE's
    /// `assert_agent_available` and the agent's own start-up delay).
    fn agent_vm(&self, req: &Request) -> ApiResult<(u32, &Vm)> {
        let vmid = self.vm_on_node(req)?;
        let vm = &self.vms[&vmid];
        // As PVE: "not configured" only without an `agent` option; `agent: 0` looks like an
        // agent that does not answer.
        match vm.config.get("agent") {
            None => return Err(ApiError::internal("No QEMU guest agent configured")),
            Some(a) if !agent_enabled(a) => {
                return Err(ApiError::internal("QEMU guest agent is not running"));
            }
            Some(_) => {}
        }
        let Some(started) = vm.started_at.filter(|_| vm.running) else {
            return Err(ApiError::internal(format!("VM {vmid} is not running")));
        };
        if started.elapsed() < self.cfg.agent_delay
            || (self.cfg.external_guests && vm.guest_interfaces.is_none())
        {
            return Err(ApiError::internal("QEMU guest agent is not running"));
        }
        Ok((vmid, vm))
    }

    /// `agent/get-osinfo`: the simulated guest is the Ubuntu the template names.
    fn agent_osinfo(&self, req: &Request) -> ApiResult {
        self.agent_vm(req)?;
        Ok(json!({"result": {
            "id": "ubuntu", "name": "Ubuntu", "pretty-name": "Ubuntu 24.04.1 LTS",
            "version": "24.04.1 LTS (Noble Numbat)", "version-id": "24.04",
            "kernel-release": "6.8.0-49-generic", "kernel-version": "#49-Ubuntu SMP PREEMPT_DYNAMIC",
            "machine": "x86_64",
        }}))
    }

    /// `agent/file-read`: cloud-init's copy of the user data the guest booted with
    /// (`/var/lib/cloud/instance/user-data.txt`, from the seed captured at start) and its report
    /// (`/run/cloud-init/result.json`: a simulated guest's cloud-init has finished, without
    /// errors, once its agent answers; a real guest's is what the harness reported); any other
    /// file does not exist in the simulated guest.
    fn agent_file_read(&self, req: &Request) -> ApiResult {
        let (_, vm) = self.agent_vm(req)?;
        let file = req.req("file")?;
        let seed = vm.boot_seed.as_ref();
        let content = match file.as_str() {
            "/var/lib/cloud/instance/user-data.txt" => seed.and_then(|s| s.user_data.clone()),
            _ if self.cfg.external_guests => vm.guest_files.get(file.as_str()).cloned(),
            CLOUD_INIT_RESULT => Some(CLOUD_INIT_DONE.to_owned()),
            _ => None,
        };
        let Some(content) = content else {
            return Err(ApiError::internal(format!(
                "Agent error: Failed to open file '{file}': No such file or directory"
            )));
        };
        Ok(json!({ "content": content }))
    }

    fn agent_interfaces(&self, req: &Request) -> ApiResult {
        let (_, vm) = self.agent_vm(req)?;
        let mut result = vec![json!({
            "name": "lo", "hardware-address": "00:00:00:00:00:00",
            "ip-addresses": [{"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8},
                             {"ip-address": "::1", "ip-address-type": "ipv6", "prefix": 128}],
            "statistics": {"rx-bytes": 0, "tx-bytes": 0, "rx-packets": 0, "tx-packets": 0,
                "rx-errs": 0, "tx-errs": 0, "rx-dropped": 0, "tx-dropped": 0},
        })];
        if let Some(interfaces) = &vm.guest_interfaces {
            for interface in interfaces {
                let ips: Vec<Value> = interface
                    .addresses
                    .iter()
                    .map(|(ip, prefix)| {
                        let family = if ip.is_ipv4() { "ipv4" } else { "ipv6" };
                        json!({"ip-address": ip.to_string(), "ip-address-type": family, "prefix": prefix})
                    })
                    .collect();
                result.push(
                    json!({"name": interface.name, "hardware-address": interface.mac.to_lowercase(),
                    "ip-addresses": ips}),
                );
            }
            return Ok(json!({ "result": result }));
        }
        let prefix = vm
            .config
            .get("ipconfig0")
            .and_then(|c| c.split(',').find_map(|p| p.strip_prefix("ip=")))
            .and_then(|ip| ip.split_once('/'))
            .and_then(|(_, p)| p.parse::<u8>().ok())
            .unwrap_or(self.cfg.address_pool_prefix);
        for (i, (_, net)) in vm.config.iter().filter(|(k, _)| is_net_key(k)).enumerate() {
            let mac = net_mac(net).unwrap_or_default().to_lowercase();
            let mut ips = Vec::new();
            if i == 0
                && let Some(ip) = vm.ip
            {
                ips.push(json!({"ip-address": ip.to_string(), "ip-address-type": "ipv4", "prefix": prefix}));
            }
            result.push(json!({"name": format!("eth{i}"), "hardware-address": mac, "ip-addresses": ips}));
        }
        if self.cfg.container_interfaces {
            for (name, ip, prefix) in [
                ("docker0", "172.17.0.1", 16),
                ("cni0", "10.244.0.1", 24),
                ("flannel.1", "10.244.0.0", 32),
                ("cali4f2a9c1d3e7", "fe80::ecee:eeff:feee:eeee", 64),
            ] {
                let family = if ip.contains(':') { "ipv6" } else { "ipv4" };
                result.push(json!({"name": name, "hardware-address": "02:42:ac:11:00:01",
                    "ip-addresses": [{"ip-address": ip, "ip-address-type": family, "prefix": prefix}]}));
            }
        }
        Ok(json!({ "result": result }))
    }

    fn find_task(&self, req: &Request) -> ApiResult<&Task> {
        let upid = req.req("upid")?;
        if !upid.starts_with("UPID:") || upid.split(':').count() < 9 {
            return Err(ApiError::param(
                "upid",
                format!("unable to parse worker upid '{upid}'"),
            ));
        }
        self.tasks
            .get(&upid)
            .ok_or_else(|| ApiError::param("upid", format!("no such task '{upid}'")))
    }

    fn task_status(&self, req: &Request) -> ApiResult {
        let t = self.find_task(req)?;
        let mut v = json!({"upid": t.upid, "node": t.node, "pid": t.pid, "pstart": t.pstart,
            "starttime": t.starttime, "type": t.kind, "id": t.id, "user": t.user,
            "status": if t.exitstatus.is_some() { "stopped" } else { "running" }});
        if let Some(e) = &t.exitstatus {
            v["exitstatus"] = json!(e);
        }
        Ok(v)
    }

    fn task_log(&self, req: &Request) -> ApiResult {
        let t = self.find_task(req)?;
        let start: usize = req.opt("start").and_then(|s| s.parse().ok()).unwrap_or(0);
        let limit: usize = req.opt("limit").and_then(|s| s.parse().ok()).unwrap_or(50);
        Ok(Value::Array(
            t.log
                .iter()
                .enumerate()
                .skip(start)
                .take(limit)
                .map(|(i, l)| json!({"n": i + 1, "t": l}))
                .collect(),
        ))
    }

    fn storage_list(&self, req: &Request) -> Value {
        let content = req.opt("content");
        let only = req.opt("storage");
        let node = req.opt("node").unwrap_or_default();
        Value::Array(
            self.cfg
                .storages
                .iter()
                .filter(|s| content.as_ref().is_none_or(|c| s.content.contains(c)))
                .filter(|s| only.as_ref().is_none_or(|o| *o == s.id))
                .map(|s| {
                    let used = self.storage_used(&node, s);
                    json!({"storage": s.id, "type": s.kind, "content": s.content.join(","), "active": 1,
                        "enabled": 1, "shared": u8::from(s.shared), "total": s.total, "used": used,
                        "avail": s.total.saturating_sub(used),
                        "used_fraction": used as f64 / s.total.max(1) as f64})
                })
                .collect(),
        )
    }

    fn content_list(&self, req: &Request) -> ApiResult {
        let node = req.req("node")?;
        let storage = req.req("storage")?;
        let spec = self
            .storage(&storage)
            .ok_or_else(|| ApiError::internal(format!("storage '{storage}' does not exist")))?;
        let filter = req.opt("content");
        let mut out = Vec::new();
        if let Some(vols) = self.volumes.get(&(node.clone(), storage.clone())) {
            for (name, v) in vols {
                out.push(
                    json!({"volid": format!("{storage}:{name}"), "content": v.content, "format": v.format,
                    "size": v.size, "ctime": v.ctime}),
                );
            }
        }
        if spec.content.iter().any(|c| c == "images") {
            for (vmid, vm) in self.vms.iter().filter(|(_, vm)| vm.node == node) {
                for (k, v) in vm.config.iter().filter(|(k, v)| is_disk_key(k) && !is_cdrom(v)) {
                    let _ = k;
                    let file = v.split(',').next().unwrap_or_default();
                    if let Some((s, vol)) = file.split_once(':')
                        && s == storage
                    {
                        out.push(json!({"volid": file, "content": "images", "format": "raw",
                            "size": disk_size(v), "vmid": vmid, "ctime": 0, "name": vol}));
                    }
                }
            }
        }
        out.retain(|v| filter.as_ref().is_none_or(|f| v["content"] == *f));
        Ok(Value::Array(out))
    }

    fn upload(&mut self, req: &Request) -> ApiResult {
        let node = req.req("node")?;
        let storage = req.req("storage")?;
        let content = req.req("content")?;
        let filename = req.req("filename")?;
        let spec = self
            .storage(&storage)
            .ok_or_else(|| ApiError::internal(format!("storage '{storage}' does not exist")))?;
        if !spec.content.contains(&content) {
            return Err(ApiError::internal(format!(
                "storage '{storage}' does not support content type '{content}'"
            )));
        }
        let data = req
            .upload
            .clone()
            .ok_or_else(|| ApiError::param("filename", "no file uploaded"))?;
        let (dir, ok_ext) = images::content_dir(&content);
        let clean = images::normalize_filename(&filename);
        if !ok_ext.iter().any(|e| clean.to_lowercase().ends_with(e)) {
            return Err(ApiError::internal("wrong file extension"));
        }
        let seed = if content == "iso" {
            iso::read_image(&data).ok()
        } else {
            None
        };
        let name = format!("{dir}/{clean}");
        let volume = Volume {
            size: data.len() as u64,
            content: content.clone(),
            format: dir.to_owned(),
            ctime: unix_now(),
            seed,
        };
        let log = vec![
            format!(
                "starting file import from: /var/tmp/pveupload-{:x}",
                self.next_pid
            ),
            format!("target node: {node}"),
            format!("target file: /var/lib/vz/template/{name}"),
            format!("file size is: {}", data.len()),
        ];
        let action = Action::StoreVolume {
            node: node.clone(),
            storage,
            name,
            volume,
        };
        Ok(json!(self.new_task(req, &node, "imgcopy", "", Some(action), log)))
    }

    fn delete_volume(&mut self, req: &Request) -> ApiResult {
        let node = req.req("node")?;
        let storage = req.req("storage")?;
        let volume = req.req("volume")?;
        self.storage(&storage)
            .ok_or_else(|| ApiError::internal(format!("storage '{storage}' does not exist")))?;
        let name = match volume.split_once(':') {
            Some((s, n)) if s == storage => n.to_owned(),
            Some((s, _)) => {
                return Err(ApiError::internal(format!(
                    "volume '{volume}' is not on storage '{s}'"
                )));
            }
            None => volume.clone(),
        };
        let exists = self
            .volumes
            .get(&(node.clone(), storage.clone()))
            .is_some_and(|v| v.contains_key(&name));
        if !exists {
            return Err(ApiError::internal(format!(
                "volume '{storage}:{name}' does not exist"
            )));
        }
        let log = vec![format!("removing volume {storage}:{name}")];
        let action = Action::DeleteVolume {
            node: node.clone(),
            storage: storage.clone(),
            name: name.clone(),
        };
        Ok(json!(self.new_task(
            req,
            &node,
            "imgdel",
            &format!("{storage}:{name}"),
            Some(action),
            log
        )))
    }

    fn pool_members(&self, pool: &str) -> Vec<Value> {
        self.vms
            .iter()
            .filter(|(_, vm)| vm.pool.as_deref() == Some(pool))
            .map(|(vmid, vm)| {
                let mut m = self.vm_summary(*vmid, vm);
                m.insert("id".into(), json!(format!("qemu/{vmid}")));
                m.insert("type".into(), json!("qemu"));
                m.insert("node".into(), json!(vm.node));
                Value::Object(m)
            })
            .collect()
    }

    fn pools_get(&self, only: Option<&str>) -> ApiResult {
        if let Some(p) = only
            && !self.pools.contains_key(p)
        {
            return Err(ApiError::internal(format!("pool '{p}' does not exist")));
        }
        Ok(Value::Array(
            self.pools
                .iter()
                .filter(|(id, _)| only.is_none_or(|o| o == id.as_str()))
                .map(|(id, comment)| {
                    let mut v = json!({"poolid": id});
                    if !comment.is_empty() {
                        v["comment"] = json!(comment);
                    }
                    if only.is_some() {
                        v["members"] = Value::Array(self.pool_members(id));
                    }
                    v
                })
                .collect(),
        ))
    }

    fn pool_get(&self, id: &str) -> ApiResult {
        let comment = self
            .pools
            .get(id)
            .ok_or_else(|| ApiError::internal(format!("pool '{id}' does not exist")))?;
        let mut v = json!({"members": self.pool_members(id)});
        if !comment.is_empty() {
            v["comment"] = json!(comment);
        }
        Ok(v)
    }

    fn pool_create(&mut self, req: &Request) -> ApiResult {
        let id = req.req("poolid")?;
        if self.pools.contains_key(&id) {
            return Err(ApiError::internal(format!(
                "create pool failed: pool '{id}' already exists"
            )));
        }
        self.pools.insert(id, req.opt("comment").unwrap_or_default());
        Ok(Value::Null)
    }

    fn pool_update(&mut self, req: &Request) -> ApiResult {
        let id = req.req("poolid")?;
        if !self.pools.contains_key(&id) {
            return Err(ApiError::internal(format!("pool '{id}' does not exist")));
        }
        if let Some(c) = req.opt("comment") {
            self.pools.insert(id.clone(), c);
        }
        let remove = req.flag("delete") == Some(true);
        for vm in split_list(&req.opt("vms").unwrap_or_default()) {
            let vmid: u32 = vm
                .parse()
                .map_err(|_| ApiError::param("vms", format!("invalid vmid '{vm}'")))?;
            let entry = self
                .vms
                .get_mut(&vmid)
                .ok_or_else(|| ApiError::internal(format!("no such VMID '{vmid}'")))?;
            if remove {
                entry.pool = None;
            } else if entry.pool.as_ref().is_some_and(|p| *p != id) && req.flag("allow-move") != Some(true) {
                return Err(ApiError::internal(format!(
                    "VM {vmid} belongs already to pool '{}'",
                    entry.pool.clone().unwrap_or_default()
                )));
            } else {
                entry.pool = Some(id.clone());
            }
        }
        Ok(Value::Null)
    }

    fn pool_delete(&mut self, req: &Request) -> ApiResult {
        let id = req.req("poolid")?;
        if !self.pools.contains_key(&id) {
            return Err(ApiError::internal(format!("pool '{id}' does not exist")));
        }
        if self
            .vms
            .values()
            .any(|vm| vm.pool.as_deref() == Some(id.as_str()))
        {
            return Err(ApiError::internal(
                "pool is not empty (includes guests or storages)".to_string(),
            ));
        }
        self.pools.remove(&id);
        Ok(Value::Null)
    }
}

/// The config with the pending changes applied.
fn with_pending(vm: &Vm) -> BTreeMap<String, String> {
    let mut config = vm.config.clone();
    for (k, v) in &vm.pending {
        match v {
            Some(v) => config.insert(k.clone(), v.clone()),
            None => config.remove(k),
        };
    }
    config
}

/// Whether PVE applies a change of `key` to a running VM at once
/// (`QemuServer.pm::vmconfig_hotplug_pending`, REAL-PVE.md R5): CPU topology never; memory and
/// NICs only with `memory`/`network` in the VM's `hotplug` (default `network,disk,usb`); the
/// removal of an IDE or SATA drive never; the rest (tags, a cdrom's medium, new disks, …) yes.
fn hot_pluggable(config: &BTreeMap<String, String>, key: &str, deletion: bool) -> bool {
    let hotplug = match config.get("hotplug").map(String::as_str) {
        None | Some("1") => "network,disk,usb",
        Some("0") => "",
        Some(list) => list,
    };
    let enabled = |feature: &str| hotplug.split(',').any(|f| f == feature);
    let drive = |prefix: &str| {
        key.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    match key {
        "cores" | "sockets" => false,
        "memory" => enabled("memory"),
        _ if is_net_key(key) => enabled("network"),
        _ if deletion && (drive("ide") || drive("sata")) => false,
        _ => true,
    }
}

fn vm_info(vmid: u32, vm: &Vm) -> VmInfo {
    VmInfo {
        vmid,
        node: vm.node.clone(),
        name: vm.config.get("name").cloned(),
        config: vm.config.clone(),
        running: vm.running,
        template: vm.config.get("template").is_some_and(|t| t == "1"),
        lock: vm.config.get("lock").cloned(),
        pool: vm.pool.clone(),
        ip: vm.ip,
        pending: vm.pending.clone(),
    }
}

fn agent_enabled(value: &str) -> bool {
    value.split(',').any(|p| p == "1" || p == "enabled=1")
}

fn is_nic_model(key: &str) -> bool {
    matches!(
        key,
        "virtio"
            | "e1000"
            | "e1000e"
            | "rtl8139"
            | "vmxnet3"
            | "ne2k_pci"
            | "ne2k_isa"
            | "pcnet"
            | "i82551"
            | "i82557b"
            | "i82559er"
            | "e1000-82540em"
            | "e1000-82544gc"
            | "e1000-82545em"
    )
}

fn net_mac(value: &str) -> Option<String> {
    value.split(',').find_map(|p| match p.split_once('=') {
        Some(("macaddr", m)) => Some(m.to_uppercase()),
        Some((k, m)) if is_nic_model(k) => Some(m.to_uppercase()),
        _ => None,
    })
}

/// `virtio=AA:..,bridge=vmbr0` → `virtio,bridge=vmbr0` (so a fresh MAC is generated).
fn strip_mac(value: &str) -> String {
    value
        .split(',')
        .filter(|p| !p.starts_with("macaddr="))
        .map(|p| match p.split_once('=') {
            Some((k, _)) if is_nic_model(k) => k.to_owned(),
            _ => p.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn static_ip(ipconfig: &str) -> Option<Ipv4Addr> {
    ipconfig
        .split(',')
        .find_map(|p| p.strip_prefix("ip="))
        .and_then(|ip| ip.split('/').next()?.parse().ok())
}

fn next_disk_index(config: &BTreeMap<String, String>, vmid: u32) -> u32 {
    let prefix = format!("vm-{vmid}-disk-");
    config
        .values()
        .filter_map(|v| {
            v.split(',')
                .next()?
                .split_once(':')
                .map(|(_, vol)| vol.rsplit('/').next().unwrap_or(vol).to_owned())
        })
        .filter_map(|vol| vol.strip_prefix(&prefix).and_then(|n| n.parse::<u32>().ok()))
        .map(|n| n + 1)
        .max()
        .unwrap_or(0)
}

fn config_digest(config: &BTreeMap<String, String>) -> String {
    let mut h = Sha256::new();
    for (k, v) in config {
        h.update(k.as_bytes());
        h.update(b": ");
        h.update(v.as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())[..40].to_owned()
}

fn describe_params(params: &BTreeMap<String, Value>) -> String {
    params
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "node" | "vmid" | "cipassword" | "sshkeys"))
        .map(|(k, v)| format!("-{k} {}", value_text(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("+10G"), Some((true, 10 << 30)));
        assert_eq!(parse_size("32G"), Some((false, 32 << 30)));
        assert_eq!(parse_size("1.5G"), Some((false, 3 << 29)));
        assert_eq!(parse_size("x"), None);
        assert_eq!(format_size(42 << 30), "42G");
        assert_eq!(format_size(1536 << 20), "1536M");
        assert_eq!(
            with_size("local-lvm:vm-1-disk-0,size=8G,discard=on", 10 << 30),
            "local-lvm:vm-1-disk-0,discard=on,size=10G"
        );
    }

    #[test]
    fn tags_are_normalised() {
        assert_eq!(normalize_tags("Web, db;web  Alpha"), "alpha;db;web");
    }

    #[test]
    fn a_vm_tells_its_nic_mac_and_smbios_uuid() {
        let vm = VmInfo {
            vmid: 100,
            node: "pve1".into(),
            name: None,
            config: [
                ("net0", "virtio=BC:24:11:0A:0B:0C,bridge=vmbr0,firewall=1"),
                ("net1", "bridge=vmbr1"),
                (
                    "smbios1",
                    "uuid=6c1f3e7a-0d2b-4a59-9c1e-5f0c2b9a9000,manufacturer=QEMU",
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
            running: false,
            template: false,
            lock: None,
            pool: None,
            ip: None,
            pending: BTreeMap::new(),
        };
        assert_eq!(vm.mac("net0").as_deref(), Some("bc:24:11:0a:0b:0c"));
        assert_eq!(vm.mac("net1"), None);
        assert_eq!(vm.mac("net2"), None);
        assert_eq!(vm.smbios_uuid(), Some("6c1f3e7a-0d2b-4a59-9c1e-5f0c2b9a9000"));
    }

    #[test]
    fn mac_stripping() {
        assert_eq!(
            strip_mac("virtio=BC:24:11:00:90:00,bridge=vmbr0"),
            "virtio,bridge=vmbr0"
        );
        assert_eq!(
            net_mac("virtio=bc:24:11:00:90:00,bridge=vmbr0").as_deref(),
            Some("BC:24:11:00:90:00")
        );
    }
}
