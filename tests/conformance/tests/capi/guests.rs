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
    let note = |line: String| {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&log) {
            let _ = writeln!(f, "[{:7.1}s] {line}", started.elapsed().as_secs_f32());
        }
    };
    loop {
        step(&sim, &lab, &image, &dir, &guests, &note);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One look at the simulator's VMs: guests powered on and off, guest agents' reports.
fn step(sim: &SimHandle, lab: &Lab, image: &Path, dir: &Path, guests: &Guests, note: &dyn Fn(String)) {
    let vms: BTreeMap<u32, _> = sim
        .vms()
        .into_iter()
        .filter(|vm| !vm.template)
        .map(|vm| (vm.vmid, vm))
        .collect();
    let mut running = guests.lock().expect("guests lock");
    // Power off the guests of VMs that stopped or are gone.
    let stopped: Vec<u32> = running
        .keys()
        .filter(|vmid| !vms.get(vmid).is_some_and(|vm| vm.running))
        .copied()
        .collect();
    for vmid in stopped {
        running.remove(&vmid);
        note(format!("VM {vmid} stopped: guest powered off"));
    }
    for (vmid, vm) in &vms {
        if !vm.running || running.contains_key(vmid) {
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
                running.insert(*vmid, guest);
            }
            Err(e) => note(format!("VM {vmid}: powering its guest on failed: {e}")),
        }
    }
    // The guest agents: what each guest's network has now.
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
