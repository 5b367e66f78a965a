//! Real guests for the Proxmox simulator: every VM the simulator runs is booted as a lab guest
//! (`banlieue_testenv::guests`) from the lab guest image, with the NIC a Proxmox guest names
//! `ens18`, the MAC of the VM's `net0` and, as its seed drive, the NoCloud ISO the provider
//! uploaded, byte for byte as the simulator stores it. What the guest's network really has is
//! what its guest agent reports (`SimHandle::report_guest_interfaces`). A VM that stops, or is
//! destroyed, powers its guest off.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use banlieue_pve_sim::{GuestInterface, SimHandle};
use banlieue_testenv::guests::{Guest, GuestSpec, Lab};

/// The NIC name of a virtio NIC in slot 18, as Debian and Ubuntu guests of Proxmox name it (the
/// cluster template's `KUBE_VIP_INTERFACE` default).
const PROXMOX_NIC: &str = "ens18";

/// The running guests by VMID, shared with the test (which reads their logs on failure).
pub type Guests = Arc<Mutex<BTreeMap<u32, Guest>>>;

/// The MAC of a `net0` value (`virtio=BC:24:11:…,bridge=vmbr0`).
fn mac_of(net: &str) -> Option<String> {
    net.split(',')
        .filter_map(|part| part.split_once('='))
        .find(|(model, value)| {
            matches!(*model, "virtio" | "e1000" | "e1000e" | "rtl8139" | "vmxnet3") && value.len() == 17
        })
        .map(|(_, mac)| mac.to_lowercase())
}

/// Keeps the guests in step with the simulator's VMs until the task is aborted; `log` gets one
/// line per power change and per problem.
pub async fn drive(
    sim: Arc<SimHandle>,
    lab: Arc<Lab>,
    image: PathBuf,
    dir: PathBuf,
    guests: Guests,
    log: PathBuf,
) {
    let started = Instant::now();
    let note = move |line: String| {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&log) {
            let _ = writeln!(f, "[{:7.1}s] {line}", started.elapsed().as_secs_f32());
        }
    };
    let mut retries = Retries::default();
    loop {
        // Powering guests on and off waits for processes and runs `ip`: off the runtime's
        // workers, which also serve the simulator.
        let work = {
            let (sim, lab, image, dir, guests) = (
                sim.clone(),
                lab.clone(),
                image.clone(),
                dir.clone(),
                guests.clone(),
            );
            let mut retries = std::mem::take(&mut retries);
            let note = note.clone();
            tokio::task::spawn_blocking(move || {
                step(&sim, &lab, &image, &dir, &guests, &mut retries, &note);
                retries
            })
        };
        match work.await {
            Ok(kept) => retries = kept,
            Err(e) => note(format!("the guest driver's step failed: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// VMs whose guest failed to power on, and when to try again (the wait doubles per failure, up
/// to 30 s).
#[derive(Default)]
struct Retries(BTreeMap<u32, (u32, Instant)>);

impl Retries {
    fn due(&self, vmid: u32) -> bool {
        self.0.get(&vmid).is_none_or(|(_, at)| Instant::now() >= *at)
    }

    fn failed(&mut self, vmid: u32) {
        let failures = self.0.get(&vmid).map_or(1, |(n, _)| n + 1);
        let wait = Duration::from_millis(500) * 2u32.saturating_pow(failures.min(6));
        self.0.insert(
            vmid,
            (failures, Instant::now() + wait.min(Duration::from_secs(30))),
        );
    }
}

/// One look at the simulator's VMs: guests powered on and off, guest agents' reports.
fn step(
    sim: &SimHandle,
    lab: &Lab,
    image: &Path,
    dir: &Path,
    guests: &Guests,
    retries: &mut Retries,
    note: &dyn Fn(String),
) {
    let vms: BTreeMap<u32, _> = sim
        .vms()
        .into_iter()
        .filter(|vm| !vm.template)
        .map(|vm| (vm.vmid, vm))
        .collect();
    // Power off the guests of VMs that stopped or are gone (outside the lock: it waits for
    // the guest's processes to end).
    let stopped: Vec<(u32, Guest)> = {
        let mut running = guests.lock().expect("guests lock");
        let vmids: Vec<u32> = running
            .keys()
            .filter(|vmid| !vms.get(vmid).is_some_and(|vm| vm.running))
            .copied()
            .collect();
        vmids
            .into_iter()
            .filter_map(|vmid| Some((vmid, running.remove(&vmid)?)))
            .collect()
    };
    for (vmid, guest) in stopped {
        drop(guest);
        note(format!("VM {vmid} stopped: guest powered off"));
    }
    for (vmid, vm) in &vms {
        if !vm.running || guests.lock().expect("guests lock").contains_key(vmid) || !retries.due(*vmid) {
            continue;
        }
        let Some(mac) = vm.config.get("net0").and_then(|n| mac_of(n)) else {
            note(format!("VM {vmid} runs without a net0 MAC: not booted"));
            continue;
        };
        let seed = sim.seed(*vmid).map(|s| s.image).filter(|i| !i.is_empty());
        let spec = GuestSpec {
            name: vmid.to_string(),
            nic: PROXMOX_NIC.to_owned(),
            mac: mac.clone(),
            seed,
        };
        // One disk per VM: a VMID PVE hands out again after a deletion is another VM (its SMBIOS
        // uuid tells), while a VM started again keeps its disk.
        let uuid = vm
            .config
            .get("smbios1")
            .and_then(|s| s.split(',').find_map(|p| p.strip_prefix("uuid=")))
            .unwrap_or("no-uuid");
        match Guest::power_on(lab, image, &dir.join(format!("{vmid}-{uuid}")), &spec) {
            Ok(guest) => {
                note(format!(
                    "VM {vmid} started: guest powered on ({PROXMOX_NIC} {mac}, seed {})",
                    if spec.seed.is_some() { "ISO" } else { "none" }
                ));
                guests.lock().expect("guests lock").insert(*vmid, guest);
            }
            Err(e) => {
                retries.failed(*vmid);
                note(format!("VM {vmid}: powering its guest on failed: {e}"));
            }
        }
    }
    // The guest agents: what each guest's network has now.
    let mut running = guests.lock().expect("guests lock");
    for (vmid, guest) in running.iter_mut() {
        if !guest.is_running() {
            continue;
        }
        let Ok(nics) = guest.interfaces() else { continue };
        let interfaces = nics
            .into_iter()
            .map(|nic| GuestInterface {
                name: nic.name,
                mac: nic.mac,
                addresses: nic.addresses,
            })
            .collect();
        if let Err(e) = sim.report_guest_interfaces(*vmid, interfaces) {
            note(format!("VM {vmid}: guest agent report refused: {e}"));
        }
    }
}

#[test]
fn the_mac_comes_from_the_nic_model() {
    assert_eq!(
        mac_of("virtio=BC:24:11:0A:0B:0C,bridge=vmbr0,firewall=1").as_deref(),
        Some("bc:24:11:0a:0b:0c")
    );
    assert_eq!(mac_of("bridge=vmbr0"), None);
}
