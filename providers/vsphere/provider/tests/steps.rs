//! Provisioning driven step by step against a real vcsim (no Kubernetes needed).
//!
//! A VSphereMachine created anew by `clusterctl move` (or a restore): same namespace, name and
//! spec with its providerID, a new UID, no status: the VM is re-adopted and re-marked, never
//! cloned again; a VM created for another machine is refused; a vanished VM is reported.
//!
//! A cluster without DRS: machines without a failure domain spread over its hosts by memory left.
//!
//! The meta-data's network is rewritten before the first power-on for the MACs vCenter gave the
//! clone's NICs, which the real cloud-init then renames to the spec's names.
//!
//! Powering off for a day-2 change: the guest is asked to shut down (VMware Tools) and the
//! request survives a restart; a guest that ignored it for the kit's timeout is powered off.

#[path = "../../../../tests/cloud-init/support.rs"]
mod cloud_init;
#[path = "support/privileges.rs"]
mod privileges;
#[path = "../../client/tests/support/vcsim.rs"]
mod vcsim_support;

use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use banlieue_api::common::PowerState;
use banlieue_api::infrastructure::{VSphereCluster, VSphereClusterSpec, VSphereMachineSpec};
use banlieue_provider_kit::machine::Deleted;
use banlieue_vsphere::phase::Phase;
use banlieue_vsphere::provision::{
    self, DeleteStep, MachineInput, OWNER_KEY, OWNER_NAME_KEY, Step, StepError,
};
use banlieue_vsphere::readopt::{self, ADOPTED_FROM_KEY, OnDeletion, Owner};
use banlieue_vsphere_client::{Client, MoRef, VmInfo, VmPowerState};
use serde_json::json;
use vcsim_support::Vcsim;

const TEMPLATE: &str = "DC0_C0_RP0_VM0";
const TIMEOUT: Duration = Duration::from_secs(60);
const OLD_UID: &str = "3f2c1d4e-0000-4000-8000-00000000a001";
const NEW_UID: &str = "7d0c5e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6";
static NO_POOL: banlieue_provider_kit::network::PoolAddresses =
    banlieue_provider_kit::network::PoolAddresses::new();

async fn vcenter() -> Result<(Vcsim, Client)> {
    let sim = Vcsim::start(&[])?;
    let c = sim.client()?;
    sim.make_template(&c, TEMPLATE).await?;
    Ok((sim, c))
}

fn cluster() -> VSphereCluster {
    VSphereCluster::new(
        "c",
        VSphereClusterSpec {
            datacenter: Some("DC0".into()),
            ..VSphereClusterSpec::default()
        },
    )
}

fn spec() -> Result<VSphereMachineSpec> {
    Ok(serde_json::from_value(json!({
        "source": {"template": TEMPLATE},
        "resourcePool": "DC0_C0/Resources",
        "datastore": "LocalDS_0",
        "cpu": {"cores": 2},
        "memoryMiB": 2048,
        "readinessChecks": {"skipGuestAgent": true},
    }))?)
}

/// The input of machine `ns/name` with `uid`, no failure domain and no pool addresses.
fn input<'a>(
    uid: &'a str,
    name: &'a str,
    spec: &'a VSphereMachineSpec,
    cluster: &'a VSphereCluster,
) -> MachineInput<'a> {
    MachineInput {
        owner: readopt::Owner {
            uid,
            namespace: "ns",
            name,
        },
        spec,
        cluster,
        failure_domain: None,
        pool_addresses: &NO_POOL,
    }
}

/// Runs provisioning steps from `phase` until the machine is provisioned and settled; returns
/// every step.
async fn drive(
    c: &Client,
    input: &MachineInput<'_>,
    mut phase: Phase,
    user_data: &[u8],
) -> Result<Vec<Step>> {
    let mut steps = Vec::new();
    for _ in 0..200 {
        let step = provision::provision_step(c, input, phase.clone(), Some(Some(user_data)), PowerState::On)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        phase = step.phase.clone();
        let settled = matches!(phase, Phase::Provisioned(_, None)) && step.waiting.is_none();
        if !step.requeue.is_zero() && !settled {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        steps.push(step);
        if settled {
            return Ok(steps);
        }
    }
    bail!("not provisioned after 200 steps: {:#?}", steps.last())
}

async fn delete(c: &Client, uid: &str, vm: Option<MoRef>) -> Result<()> {
    let mut task = None;
    for _ in 0..200 {
        match provision::delete_step(c, uid, vm.clone(), task.clone())
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?
        {
            DeleteStep::Gone => return Ok(()),
            DeleteStep::Wait(t, _) => {
                task = Some(t);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    bail!("deletion did not finish")
}

/// Every VM of the inventory named `name` (templates excluded).
async fn vms_named(c: &Client, name: &str) -> Result<Vec<MoRef>> {
    Ok(c.all_vms(&["name", "config.template"])
        .await?
        .into_iter()
        .filter(|(_, p)| {
            p.get("name").map(|n| n.text.trim()) == Some(name)
                && p.get("config.template").map(|t| t.text.trim()) != Some("true")
        })
        .map(|(vm, _)| vm)
        .collect())
}

/// Provisions machine `ns/name` with [`OLD_UID`]; returns its VM and the spec with the
/// providerID CAPI copies.
async fn provisioned(
    c: &Client,
    cluster: &VSphereCluster,
    name: &str,
) -> Result<(VmInfo, VSphereMachineSpec)> {
    let mut s = spec()?;
    let input = input(OLD_UID, name, &s, cluster);
    let steps = drive(c, &input, Phase::Clone, b"#cloud-config\n").await?;
    let Some(Phase::Provisioned(vm, None)) = steps.last().map(|s| s.phase.clone()) else {
        bail!("not provisioned");
    };
    let info = c.vm_info(&vm).await?.context("VM gone")?;
    ensure!(info.extra_config.get(OWNER_KEY).map(String::as_str) == Some(OLD_UID));
    ensure!(
        info.extra_config.get(OWNER_NAME_KEY).map(String::as_str) == Some(format!("ns/{name}").as_str()),
        "the clone carries namespace/name: {:?}",
        info.extra_config
    );
    s.provider_id = Some(format!(
        "vsphere://{}",
        info.bios_uuid.clone().context("no BIOS uuid")?
    ));
    Ok((info, s))
}

#[tokio::test]
async fn a_machine_created_anew_by_clusterctl_move_adopts_its_vm_by_provider_id() -> Result<()> {
    let (_sim, c) = vcenter().await?;
    let cluster = cluster();
    let (before, s) = provisioned(&c, &cluster, "m1").await?;
    ensure!(before.power_state == Some(VmPowerState::PoweredOn));

    // The copy: new UID, providerID, no status (Phase::Clone). Its bootstrap data differs to
    // show it is never delivered.
    let copy = input(NEW_UID, "m1", &s, &cluster);
    let steps = drive(&c, &copy, Phase::Clone, b"#cloud-config\nnew: data\n").await?;
    let events: Vec<&str> = steps.iter().flat_map(|s| &s.events).map(|e| e.0).collect();
    ensure!(events == ["Adopting", "Provisioned"], "{events:?}");
    let Some(Phase::Provisioned(vm, None)) = steps.last().map(|s| s.phase.clone()) else {
        bail!("not provisioned");
    };
    ensure!(vm == before.vm, "the same VM: {vm:?} vs {:?}", before.vm);
    ensure!(
        vms_named(&c, "m1").await? == vec![before.vm.clone()],
        "exactly one VM"
    );
    let after = c.vm_info(&vm).await?.context("VM gone")?;
    ensure!(after.bios_uuid == before.bios_uuid);
    ensure!(after.extra_config.get(OWNER_KEY).map(String::as_str) == Some(NEW_UID));
    ensure!(after.extra_config.get(OWNER_NAME_KEY).map(String::as_str) == Some("ns/m1"));
    ensure!(
        after.extra_config.get("guestinfo.userdata") == before.extra_config.get("guestinfo.userdata"),
        "bootstrap data not re-delivered"
    );
    ensure!(
        after.power_state == Some(VmPowerState::PoweredOn),
        "not powered off"
    );
    ensure!(c.find_vms_by_extra_config(OWNER_KEY, OLD_UID).await?.is_empty());

    // The old UID cannot delete it any more; the copy's deletion does.
    delete(&c, OLD_UID, Some(vm.clone())).await?;
    ensure!(c.vm_info(&vm).await?.is_some(), "deleted by the old object");
    delete(&c, NEW_UID, Some(vm.clone())).await?;
    ensure!(c.vm_info(&vm).await?.is_none(), "the adopted VM was deleted");
    ensure!(vms_named(&c, "m1").await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_provider_id_of_a_vm_created_for_another_machine_is_refused_and_a_vanished_vm_reported()
-> Result<()> {
    let (_sim, c) = vcenter().await?;
    let cluster = cluster();
    let (before, s) = provisioned(&c, &cluster, "mine").await?;
    let thief = input(NEW_UID, "thief", &s, &cluster);
    let err = provision::provision_step(&c, &thief, Phase::Clone, Some(Some(b"")), PowerState::On)
        .await
        .err()
        .context("a foreign VM was adopted")?;
    ensure!(
        matches!(&err, StepError::Permanent { reason: "AdoptionFailed", message }
            if message.contains("VSphereMachine ns/mine") && message.contains("refusing to adopt")),
        "{err}"
    );
    let after = c.vm_info(&before.vm).await?.context("VM gone")?;
    ensure!(
        after.extra_config.get(OWNER_KEY).map(String::as_str) == Some(OLD_UID),
        "left untouched"
    );
    ensure!(vms_named(&c, "thief").await?.is_empty(), "nothing cloned");

    // A providerID whose VM is gone: VMNotFound, never a new clone.
    let mut gone = spec()?;
    gone.provider_id = Some("vsphere://4218a0f3-dead-4000-8000-000000000777".into());
    let input = input(NEW_UID, "gone", &gone, &cluster);
    let err = provision::provision_step(&c, &input, Phase::Clone, Some(Some(b"")), PowerState::On)
        .await
        .err()
        .context("a machine with a vanished VM provisioned")?;
    ensure!(
        matches!(&err, StepError::Permanent { reason: "VMNotFound", message }
            if message.contains("delete this machine to replace it")),
        "{err}"
    );
    ensure!(vms_named(&c, "gone").await?.is_empty(), "nothing cloned");
    Ok(())
}

#[tokio::test]
async fn the_original_never_takes_back_a_vm_its_copy_adopted_and_an_unadopted_copy_leaves_it_on_deletion()
-> Result<()> {
    let (_sim, c) = vcenter().await?;
    let cluster = cluster();
    let (before, s) = provisioned(&c, &cluster, "pp").await?;
    let provider_id = s.provider_id.clone().context("no providerID")?;
    let copy_owner = Owner {
        uid: NEW_UID,
        namespace: "ns",
        name: "pp",
    };
    // Deleting a copy that never adopted the VM: left in place, not re-marked.
    let OnDeletion::Release(Deleted::Released {
        reason: "VMLeftInPlace",
        note,
    }) = readopt::on_deletion(&c, copy_owner, &provider_id)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
    else {
        bail!("must be left in place");
    };
    ensure!(
        note.contains("earlier object of this name") && note.contains(OLD_UID),
        "{note}"
    );
    let untouched = c.vm_info(&before.vm).await?.context("VM gone")?;
    ensure!(untouched.extra_config.get(OWNER_KEY).map(String::as_str) == Some(OLD_UID));
    let OnDeletion::Release(Deleted::Released {
        reason: "Deleted",
        note,
    }) = readopt::on_deletion(&c, copy_owner, "vsphere-bogus")
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
    else {
        bail!("an unparsable providerID names no VM");
    };
    ensure!(note.contains("nothing deleted"), "{note}");

    // The copy adopts the VM while the original still exists.
    let copy = input(NEW_UID, "pp", &s, &cluster);
    drive(&c, &copy, Phase::Clone, b"").await?;
    let adopted = c.vm_info(&before.vm).await?.context("VM gone")?;
    ensure!(adopted.extra_config.get(OWNER_KEY).map(String::as_str) == Some(NEW_UID));
    ensure!(adopted.extra_config.get(ADOPTED_FROM_KEY).map(String::as_str) == Some(OLD_UID));

    // The original's provisioned path (and a fresh look) refuse to take it back.
    let original = input(OLD_UID, "pp", &s, &cluster);
    for phase in [Phase::Provisioned(before.vm.clone(), None), Phase::Clone] {
        let err = provision::provision_step(&c, &original, phase, Some(None), PowerState::On)
            .await
            .err()
            .context("the original took the VM back")?;
        ensure!(
            matches!(&err, StepError::Permanent { reason: "AdoptionFailed", message }
                if message.contains(&format!("taken over by a copy of this machine (object uid {NEW_UID})"))
                    && message.contains("refusing to take it back")),
            "{err}"
        );
        let now = c.vm_info(&before.vm).await?.context("VM gone")?;
        ensure!(
            now.extra_config.get(OWNER_KEY).map(String::as_str) == Some(NEW_UID),
            "untouched"
        );
    }

    // Owned by the copy now: its deletion deletes it.
    let OnDeletion::Delete(readopt::Candidate { vm, .. }) =
        readopt::on_deletion(&c, copy_owner, &provider_id)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?
    else {
        bail!("owned: deleted");
    };
    delete(&c, NEW_UID, Some(vm.vm)).await?;
    ensure!(vms_named(&c, "pp").await?.is_empty());
    Ok(())
}

/// One provisioning step of `input` from `phase` with `spec.powerState: Off`.
async fn off_step(c: &Client, input: &MachineInput<'_>, phase: Phase) -> Result<Step> {
    provision::provision_step(c, input, phase, None, PowerState::Off)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// `spec.powerState: Off` on a provisioned VM asks the guest to shut down (no hard power-off
/// task) and records when; a guest still running after the kit's timeout is powered off hard
/// with a `PoweredOffForcibly` Event.
#[tokio::test]
async fn powering_off_asks_the_guest_first_and_forces_it_after_the_timeout() -> Result<()> {
    use banlieue_provider_kit::power;
    let (_sim, c) = vcenter().await?;
    let cluster = cluster();
    let (info, s) = provisioned(&c, &cluster, "off-1").await?;
    let vm = info.vm.clone();
    let input = input(OLD_UID, "off-1", &s, &cluster);
    let step = off_step(&c, &input, Phase::Provisioned(vm.clone(), None)).await?;
    let Phase::ShuttingDown(_, since) = step.phase else {
        bail!("not shutting down: {:?}", step.phase);
    };
    ensure!(
        step.events
            .first()
            .is_some_and(|(reason, _)| *reason == "PoweringOff"),
        "{:?}",
        step.events
    );
    // vcsim's guest obeys at once: the next step finds it off and goes on from Provisioned.
    let step = off_step(&c, &input, Phase::ShuttingDown(vm.clone(), since)).await?;
    ensure!(
        step.phase == Phase::Provisioned(vm.clone(), None),
        "{:?}",
        step.phase
    );
    ensure!(
        c.vm_info(&vm).await?.context("VM gone")?.power_state == Some(VmPowerState::PoweredOff),
        "the guest shutdown did not power the VM off"
    );

    // A guest that ignores the request: powered on again, the request made long ago.
    let t = c.power_on(&vm).await?;
    c.wait_task(&t, Duration::from_millis(50), TIMEOUT).await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let recent = now - k8s_openapi::jiff::SignedDuration::from_secs(5);
    let step = off_step(&c, &input, Phase::ShuttingDown(vm.clone(), recent)).await?;
    ensure!(
        step.phase == Phase::ShuttingDown(vm.clone(), recent),
        "a guest within its timeout is waited for: {:?}",
        step.phase
    );
    let waiting = step.waiting.clone().unwrap_or_default();
    ensure!(
        waiting.contains("(spec.powerState is Off): asked ")
            && waiting.contains("powered off hard after 120s"),
        "the wait says what for and since when: {waiting:?}"
    );
    let long_ago =
        now - k8s_openapi::jiff::SignedDuration::from_secs(power::SHUTDOWN_TIMEOUT.as_secs() as i64 + 1);
    let step = off_step(&c, &input, Phase::ShuttingDown(vm.clone(), long_ago)).await?;
    let Phase::Provisioned(_, Some(task)) = &step.phase else {
        bail!("no hard power-off: {:?}", step.phase);
    };
    ensure!(
        step.events
            .first()
            .is_some_and(|(reason, _)| *reason == power::POWERED_OFF_FORCIBLY),
        "{:?}",
        step.events
    );
    c.wait_task(task, Duration::from_millis(50), TIMEOUT).await?;
    ensure!(
        c.vm_info(&vm).await?.context("VM gone")?.power_state == Some(VmPowerState::PoweredOff),
        "not powered off"
    );
    Ok(())
}

#[tokio::test]
async fn machines_without_a_failure_domain_spread_over_the_hosts_of_a_cluster_without_drs() -> Result<()> {
    let (sim, c) = vcenter().await?;
    sim.disable_drs(&c, "/DC0/host/DC0_C0").await?;
    let cluster = cluster();
    let s = spec()?;
    let mut hosts = Vec::new();
    for (i, uid) in [OLD_UID, NEW_UID, "5e6f7a8b-0000-4000-8000-00000000a003"]
        .into_iter()
        .enumerate()
    {
        let name = format!("spread-{i}");
        let input = input(uid, &name, &s, &cluster);
        let steps = drive(&c, &input, Phase::Clone, b"#cloud-config\n").await?;
        let Some(Phase::Provisioned(vm, None)) = steps.last().map(|s| s.phase.clone()) else {
            bail!("{name} not provisioned");
        };
        let info = c.vm_info(&vm).await?.context("VM gone")?;
        hosts.push(info.host.context("no host")?.value);
    }
    let mut distinct = hosts.clone();
    distinct.sort_unstable();
    distinct.dedup();
    ensure!(
        distinct.len() == 3,
        "three 2 GiB machines on three 4 GiB hosts, each where the most memory was left: {hosts:?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_guest_network_is_matched_by_the_macs_vcenter_assigned() -> Result<()> {
    let (_sim, c) = vcenter().await?;
    let cluster = cluster();
    let mut s = spec()?;
    s.networks = serde_json::from_value(json!([{
        "name": "ens192", "network": "VM Network",
        "ipv4": {"mode": "Static", "addresses": ["192.0.2.10/24"], "gateway": "192.0.2.1"},
    }]))?;
    let input = input(OLD_UID, "net-1", &s, &cluster);
    let steps = drive(&c, &input, Phase::Clone, b"#cloud-config\n").await?;
    let Some(Phase::Provisioned(vm, None)) = steps.last().map(|s| s.phase.clone()) else {
        bail!("not provisioned");
    };
    let info = c.vm_info(&vm).await?.context("VM gone")?;
    let mac = info
        .hardware
        .nics
        .first()
        .and_then(|n| n.mac.clone())
        .context("no NIC MAC")?;
    let guestinfo: Vec<(String, String)> = info
        .extra_config
        .iter()
        .filter(|(k, _)| k.starts_with("guestinfo."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let read = cloud_init::read_vmware(&guestinfo)?;
    let renames: Vec<(String, String)> = read
        .renames
        .iter()
        .map(|r| (r.0.to_ascii_lowercase(), r.1.clone()))
        .collect();
    ensure!(
        renames == [(mac.to_ascii_lowercase(), "ens192".to_owned())],
        "{renames:?} (VM MAC {mac})"
    );
    let netplan = read.file("netplan", "50-cloud-init.yaml")?;
    ensure!(
        netplan.contains("- 192.0.2.10/24") && netplan.contains("set-name: ens192"),
        "{netplan}"
    );
    Ok(())
}

/// The networks of a machine in a failure domain are looked up in the datacenter it is placed in,
/// the failure domain's (here neither the machine nor the cluster names one).
#[tokio::test]
async fn the_networks_of_a_machine_in_a_failure_domain_are_the_failure_domains_datacenters() -> Result<()> {
    let (_sim, c) = vcenter().await?;
    let cluster = VSphereCluster::new(
        "c",
        serde_json::from_value(json!({
            "failureDomains": [{"name": "fd1", "datacenter": "DC0", "computeCluster": "DC0_C0"}],
        }))?,
    );
    let mut s = spec()?;
    s.resource_pool = None;
    s.networks = serde_json::from_value(json!([{"name": "ens192", "network": "VM Network"}]))?;
    let input = MachineInput {
        failure_domain: Some("fd1"),
        ..input(OLD_UID, "fd-net-1", &s, &cluster)
    };
    let steps = drive(&c, &input, Phase::Clone, b"#cloud-config\n").await?;
    let Some(Phase::Provisioned(vm, None)) = steps.last().map(|s| s.phase.clone()) else {
        bail!("not provisioned");
    };
    let info = c.vm_info(&vm).await?.context("VM gone")?;
    ensure!(info.hardware.nics.len() == 1, "{:?}", info.hardware.nics);
    Ok(())
}

/// A network vCenter does not have is refused for good (NetworkNotFound) with the inventory path
/// it was looked up at, before the VM is ever powered on.
#[tokio::test]
async fn a_network_vcenter_lacks_is_refused_with_its_path() -> Result<()> {
    let (_sim, c) = vcenter().await?;
    let cluster = cluster();
    let mut s = spec()?;
    s.networks = serde_json::from_value(json!([{"name": "ens192", "network": "No Such Network"}]))?;
    let input = input(OLD_UID, "net-missing", &s, &cluster);
    let mut phase = Phase::Clone;
    for _ in 0..200 {
        let step = provision::provision_step(
            &c,
            &input,
            phase.clone(),
            Some(Some(b"#cloud-config\n")),
            PowerState::On,
        );
        match step.await {
            Ok(step) => phase = step.phase,
            Err(e) => {
                ensure!(
                    e.reason() == "NetworkNotFound",
                    "{} in {phase:?}: {e}",
                    e.reason()
                );
                ensure!(
                    e.to_string()
                        .contains(r#"network "/DC0/network/No Such Network" not found in vCenter"#),
                    "{e}"
                );
                ensure!(
                    matches!(phase, Phase::Configure(..)),
                    "refused while configuring: {phase:?}"
                );
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("never refused; last phase {phase:?}")
}

/// A one-disk OVF descriptor as exporters write it (`disk-0.vmdk`, 1 GiB).
const OVF: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1" xmlns:rasd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData" xmlns:vssd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_VirtualSystemSettingData" xmlns:vmw="http://www.vmware.com/schema/ovf">
  <References><File ovf:href="disk-0.vmdk" ovf:id="file1"/></References>
  <DiskSection><Info>Virtual disk information</Info>
    <Disk ovf:capacity="1" ovf:capacityAllocationUnits="byte * 2^30" ovf:diskId="vmdisk1" ovf:fileRef="file1" ovf:format="http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized"/>
  </DiskSection>
  <NetworkSection><Info>The logical networks</Info><Network ovf:name="VM Network"><Description>VM Network</Description></Network></NetworkSection>
  <VirtualSystem ovf:id="noble">
    <Info>A virtual machine</Info>
    <Name>noble</Name>
    <OperatingSystemSection ovf:id="94" vmw:osType="ubuntu64Guest"><Info>The guest operating system</Info></OperatingSystemSection>
    <VirtualHardwareSection>
      <Info>Virtual hardware requirements</Info>
      <System><vssd:ElementName>Virtual Hardware Family</vssd:ElementName><vssd:InstanceID>0</vssd:InstanceID><vssd:VirtualSystemIdentifier>noble</vssd:VirtualSystemIdentifier><vssd:VirtualSystemType>vmx-13</vssd:VirtualSystemType></System>
      <Item><rasd:AllocationUnits>hertz * 10^6</rasd:AllocationUnits><rasd:Description>Number of Virtual CPUs</rasd:Description><rasd:ElementName>1 virtual CPU(s)</rasd:ElementName><rasd:InstanceID>1</rasd:InstanceID><rasd:ResourceType>3</rasd:ResourceType><rasd:VirtualQuantity>1</rasd:VirtualQuantity></Item>
      <Item><rasd:AllocationUnits>byte * 2^20</rasd:AllocationUnits><rasd:Description>Memory Size</rasd:Description><rasd:ElementName>512MB of memory</rasd:ElementName><rasd:InstanceID>2</rasd:InstanceID><rasd:ResourceType>4</rasd:ResourceType><rasd:VirtualQuantity>512</rasd:VirtualQuantity></Item>
      <Item><rasd:Address>0</rasd:Address><rasd:Description>SCSI Controller</rasd:Description><rasd:ElementName>SCSI Controller 0</rasd:ElementName><rasd:InstanceID>3</rasd:InstanceID><rasd:ResourceSubType>lsilogic</rasd:ResourceSubType><rasd:ResourceType>6</rasd:ResourceType></Item>
      <Item><rasd:AddressOnParent>0</rasd:AddressOnParent><rasd:ElementName>Hard Disk 1</rasd:ElementName><rasd:HostResource>ovf:/disk/vmdisk1</rasd:HostResource><rasd:InstanceID>4</rasd:InstanceID><rasd:Parent>3</rasd:Parent><rasd:ResourceType>17</rasd:ResourceType></Item>
      <Item><rasd:AddressOnParent>7</rasd:AddressOnParent><rasd:AutomaticAllocation>true</rasd:AutomaticAllocation><rasd:Connection>VM Network</rasd:Connection><rasd:ElementName>Network adapter 1</rasd:ElementName><rasd:InstanceID>5</rasd:InstanceID><rasd:ResourceSubType>VmxNet3</rasd:ResourceSubType><rasd:ResourceType>10</rasd:ResourceType></Item>
    </VirtualHardwareSection>
  </VirtualSystem>
</Envelope>
"#;

fn ova(disk: &[u8]) -> Vec<u8> {
    banlieue_testenv::files::ustar(&[("noble.ovf", OVF.as_bytes()), ("disk-0.vmdk", disk)])
}

fn image_spec(url: &str, checksum: &str) -> Result<VSphereMachineSpec> {
    let mut spec = spec()?;
    spec.source = serde_json::from_value(json!({
        "template": "/DC0/vm/noble",
        "image": {"url": url, "checksumAlgorithm": "SHA256", "checksum": checksum},
    }))?;
    Ok(spec)
}

/// Steps until provisioned or a step fails (bounded); the reasons waited with, deduplicated.
async fn drive_image(
    c: &Client,
    input: &MachineInput<'_>,
) -> (Vec<&'static str>, std::result::Result<Phase, StepError>) {
    let (mut phase, mut reasons) = (Phase::Clone, Vec::new());
    for _ in 0..600 {
        match provision::provision_step(
            c,
            input,
            phase.clone(),
            Some(Some(b"#cloud-config\n")),
            PowerState::On,
        )
        .await
        {
            Ok(step) => {
                if let Some(reason) = step.waiting_reason
                    && reasons.last() != Some(&reason)
                {
                    reasons.push(reason);
                }
                phase = step.phase.clone();
                if matches!(phase, Phase::Provisioned(_, None)) && step.waiting.is_none() {
                    return (reasons, Ok(phase));
                }
            }
            Err(StepError::Transient { .. }) => {}
            Err(e) => return (reasons, Err(e)),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not provisioned after 600 steps, phase {phase:?}");
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_template_is_imported_from_an_ova_once_and_cloned() -> Result<()> {
    // The provider's side runs under exactly the documented vCenter role, which this vcsim
    // checks: the import's privileges (ImportVApp, MarkAsTemplate, Rename, Destroy) are in it.
    let privileges = privileges::role_privileges();
    let sim = Vcsim::start(&[
        "-role-user",
        "importer",
        "-role-password",
        "imp0rt",
        "-role-privileges",
        &privileges,
    ])?;
    sim.make_template(&sim.client()?, TEMPLATE).await?;
    let c = sim.client_as("importer", "imp0rt")?;
    let image = ova(&[5u8; 4096]);
    let server =
        banlieue_testenv::files::FileServer::start([("/noble.ova".to_owned(), image.clone())]).await?;
    let spec = image_spec(&server.url("/noble.ova"), &sha256_hex(&image))?;
    let cluster = cluster();

    let (reasons, first) = drive_image(&c, &input(OLD_UID, "m-ova-1", &spec, &cluster)).await;
    ensure!(reasons == ["ImportingImage"], "waited with {reasons:?}");
    first.map_err(|e| anyhow::anyhow!("{e}"))?;
    let (reasons, second) = drive_image(&c, &input(NEW_UID, "m-ova-2", &spec, &cluster)).await;
    ensure!(
        reasons.is_empty(),
        "the second machine finds the template: {reasons:?}"
    );
    second.map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(server.requests(), ["/noble.ova"], "downloaded once");

    let template = c
        .find_by_inventory_path("/DC0/vm/noble")
        .await?
        .context("the imported template")?;
    let props = c
        .properties(&template, &["config.template"])
        .await?
        .context("its properties")?;
    assert_eq!(props.get("config.template").map(|t| t.text.trim()), Some("true"));
    assert!(
        c.find_by_inventory_path(&format!(
            "/DC0/vm/noble{}",
            banlieue_vsphere::image_import::STAGING_SUFFIX
        ))
        .await?
        .is_none(),
        "the staging name is gone"
    );
    ensure!(vms_named(&c, "m-ova-1").await?.len() == 1 && vms_named(&c, "m-ova-2").await?.len() == 1);
    let recorded = c.vm_info(&template).await?.context("the template")?.extra_config;
    assert_eq!(
        recorded.get(banlieue_vsphere::image_import::IMAGE_KEY),
        Some(&format!("sha256:{}", sha256_hex(&image))),
        "the template records the image it was imported from"
    );

    // Another image at the same template path is refused, not silently served the old one.
    let other = ova(&[8u8; 4096]);
    let changed = image_spec(&server.url("/noble.ova"), &sha256_hex(&other))?;
    let (_, outcome) = drive_image(
        &c,
        &input(
            "5e1d2c3b-0000-4000-8000-00000000a003",
            "m-ova-3",
            &changed,
            &cluster,
        ),
    )
    .await;
    match outcome {
        Err(StepError::Permanent { reason, message }) => {
            assert_eq!(reason, "ImageConflict");
            assert!(message.contains("/DC0/vm/noble"), "{message}");
        }
        other => bail!("expected ImageConflict, got {other:?}"),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ova_whose_checksum_differs_is_refused_and_nothing_is_imported() -> Result<()> {
    let (_sim, c) = vcenter().await?;
    let image = ova(&[6u8; 4096]);
    let server =
        banlieue_testenv::files::FileServer::start([("/noble.ova".to_owned(), image.clone())]).await?;
    let published = sha256_hex(b"what the vendor published");
    let spec = image_spec(&server.url("/noble.ova"), &published)?;
    let cluster = cluster();

    let (reasons, outcome) = drive_image(&c, &input(OLD_UID, "m-ova-bad", &spec, &cluster)).await;
    ensure!(reasons == ["ImportingImage"], "waited with {reasons:?}");
    match outcome {
        Err(StepError::Permanent { reason, message }) => {
            assert_eq!(reason, "ImageChecksumMismatch");
            assert!(message.contains(&published), "{message}");
            assert!(message.contains(&sha256_hex(&image)), "{message}");
        }
        other => bail!("expected ImageChecksumMismatch, got {other:?}"),
    }
    for path in [
        "/DC0/vm/noble".to_owned(),
        format!("/DC0/vm/noble{}", banlieue_vsphere::image_import::STAGING_SUFFIX),
    ] {
        ensure!(
            c.find_by_inventory_path(&path).await?.is_none(),
            "{path} was not created"
        );
    }
    ensure!(vms_named(&c, "m-ova-bad").await?.is_empty(), "no clone");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_needs_a_datastore_to_be_imported_to() -> Result<()> {
    let (_sim, c) = vcenter().await?;
    let mut spec = image_spec("http://127.0.0.1:9/noble.ova", &sha256_hex(b"x"))?;
    spec.datastore = None;
    let cluster = cluster();
    let (_, outcome) = drive_image(&c, &input(OLD_UID, "m-ova-nods", &spec, &cluster)).await;
    match outcome {
        Err(StepError::Permanent { reason, message }) => {
            assert_eq!(reason, "ImportNeedsDatastore");
            assert!(message.contains("spec.datastore"), "{message}");
        }
        other => bail!("expected ImportNeedsDatastore, got {other:?}"),
    }
    Ok(())
}
