//! Scenario tests: the controllers on a real kube-apiserver (banlieue-testenv) against a real
//! vcsim.
//!
//! The CAPI-style scenarios shared by every provider (`banlieue-scenarios`: provision, scale
//! across failure domains, delete, pause, bad template, bad credentials, crash/restart) run
//! through `scenarios/vcsim.rs`. The vSphere-specific scenarios below run in standalone mode (a
//! banlieue Provider + the VSphereCluster the banlieue controller would create, a
//! VirtualMachine owning the VSphereMachine); each has its own namespace, Provider, vcsim and
//! controllers (watching only that namespace).

#[path = "support/privileges.rs"]
mod privileges;
#[path = "../../client/tests/support/vcsim.rs"]
mod vcsim_support;

#[path = "scenarios/vcsim.rs"]
mod vcsim;

banlieue_scenarios::scenario_tests!(
    vcsim::VcSim: provision,
    scale,
    delete,
    bad_template,
    bad_credentials,
    crash_restart,
    pause,
    outage,
    address_modes,
    few_writes,
    unsupported_field,
    creation_only_change,
);

// One workload cluster over two vCenters: failure domain `remote` names its own server.
banlieue_scenarios::scenario_tests!(
    mod spread_scenarios;
    vcsim::VcSimSpread: provision,
    delete,
    crash_restart,
    outage,
    bad_credentials,
);

/// A failure domain in another vCenter that cannot be reached is left out of
/// `status.failureDomains` (said on `VSphereConnected`), the cluster stays usable in the
/// others, and it comes back once its vCenter answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_vcenter_leaves_out_only_its_failure_domain() -> Result<()> {
    use banlieue_scenarios::{Access, ProviderUnderTest as _, Scenario, TIMEOUT};
    let mut s = Scenario::<vcsim::VcSimSpread>::new("unreach").await?;
    let remote = &s
        .provider
        .sites
        .iter()
        .find(|site| site.0 == "remote")
        .context("remote")?
        .3;
    remote.set_down(true);
    s.cluster(Access::Valid).await?;
    s.provider.start();
    // In the order of spec.failureDomains.
    let published = |c: &serde_json::Value| -> Vec<String> {
        c.pointer("/status/failureDomains")
            .and_then(|d| d.as_array())
            .map(|d| {
                d.iter()
                    .filter_map(|d| d["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let wait = async |what: &str, check: &dyn Fn(&serde_json::Value) -> bool| -> Result<serde_json::Value> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let c = s
                .get_infra("VSphereCluster", banlieue_scenarios::fixture::CLUSTER)
                .await?
                .unwrap_or_default();
            if check(&c) {
                return Ok(c);
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {:#}",
                c["status"]
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let c = wait("home alone", &|c| published(c) == ["home"]).await?;
    let connected =
        banlieue_scenarios::object::condition(&c, "VSphereConnected").context("VSphereConnected")?;
    ensure!(connected.status == "True", "{connected:?}");
    ensure!(
        connected
            .message
            .contains("failure domain remote left out (VCenterUnreachable)"),
        "{connected:?}"
    );
    ensure!(
        c.pointer("/status/initialization/provisioned") == Some(&serde_json::json!(true)),
        "{:#}",
        c["status"]
    );
    let remote = &s
        .provider
        .sites
        .iter()
        .find(|site| site.0 == "remote")
        .context("remote")?
        .3;
    remote.set_down(false);
    // Any change wakes the cluster's reconcile (its periodic re-check is minutes away).
    s.infra("VSphereCluster")
        .patch(
            banlieue_scenarios::fixture::CLUSTER,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&serde_json::json!({"metadata": {"annotations": {"poke": "1"}}})),
        )
        .await?;
    wait("both failure domains", &|c| published(c) == ["remote", "home"]).await?;
    Ok(())
}

/// A failure domain whose vCenter changes under its machines (here: its own `server` removed,
/// so it would name the cluster's vCenter) blocks them with `VCenterChanged` instead of looking
/// for their VMs in the wrong vCenter (where they would look gone): deleting such a machine
/// keeps its finalizer and its VM until the failure domain's server is put back, then deletes
/// both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_whose_failure_domain_changes_vcenter_is_blocked_not_lost() -> Result<()> {
    use banlieue_scenarios::{Scenario, Template, fixture::CLUSTER, object};
    let mut s = Scenario::<vcsim::VcSimSpread>::new("moved").await?;
    s.ready_cluster().await?;
    let uid = s.machine("m1", Some("remote"), Template::Valid).await?;
    let m1 = s
        .wait_machine("m1", "provisioned", object::fully_provisioned)
        .await?;
    ensure!(
        m1.pointer("/status/server").and_then(|v| v.as_str()).is_some(),
        "status.server records the remote vCenter: {:#}",
        m1["status"]
    );
    let clusters = s.infra("VSphereCluster");
    let original = clusters.get(CLUSTER).await?;
    let domains = original.data["spec"]["failureDomains"].clone();
    let moved: Vec<serde_json::Value> = domains
        .as_array()
        .context("failureDomains")?
        .iter()
        .map(|d| {
            let mut d = d.clone();
            if let Some(d) = d.as_object_mut()
                && d.get("name").and_then(|n| n.as_str()) == Some("remote")
            {
                for key in ["server", "credentialsRef", "tls"] {
                    d.remove(key);
                }
            }
            d
        })
        .collect();
    let patch = |domains: serde_json::Value| {
        kube::api::Patch::Merge(serde_json::json!({"spec": {"failureDomains": domains}}))
    };
    clusters
        .patch(
            CLUSTER,
            &kube::api::PatchParams::default(),
            &patch(serde_json::json!(moved)),
        )
        .await?;
    // A settled machine is looked at again when due (or changed); its deletion at once.
    s.delete_machine("m1").await?;
    s.wait_machine("m1", "blocked by the changed vCenter", |m| {
        object::condition(m, "Ready").is_some_and(|c| c.reason == "VCenterChanged")
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(
        s.get_infra("VSphereMachine", "m1").await?.is_some(),
        "m1 keeps its finalizer while blocked"
    );
    ensure!(s.vms_of(&uid).await?.len() == 1, "its VM is still there");
    clusters
        .patch(CLUSTER, &kube::api::PatchParams::default(), &patch(domains))
        .await?;
    s.wait_machine_gone("m1").await?;
    ensure!(
        s.vms_of(&uid).await?.is_empty(),
        "deleted once the server is back"
    );
    Ok(())
}

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use banlieue_api::infrastructure::VSphereCluster;
use banlieue_api::standalone::infra_cluster_name;
use banlieue_vsphere::provision::OWNER_KEY;
use banlieue_vsphere_client::vim::ConfigSpec;
use banlieue_vsphere_client::{MoRef, VmPowerState};
use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use vcsim_support::{PASSWORD, Vcsim};

#[path = "scenarios/standalone.rs"]
mod standalone;
use standalone::*;

/// vCenter refuses a call whose privilege the account's role lacks (this vcsim checks them as
/// vCenter does): the machine says which privilege on which object, and clones nothing. The
/// shared scenarios run under exactly the documented role (`tests/support/privileges.rs`).
#[tokio::test]
async fn a_role_without_a_documented_privilege_is_refused_naming_it() -> Result<()> {
    const MISSING: &str = "VirtualMachine.Provisioning.DeployTemplate";
    let role: Vec<&str> = privileges::ROLE
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| *p != MISSING)
        .collect();
    let role = role.join(",");
    let sim = Vcsim::start(&[
        "-role-user",
        "narrow",
        "-role-password",
        "narrow-p4ss",
        "-role-privileges",
        &role,
    ])?;
    let vc = sim.client()?;
    sim.make_template(&vc, TEMPLATE).await?;
    let s = scenario_as(&sim, "vs-narrow", "narrow", "narrow-p4ss").await?;
    s.machine("web-1", TEMPLATE).await?;
    let m = s
        .wait_machine("web-1", "refused for the missing privilege", |m| {
            m.status.as_ref().is_some_and(|st| {
                st.conditions.iter().any(|c| {
                    c.message
                        .contains(&format!("lacks the privilege {MISSING} on VirtualMachine"))
                })
            })
        })
        .await?;
    ensure!(
        m.status.as_ref().and_then(|s| s.vm_ref.as_ref()).is_none(),
        "no VM may be cloned without the privilege: {:?}",
        m.status
    );
    let clones = vc
        .find_vms_by_extra_config(OWNER_KEY, &m.uid().unwrap_or_default())
        .await?;
    ensure!(clones.is_empty(), "VMs carry the machine's UID: {clones:?}");
    Ok(())
}

#[tokio::test]
async fn provisions_a_machine_and_deletes_its_vm() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let vc = sim.client()?;
    sim.make_template(&vc, TEMPLATE).await?;
    let s = scenario(&sim, "vs-provision", PASSWORD).await?;
    s.machine("web-1", TEMPLATE).await?;

    // The clone ran: the VM exists, carries the machine's UID and user data, and waits for an IP.
    let m = s
        .wait_machine("web-1", "WaitingForGuest", |m| {
            state(m).as_deref() == Some("WaitingForGuest")
        })
        .await?;
    let vm = MoRef::new(
        "VirtualMachine",
        m.status
            .as_ref()
            .and_then(|s| s.vm_ref.clone())
            .context("no vmRef")?,
    );
    let info = vc.vm_info(&vm).await?.context("VM not in vcsim")?;
    ensure!(info.extra_config.get(OWNER_KEY) == m.uid().as_ref(), "{info:?}");
    let user_data = base64::engine::general_purpose::STANDARD.decode(
        info.extra_config
            .get("guestinfo.userdata")
            .context("no guestinfo.userdata")?,
    )?;
    ensure!(user_data == b"#cloud-config\nhostname: web-1\n");
    ensure!(info.power_state == Some(VmPowerState::PoweredOn), "{info:?}");
    ensure!(
        info.num_cpu == Some(2) && info.memory_mb == Some(2048),
        "{info:?}"
    );
    let (status, reason, _) = ready(&m).context("no Ready")?;
    ensure!(status == "False" && reason == "WaitingForGuest", "{reason}");

    // What the guest sets, as vcsim takes it: extraConfig values, in one reconfigure.
    let guest_sets = |key: &str, value: String| {
        let spec = ConfigSpec {
            extra_config: vec![(key.to_owned(), value)],
            ..ConfigSpec::default()
        };
        let (vc, vm) = (&vc, &vm);
        async move {
            let task = vc.reconfigure(vm, &spec).await?;
            vc.wait_task(&task, Duration::from_millis(100), TIMEOUT).await?;
            anyhow::Ok(())
        }
    };
    // VMware Tools reports an IP (vcsim: through extraConfig).
    guest_sets("SET.guest.ipAddress", "192.0.2.15".into()).await?;
    // Provisioned (CAPI goes on), but not Ready until the guest publishes cloud-init's report:
    // the clone carries the vendor data that does, and no report yet.
    let m = s
        .wait_machine("web-1", "WaitingForCloudInit", |m| {
            ready(m).is_some_and(|r| r.1 == "WaitingForCloudInit")
        })
        .await?;
    ensure!(m.spec.provider_id.is_some(), "provisioned while cloud-init runs");
    let info = vc.vm_info(&vm).await?.context("clone gone")?;
    ensure!(
        info.extra_config
            .get(banlieue_vsphere::guest_report::REPORT_KEY)
            .is_none_or(String::is_empty),
        "a clone starts without a report"
    );
    let vendor_data = base64::engine::general_purpose::STANDARD.decode(
        info.extra_config
            .get("guestinfo.vendordata")
            .context("no vendor data")?,
    )?;
    ensure!(String::from_utf8(vendor_data)?.contains("vmware-rpctool"));
    // The guest publishes cloud-init's errors: CloudInitFailed names them.
    let publish = |report: &str| {
        guest_sets(
            banlieue_vsphere::guest_report::REPORT_KEY,
            banlieue_vsphere::guest_report::encode(report),
        )
    };
    publish(r#"{"v1": {"errors": ["('scripts_user', RuntimeError('kubeadm failed'))"]}}"#).await?;
    let m = s
        .wait_machine("web-1", "CloudInitFailed", |m| {
            ready(m).is_some_and(|r| r.1 == "CloudInitFailed" && r.2.contains("kubeadm failed"))
        })
        .await?;
    ensure!(ready(&m).is_some_and(|r| r.0 == "False"));
    // ... and a Warning Event says so once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !s.events("web-1").await?.iter().any(|e| e == "CloudInitFailed") {
        ensure!(tokio::time::Instant::now() < deadline, "no CloudInitFailed event");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Then (a reboot that ran it again) a report without errors: Ready.
    publish(r#"{"v1": {"errors": []}}"#).await?;
    let m = s
        .wait_machine("web-1", "Ready", |m| ready(m).is_some_and(|r| r.0 == "True"))
        .await?;
    let st = m.status.clone().unwrap_or_default();
    ensure!(
        m.spec.provider_id == info.bios_uuid.as_ref().map(|u| format!("vsphere://{u}")),
        "{:?}",
        m.spec.provider_id
    );
    ensure!(st.initialization.and_then(|i| i.provisioned) == Some(true));
    ensure!(
        st.addresses.iter().any(|a| a.address == "192.0.2.15"),
        "{:?}",
        st.addresses
    );
    ensure!(st.node.is_some(), "no node");
    ensure!(st.observed_generation == m.metadata.generation);
    // The Events follow the status write that reports the machine provisioned.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let events = s.events("web-1").await?;
        if events.iter().any(|e| e == "CloneStarted") && events.iter().any(|e| e == "Provisioned") {
            break;
        }
        ensure!(tokio::time::Instant::now() < deadline, "{events:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // spec.powerState Off powers the provisioned VM off (no re-clone) and status reports it.
    let patch = json!({"spec": {"powerState": "Off"}});
    s.machines()
        .patch(
            "web-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    s.wait_machine("web-1", "powerState Off", |m| {
        m.status.as_ref().and_then(|st| st.power_state) == Some(banlieue_api::common::PowerState::Off)
    })
    .await?;
    let info = vc.vm_info(&vm).await?.context("VM vanished")?;
    ensure!(info.power_state == Some(VmPowerState::PoweredOff), "{info:?}");
    // Provisioned, but not Ready while off, saying why and what to do.
    let off = s
        .wait_machine("web-1", "Ready=False PoweredOff", |m| {
            m.status.as_ref().is_some_and(|st| {
                banlieue_api::condition::find(&st.conditions, banlieue_api::condition::READY)
                    .is_some_and(|c| c.status == "False" && c.reason == "PoweredOff")
            })
        })
        .await?;
    let st = off.status.context("status")?;
    ensure!(st.initialization.and_then(|i| i.provisioned) == Some(true));
    let ready =
        banlieue_api::condition::find(&st.conditions, banlieue_api::condition::READY).context("Ready")?;
    ensure!(
        ready.message
            == "VM web-1 is powered off because spec.powerState is Off; set it to On to start the VM",
        "{}",
        ready.message
    );

    // Deletion powers off and destroys the VM, then releases the object.
    s.machines().delete("web-1", &DeleteParams::default()).await?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while s.machines().get_opt("web-1").await?.is_some() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "VSphereMachine not released"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(vc.vm_info(&vm).await?.is_none(), "VM still in vcsim");
    Ok(())
}

#[tokio::test]
async fn a_vm_carrying_the_machine_uid_is_adopted_not_cloned_again() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let vc = sim.client()?;
    sim.make_template(&vc, TEMPLATE).await?;
    let s = scenario(&sim, "vs-adopt", PASSWORD).await?;
    // Paused: the controller only reports Paused, so the test can play "a previous controller
    // started the clone and crashed before recording the task".
    s.machine_with("db-1", TEMPLATE, json!({"cluster.x-k8s.io/paused": "true"}))
        .await?;
    let m = s
        .wait_machine("db-1", "Paused", |m| {
            m.status.as_ref().is_some_and(|st| {
                st.conditions
                    .iter()
                    .any(|c| c.type_ == "Paused" && c.status == "True")
            })
        })
        .await?;
    ensure!(
        m.status.as_ref().and_then(|s| s.provisioning.clone()).is_none(),
        "paused machine progressed"
    );
    let uid = m.uid().context("no uid")?;
    let spec = banlieue_vsphere_client::CloneSpec {
        folder: vc.find_by_inventory_path("/DC0/vm").await?.context("folder")?,
        name: "db-1".into(),
        pool: vc
            .find_by_inventory_path("/DC0/host/DC0_C0/Resources")
            .await?
            .context("pool")?,
        datastore: None,
        host: None,
        linked_snapshot: None,
        config: ConfigSpec {
            extra_config: vec![(OWNER_KEY.into(), uid.clone())],
            ..ConfigSpec::default()
        },
        power_on: false,
    };
    let template = vc
        .find_by_inventory_path(&format!("/DC0/vm/{TEMPLATE}"))
        .await?
        .context("template")?;
    let orphan = vc
        .wait_task(
            &vc.clone_vm(&template, &spec).await?,
            Duration::from_millis(100),
            TIMEOUT,
        )
        .await?
        .context("clone returned nothing")?;

    let patch = json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": null}}});
    s.machines()
        .patch(
            "db-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    let m = s
        .wait_machine("db-1", "WaitingForGuest", |m| {
            state(m).as_deref() == Some("WaitingForGuest")
        })
        .await?;
    ensure!(
        m.status.as_ref().and_then(|s| s.vm_ref.as_deref()) == Some(orphan.value.as_str()),
        "{:?}",
        m.status
    );
    ensure!(
        vc.find_vms_by_extra_config(OWNER_KEY, &uid).await? == vec![orphan.clone()],
        "cloned twice"
    );
    ensure!(s.events("db-1").await?.iter().any(|e| e == "Adopted"));
    // Adoption still applies the spec: CPU and memory of the adopted VM were reconfigured.
    let info = vc.vm_info(&orphan).await?.context("gone")?;
    ensure!(
        info.num_cpu == Some(2) && info.memory_mb == Some(2048),
        "{info:?}"
    );
    Ok(())
}

#[tokio::test]
async fn vcenter_going_away_is_a_clear_condition() -> Result<()> {
    let mut sim = Vcsim::start(&[])?;
    let vc = sim.client()?;
    sim.make_template(&vc, TEMPLATE).await?;
    let s = scenario(&sim, "vs-outage", PASSWORD).await?;
    s.machine("o-1", TEMPLATE).await?;
    s.wait_machine("o-1", "WaitingForGuest", |m| {
        state(m).as_deref() == Some("WaitingForGuest")
    })
    .await?;
    // vCenter stops answering while the machine waits for its guest.
    sim.stop();
    let m = s
        .wait_machine("o-1", "VCenterUnreachable", |m| {
            ready(m).is_some_and(|r| r.1 == "VCenterUnreachable")
        })
        .await?;
    let (status, _, message) = ready(&m).context("no Ready")?;
    ensure!(
        status == "False" && message.contains("connection failed"),
        "{message}"
    );
    // The persisted progress is kept for when vCenter is back.
    ensure!(state(&m).as_deref() == Some("WaitingForGuest"));
    ensure!(m.status.and_then(|s| s.vm_ref).is_some());
    Ok(())
}

/// Issue 14: a credentials Secret fixed after the fact is acted on within seconds (the Secret
/// watch; the resync of a failing VSphereCluster is 5 minutes).
#[tokio::test]
async fn a_fixed_credentials_secret_is_noticed_within_seconds() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let s = scenario(&sim, "vs-fixed-secret", "not-the-password").await?;
    let clusters: Api<VSphereCluster> = Api::namespaced(s.kube.clone(), &s.ns);
    let name = infra_cluster_name(&s.provider);
    let ready = |c: &VSphereCluster| {
        c.status
            .as_ref()
            .and_then(|st| banlieue_api::condition::find(&st.conditions, "Ready").cloned())
    };
    let wait =
        |what: &'static str, timeout: Duration, check: fn(&banlieue_api::condition::Condition) -> bool| {
            let (clusters, name) = (clusters.clone(), name.clone());
            async move {
                let deadline = tokio::time::Instant::now() + timeout;
                loop {
                    let c = clusters.get(&name).await?;
                    if ready(&c).is_some_and(|r| check(&r)) {
                        return Ok::<_, anyhow::Error>(());
                    }
                    ensure!(
                        tokio::time::Instant::now() < deadline,
                        "VSphereCluster not {what} within {timeout:?}: {:?}",
                        c.status
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
    wait("AuthenticationFailed", Duration::from_secs(90), |r| {
        r.reason == "AuthenticationFailed"
    })
    .await?;
    Api::<Secret>::namespaced(s.kube.clone(), &s.ns)
        .patch(
            "vc-creds",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"password": PASSWORD}})),
        )
        .await?;
    wait("Ready after the fix", Duration::from_secs(15), |r| {
        r.status == "True"
    })
    .await
}
