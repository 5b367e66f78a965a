//! Real guests for a simulated hypervisor: every VM the hypervisor runs (`Hypervisor::lab_vms`:
//! the Proxmox simulator, vcsim or libvirt's test driver) is booted as a lab guest (`banlieue_testenv::guests`) from the
//! lab guest image, with the NIC name its guest OS gives the VM's first NIC, that NIC's MAC, the
//! VM's SMBIOS uuid and what the VM carries for cloud-init: Proxmox and libvirt, the NoCloud ISO
//! the provider uploaded, byte for byte as the hypervisor stores it; vSphere, the VM's `guestinfo.*` values,
//! which the guest's `vmware-rpctool` serves to cloud-init's VMware datasource. What the guest's
//! network really has is what its agent reports (`Hypervisor::report_guest_addresses`). A VM that
//! stops, or is destroyed, powers its guest off.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use banlieue_testenv::guests::{Guest, GuestNic, GuestSpec, Lab, interfaces_in};

use super::hypervisor::{Hypervisor, LabVm};

/// The running guests by VM id, shared with the test (which reads their logs on failure).
pub type Guests = Arc<Mutex<BTreeMap<String, Guest>>>;

/// How often a guest agent's report is sent again although nothing changed (a hypervisor
/// forgets it when the VM restarts).
const REPORT_AGAIN: Duration = Duration::from_secs(10);

/// The running guest driver ([`drive`]): dropping it stops the driver and, once a step in
/// flight ended, powers no guest on any more.
pub struct Driver {
    task: tokio::task::JoinHandle<()>,
    stop: Arc<AtomicBool>,
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.abort();
    }
}

/// Starts keeping the guests in step with the hypervisor's VMs (see [`Driver`]); `log` gets one
/// line per power change and per problem.
pub fn drive(
    hv: Arc<Hypervisor>,
    lab: Arc<Lab>,
    image: PathBuf,
    dir: PathBuf,
    guests: Guests,
    log: PathBuf,
) -> Driver {
    let stop = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn(run(hv, lab, image, dir, guests, log, stop.clone()));
    Driver { task, stop }
}

async fn run(
    hv: Arc<Hypervisor>,
    lab: Arc<Lab>,
    image: PathBuf,
    dir: PathBuf,
    guests: Guests,
    log: PathBuf,
    stop: Arc<AtomicBool>,
) {
    let started = Instant::now();
    let note = move |line: String| {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&log) {
            let _ = writeln!(f, "[{:7.1}s] {line}", started.elapsed().as_secs_f32());
        }
    };
    let mut retries = Retries::default();
    let mut kept_disks = KeptDisks::default();
    // What each guest's agent reported last, and when.
    let mut reported: BTreeMap<String, (AgentView, Instant)> = BTreeMap::new();
    while !stop.load(Ordering::SeqCst) {
        match hv.lab_vms().await {
            Err(e) => note(format!("listing the hypervisor's VMs failed: {e:#}")),
            Ok(vms) => {
                // Powering guests on and off waits for processes and runs `ip`: off the runtime's
                // workers, which also serve the simulator.
                let work = {
                    let site = Site {
                        lab: lab.clone(),
                        image: image.clone(),
                        dir: dir.clone(),
                    };
                    let (guests, stop) = (guests.clone(), stop.clone());
                    let mut retries = std::mem::take(&mut retries);
                    let mut disks = std::mem::take(&mut kept_disks);
                    let note = note.clone();
                    tokio::task::spawn_blocking(move || {
                        let nics = step(&vms, &site, &guests, &mut retries, &mut disks, &stop, &note);
                        (retries, disks, nics)
                    })
                };
                match work.await {
                    Ok((kept, disks, nics)) => {
                        retries = kept;
                        kept_disks = disks;
                        reported.retain(|id, _| nics.contains_key(id));
                        for (id, nics) in nics {
                            if reported
                                .get(&id)
                                .is_some_and(|(last, at)| *last == nics && at.elapsed() < REPORT_AGAIN)
                            {
                                continue;
                            }
                            match hv.report_guest(&id, &nics).await {
                                Ok(()) => {
                                    reported.insert(id, (nics, Instant::now()));
                                }
                                Err(e) => note(format!("VM {id}: guest agent report refused: {e:#}")),
                            }
                        }
                    }
                    Err(e) => note(format!("the guest driver's step failed: {e}")),
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// VMs whose guest failed to power on, and when to try again (the wait doubles per failure, up
/// to 30 s).
#[derive(Default)]
struct Retries(BTreeMap<String, (u32, Instant)>);

impl Retries {
    fn due(&self, id: &str) -> bool {
        self.0.get(id).is_none_or(|(_, at)| Instant::now() >= *at)
    }

    fn failed(&mut self, id: &str) {
        let failures = self.0.get(id).map_or(1, |(n, _)| n + 1);
        let wait = Duration::from_millis(500) * 2u32.saturating_pow(failures.min(6));
        self.0.insert(
            id.to_owned(),
            (failures, Instant::now() + wait.min(Duration::from_secs(30))),
        );
    }

    fn succeeded(&mut self, id: &str) {
        self.0.remove(id);
    }

    /// Forgets VMs that are gone (an id handed out again is another VM).
    fn keep_only(&mut self, vms: &[LabVm]) {
        self.0.retain(|id, _| vms.iter().any(|vm| &vm.id == id));
    }
}

/// The folders of powered-off guests: their disks stay (a VM started again boots from its disk)
/// until their VM is deleted.
#[derive(Default)]
struct KeptDisks(std::collections::BTreeSet<PathBuf>);

impl KeptDisks {
    /// Discards the disks whose VM is gone (see [`Guest::discard_disk`]): no listed VM has their
    /// folder (a VM id handed out again after a deletion is another VM, with another folder).
    fn discard_gone(&mut self, vms: &[LabVm], site: &Site, note: &dyn Fn(String)) {
        let listed: std::collections::BTreeSet<PathBuf> = vms.iter().map(|vm| site.folder_of(vm)).collect();
        self.0.retain(|dir| {
            let exists = listed.contains(dir);
            if !exists {
                Guest::discard_disk(dir);
                note(format!("{}: VM gone, its disk discarded", dir.display()));
            }
            exists
        });
    }
}

/// Where guests boot: the lab network, the guest image, the folder of the guests' files.
struct Site {
    lab: Arc<Lab>,
    image: PathBuf,
    dir: PathBuf,
}

impl Site {
    /// The folder of `vm`'s guest, its disk: one per VM; an id the hypervisor hands out again
    /// after a deletion is another VM (its SMBIOS uuid tells), while a VM started again keeps
    /// its disk.
    fn folder_of(&self, vm: &LabVm) -> PathBuf {
        let uuid = vm.smbios.as_ref().map_or("no-uuid", |s| s.uuid.as_str());
        self.dir.join(format!("{}-{uuid}", vm.id))
    }
}

/// One look at the VMs: guests powered on and off; returns what each running guest's network
/// has (what its agent would report).
fn step(
    vms: &[LabVm],
    site: &Site,
    guests: &Guests,
    retries: &mut Retries,
    kept_disks: &mut KeptDisks,
    stop: &AtomicBool,
    note: &dyn Fn(String),
) -> BTreeMap<String, AgentView> {
    retries.keep_only(vms);
    let by_id: BTreeMap<&str, &LabVm> = vms.iter().map(|vm| (vm.id.as_str(), vm)).collect();
    // Power off the guests of VMs that stopped or are gone (outside the lock: it waits for
    // the guest's processes to end).
    let stopped: Vec<(String, Guest)> = {
        let mut running = guests.lock().expect("guests lock");
        let ids: Vec<String> = running
            .keys()
            .filter(|id| !by_id.get(id.as_str()).is_some_and(|vm| vm.running))
            .cloned()
            .collect();
        ids.into_iter()
            .filter_map(|id| {
                let guest = running.remove(&id)?;
                Some((id, guest))
            })
            .collect()
    };
    for (id, guest) in stopped {
        kept_disks.0.insert(guest.dir().to_owned());
        drop(guest);
        note(format!("VM {id} stopped: guest powered off"));
    }
    kept_disks.discard_gone(vms, site, note);
    for vm in vms {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        if !vm.running || guests.lock().expect("guests lock").contains_key(&vm.id) || !retries.due(&vm.id) {
            continue;
        }
        let Some(mac) = vm.mac.clone() else {
            note(format!("VM {} runs without a NIC MAC: not booted", vm.id));
            continue;
        };
        let spec = GuestSpec {
            name: vm.id.clone(),
            nic: vm.nic.to_owned(),
            mac: mac.clone(),
            seed: vm.seed.clone(),
            smbios: vm.smbios.clone(),
            guestinfo: vm.guestinfo.clone(),
            kubernetes: vm.kubernetes.clone(),
        };
        match Guest::power_on(&site.lab, &site.image, &site.folder_of(vm), &spec) {
            Ok(guest) => {
                note(format!(
                    "VM {} started: guest powered on ({} {mac}, {})",
                    vm.id,
                    vm.nic,
                    if spec.seed.is_some() {
                        "seed ISO".to_owned()
                    } else {
                        format!("{} guestinfo keys", spec.guestinfo.len())
                    }
                ));
                retries.succeeded(&vm.id);
                guests.lock().expect("guests lock").insert(vm.id.clone(), guest);
            }
            Err(e) => {
                retries.failed(&vm.id);
                note(format!("VM {}: powering its guest on failed: {e}", vm.id));
            }
        }
    }
    // The guest agents: what each running guest's network has now (read outside the lock), and
    // cloud-init's report once its last stage ran.
    type Running = (String, String, Option<String>, Option<String>);
    let running: Vec<Running> = guests
        .lock()
        .expect("guests lock")
        .iter_mut()
        .filter_map(|(id, guest)| {
            guest.is_running().then(|| {
                (
                    id.clone(),
                    guest.network_namespace().to_owned(),
                    guest.cloud_init_result(),
                    guest
                        .guestinfo_set(banlieue_vsphere::guest_report::REPORT_KEY)
                        .filter(|v| !v.is_empty()),
                )
            })
        })
        .collect();
    running
        .into_iter()
        .filter_map(|(id, netns, cloud_init, published)| {
            let nics = interfaces_in(&netns).ok()?;
            Some((
                id,
                AgentView {
                    nics,
                    cloud_init,
                    published,
                },
            ))
        })
        .collect()
}

/// What a running guest's agent can tell: its network, and cloud-init's report
/// (`/run/cloud-init/result.json`) once written.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentView {
    /// The guest's interfaces and addresses.
    pub nics: Vec<GuestNic>,
    /// cloud-init's report, once its last stage ran.
    pub cloud_init: Option<String>,
    /// What the guest published with `vmware-rpctool info-set` under the provider's report key
    /// (vSphere: the vendor data's script, once cloud-init ran), for vCenter to show.
    pub published: Option<String>,
}
