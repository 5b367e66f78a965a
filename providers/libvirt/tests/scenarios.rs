//! Scenario tests on the real control plane harness (etcd + kube-apiserver +
//! kube-controller-manager) and libvirt's `test:///default` driver through the real `virt`
//! connection.
//!
//! The CAPI-style scenarios shared by every provider (`banlieue-scenarios`: provision, scale,
//! delete, pause, bad template, bad access, crash/restart) run through
//! `scenarios/test_driver.rs`. The libvirt-specific scenarios below write what the banlieue
//! controller would create in standalone mode (a LibvirtCluster owned by a Provider, a
//! LibvirtMachine owned by a VirtualMachine) the way it writes them, the Cluster's endpoint
//! mirror, and the Secret watch (a user-data Secret created late is acted on at once).
//!
//! Run: `cargo test -p banlieue-libvirt --test scenarios` (needs `tests/controlplane/build.sh`).

#![cfg(feature = "libvirt")]

#[path = "scenarios/test_driver.rs"]
mod test_driver;

banlieue_scenarios::scenario_tests!(
    test_driver::TestDriver: provision,
    scale,
    delete,
    pause,
    bad_template,
    bad_credentials,
    crash_restart,
    outage,
    address_modes,
    few_writes,
    creation_only_change,
);

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use banlieue_api::infrastructure::{LibvirtCluster, LibvirtMachine};
use banlieue_api::standalone::infra_cluster_name;
use banlieue_capi::Cluster;
use banlieue_cloudinit::SeedFiles;
use banlieue_libvirt::hypervisor::{Hypervisor, RunState};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const FINALIZER: &str = banlieue_api::common::Backend::Libvirt.finalizer();

#[path = "scenarios/standalone.rs"]
mod standalone;

use standalone::*;

#[tokio::test]
async fn a_standalone_machine_is_provisioned_powered_off_and_deleted() -> Result<()> {
    let (s, _ns) = Standalone::new("lv-standalone").await?;
    let hv = s.connector.get(URI);

    // The Provider-owned LibvirtCluster is provisioned with one failure domain per host.
    let lvc_api = s.api::<LibvirtCluster>();
    let lvc = eventually("LibvirtCluster provisioned", || async {
        let c = lvc_api.get(&infra_cluster_name(&s.provider)).await?;
        let ok = c
            .status
            .as_ref()
            .and_then(|st| st.initialization.as_ref())
            .and_then(|i| i.provisioned)
            == Some(true);
        Ok(ok.then_some(c))
    })
    .await?;
    let status = lvc.status.clone().unwrap_or_default();
    assert_eq!(
        status
            .failure_domains
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>(),
        ["localhost"]
    );
    assert!(lvc.finalizers().iter().any(|f| f == FINALIZER));

    let created = s.machine("web-1", "#!/bin/sh\necho token-123\n").await?;
    let uid = created.uid().context("uid")?;
    let lm = s.provisioned("web-1").await?;
    assert_eq!(
        lm.spec.provider_id.as_deref(),
        Some(format!("libvirt://localhost/{uid}").as_str())
    );
    assert!(lm.finalizers().iter().any(|f| f == FINALIZER));
    let st = lm.status.clone().unwrap_or_default();
    assert!(
        st.addresses
            .iter()
            .any(|a| a.type_ == banlieue_api::common::MachineAddressType::InternalIP),
        "{:?}",
        st.addresses
    );
    assert_eq!(st.failure_domain.as_deref(), Some("localhost"));
    assert_eq!(st.domain_uuid.as_deref(), Some(uid.as_str()));
    let ready = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .context("Ready")?;
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Provisioned")
    );

    // On libvirt: the domain with the machine's UID as uuid and owner metadata, and the seed
    // carrying the VirtualMachine's user data (key `userdata`).
    let domain = hv.domain_by_uuid(&uid).await?.context("domain")?;
    assert_eq!(domain.name, format!("{}_web-1", s.ns));
    assert_eq!(domain.owner.as_ref().map(|o| o.uid.as_str()), Some(uid.as_str()));
    assert_eq!(domain.state, RunState::Running);
    let seed = hv
        .uploaded(POOL, &format!("{}_web-1-seed.iso", s.ns))
        .context("seed uploaded")?;
    let files = SeedFiles::from_iso(&seed)?;
    assert_eq!(
        files.user_data.as_deref(),
        Some(&b"#!/bin/sh\necho token-123\n"[..])
    );
    let root = hv
        .volume(POOL, &format!("{}_web-1-root.qcow2", s.ns))
        .await?
        .context("root")?;
    assert_eq!(root.capacity, 2 << 30);

    // powerState Off (what the banlieue controller copies from the VirtualMachine).
    let api = s.api::<LibvirtMachine>();
    api.patch(
        "web-1",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"powerState": "Off"}})),
    )
    .await?;
    eventually("powered off", || async {
        let lm = api.get("web-1").await?;
        let off =
            lm.status.as_ref().and_then(|s| s.power_state) == Some(banlieue_api::common::PowerState::Off);
        Ok(off.then_some(()))
    })
    .await?;
    assert_eq!(
        hv.domain_by_uuid(&uid).await?.context("domain")?.state,
        RunState::ShutOff
    );
    // Provisioned, but not Ready while off, saying why and what to do.
    let lm = api.get("web-1").await?;
    let status = lm.status.context("status")?;
    assert_eq!(status.initialization.and_then(|i| i.provisioned), Some(true));
    let ready =
        banlieue_api::condition::find(&status.conditions, banlieue_api::condition::READY).context("Ready")?;
    assert_eq!(
        (
            ready.status.as_str(),
            ready.reason.as_str(),
            ready.message.as_str()
        ),
        (
            "False",
            "PoweredOff",
            format!(
                "domain {}_web-1 is powered off because spec.powerState is Off; set it to On to start the VM",
                s.ns
            )
            .as_str()
        )
    );

    // Deletion: the domain and every volume go, then the finalizer.
    api.delete("web-1", &DeleteParams::default()).await?;
    eventually("LibvirtMachine gone", || async {
        Ok(api.get_opt("web-1").await?.is_none().then_some(()))
    })
    .await?;
    assert_eq!(hv.domain_by_uuid(&uid).await?, None);
    for v in ["root.qcow2", "seed.iso"] {
        assert_eq!(
            hv.volume(POOL, &format!("{}_web-1-{v}", s.ns)).await?,
            None,
            "{v}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_machine_without_a_controlling_owner_of_ours_is_left_alone() -> Result<()> {
    let (s, _ns) = Standalone::new("lv-orphan").await?;
    let lm: LibvirtMachine = serde_json::from_value(json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine",
        "metadata": {"name": "orphan"},
        "spec": {
            "providerRef": {"name": s.provider},
            "source": {"volume": "base.qcow2", "pool": POOL},
            "cpu": {"cores": 1}, "memoryMiB": 256,
        },
    }))?;
    let api = s.api::<LibvirtMachine>();
    api.create(&PostParams::default(), &lm).await?;
    // A machine with an owner is provisioned meanwhile: proof the controller is running.
    s.machine("witness", "").await?;
    s.provisioned("witness").await?;
    let orphan = api.get("orphan").await?;
    assert!(orphan.finalizers().is_empty());
    assert_eq!(orphan.status, None);
    assert!(
        s.connector
            .get(URI)
            .domain_by_name(&format!("{}_orphan", s.ns))
            .await?
            .is_none()
    );
    Ok(())
}

#[tokio::test]
async fn a_capi_cluster_endpoint_is_mirrored_to_the_libvirt_cluster() -> Result<()> {
    let (s, _ns) = Standalone::new("lv-capi").await?;
    // A Cluster with an endpoint and a LibvirtCluster (owned by the Cluster) without one.
    let cluster: Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "c1"},
        "spec": {
            "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
            "infrastructureRef": {"apiGroup": "infrastructure.banlieue.io", "kind": "LibvirtCluster", "name": "c1"},
        },
    }))?;
    let cluster = s
        .api::<Cluster>()
        .create(&PostParams::default(), &cluster)
        .await?;
    let lvc: LibvirtCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtCluster",
        "metadata": {"name": "c1", "ownerReferences": [owner_ref(&cluster)],
                     "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
        "spec": {"uri": URI},
    }))?;
    s.api::<LibvirtCluster>()
        .create(&PostParams::default(), &lvc)
        .await?;
    let lvc_api = s.api::<LibvirtCluster>();
    let lvc = eventually("CAPI LibvirtCluster provisioned", || async {
        let c = lvc_api.get("c1").await?;
        let ok = c
            .status
            .as_ref()
            .and_then(|st| st.initialization.as_ref())
            .and_then(|i| i.provisioned)
            == Some(true);
        Ok(ok.then_some(c))
    })
    .await?;
    assert_eq!(
        lvc.spec.control_plane_endpoint.map(|e| (e.host, e.port)),
        Some(("10.0.0.100".to_owned(), 6443)),
        "the Cluster's endpoint is mirrored"
    );
    Ok(())
}

/// The Secret watch: a machine whose user-data Secret does not exist yet says so, and once the
/// Secret is created it is provisioned within seconds, although the controllers requeue a
/// waiting machine only every 10 minutes here.
#[tokio::test]
async fn a_late_user_data_secret_is_acted_on_within_seconds() -> Result<()> {
    const LONG_REQUEUE: Duration = Duration::from_secs(600);
    const WELL_BEFORE_THE_REQUEUE: Duration = Duration::from_secs(30);
    let (s, _ns) = Standalone::requeueing("lv-late-userdata", Some(LONG_REQUEUE)).await?;
    let api = s.api::<LibvirtMachine>();
    s.machine_without_user_data("late").await?;
    let ready = |lm: &LibvirtMachine| {
        lm.status
            .as_ref()
            .and_then(|st| banlieue_api::condition::find(&st.conditions, banlieue_api::condition::READY))
            .cloned()
    };
    let waiting = eventually("waiting for its user data", || async {
        let lm = api.get("late").await?;
        Ok(ready(&lm).filter(|c| c.reason == "UserDataSecretNotFound"))
    })
    .await?;
    assert_eq!(waiting.status, "False");
    assert!(
        waiting.message.contains(&format!("{}/late-user-data", s.ns)),
        "{}",
        waiting.message
    );
    let hv = s.connector.get(URI);
    assert!(
        hv.domain_by_name(&format!("{}_late", s.ns)).await?.is_none(),
        "nothing is defined without user data"
    );
    // Let the reconciles its own writes (finalizer, status) triggered finish: from now on only
    // the Secret watch brings it back before the requeue.
    tokio::time::sleep(Duration::from_secs(3)).await;

    s.user_data_secret("late", "#cloud-config\nlate: true\n").await?;
    let deadline = tokio::time::Instant::now() + WELL_BEFORE_THE_REQUEUE;
    let lm = loop {
        let lm = api.get("late").await?;
        if ready(&lm).is_some_and(|c| c.status == "True") {
            break lm;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "not provisioned within {WELL_BEFORE_THE_REQUEUE:?} of its Secret (the requeue is {LONG_REQUEUE:?}): {:?}",
                ready(&lm)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let seed = hv
        .uploaded(POOL, &format!("{}_late-seed.iso", s.ns))
        .context("seed uploaded")?;
    assert_eq!(
        SeedFiles::from_iso(&seed)?.user_data.as_deref(),
        Some(&b"#cloud-config\nlate: true\n"[..])
    );
    assert!(lm.spec.provider_id.is_some());
    Ok(())
}

/// The `Ready` condition of a LibvirtMachine: (status, reason, message).
fn ready_of(lm: &LibvirtMachine) -> Option<(String, String, String)> {
    lm.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test]
async fn an_image_imported_from_a_url_reports_its_progress_and_a_tampered_one_is_refused() -> Result<()> {
    use sha2::Digest;
    let (s, _ns) = Standalone::new("lv-image").await?;
    let mut image = b"QFI\xfb\0\0\0\x03".to_vec();
    image.extend_from_slice(&[0; 16]);
    image.extend_from_slice(&(2u64 << 30).to_be_bytes());
    image.resize(104, 0); // the rest of a version 3 header: no backing file, no data file
    image.extend(s.ns.as_bytes()); // this run's own image
    let server =
        banlieue_testenv::files::FileServer::holding([("/focal.qcow2".to_owned(), image.clone())]).await?;
    let source = |checksum: String| {
        json!({"pool": POOL, "image": {
            "url": server.url("/focal.qcow2"), "checksumAlgorithm": "SHA256", "checksum": checksum,
        }})
    };
    let api = s.api::<LibvirtMachine>();

    // Tampered: the checksum published is of other bytes. Held, both machines show the import.
    let published = hex::encode(sha2::Sha256::digest(b"what the vendor published"));
    s.user_data_secret("tampered", "#cloud-config\n").await?;
    s.machine_from("tampered", source(published.clone())).await?;
    s.user_data_secret("good", "#cloud-config\n").await?;
    s.machine_from("good", source(hex::encode(sha2::Sha256::digest(&image))))
        .await?;
    for name in ["tampered", "good"] {
        eventually(&format!("{name} shows the import"), || async {
            let lm = api.get(name).await?;
            Ok(ready_of(&lm).filter(|(status, reason, message)| {
                status == "False"
                    && reason == "ImportingImage"
                    && message.contains(&server.url("/focal.qcow2"))
            }))
        })
        .await?;
    }
    server.release();

    s.provisioned("good").await?;
    let (_, reason, message) = eventually("the tampered image is refused", || async {
        let lm = api.get("tampered").await?;
        Ok(ready_of(&lm).filter(|(_, reason, _)| reason == "ImageChecksumMismatch"))
    })
    .await?;
    assert_eq!(reason, "ImageChecksumMismatch");
    assert!(message.contains(&published), "{message}");
    let hv = s.connector.get(URI);
    let domain = banlieue_libvirt::desired::domain_name(&s.ns, "tampered");
    assert!(
        hv.domain_by_name(&domain).await?.is_none(),
        "no domain was defined on the tampered image"
    );
    assert_eq!(
        server.requests(),
        ["/focal.qcow2", "/focal.qcow2"],
        "one download per checksum"
    );
    Ok(())
}
