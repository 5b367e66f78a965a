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
use banlieue_libvirt::hypervisor::{Hypervisor, RunState};
use banlieue_libvirt::phase::Phase;
use banlieue_libvirt::provision::{self, Host, MachineInput, StepError};
use banlieue_libvirt::xml::{self, DomainType, Owner};

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
    let input = MachineInput {
        owner: &o,
        spec: &s,
        uuid: &o.uid,
        failure_domain: None,
        settings: &settings,
        power: PowerState::On,
    };
    let step = provision::provision(&hosts, &input, Phase::SelectHost, Some(b"#cloud-config\n"))
        .await
        .unwrap();
    // The test driver hands out fake leases, so the machine is provisioned at once.
    let done = step.provisioned.clone().expect("provisioned");
    assert_eq!(done.provider_id, format!("libvirt://h1/{}", o.uid));
    assert!(!done.addresses.is_empty());
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
        owner: &o,
        spec: &s,
        uuid: &o.uid,
        failure_domain: Some("h1"),
        settings: &settings,
        power: PowerState::On,
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
    s.source.volume = "missing.qcow2".into();
    let input = MachineInput {
        owner: &o,
        spec: &s,
        uuid: &o.uid,
        failure_domain: None,
        settings: &settings,
        power: PowerState::On,
    };
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
