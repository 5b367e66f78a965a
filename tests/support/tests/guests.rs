//! A lab guest keeps its disk across a power cycle, as a VM does: powered off and on again from
//! the same folder, it boots from the same writes (kubelet's and containerd's folders included),
//! and cloud-init, finding the first boot's record of the instance, does not run its first-boot
//! commands again. A deleted VM's disk is discarded, its logs kept.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use banlieue_testenv::guests::{Guest, GuestSpec, Lab, Smbios, guest_image};

const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

/// A NoCloud seed drive (`cidata`) with this user data, made as users make one (genisoimage).
fn seed_drive(dir: &Path, user_data: &str) -> Result<Vec<u8>> {
    let files = dir.join("seed-files");
    std::fs::create_dir_all(&files)?;
    std::fs::write(
        files.join("meta-data"),
        "instance-id: i-reboot-1\nlocal-hostname: reboot-1\n",
    )?;
    std::fs::write(files.join("user-data"), user_data)?;
    let iso = dir.join("seed-source.iso");
    let output = Command::new("genisoimage")
        .args(["-quiet", "-output"])
        .arg(&iso)
        .args(["-volid", "cidata", "-joliet", "-rock"])
        .arg(files.join("user-data"))
        .arg(files.join("meta-data"))
        .output()
        .context("running genisoimage (Debian's genisoimage package)")?;
    ensure!(
        output.status.success(),
        "genisoimage: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(std::fs::read(&iso)?)
}

/// Waits until the guest's console says its boot finished.
fn wait_for_boot(guest: &mut Guest) -> Result<()> {
    let deadline = Instant::now() + BOOT_TIMEOUT;
    loop {
        if guest.console_tail(400).contains("boot finished") {
            return Ok(());
        }
        if !guest.is_running() || Instant::now() > deadline {
            bail!("the guest did not finish booting:\n{}", guest.boot_report(60));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn a_guest_powered_off_and_on_again_boots_from_the_same_disk() -> Result<()> {
    let image = guest_image()?;
    let lab = Lab::create()?;
    let work = tempfile::tempdir()?;
    let dir = work.path().join("guest");
    // First boot only (cloud-init's runcmd runs once per instance): a mark in kubelet's folder,
    // one line per run in a count on the disk.
    let user_data = "#cloud-config\nruncmd:\n  - [sh, -c, 'date +%s%N > /var/lib/kubelet/first-boot; echo run >> /var/lib/runcmd-runs']\n";
    let spec = GuestSpec {
        name: "reboot-1".to_owned(),
        nic: "ens18".to_owned(),
        mac: "bc:24:11:5e:00:01".to_owned(),
        seed: Some(seed_drive(work.path(), user_data)?),
        smbios: Some(Smbios {
            vendor: "QEMU".to_owned(),
            product: "Standard PC (i440FX + PIIX, 1996)".to_owned(),
            uuid: "5f0c3a1e-7d2b-4c9a-9e61-0a8b2c4d6e01".to_owned(),
        }),
        guestinfo: Default::default(),
        kubernetes: None,
    };
    let mark = dir.join("kubelet/first-boot");
    let runs = dir.join("disk/var/lib/runcmd-runs");

    let mut guest = Guest::power_on(&lab, &image, &dir, &spec)?;
    wait_for_boot(&mut guest)?;
    let first_mark = std::fs::read_to_string(&mark).context("the first boot's mark in kubelet's folder")?;
    drop(guest);
    ensure!(
        std::fs::read_to_string(&mark)? == first_mark,
        "powered off, the guest keeps kubelet's folder"
    );
    ensure!(
        dir.join("containerd").read_dir()?.next().is_some(),
        "powered off, the guest keeps containerd's folder"
    );

    let mut guest = Guest::power_on(&lab, &image, &dir, &spec)?;
    wait_for_boot(&mut guest)?;
    ensure!(
        std::fs::read_to_string(&mark)? == first_mark,
        "the second boot sees the first boot's mark in kubelet's folder"
    );
    let count = std::fs::read_to_string(&runs)?;
    ensure!(
        count.lines().count() == 1,
        "cloud-init ran the first-boot commands once, not at every boot: {count:?}"
    );
    drop(guest);

    Guest::discard_disk(&dir);
    ensure!(
        !dir.join("kubelet").exists() && !dir.join("containerd").exists(),
        "a deleted VM's disk is discarded"
    );
    ensure!(runs.exists(), "its logs and writes under disk/ stay");
    Ok(())
}
