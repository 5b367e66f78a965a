//! Domain and volume lifecycle on libvirt's built-in `test:///default` driver (in-process, no
//! daemon): the generated XML is accepted, provisioning adopts instead of duplicating, and
//! deletion removes the domain and every volume.

#![cfg(feature = "libvirt")]

use std::sync::Arc;

use banlieue_api::common::PowerState;
use banlieue_api::infrastructure::LibvirtMachineSpec;
use banlieue_cloudinit::SeedFiles;
use banlieue_libvirt::connection::VirtHypervisor;
use banlieue_libvirt::desired::{self, Settings};
use banlieue_libvirt::hypervisor::{GuestAddress, Hypervisor, RunState};
use banlieue_libvirt::phase::Phase;
use banlieue_libvirt::provision::{self, Host, MachineInput, StepError};
use banlieue_libvirt::readopt::{self, OnDeletion};
use banlieue_libvirt::xml::{self, DomainType, Owner};
use banlieue_provider_kit::machine::Deleted;

/// The image imports of the provider process these tests stand for.
static IMPORTS: std::sync::LazyLock<banlieue_provider_kit::image::Imports> =
    std::sync::LazyLock::new(Default::default);

static NO_POOL: banlieue_provider_kit::network::PoolAddresses =
    banlieue_provider_kit::network::PoolAddresses::new();
const POOL: &str = "default-pool";

fn spec(disks: serde_json::Value) -> LibvirtMachineSpec {
    serde_json::from_value(serde_json::json!({
        "source": {"volume": "base.qcow2", "pool": POOL},
        "cpu": {"cores": 2, "sockets": 1},
        "memoryMiB": 512,
        "disks": disks,
        "networks": [{"name": "eth0", "network": "default"}],
    }))
    .unwrap()
}

fn owner(name: &str) -> Owner {
    Owner {
        uid: format!(
            "6f1b0b7e-1c7e-4a55-9d53-{:012x}",
            name.bytes().fold(0u64, |h, b| h * 131 + u64::from(b))
        ),
        namespace: "ns".into(),
        name: name.into(),
    }
}

/// The input of a machine owned by `owner`, uuid from its UID, no failure domain, powered on.
fn machine_input<'a>(
    owner: &'a Owner,
    spec: &'a LibvirtMachineSpec,
    settings: &'a Settings,
) -> MachineInput<'a> {
    MachineInput {
        imports: &IMPORTS,
        owner,
        spec,
        uuid: &owner.uid,
        failure_domain: None,
        settings,
        power: PowerState::On,
        shutdown_requested_at: None,
        pool_addresses: &NO_POOL,
        ask_cloud_init: true,
    }
}

async fn host_with_base() -> Host<VirtHypervisor> {
    // Connections of one process share the test driver's state while one stays open, and the
    // tests run in parallel: create the base volume once.
    let hv = Arc::new(VirtHypervisor::new("test:///default"));
    if hv.volume(POOL, "base.qcow2").await.unwrap().is_none() {
        let _ = hv
            .create_volume(POOL, &xml::plain_volume_xml("base.qcow2", 2 << 30, "qcow2"))
            .await;
    }
    Host {
        name: "h1".into(),
        uri: "test:///default".into(),
        hv,
    }
}

fn settings() -> Settings {
    Settings {
        domain_type: DomainType::Qemu,
        ..Settings::default()
    }
}

#[tokio::test]
async fn provisions_adopts_and_deletes_on_the_test_driver() {
    let host = host_with_base().await;
    let hosts = [host];
    let hv = hosts[0].hv.clone();
    let o = owner("m1");
    let s = spec(serde_json::json!([{"name": "root", "sizeGiB": 4}, {"name": "data", "sizeGiB": 1}]));
    let settings = settings();
    let input = machine_input(&o, &s, &settings);
    let step = provision::provision(&hosts, &input, Phase::SelectHost, Some(b"#cloud-config\n"))
        .await
        .unwrap();
    // The test driver hands out fake leases, so the machine is provisioned at once.
    let done = step.provisioned.clone().expect("provisioned");
    assert_eq!(done.provider_id, format!("libvirt://h1/{}", o.uid));
    assert!(done.addresses.as_ref().is_some_and(|a| !a.is_empty()));
    assert_eq!(
        step.phase,
        Some(Phase::Provisioned {
            host: "h1".into(),
            uuid: o.uid.clone()
        })
    );
    let reasons: Vec<&str> = step.events.iter().map(|e| e.0).collect();
    assert_eq!(
        reasons,
        ["VolumesCreated", "DomainDefined", "PoweredOn", "Provisioned"]
    );

    let d = hv.domain_by_uuid(&o.uid).await.unwrap().expect("domain exists");
    assert_eq!(d.name, "ns_m1");
    assert_eq!(d.state, RunState::Running);
    assert_eq!(d.owner.as_ref(), Some(&o));
    let root = hv
        .volume(POOL, "ns_m1-root.qcow2")
        .await
        .unwrap()
        .expect("root volume");
    assert_eq!(root.capacity, 4 << 30);
    let data = hv
        .volume(POOL, "ns_m1-data.qcow2")
        .await
        .unwrap()
        .expect("data volume");
    assert_eq!(data.capacity, 1 << 30);
    let seed = hv.uploaded(POOL, "ns_m1-seed.iso").expect("seed uploaded");
    let files = SeedFiles::from_iso(&seed).unwrap();
    assert_eq!(files.user_data.as_deref(), Some(&b"#cloud-config\n"[..]));
    assert!(files.meta_data.unwrap().contains(&o.uid));

    // A controller that lost its status (crash before the write) starts over and adopts.
    let again = provision::provision(&hosts, &input, Phase::SelectHost, Some(b"#cloud-config\n"))
        .await
        .unwrap();
    assert_eq!(again.provisioned, Some(done));
    assert_eq!(hv.domain_by_name("ns_m1").await.unwrap().unwrap().uuid, o.uid);

    let note = provision::delete(&*hv, &o, &s, &o.uid).await.unwrap();
    assert!(note.contains("destroyed and undefined"), "{note}");
    assert_eq!(hv.domain_by_uuid(&o.uid).await.unwrap(), None);
    for v in ["ns_m1-root.qcow2", "ns_m1-data.qcow2", "ns_m1-seed.iso"] {
        assert_eq!(hv.volume(POOL, v).await.unwrap(), None, "{v} deleted");
    }
    assert_eq!(
        hv.volume(POOL, "base.qcow2").await.unwrap().map(|v| v.name),
        Some("base.qcow2".into())
    );
    // Deleting again is a no-op.
    let note = provision::delete(&*hv, &o, &s, &o.uid).await.unwrap();
    assert!(note.contains("already gone"), "{note}");
}

#[tokio::test]
async fn a_foreign_domain_with_our_name_is_never_adopted_or_deleted() {
    let host = host_with_base().await;
    let hv = host.hv.clone();
    let hosts = [host];
    let stranger = Owner {
        uid: "11111111-2222-4333-8444-555555555555".into(),
        namespace: "ns".into(),
        name: "m2".into(),
    };
    let s = spec(serde_json::json!([]));
    let config = desired::domain_config(&s, &stranger, &stranger.uid, &settings());
    hv.define_domain(&xml::domain_xml(&config)).await.unwrap();

    let o = owner("m2");
    let settings = settings();
    let input = MachineInput {
        imports: &IMPORTS,
        owner: &o,
        spec: &s,
        uuid: &o.uid,
        failure_domain: Some("h1"),
        settings: &settings,
        power: PowerState::On,
        shutdown_requested_at: None,
        pool_addresses: &NO_POOL,
        ask_cloud_init: true,
    };
    let err = provision::provision(&hosts, &input, Phase::SelectHost, Some(b""))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StepError::Permanent {
                reason: "DomainNameConflict",
                ..
            }
        ),
        "{err:?}"
    );
    let note = provision::delete(&*hv, &o, &s, &o.uid).await.unwrap();
    assert!(note.contains("not ours"), "{note}");
    assert!(hv.domain_by_uuid(&stranger.uid).await.unwrap().is_some());
}

#[tokio::test]
async fn bad_input_is_a_permanent_error_with_an_actionable_reason() {
    let host = host_with_base().await;
    let hosts = [host];
    let settings = settings();
    let o = owner("m3");
    let mut s = spec(serde_json::json!([]));
    s.source.volume = Some("missing.qcow2".into());
    let input = machine_input(&o, &s, &settings);
    let err = provision::provision(&hosts, &input, Phase::SelectHost, Some(b""))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StepError::Permanent {
                reason: "BaseVolumeNotFound",
                ..
            }
        ),
        "{err:?}"
    );

    let s = spec(serde_json::json!([]));
    let input = MachineInput {
        failure_domain: Some("elsewhere"),
        spec: &s,
        ..input
    };
    let err = provision::provision(&hosts, &input, Phase::SelectHost, Some(b""))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StepError::Permanent {
                reason: "HostNotFound",
                ..
            }
        ),
        "{err:?}"
    );

    let s = spec(serde_json::json!([{"name": "root", "sizeGiB": 1}]));
    let input = MachineInput {
        failure_domain: None,
        spec: &s,
        ..input
    };
    let err = provision::provision(&hosts, &input, Phase::SelectHost, Some(b""))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StepError::Permanent {
                reason: "DiskTooSmall",
                ..
            }
        ),
        "{err:?}"
    );
}

/// A second, separate in-memory hypervisor: the test driver with a custom node file (every
/// `test:///default` connection of a process shares one state; a file gives a fresh one per
/// connection). Same pool and network names as `test:///default`.
fn second_host_uri(tag: &str) -> String {
    let path = std::env::temp_dir().join(format!("banlieue-libvirt-node-{tag}-{}.xml", std::process::id()));
    std::fs::write(
        &path,
        "<node>\n  <network>\n    <name>default</name>\n    <bridge name='virbr0'/>\n    <forward/>\n    \
         <ip address='192.168.123.1' netmask='255.255.255.0'>\n      <dhcp><range start='192.168.123.2' end='192.168.123.254'/></dhcp>\n    \
         </ip>\n  </network>\n  <pool type='dir'>\n    <name>default-pool</name>\n    <capacity unit='GiB'>100</capacity>\n    \
         <allocation>0</allocation>\n    <available unit='GiB'>100</available>\n    <target><path>/default-pool</path></target>\n  \
         </pool>\n</node>\n",
    )
    .unwrap();
    format!("test://{}", path.display())
}

async fn with_base(hv: &VirtHypervisor) {
    if hv.volume(POOL, "base.qcow2").await.unwrap().is_none() {
        let _ = hv
            .create_volume(POOL, &xml::plain_volume_xml("base.qcow2", 2 << 30, "qcow2"))
            .await;
    }
}

#[tokio::test]
async fn machines_land_on_the_host_of_their_failure_domain() {
    use banlieue_libvirt::connection::VirtConnector;
    let connector = VirtConnector::default();
    let uri_b = second_host_uri("fd");
    let (a, b) = (connector.get("test:///default"), connector.get(&uri_b));
    assert!(
        Arc::ptr_eq(&a, &connector.get("test:///default")),
        "one handle per URI"
    );
    with_base(&a).await;
    with_base(&b).await;
    let hosts = [
        Host {
            name: "kvm-a".into(),
            uri: "test:///default".into(),
            hv: a.clone(),
        },
        Host {
            name: "kvm-b".into(),
            uri: uri_b.clone(),
            hv: b.clone(),
        },
    ];
    let settings = settings();
    let s = spec(serde_json::json!([]));
    for (machine, fd, on, off) in [
        ("fdb", Some("kvm-b"), &b, &a),
        ("fda", Some("kvm-a"), &a, &b),
        // No failure domain: the first host by name.
        ("fdn", None, &a, &b),
    ] {
        let o = owner(machine);
        let input = MachineInput {
            imports: &IMPORTS,
            owner: &o,
            spec: &s,
            uuid: &o.uid,
            failure_domain: fd,
            settings: &settings,
            power: PowerState::On,
            shutdown_requested_at: None,
            pool_addresses: &NO_POOL,
            ask_cloud_init: true,
        };
        let step = provision::provision(&hosts, &input, Phase::SelectHost, Some(b""))
            .await
            .unwrap();
        let host = fd.unwrap_or("kvm-a");
        assert_eq!(
            step.provisioned.expect("provisioned").provider_id,
            format!("libvirt://{host}/{}", o.uid)
        );
        assert!(
            on.domain_by_uuid(&o.uid).await.unwrap().is_some(),
            "{machine} on {host}"
        );
        assert!(
            off.domain_by_uuid(&o.uid).await.unwrap().is_none(),
            "{machine} only on {host}: the two hosts are separate hypervisors"
        );
        provision::delete(&**on, &o, &s, &o.uid).await.unwrap();
    }
}

/// Drives a provisioned machine until it reports no waiting, collecting event reasons.
async fn settle(
    hosts: &[Host<VirtHypervisor>],
    input: &MachineInput<'_>,
    mut phase: Phase,
) -> (Vec<&'static str>, provision::Step) {
    let mut reasons = Vec::new();
    for _ in 0..20 {
        let step = provision::provision(hosts, input, phase.clone(), None)
            .await
            .unwrap();
        reasons.extend(step.events.iter().map(|e| e.0));
        phase = step.phase.clone().unwrap();
        if step.waiting.is_none() {
            return (reasons, step);
        }
    }
    panic!("did not settle: {reasons:?}");
}

#[tokio::test]
async fn cpu_memory_and_power_changes_reconfigure_the_same_domain_without_recloning() {
    let host = host_with_base().await;
    let hv = host.hv.clone();
    let hosts = [host];
    let settings = settings();
    let o = owner("reconf");
    let s0 = spec(serde_json::json!([{"name": "root", "sizeGiB": 4}]));
    let input = machine_input(&o, &s0, &settings);
    let step = provision::provision(&hosts, &input, Phase::SelectHost, Some(b"ud"))
        .await
        .unwrap();
    let provisioned = step.phase.clone().unwrap();
    let root_before = hv.volume(POOL, "ns_reconf-root.qcow2").await.unwrap().unwrap();
    let seed_before = hv.uploaded(POOL, "ns_reconf-seed.iso").unwrap();
    let before = hv.domain_by_uuid(&o.uid).await.unwrap().unwrap();
    assert_eq!(
        before.sizing.map(|z| (z.sockets, z.cores, z.memory_mib)),
        Some((1, 2, 512))
    );

    // Nothing to change: no call that changes anything, no event.
    let (reasons, _) = settle(&hosts, &input, provisioned.clone()).await;
    assert!(reasons.is_empty(), "{reasons:?}");

    // CPU and memory under the default restart policy (Manual): nothing happens to the running
    // domain; the step says what waits.
    let mut s = s0.clone();
    s.cpu.cores = 4;
    s.memory_mib = 1024;
    let waiting = MachineInput { spec: &s, ..input };
    let (reasons, step) = settle(&hosts, &waiting, provisioned.clone()).await;
    assert!(reasons.is_empty(), "{reasons:?}");
    let up_to_date = step.up_to_date.expect("VMUpToDate");
    assert_eq!(up_to_date.reason, banlieue_api::condition::RESTART_REQUIRED);
    let why = up_to_date.message;
    assert!(why.contains("cores 2→4"), "{why}");
    let unchanged = hv.domain_by_uuid(&o.uid).await.unwrap().unwrap();
    assert_eq!(unchanged.sizing, before.sizing);
    assert_eq!(unchanged.state, RunState::Running);

    // Allowed (Automatic): shut down, redefine, start; same domain, same volumes.
    s.restart_policy = Some(banlieue_api::common::RestartPolicy::Automatic);
    let input = MachineInput { spec: &s, ..input };
    let (reasons, step) = settle(&hosts, &input, provisioned.clone()).await;
    assert_eq!(reasons, ["PoweringOff", "Reconfigured", "PoweredOn"]);
    assert_eq!(step.phase, Some(provisioned.clone()));
    assert_eq!(
        (step.provisioned.is_some(), step.power),
        (true, Some(PowerState::On))
    );
    let after = hv.domain_by_uuid(&o.uid).await.unwrap().unwrap();
    assert_eq!(
        (after.uuid.as_str(), after.name.as_str()),
        (o.uid.as_str(), "ns_reconf")
    );
    assert_eq!(after.state, RunState::Running);
    assert_eq!(after.macs, before.macs);
    assert_eq!(
        after.sizing.map(|z| (z.sockets, z.cores, z.memory_mib)),
        Some((1, 4, 1024))
    );
    assert_eq!(
        hv.volume(POOL, "ns_reconf-root.qcow2").await.unwrap().unwrap(),
        root_before,
        "the boot disk is not re-cloned"
    );
    assert_eq!(hv.uploaded(POOL, "ns_reconf-seed.iso").unwrap(), seed_before);

    // powerState Off: ACPI shutdown, reported Off; a CPU change while off is applied without
    // starting the domain; On starts it again.
    let off = MachineInput {
        power: PowerState::Off,
        ..input
    };
    let (reasons, step) = settle(&hosts, &off, provisioned.clone()).await;
    assert_eq!(reasons, ["PoweringOff"]);
    assert_eq!(
        hv.domain_by_uuid(&o.uid).await.unwrap().unwrap().state,
        RunState::ShutOff
    );
    let (reasons, step2) = settle(&hosts, &off, step.phase.unwrap()).await;
    assert!(reasons.is_empty(), "{reasons:?}");
    assert_eq!(
        (step2.provisioned.is_some(), step2.power),
        (true, Some(PowerState::Off))
    );
    let mut s2 = s.clone();
    s2.cpu.sockets = Some(2);
    let off2 = MachineInput { spec: &s2, ..off };
    let (reasons, _) = settle(&hosts, &off2, provisioned.clone()).await;
    assert_eq!(reasons, ["Reconfigured"]);
    let d = hv.domain_by_uuid(&o.uid).await.unwrap().unwrap();
    assert_eq!((d.state, d.sizing.unwrap().sockets), (RunState::ShutOff, 2));
    let on = MachineInput {
        power: PowerState::On,
        ..off2
    };
    let (reasons, step) = settle(&hosts, &on, provisioned).await;
    assert_eq!(reasons, ["PoweredOn"]);
    assert_eq!(
        (step.provisioned.is_some(), step.power),
        (true, Some(PowerState::On))
    );
    assert_eq!(
        hv.domain_by_uuid(&o.uid).await.unwrap().unwrap().state,
        RunState::Running
    );
    provision::delete(&*hv, &o, &s2, &o.uid).await.unwrap();
}

#[tokio::test]
async fn a_guest_ignoring_the_acpi_shutdown_is_powered_off_after_the_timeout() {
    let host = host_with_base().await;
    let hv = host.hv.clone();
    let hosts = [host];
    let settings = settings();
    let o = owner("acpi");
    let s = spec(serde_json::json!([]));
    let on = machine_input(&o, &s, &settings);
    let step = provision::provision(&hosts, &on, Phase::SelectHost, Some(b""))
        .await
        .unwrap();
    let provisioned = step.phase.unwrap();
    assert_eq!(
        hv.domain_by_uuid(&o.uid).await.unwrap().unwrap().state,
        RunState::Running
    );
    // The test driver obeys ACPI at once; a shutdown requested long ago whose guest is still
    // running stands for a guest that ignores it.
    let long_ago = k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(200);
    let off = MachineInput {
        power: PowerState::Off,
        shutdown_requested_at: Some(long_ago),
        ..on
    };
    let step = provision::provision(&hosts, &off, provisioned.clone(), None)
        .await
        .unwrap();
    let reasons: Vec<&str> = step.events.iter().map(|e| e.0).collect();
    assert_eq!(reasons, ["PoweredOffForcibly"]);
    assert_eq!(step.found, None, "nothing pending any more");
    assert_eq!(
        hv.domain_by_uuid(&o.uid).await.unwrap().unwrap().state,
        RunState::ShutOff
    );
    // A recent request is repeated (no second event) and remembered with its first time.
    let recent = k8s_openapi::jiff::Timestamp::now();
    provision::provision(&hosts, &on, provisioned.clone(), None)
        .await
        .unwrap();
    let again = MachineInput {
        power: PowerState::Off,
        shutdown_requested_at: Some(recent),
        ..on
    };
    let step = provision::provision(&hosts, &again, provisioned, None)
        .await
        .unwrap();
    assert!(step.events.is_empty(), "{:?}", step.events);
    assert_eq!(step.found, Some(recent));
    provision::delete(&*hv, &o, &s, &o.uid).await.unwrap();
}

/// Every domain on `test:///default` whose banlieue metadata names `namespace/name` (any UID),
/// as `(uuid, owner uid)`.
fn domains_of(namespace: &str, name: &str) -> Vec<(String, String)> {
    let conn = virt::connect::Connect::open(Some("test:///default")).unwrap();
    conn.list_all_domains(0)
        .unwrap()
        .iter()
        .filter_map(|d| {
            // The test driver's state is shared by the tests running in parallel: a domain
            // another test deletes between the listing and this read is skipped.
            let owner = xml::owner_from_xml(&d.xml_desc(virt::sys::VIR_DOMAIN_XML_INACTIVE).ok()?)?;
            (owner.namespace == namespace && owner.name == name)
                .then(|| Some((d.uuid_string().ok()?.to_ascii_lowercase(), owner.uid)))
                .flatten()
        })
        .collect()
}

/// What `clusterctl move` (or a restore) leaves the target cluster's provider with: the same
/// namespace, name and spec (providerID included), a new UID and no status.
fn moved(o: &Owner) -> Owner {
    Owner {
        uid: "7d0c5e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6".into(),
        ..o.clone()
    }
}

/// Provisions `name` and returns its owner, its spec with the providerID CAPI copies, and the
/// domain uuid.
async fn provisioned_machine(
    hosts: &[Host<VirtHypervisor>],
    name: &str,
) -> (Owner, LibvirtMachineSpec, String) {
    let o = owner(name);
    let settings = settings();
    let mut s = spec(serde_json::json!([]));
    let input = machine_input(&o, &s, &settings);
    let step = provision::provision(hosts, &input, Phase::SelectHost, Some(b"#cloud-config\n"))
        .await
        .unwrap();
    let done = step.provisioned.expect("provisioned");
    s.provider_id = Some(done.provider_id);
    (o, s, step.phase.unwrap().uuid().unwrap().to_owned())
}

#[tokio::test]
async fn a_machine_created_anew_by_clusterctl_move_adopts_its_domain_by_provider_id() {
    let host = host_with_base().await;
    let hv = host.hv.clone();
    let hosts = [host];
    let settings = settings();
    let (o, s, uuid) = provisioned_machine(&hosts, "mv").await;
    let before = hv.domain_by_uuid(&uuid).await.unwrap().unwrap();
    let root_before = hv.volume(POOL, "ns_mv-root.qcow2").await.unwrap().unwrap();
    let seed_before = hv.uploaded(POOL, "ns_mv-seed.iso").unwrap();
    assert_eq!(domains_of("ns", "mv"), [(uuid.clone(), o.uid.clone())]);

    // The copy: new UID, providerID, no status (so no domain uuid: its own UID is the default).
    let copy = moved(&o);
    let input = machine_input(&copy, &s, &settings);
    let step = provision::provision(&hosts, &input, Phase::SelectHost, None)
        .await
        .unwrap();
    let reasons: Vec<&str> = step.events.iter().map(|e| e.0).collect();
    assert_eq!(
        reasons,
        ["Adopting", "Adopted", "Provisioned"],
        "{:?}",
        step.events
    );
    assert_eq!(
        step.phase,
        Some(Phase::Provisioned {
            host: "h1".into(),
            uuid: uuid.clone()
        })
    );
    assert_eq!(
        step.provisioned.unwrap().provider_id,
        s.provider_id.clone().unwrap()
    );

    assert_eq!(
        domains_of("ns", "mv"),
        [(uuid.clone(), copy.uid.clone())],
        "exactly one domain, the same one, marked with the new UID"
    );
    assert_eq!(
        hv.domain_by_uuid(&copy.uid).await.unwrap(),
        None,
        "nothing defined anew"
    );
    let after = hv.domain_by_uuid(&uuid).await.unwrap().unwrap();
    assert_eq!(after.state, RunState::Running, "not restarted");
    assert_eq!(after.macs, before.macs);
    assert_eq!(after.sizing, before.sizing);
    assert_eq!(
        hv.volume(POOL, "ns_mv-root.qcow2").await.unwrap().unwrap(),
        root_before,
        "the boot disk is not re-cloned"
    );
    assert_eq!(
        hv.uploaded(POOL, "ns_mv-seed.iso").unwrap(),
        seed_before,
        "bootstrap data not rewritten"
    );

    // Adopted: the next reconciles find nothing to do.
    let again = provision::provision(&hosts, &input, step.phase.clone().unwrap(), None)
        .await
        .unwrap();
    assert!(again.events.is_empty(), "{:?}", again.events);

    // The old object's UID no longer owns it; the copy's does: deleting the copy deletes it.
    let note = provision::delete(&*hv, &o, &s, &uuid).await.unwrap();
    assert!(note.contains("not ours"), "{note}");
    let note = provision::delete(&*hv, &copy, &s, &uuid).await.unwrap();
    assert!(note.contains("destroyed and undefined"), "{note}");
    assert!(domains_of("ns", "mv").is_empty());
    assert_eq!(hv.volume(POOL, "ns_mv-root.qcow2").await.unwrap(), None);
}

#[tokio::test]
async fn a_provider_id_of_a_domain_defined_for_another_machine_is_refused() {
    let host = host_with_base().await;
    let hv = host.hv.clone();
    let hosts = [host];
    let settings = settings();
    let (o, s, uuid) = provisioned_machine(&hosts, "mine").await;
    // Another machine (same namespace, other name) whose spec carries m1's providerID.
    let thief = Owner {
        name: "thief".into(),
        ..moved(&o)
    };
    let input = machine_input(&thief, &s, &settings);
    let err = provision::provision(&hosts, &input, Phase::SelectHost, Some(b""))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StepError::Permanent { reason: "AdoptionFailed", message }
            if message.contains("LibvirtMachine ns/mine") && message.contains("refusing to adopt")),
        "{err:?}"
    );
    assert_eq!(
        domains_of("ns", "mine"),
        [(uuid.clone(), o.uid.clone())],
        "left untouched"
    );
    assert!(domains_of("ns", "thief").is_empty(), "nothing defined");
    assert_eq!(hv.volume(POOL, "ns_thief-root.qcow2").await.unwrap(), None);
    provision::delete(&*hv, &o, &s, &uuid).await.unwrap();
}

#[tokio::test]
async fn a_provider_id_without_a_domain_is_reported_and_never_redefined() {
    let host = host_with_base().await;
    let hv = host.hv.clone();
    let hosts = [host];
    let settings = settings();
    let o = owner("gone");
    let mut s = spec(serde_json::json!([]));
    s.provider_id = Some("libvirt://h1/0000aaaa-0000-4000-8000-000000000777".into());
    let input = machine_input(&o, &s, &settings);
    let err = provision::provision(&hosts, &input, Phase::SelectHost, Some(b""))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StepError::Permanent { reason: "VMNotFound", message }
            if message.contains("delete this machine to replace it")),
        "{err:?}"
    );
    assert!(domains_of("ns", "gone").is_empty());
    assert_eq!(hv.volume(POOL, "ns_gone-root.qcow2").await.unwrap(), None);
    assert_eq!(hv.uploaded(POOL, "ns_gone-seed.iso"), None);

    // A providerID naming a host the LibvirtCluster does not have is refused too.
    let mut elsewhere = s.clone();
    elsewhere.provider_id = Some("libvirt://elsewhere/0000aaaa-0000-4000-8000-000000000777".into());
    let input = MachineInput {
        spec: &elsewhere,
        ..input
    };
    let err = provision::provision(&hosts, &input, Phase::SelectHost, Some(b""))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StepError::Permanent { reason: "AdoptionFailed", message } if message.contains("elsewhere")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_restored_provisioned_machine_remarks_its_domain_and_keeps_its_macs() {
    let host = host_with_base().await;
    let hv = host.hv.clone();
    let hosts = [host];
    let settings = settings();
    let (o, s, uuid) = provisioned_machine(&hosts, "rst").await;
    let before = hv.domain_by_uuid(&uuid).await.unwrap().unwrap();
    // Restored with its status (phase Provisioned) but a new UID, and a CPU change: the domain
    // is re-marked, then redefined with the MACs it has (not ones derived from the new UID).
    let copy = moved(&o);
    let mut s2 = s.clone();
    s2.cpu.cores = 3;
    s2.restart_policy = Some(banlieue_api::common::RestartPolicy::Automatic);
    let input = MachineInput {
        imports: &IMPORTS,
        owner: &copy,
        spec: &s2,
        uuid: &uuid,
        failure_domain: None,
        settings: &settings,
        power: PowerState::On,
        shutdown_requested_at: None,
        pool_addresses: &NO_POOL,
        ask_cloud_init: true,
    };
    let (reasons, step) = settle(
        &hosts,
        &input,
        Phase::Provisioned {
            host: "h1".into(),
            uuid: uuid.clone(),
        },
    )
    .await;
    assert_eq!(reasons, ["Adopting", "PoweringOff", "Reconfigured", "PoweredOn"]);
    assert!(step.provisioned.is_some());
    let after = hv.domain_by_uuid(&uuid).await.unwrap().unwrap();
    assert_eq!(after.owner.as_ref(), Some(&copy));
    assert_eq!(after.macs, before.macs);
    assert_eq!(after.sizing.map(|z| z.cores), Some(3));
    assert_eq!(domains_of("ns", "rst").len(), 1);
    provision::delete(&*hv, &copy, &s2, &uuid).await.unwrap();
    assert!(domains_of("ns", "rst").is_empty());
}

#[tokio::test]
async fn the_original_never_takes_back_a_domain_its_copy_adopted() {
    let host = host_with_base().await;
    let hv = host.hv.clone();
    let hosts = [host];
    let settings = settings();
    let (o, s, uuid) = provisioned_machine(&hosts, "pp").await;
    let provisioned = Phase::Provisioned {
        host: "h1".into(),
        uuid: uuid.clone(),
    };
    // The copy (clusterctl move --to-directory/--from-directory into a second management
    // cluster) adopts the domain while the original keeps running.
    let copy = moved(&o);
    let copy_input = machine_input(&copy, &s, &settings);
    provision::provision(&hosts, &copy_input, Phase::SelectHost, None)
        .await
        .unwrap();
    let adopted = hv.domain_by_uuid(&uuid).await.unwrap().unwrap();
    assert_eq!(adopted.owner.as_ref(), Some(&copy));
    assert_eq!(adopted.adopted_from.as_deref(), Some(o.uid.as_str()));

    // The original's provisioned path would re-mark it back ("a restored provisioned object is
    // re-marked"): refused, nothing written.
    let original = MachineInput {
        imports: &IMPORTS,
        owner: &o,
        spec: &s,
        uuid: &uuid,
        failure_domain: None,
        settings: &settings,
        power: PowerState::On,
        shutdown_requested_at: None,
        pool_addresses: &NO_POOL,
        ask_cloud_init: true,
    };
    for phase in [provisioned.clone(), Phase::SelectHost] {
        let err = provision::provision(&hosts, &original, phase, None)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StepError::Permanent { reason: "AdoptionFailed", message }
                if message.contains(&format!("taken over by a copy of this machine (object uid {})", copy.uid))
                    && message.contains("refusing to take it back")),
            "{err:?}"
        );
        assert_eq!(
            hv.domain_by_uuid(&uuid).await.unwrap().unwrap(),
            adopted,
            "untouched"
        );
    }
    // The copy keeps it: its reconciles find nothing to do.
    let again = provision::provision(&hosts, &copy_input, provisioned, None)
        .await
        .unwrap();
    assert!(again.events.is_empty(), "{:?}", again.events);
    assert_eq!(
        hv.domain_by_uuid(&uuid).await.unwrap().unwrap().owner.as_ref(),
        Some(&copy)
    );
    provision::delete(&*hv, &copy, &s, &uuid).await.unwrap();
}

#[tokio::test]
async fn deleting_a_copy_that_never_adopted_its_domain_leaves_it_in_place() {
    let host = host_with_base().await;
    let hv = host.hv.clone();
    let hosts = [host];
    let (o, s, uuid) = provisioned_machine(&hosts, "del").await;
    let copy = moved(&o);
    let before = hv.domain_by_uuid(&uuid).await.unwrap().unwrap();
    // Created for an earlier object of this name: left in place, not re-marked.
    let OnDeletion::Release(Deleted::Released {
        reason: "VMLeftInPlace",
        note,
    }) = readopt::on_deletion(&*hv, &copy, "h1", &uuid).await.unwrap()
    else {
        panic!("must be left in place");
    };
    assert!(
        note.contains("left untouched")
            && note.contains("earlier object of this name")
            && note.contains(&o.uid),
        "{note}"
    );
    assert_eq!(
        hv.domain_by_uuid(&uuid).await.unwrap().unwrap(),
        before,
        "not re-marked"
    );
    // Another machine's domain: said so, untouched.
    let other = Owner {
        name: "other".into(),
        ..copy.clone()
    };
    let OnDeletion::Release(Deleted::Released {
        reason: "Deleted",
        note,
    }) = readopt::on_deletion(&*hv, &other, "h1", &uuid).await.unwrap()
    else {
        panic!("another object's domain");
    };
    assert!(
        note.contains("owned by another object") && note.contains("ns/del"),
        "{note}"
    );
    // No such domain.
    let OnDeletion::Release(Deleted::Released {
        reason: "Deleted",
        note,
    }) = readopt::on_deletion(&*hv, &copy, "h1", "0000aaaa-0000-4000-8000-000000000777")
        .await
        .unwrap()
    else {
        panic!("no domain");
    };
    assert!(note.contains("nothing deleted"), "{note}");
    // Once it carries the copy's UID, deleting the copy deletes it.
    readopt::remark(&*hv, before, &copy).await.unwrap();
    let OnDeletion::Delete(d) = readopt::on_deletion(&*hv, &copy, "h1", &uuid).await.unwrap() else {
        panic!("owned: deleted");
    };
    let note = provision::delete(&*hv, &copy, &s, &d.vm.uuid).await.unwrap();
    assert!(note.contains("destroyed and undefined"), "{note}");
    assert!(domains_of("ns", "del").is_empty());
}

#[tokio::test]
async fn leases_a_test_guest_reports_are_its_addresses_until_it_stops() {
    let host = host_with_base().await;
    let hosts = [host];
    let hv = hosts[0].hv.clone();
    let o = owner("leased");
    let s = spec(serde_json::json!([{"name": "root", "sizeGiB": 4}]));
    let settings = settings();
    let input = machine_input(&o, &s, &settings);
    provision::provision(&hosts, &input, Phase::SelectHost, Some(b"#cloud-config\n"))
        .await
        .unwrap();
    let mac = hv.domain_by_uuid(&o.uid).await.unwrap().expect("domain").macs[0].clone();
    let made_up = hv.domain_addresses(&o.uid).await.unwrap();
    let lease = GuestAddress {
        mac: mac.clone(),
        ip: "10.203.7.9".into(),
    };
    assert!(!made_up.contains(&lease), "{made_up:?}");

    hv.report_leases(&o.uid.to_ascii_uppercase(), vec![lease.clone()]);
    assert_eq!(hv.domain_addresses(&o.uid).await.unwrap(), vec![lease.clone()]);

    hv.report_leases(&o.uid, vec![lease.clone()]);
    hv.shutdown_domain(&o.uid).await.unwrap();
    hv.start_domain(&o.uid).await.unwrap();
    let restarted = hv.domain_addresses(&o.uid).await.unwrap();
    assert!(
        !restarted.contains(&lease),
        "a restarted guest has no lease yet: {restarted:?}"
    );

    hv.report_leases(&o.uid, vec![lease.clone()]);
    hv.destroy_domain(&o.uid).await.unwrap();
    hv.start_domain(&o.uid).await.unwrap();
    let after = hv.domain_addresses(&o.uid).await.unwrap();
    assert!(
        !after.contains(&lease),
        "a stopped guest's lease is gone: {after:?}"
    );
}

/// cloud-init's report is asked for while the machine is provisioned and while its Ready waits
/// on it: not written yet is `Running`, a report with errors `Failed`, a clean one `Done`; a
/// test-driver guest nobody reported on finished at once; `skipCloudInit` and a machine not
/// waiting any more ask nothing.
#[tokio::test]
async fn cloud_init_is_asked_until_its_report_says_it_finished() {
    use banlieue_provider_kit::cloud_init::CloudInit;
    let host = host_with_base().await;
    let hosts = [host];
    let hv = hosts[0].hv.clone();
    let o = owner("ci1");
    let s = spec(serde_json::json!([{"name": "root", "sizeGiB": 4}]));
    let settings = settings();
    let input = machine_input(&o, &s, &settings);
    hv.report_cloud_init(&o.uid, None);
    let step = provision::provision(&hosts, &input, Phase::SelectHost, Some(b"#cloud-config\n"))
        .await
        .unwrap();
    assert!(
        step.provisioned.is_some(),
        "provisioned before cloud-init finished"
    );
    assert_eq!(step.cloud_init, Some(CloudInit::Running));
    let phase = step.phase.clone().unwrap();

    let failed = r#"{"v1": {"errors": ["('scripts_user', RuntimeError('runparts: 1 failed'))"]}}"#;
    hv.report_cloud_init(&o.uid.to_ascii_uppercase(), Some(failed.into()));
    let step = provision::provision(&hosts, &input, phase.clone(), None)
        .await
        .unwrap();
    match step.cloud_init {
        Some(CloudInit::Failed(why)) => assert!(why.contains("runparts: 1 failed"), "{why}"),
        other => panic!("expected a failure, got {other:?}"),
    }

    hv.report_cloud_init(&o.uid, Some(r#"{"v1": {"errors": []}}"#.into()));
    let step = provision::provision(&hosts, &input, phase.clone(), None)
        .await
        .unwrap();
    assert_eq!(step.cloud_init, Some(CloudInit::Done));

    let settled = MachineInput {
        ask_cloud_init: false,
        ..input
    };
    let step = provision::provision(&hosts, &settled, phase.clone(), None)
        .await
        .unwrap();
    assert_eq!(
        step.cloud_init, None,
        "a machine not waiting any more asks nothing"
    );

    let mut skipping = s.clone();
    skipping.readiness_checks = Some(banlieue_api::common::ReadinessChecks {
        skip_cloud_init: Some(true),
        ..Default::default()
    });
    let skip = MachineInput {
        spec: &skipping,
        ..input
    };
    let step = provision::provision(&hosts, &skip, phase.clone(), None)
        .await
        .unwrap();
    assert_eq!(step.cloud_init, None, "skipCloudInit asks nothing");

    let unreported = owner("ci2");
    let input = machine_input(&unreported, &s, &settings);
    let step = provision::provision(&hosts, &input, Phase::SelectHost, Some(b"#cloud-config\n"))
        .await
        .unwrap();
    assert_eq!(step.cloud_init, Some(CloudInit::Done), "finished at once");
    for owner in [&o, &unreported] {
        provision::delete(&*hv, owner, &s, &owner.uid).await.unwrap();
    }
}

/// Provisions a machine named `name` with `spec` on the test driver and returns its definition
/// as libvirt keeps it (its own XML, not the one sent), the domain deleted again.
async fn kept_definition(name: &str, s: &LibvirtMachineSpec) -> String {
    let hosts = [host_with_base().await];
    let hv = hosts[0].hv.clone();
    let o = owner(name);
    let settings = settings();
    let input = machine_input(&o, s, &settings);
    let step = provision::provision(&hosts, &input, Phase::SelectHost, Some(b"#cloud-config\n"))
        .await
        .unwrap();
    assert!(step.provisioned.is_some(), "{:?}", step.phase);
    let conn = virt::connect::Connect::open(Some("test:///default")).unwrap();
    let xml = conn
        .lookup_domain_by_uuid_string(&o.uid)
        .unwrap()
        .xml_desc(0)
        .unwrap();
    provision::delete(&*hv, &o, s, &o.uid).await.unwrap();
    // libvirt writes attributes in double quotes.
    xml.replace('"', "'")
}

/// libvirt itself (the test driver parses what it is given) accepts a domain with a CPU model,
/// CPU features, a TPM 2.0, a host PCI device and the seed on SCSI.
#[tokio::test]
async fn libvirt_accepts_a_cpu_model_features_a_tpm_a_host_pci_device_and_a_scsi_seed() {
    let mut s = spec(serde_json::json!([{"name": "root", "sizeGiB": 4}]));
    s.cpu_type = Some("Skylake-Server".into());
    s.cpu_flags = vec!["+aes".into(), "-pcid".into()];
    s.tpm = Some(true);
    s.seed_drive_bus = Some(banlieue_api::common::SeedDriveBus::Scsi);
    s.pci_devices = vec![banlieue_api::infrastructure::LibvirtPciDevice {
        address: "0000:01:00.0".into(),
    }];
    let xml = kept_definition("hw1", &s).await;
    assert!(
        xml.contains("<hostdev mode='subsystem' type='pci' managed='yes'>"),
        "{xml}"
    );
    assert!(xml.contains("bus='0x01'"), "{xml}");
    assert!(xml.contains("<tpm model='tpm-crb'>"), "{xml}");
}

/// libvirt accepts a Secure Boot domain (q35 with SMM, OVMF with enrolled keys asked by
/// `<firmware>` features, the NICs at their pinned slots on the PCIe root bus), and keeps what
/// was asked in its definition.
#[tokio::test]
async fn libvirt_accepts_a_secure_boot_domain_on_q35() {
    let mut s = spec(serde_json::json!([{"name": "root", "sizeGiB": 4}]));
    s.firmware = Some(banlieue_api::common::Firmware::UEFI);
    s.secure_boot = Some(true);
    let xml = kept_definition("sb1", &s).await;
    assert!(xml.contains("q35"), "{xml}");
    assert!(xml.contains("secure-boot"), "{xml}");
    assert!(xml.contains("<smm state='on'/>"), "{xml}");
}

/// A small QCOW2-looking image: a version 3 header (no backing file, no external data file)
/// with a virtual size of 3 GiB, then filler.
fn qcow2_image(filler: u8) -> Vec<u8> {
    let mut image = b"QFI\xfb\0\0\0\x03".to_vec();
    image.extend_from_slice(&[0; 16]);
    image.extend_from_slice(&(3u64 << 30).to_be_bytes());
    image.resize(104, 0);
    image.extend(std::iter::repeat_n(filler, 300 * 1024));
    image
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// A spec whose source is `url` with `checksum` (SHA256) in [`POOL`].
fn image_spec(url: &str, checksum: &str) -> LibvirtMachineSpec {
    let mut s = spec(serde_json::json!([]));
    s.source = serde_json::from_value(serde_json::json!({
        "pool": POOL,
        "image": {"url": url, "checksumAlgorithm": "SHA256", "checksum": checksum},
    }))
    .unwrap();
    s
}

/// Provisions until the step stops waiting for the import (bounded); returns the steps that
/// waited, and the outcome.
async fn provision_through_import(
    hosts: &[Host<VirtHypervisor>],
    input: &MachineInput<'_>,
) -> (Vec<provision::Step>, Result<provision::Step, StepError>) {
    let mut waited = Vec::new();
    for _ in 0..400 {
        match provision::provision(hosts, input, Phase::SelectHost, Some(b"#cloud-config\n")).await {
            Ok(step) if step.waiting_reason == Some(banlieue_provider_kit::image::IMPORTING_IMAGE) => {
                waited.push(step);
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            }
            outcome => return (waited, outcome),
        }
    }
    panic!("the import did not end within 10s");
}

/// Two clusters may give different hosts the same name: an import on one is not taken for the
/// other's. While host `h1` of one cluster imports an image (its download hangs), host `h1` of
/// another, whose volume of that image is complete, uses it at once.
#[tokio::test]
async fn hosts_named_alike_in_two_clusters_import_apart() {
    use banlieue_libvirt::connection::VirtConnector;
    use banlieue_libvirt::image_import::{self, Base};
    // A server that accepts and never answers: the first import stays running.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/noble.qcow2", listener.local_addr().unwrap());
    let _server = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let image = qcow2_image(9);
    let source = image_spec(&url, &sha256_hex(&image)).source;
    let volume = image_import::volume_name(source.image.as_ref().unwrap());
    let connector = VirtConnector::default();
    let (uri_a, uri_b) = (second_host_uri("alike-a"), second_host_uri("alike-b"));
    let (a, b) = (connector.get(&uri_a), connector.get(&uri_b));
    for name in [volume.clone(), format!("{volume}.ok")] {
        b.create_volume(POOL, &xml::plain_volume_xml(&name, 512, "raw"))
            .await
            .unwrap();
    }
    let imports = banlieue_provider_kit::image::Imports::default();
    let fail = |e| panic!("{e}");
    let on_a = image_import::base_volume(&a, ("h1", &uri_a), &source, &imports, fail).await;
    assert!(matches!(on_a, Ok(Base::Importing(_))), "{on_a:?}");
    let on_b = image_import::base_volume(&b, ("h1", &uri_b), &source, &imports, fail).await;
    let Ok(Base::Ready(found)) = on_b else {
        panic!("h1 of the other cluster waits for an import that is not its own: {on_b:?}");
    };
    assert_eq!(found.name, volume);
}

#[tokio::test]
async fn an_image_from_a_url_is_imported_once_and_backs_every_machine_that_names_it() {
    let image = qcow2_image(7);
    let server = banlieue_testenv::files::FileServer::start([("/noble.qcow2".to_owned(), image.clone())])
        .await
        .unwrap();
    let host = host_with_base().await;
    let hosts = [host];
    let hv = hosts[0].hv.clone();
    let settings = settings();
    let s = image_spec(&server.url("/noble.qcow2"), &sha256_hex(&image));
    let volume = banlieue_libvirt::image_import::volume_name(s.source.image.as_ref().unwrap());

    let (a, b) = (owner("img-a"), owner("img-b"));
    let (input_a, input_b) = (machine_input(&a, &s, &settings), machine_input(&b, &s, &settings));
    // Both machines ask before the import ends: one import serves both.
    let first_a = provision::provision(&hosts, &input_a, Phase::SelectHost, Some(b""))
        .await
        .unwrap();
    let first_b = provision::provision(&hosts, &input_b, Phase::SelectHost, Some(b""))
        .await
        .unwrap();
    for first in [&first_a, &first_b] {
        assert_eq!(
            first.waiting_reason,
            Some(banlieue_provider_kit::image::IMPORTING_IMAGE)
        );
        assert_eq!(
            first.phase,
            Some(Phase::Volumes { host: "h1".into() }),
            "nothing is created before the image"
        );
        let message = first.waiting.as_deref().unwrap_or_default();
        assert!(message.contains(&server.url("/noble.qcow2")), "{message}");
    }
    let (_, done_a) = provision_through_import(&hosts, &input_a).await;
    let (_, done_b) = provision_through_import(&hosts, &input_b).await;
    for done in [done_a, done_b] {
        assert!(
            done.unwrap().provisioned.is_some(),
            "the machine is provisioned on the imported image"
        );
    }
    assert_eq!(
        server.requests(),
        ["/noble.qcow2"],
        "downloaded once for both machines"
    );

    let imported = hv
        .volume(POOL, &volume)
        .await
        .unwrap()
        .expect("the imported volume");
    assert_eq!(imported.capacity, 3 << 30, "the QCOW2 header's virtual size");
    assert_eq!(imported.format, "qcow2");
    assert_eq!(
        hv.uploaded(POOL, &volume),
        Some(image),
        "the verified bytes, whole"
    );
    assert!(
        hv.volume(POOL, &format!("{volume}.part"))
            .await
            .unwrap()
            .is_none(),
        "the upload's staging volume is gone"
    );
    assert!(
        hv.volume(POOL, &format!("{volume}.ok")).await.unwrap().is_some(),
        "the copy's completion is marked"
    );
    // Each boot disk is an overlay on the imported volume.
    let boot = desired::disk_volumes(&s, &desired::domain_name("ns", "img-a"))
        .into_iter()
        .find(|v| v.boot)
        .unwrap();
    assert!(hv.volume(&boot.pool, &boot.name).await.unwrap().is_some());

    // A final volume without its marker (a copy cut short by a crash) is not used: imported again.
    hv.delete_volume(POOL, &format!("{volume}.ok")).await.unwrap();
    let c = owner("img-c");
    let (waited, done_c) = provision_through_import(&hosts, &machine_input(&c, &s, &settings)).await;
    assert!(!waited.is_empty(), "the unmarked volume was imported again");
    assert!(done_c.unwrap().provisioned.is_some());
    assert_eq!(server.requests().len(), 2);
    provision::delete(&*hv, &c, &s, &c.uid).await.unwrap();

    // Deleting a machine keeps the image for the others.
    provision::delete(&*hv, &a, &s, &a.uid).await.unwrap();
    assert!(hv.volume(POOL, &volume).await.unwrap().is_some());
    provision::delete(&*hv, &b, &s, &b.uid).await.unwrap();
}

#[tokio::test]
async fn an_image_whose_checksum_differs_is_refused_and_nothing_is_stored() {
    let image = qcow2_image(9);
    let server = banlieue_testenv::files::FileServer::start([("/tampered.qcow2".to_owned(), image.clone())])
        .await
        .unwrap();
    let host = host_with_base().await;
    let hosts = [host];
    let hv = hosts[0].hv.clone();
    let settings = settings();
    let asked = sha256_hex(b"the image that was published");
    let s = image_spec(&server.url("/tampered.qcow2"), &asked);
    let volume = banlieue_libvirt::image_import::volume_name(s.source.image.as_ref().unwrap());
    let o = owner("img-bad");
    let input = machine_input(&o, &s, &settings);

    let (waited, outcome) = provision_through_import(&hosts, &input).await;
    assert!(!waited.is_empty(), "the download was reported while it ran");
    match outcome {
        Err(StepError::Permanent { reason, message }) => {
            assert_eq!(reason, banlieue_provider_kit::image::IMAGE_CHECKSUM_MISMATCH);
            assert!(
                message.contains(&asked),
                "names the checksum asked for: {message}"
            );
            assert!(
                message.contains(&sha256_hex(&image)),
                "names the checksum served: {message}"
            );
            assert!(
                message.contains("spec.source.image"),
                "names the field: {message}"
            );
        }
        other => panic!("expected ImageChecksumMismatch, got {other:?}"),
    }
    for name in [volume.clone(), format!("{volume}.part")] {
        assert!(
            hv.volume(POOL, &name).await.unwrap().is_none(),
            "{name} was not created"
        );
    }
    // Asked again at once, the failure is reported without downloading again.
    let again = provision::provision(&hosts, &input, Phase::SelectHost, Some(b"")).await;
    assert!(
        matches!(
            again,
            Err(StepError::Permanent {
                reason: "ImageChecksumMismatch",
                ..
            })
        ),
        "{again:?}"
    );
    assert_eq!(server.requests().len(), 1);
}
