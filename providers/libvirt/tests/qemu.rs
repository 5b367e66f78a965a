//! The one slow test: a real domain on `qemu:///system` (libvirtd started by
//! `providers/libvirt/ci/start-libvirtd.sh`, in its own network namespace, isolated network
//! `banlieue-test`), domain type `qemu` (TCG). The guest is Debian's kernel with a busybox
//! initramfs built by `tests/guest/build.sh`; provisioning creates the overlay boot disk and
//! the seed volume through the real daemon, the guest gets a DHCP lease (the address the
//! provider reports) and prints the seed's meta-data, the sha256 of its user-data and the
//! output of the user-data script (among it the size of its data disk) to its serial console,
//! which libvirt logs to a file. Then the
//! running guest is reconfigured (more cores and memory): the guest has no ACPI handling, so it
//! is powered off hard after the shutdown timeout, redefined and started, with the same domain
//! and boot disk.
//!
//! Without a reachable daemon the test is skipped with a message, except under CI (`CI` set),
//! where `.ci/run` starts the daemon and a skip would hide a broken set-up.

#![cfg(feature = "libvirt")]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_api::common::{MachineAddressType, PowerState};
use banlieue_api::infrastructure::LibvirtMachineSpec;
use banlieue_libvirt::connection::VirtHypervisor;
use banlieue_libvirt::desired::Settings;
use banlieue_libvirt::hypervisor::{Hypervisor, RunState};
use banlieue_libvirt::phase::Phase;
use banlieue_libvirt::provision::{self, Host, MachineInput};
use banlieue_libvirt::update;
use banlieue_libvirt::xml::{self, DomainType, KernelBoot, Owner};
use sha2::{Digest, Sha256};

/// The image imports of the provider process these tests stand for.
static IMPORTS: std::sync::LazyLock<banlieue_provider_kit::image::Imports> =
    std::sync::LazyLock::new(Default::default);

static NO_POOL: banlieue_provider_kit::network::PoolAddresses =
    banlieue_provider_kit::network::PoolAddresses::new();
const URI: &str = "qemu:///system";
const POOL: &str = "default";
const NETWORK: &str = "banlieue-test";
const BOOT_DIR: &str = "/var/lib/libvirt/boot/banlieue-test";
const SERIAL_DIR: &str = "/var/log/libvirt/qemu";

fn pseudo_uuid() -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let h = format!("{:032x}", n ^ (u128::from(std::process::id()) << 64));
    format!(
        "{}-{}-4{}-8{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// The daemon at [`URI`]; `None` (the test is skipped, with a message) without one, except
/// under CI (`CI` set), where `.ci/run` starts it and a skip would hide a broken set-up.
async fn daemon() -> Option<Arc<VirtHypervisor>> {
    let hv = Arc::new(VirtHypervisor::new(URI));
    match hv.host_info().await {
        Ok(_) => Some(hv),
        Err(e) if std::env::var_os("CI").is_some() => {
            panic!("libvirtd must run under CI (providers/libvirt/ci/start-libvirtd.sh): {e}")
        }
        Err(e) => {
            eprintln!(
                "SKIPPED: no libvirt daemon at {URI} ({e}); run providers/libvirt/ci/start-libvirtd.sh as root"
            );
            None
        }
    }
}

#[tokio::test]
async fn a_tiny_guest_boots_under_tcg_gets_a_lease_and_runs_its_user_data() {
    let Some(hv) = daemon().await else { return };
    let base = guest_and_base_volume(&hv).await;

    let uid = pseudo_uuid();
    let owner = Owner {
        uid: uid.clone(),
        namespace: "qemu-test".into(),
        // The uid's last digits: its first 8 are always 0 (the clock's nanoseconds fit in 96
        // bits), which would give every run the same domain name.
        name: format!("tiny-{}", &uid[28..]),
    };
    let spec: LibvirtMachineSpec = serde_json::from_value(serde_json::json!({
        "source": {"volume": base, "pool": POOL},
        "cpu": {"cores": 1},
        "memoryMiB": 256,
        "disks": [{"name": "root", "sizeGiB": 1}, {"name": "data", "sizeGiB": 2}],
        "networks": [{"name": "eth0", "network": NETWORK}],
    }))
    .unwrap();
    let settings = tcg_settings();
    let token = format!("token-{}", &uid[24..]);
    // The guest also says what its second disk (the data disk, virtio `vdb`) holds: its size
    // in 512-byte sectors.
    let user_data = format!(
        "#!/bin/sh\necho \"BANLIEUE user-data says {token}\"\necho \"BANLIEUE data disk sectors $(cat /sys/block/vdb/size)\"\n"
    );
    let input = machine_input(&owner, &spec, &uid, &settings);
    let hosts = [Host {
        name: "localhost".into(),
        uri: URI.into(),
        hv: hv.clone(),
    }];

    let (phase, done) = provision_until_lease(&hosts, &input, &user_data).await;
    assert_eq!(done.provider_id, format!("libvirt://localhost/{uid}"));
    let ip = (done.addresses.iter().flatten())
        .find(|a| a.type_ == MachineAddressType::InternalIP)
        .expect("an InternalIP")
        .address
        .clone();
    assert!(ip.starts_with("10.213.0."), "{ip} is not on {NETWORK}");

    let domain = format!("{}_{}", owner.namespace, owner.name);
    let (log_path, log) = serial_log_until_ready(&domain).await;
    let digest = hex::encode(Sha256::digest(user_data.as_bytes()));

    // Reconfigure the running guest (1 → 2 cores, 256 → 384 MiB), a restart allowed: shutdown,
    // redefine, start; the same domain and disks, never a re-clone. This busybox guest has no
    // acpid, so it ignores the ACPI shutdown like a hung guest: the provider powers it off hard
    // once the first request is `SHUTDOWN_TIMEOUT` old. The first request is backdated by 110 s so the
    // test waits ~10 s of real time for that, not 120.
    let mut bigger = spec.clone();
    bigger.cpu.cores = 2;
    bigger.memory_mib = 384;
    bigger.restart_policy = Some(banlieue_api::common::RestartPolicy::Automatic);
    let root = format!("{domain}-root.qcow2");
    let root_before = hv.volume(POOL, &root).await.unwrap();
    let mut reasons = Vec::new();
    let first_request = k8s_openapi::jiff::Timestamp::now()
        - k8s_openapi::jiff::SignedDuration::from_secs(update::SHUTDOWN_TIMEOUT.as_secs() as i64 - 10);
    let mut pending = Some(first_request);
    let started = Instant::now();
    let reconfigured = loop {
        let reconf = MachineInput {
            spec: &bigger,
            shutdown_requested_at: pending,
            ..input
        };
        match provision::provision(&hosts, &reconf, phase.clone(), None).await {
            Ok(step) => {
                reasons.extend(step.events.iter().map(|e| e.0));
                pending = step.found;
                if step.waiting.is_none() {
                    break Ok(());
                }
            }
            Err(e) => break Err(e.to_string()),
        }
        if started.elapsed() > Duration::from_secs(200) {
            break Err(format!("not reconfigured after 200 s: {reasons:?}"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    eprintln!(
        "reconfiguration (shutdown, redefine, start): {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let after = hv.domain_by_uuid(&uid).await.unwrap();
    let root_after = hv.volume(POOL, &root).await.unwrap();

    let cleanup = provision::delete(&*hv, &owner, &spec, &uid).await;
    reconfigured.expect("reconfiguration");
    assert_eq!(reasons, ["PoweredOffForcibly", "Reconfigured", "PoweredOn"]);
    let after = after.expect("the same domain");
    assert_eq!(after.state, RunState::Running);
    assert_eq!(after.sizing.map(|z| (z.cores, z.memory_mib)), Some((2, 384)));
    assert_eq!(root_after, root_before, "the boot disk is untouched");
    assert!(
        log.contains("BANLIEUE ready"),
        "guest did not finish; serial log:\n{log}"
    );
    assert!(
        log.contains(&format!("BANLIEUE address {ip}")),
        "serial log:\n{log}"
    );
    // Quoted when YAML 1.1 would read it as something else (a uuid starting with a digit).
    assert!(
        log.contains(&format!("instance-id: {uid}")) || log.contains(&format!("instance-id: \"{uid}\"")),
        "serial log:\n{log}"
    );
    assert!(
        log.contains(&format!("BANLIEUE user-data sha256 {digest}")),
        "serial log:\n{log}"
    );
    assert!(
        log.contains(&format!("BANLIEUE user-data says {token}")),
        "serial log:\n{log}"
    );
    assert!(
        log.contains(&format!("BANLIEUE data disk sectors {}", (2u64 << 30) / 512)),
        "the guest does not see a 2 GiB data disk; serial log:\n{log}"
    );

    let note = cleanup.expect("deletion");
    assert!(note.contains("destroyed and undefined"), "{note}");
    assert_eq!(hv.domain_by_uuid(&uid).await.unwrap(), None);
    assert_eq!(
        hv.volume(POOL, &format!("{domain}-root.qcow2")).await.unwrap(),
        None
    );
    assert_eq!(
        hv.volume(POOL, &format!("{domain}-seed.iso")).await.unwrap(),
        None
    );
    assert_eq!(
        hv.volume(POOL, &format!("{domain}-data.qcow2")).await.unwrap(),
        None,
        "the data disk is deleted with the machine"
    );
    let _ = std::fs::remove_file(&log_path);
}

/// A machine given UEFI firmware and a TPM boots on OVMF (libvirt's firmware auto-selection,
/// Debian's `ovmf`) with an emulated TPM 2.0 (`swtpm`): the guest sees EFI and the TPM, and
/// deleting the machine removes the domain with its NVRAM and TPM state.
#[tokio::test]
async fn a_guest_given_uefi_firmware_and_a_tpm_sees_both() {
    let Some(hv) = daemon().await else { return };
    let base = guest_and_base_volume(&hv).await;
    let uid = pseudo_uuid();
    let owner = Owner {
        uid: uid.clone(),
        namespace: "qemu-test".into(),
        name: format!("efi-{}", &uid[28..]),
    };
    let spec: LibvirtMachineSpec = serde_json::from_value(serde_json::json!({
        "source": {"volume": base, "pool": POOL},
        "cpu": {"cores": 1},
        "memoryMiB": 256,
        "firmware": "UEFI",
        "tpm": true,
        "networks": [{"name": "eth0", "network": NETWORK}],
    }))
    .unwrap();
    let settings = tcg_settings();
    let user_data = "#!/bin/sh\n\
        [ -d /sys/firmware/efi ] && echo \"BANLIEUE firmware efi $(cat /sys/firmware/efi/fw_platform_size)\"\n\
        [ -e /sys/class/tpm/tpm0 ] && echo \"BANLIEUE tpm version $(cat /sys/class/tpm/tpm0/tpm_version_major)\"\n";
    let input = machine_input(&owner, &spec, &uid, &settings);
    let hosts = [Host {
        name: "localhost".into(),
        uri: URI.into(),
        hv: hv.clone(),
    }];
    let booted = tokio::time::timeout(Duration::from_secs(400), async {
        provision_until_lease(&hosts, &input, user_data).await;
        serial_log_until_ready(&format!("{}_{}", owner.namespace, owner.name)).await
    })
    .await;
    let cleanup = provision::delete(&*hv, &owner, &spec, &uid).await;
    let (log_path, log) = booted.expect("booted within 400 s");
    let _ = std::fs::remove_file(&log_path);
    assert!(
        log.contains("BANLIEUE firmware efi 64"),
        "the guest did not boot on UEFI; serial log:\n{log}"
    );
    assert!(
        log.contains("BANLIEUE tpm version 2"),
        "the guest sees no TPM 2.0; serial log:\n{log}"
    );
    let note = cleanup.expect("deletion");
    assert!(note.contains("destroyed and undefined"), "{note}");
    assert_eq!(hv.domain_by_uuid(&uid).await.unwrap(), None);
}

/// Builds the test guest (kernel + initramfs in [`BOOT_DIR`]) and makes sure its (empty) base
/// volume exists; returns the base volume's name.
async fn guest_and_base_volume(hv: &VirtHypervisor) -> &'static str {
    // One test at a time: the tests run in parallel and share the guest's files and volume.
    static ONE_AT_A_TIME: tokio::sync::Mutex<bool> = tokio::sync::Mutex::const_new(false);
    let mut built = ONE_AT_A_TIME.lock().await;
    if !*built {
        let build = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/guest/build.sh"))
            .arg(BOOT_DIR)
            .status()
            .expect("running tests/guest/build.sh");
        assert!(build.success(), "building the test guest failed");
        *built = true;
    }
    let base = "banlieue-test-base.qcow2";
    if hv.volume(POOL, base).await.unwrap().is_none() {
        hv.create_volume(POOL, &xml::plain_volume_xml(base, 64 << 20, "qcow2"))
            .await
            .unwrap();
    }
    base
}

/// What provisioning a machine of this process takes: powered on, no failure domain, no pool
/// addresses.
fn machine_input<'a>(
    owner: &'a Owner,
    spec: &'a LibvirtMachineSpec,
    uuid: &'a str,
    settings: &'a Settings,
) -> MachineInput<'a> {
    MachineInput {
        imports: &IMPORTS,
        owner,
        spec,
        uuid,
        failure_domain: None,
        settings,
        power: PowerState::On,
        shutdown_requested_at: None,
        pool_addresses: &NO_POOL,
        ask_cloud_init: true,
    }
}

/// TCG, the serial console logged under [`SERIAL_DIR`], the test guest booted directly.
fn tcg_settings() -> Settings {
    Settings {
        domain_type: DomainType::Qemu,
        serial_log_dir: Some(SERIAL_DIR.into()),
        kernel_boot: Some(KernelBoot {
            kernel: format!("{BOOT_DIR}/vmlinuz"),
            initrd: format!("{BOOT_DIR}/initrd.gz"),
            cmdline: "console=ttyS0 panic=-1".into(),
        }),
    }
}

/// Runs provisioning steps until the machine is provisioned (its guest has a lease); the last
/// phase and what was provisioned.
async fn provision_until_lease(
    hosts: &[Host<VirtHypervisor>],
    input: &MachineInput<'_>,
    user_data: &str,
) -> (Phase, banlieue_provider_kit::machine::Provisioned) {
    let started = Instant::now();
    let mut phase = Phase::SelectHost;
    loop {
        let data = phase.needs_bootstrap_data().then_some(user_data.as_bytes());
        let step = provision::provision(hosts, input, phase.clone(), data)
            .await
            .expect("provisioning step");
        phase = step.phase.clone().expect("phase");
        if let Some(done) = step.provisioned {
            // The busybox guest runs no QEMU guest agent: libvirt says the agent is not
            // connected, which is cloud-init not done yet (not an error).
            assert_eq!(
                step.cloud_init,
                Some(banlieue_provider_kit::cloud_init::CloudInit::Running),
                "cloud-init asked through the real daemon's agent channel"
            );
            eprintln!("boot to lease: {:.1} s", started.elapsed().as_secs_f64());
            return (phase, done);
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no lease after 300 s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The serial log of `domain` once the guest says `BANLIEUE ready` (or after 120 s), and its
/// path.
async fn serial_log_until_ready(domain: &str) -> (String, String) {
    let log_path = format!("{SERIAL_DIR}/{domain}.serial");
    let mut log = String::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !log.contains("BANLIEUE ready") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        log = std::fs::read_to_string(Path::new(&log_path)).unwrap_or_default();
    }
    (log_path, log)
}

/// An image served over HTTP is imported into the real `default` pool: the daemon accepts the
/// upload of a QCOW2 file into a QCOW2 volume and the copy to the final name (`qemu-img convert`
/// on a dir pool), the result has the image's virtual size and the same content, and the
/// staging volume is gone.
#[tokio::test]
async fn an_image_from_a_url_lands_in_a_real_pool_with_its_content() {
    use banlieue_libvirt::image_import::{self, Base};
    let Some(hv) = daemon().await else { return };
    // A QCOW2 image with content of this run's own (so that each run imports anew).
    let dir = tempfile::tempdir().unwrap();
    let (raw, served) = (dir.path().join("disk.raw"), dir.path().join("disk.qcow2"));
    let mut content = vec![0u8; 4 << 20];
    content[..36].copy_from_slice(pseudo_uuid().as_bytes());
    std::fs::write(&raw, &content).unwrap();
    let convert = Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&served)
        .status()
        .expect("running qemu-img");
    assert!(convert.success());
    let image = std::fs::read(&served).unwrap();
    let server = banlieue_testenv::files::FileServer::start([("/disk.qcow2".to_owned(), image.clone())])
        .await
        .unwrap();
    let source: banlieue_api::infrastructure::LibvirtVolumeSource =
        serde_json::from_value(serde_json::json!({
            "pool": POOL,
            "image": {
                "url": server.url("/disk.qcow2"),
                "checksumAlgorithm": "SHA256",
                "checksum": hex::encode(Sha256::digest(&image)),
            },
        }))
        .unwrap();
    let name = image_import::volume_name(source.image.as_ref().unwrap());

    let deadline = Instant::now() + Duration::from_secs(120);
    let imported = loop {
        match image_import::base_volume(&hv, ("h1", URI), &source, &IMPORTS, |e| panic!("{e}")).await {
            Ok(Base::Ready(v)) => break v,
            Ok(Base::Importing(how_far)) => {
                assert!(Instant::now() < deadline, "still importing after 120s: {how_far}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("import failed: {e:?}"),
        }
    };
    assert_eq!(imported.name, name);
    assert_eq!(imported.format, "qcow2");
    assert_eq!(imported.capacity, 4 << 20, "the image's virtual size");
    assert!(hv.volume(POOL, &format!("{name}.part")).await.unwrap().is_none());
    let compare = Command::new("qemu-img")
        .args(["compare", "-f", "qcow2", "-F", "qcow2"])
        .arg(&served)
        .arg(&imported.path)
        .output()
        .expect("running qemu-img compare");
    assert!(
        compare.status.success(),
        "the imported volume's content differs from the served image: {}",
        String::from_utf8_lossy(&compare.stdout)
    );
    assert_eq!(server.requests().len(), 1);
    hv.delete_volume(POOL, &name).await.unwrap();
}
