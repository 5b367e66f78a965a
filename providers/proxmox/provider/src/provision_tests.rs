//! Tests of the provisioning and deletion steps against the in-memory [`FakePve`].

use banlieue_api::common::{Cpu, Disk, PowerState, ProvisioningState, ProvisioningStatus, RestartPolicy};
use banlieue_api::infrastructure::{
    ProxmoxMachineSpec, ProxmoxMachineStatus, ProxmoxTemplateSource, VmidRange,
};
use banlieue_capi::bootstrap::{BootstrapData, BootstrapFormat};
use banlieue_cloudinit::SeedFiles;
use pretty_assertions::assert_eq;
use rstest::rstest;

use crate::desired;
use crate::fake::{FakePve, FakeVm, api_error};
use crate::hypervisor::Hypervisor as _;
use crate::phase::{Phase, VmLocation};
use crate::provision::{
    DeleteStep, MachineInput, Step, StepError, VMID_PROBES, VmidReservations, delete_step, provision_step,
};
use crate::readopt;

static NO_POOL: banlieue_provider_kit::network::PoolAddresses =
    banlieue_provider_kit::network::PoolAddresses::new();
const UID: &str = "0b7c6a52-1d2e-4f00-9a8b-77c6d5e4f301";
const USER_DATA: &[u8] = b"#cloud-config\nwrite_files:\n- path: /etc/x\n  content: \"\xe2\x9c\x93 bytes\"\n";

fn spec() -> ProxmoxMachineSpec {
    ProxmoxMachineSpec {
        disks: vec![Disk {
            name: "scsi0".into(),
            size_gib: 20,
            storage: None,
        }],
        tags: vec!["k8s".into()],
        ..ProxmoxMachineSpec::new(
            ProxmoxTemplateSource {
                vmid: Some(9000),
                ..ProxmoxTemplateSource::default()
            },
            Cpu::cores(2),
            4096,
        )
    }
}

fn bootstrap() -> BootstrapData {
    BootstrapData {
        format: BootstrapFormat::CloudConfig,
        value: USER_DATA.to_vec(),
    }
}

fn input<'a>(spec: &'a ProxmoxMachineSpec, fd: Option<&'a str>) -> MachineInput<'a> {
    MachineInput {
        owner: readopt::Owner {
            uid: UID,
            namespace: "ns",
            name: "m1",
        },
        spec,
        failure_domain: fd,
        cluster_allowed_nodes: &[],
        cluster_vmid_range: None,
        seed_storage: "local",
        pool_addresses: &NO_POOL,
        waiting_since: None,
        cloud_init_pending: false,
    }
}

/// Runs steps from `phase` until `stop` holds or 60 steps pass; returns the steps taken.
async fn drive(
    hv: &FakePve,
    input: &MachineInput<'_>,
    mut phase: Phase,
    reservations: &VmidReservations,
    stop: impl Fn(&Phase) -> bool,
) -> Result<Vec<Step>, StepError> {
    let mut steps = Vec::new();
    for _ in 0..60 {
        if stop(&phase) {
            return Ok(steps);
        }
        let step = provision_step(hv, input, phase, Some(&bootstrap()), reservations).await?;
        phase = step.phase.clone();
        steps.push(step);
    }
    panic!("no convergence; last phase {phase:?}");
}

fn provisioned(p: &Phase) -> bool {
    matches!(p, Phase::Provisioned(_))
}

/// One step from `phase` without user data, with fresh reservations.
async fn one_step(hv: &FakePve, input: &MachineInput<'_>, phase: Phase) -> Step {
    provision_step(hv, input, phase, None, &VmidReservations::default())
        .await
        .unwrap()
}

/// Drives a fresh machine until it waits for its guest (started, seed attached); the steps.
async fn booting(hv: &FakePve, input: &MachineInput<'_>) -> Vec<Step> {
    drive(hv, input, Phase::SelectNode, &VmidReservations::default(), |p| {
        matches!(p, Phase::WaitGuest(_))
    })
    .await
    .unwrap()
}

/// Drives a fresh machine to `Provisioned` with its own reservations; the steps taken.
async fn provision(hv: &FakePve, input: &MachineInput<'_>) -> Vec<Step> {
    drive(
        hv,
        input,
        Phase::SelectNode,
        &VmidReservations::default(),
        provisioned,
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn provisions_a_machine_end_to_end() {
    let hv = FakePve::new(3);
    hv.set_task_polls(1);
    let spec = spec();
    let input = input(&spec, Some("pve2"));
    let steps = provision(&hv, &input).await;

    let vms = hv.vms();
    assert_eq!(vms.len(), 1, "exactly one VM");
    let (vmid, vm) = vms.into_iter().next().unwrap();
    assert_eq!(vm.node, "pve2", "placed in the Machine's failure domain");
    assert!(vm.running);
    assert_eq!(vm.config["cores"], "2");
    assert_eq!(vm.config["memory"], "4096");
    assert_eq!(vm.config["scsi0"], "local-lvm:base-9000-disk-0,size=20G");
    assert!(desired::is_owned_by(
        &banlieue_pve_client::VmConfig(vm.config.clone()),
        UID
    ));
    assert!(vm.config["tags"].split(';').any(|t| t == "k8s"));
    assert_eq!(
        vm.config["ide2"], "none,media=cdrom",
        "seed ejected after provisioning"
    );
    assert!(hv.volumes().is_empty(), "seed ISO deleted after provisioning");

    let last = steps.last().unwrap();
    let done = last.provisioned.as_ref().expect("the last step reports the VM");
    assert_eq!(
        done.provider_id,
        format!("proxmox://0000aaaa-0000-0000-0000-{vmid:012}")
    );
    assert_eq!(done.addresses.as_ref().unwrap()[0].address, "m1");
    assert!(done.addresses.iter().flatten().all(|a| a.address != "127.0.0.1"));
    assert_eq!(
        last.phase,
        Phase::Provisioned(VmLocation {
            node: "pve2".into(),
            vmid
        })
    );
    let events: Vec<&str> = steps.iter().flat_map(|s| s.events.iter().map(|e| e.0)).collect();
    assert_eq!(
        events,
        ["CloneStarted", "Cloned", "Configured", "PoweredOn", "Provisioned"]
    );
}

#[tokio::test]
async fn the_seed_carries_the_bootstrap_data_byte_for_byte() {
    let hv = FakePve::new(1);
    let spec = spec();
    let input = input(&spec, None);
    // Stop right after the upload task is recorded, before the seed is deleted.
    drive(
        &hv,
        &input,
        Phase::SelectNode,
        &VmidReservations::default(),
        |p| matches!(p, Phase::PowerOn(..)),
    )
    .await
    .unwrap();
    let volumes = hv.volumes();
    let iso = &volumes[&("pve1".to_owned(), desired::seed_volid("local", UID))];
    let files = SeedFiles::from_iso(iso).unwrap();
    assert_eq!(files.user_data.as_deref(), Some(USER_DATA));
    let meta = files.meta_data.unwrap();
    assert!(meta.contains("local-hostname: m1"), "{meta}");
    assert!(meta.contains("instance-id: \"0000AAAA-0000-0000-0000-"), "{meta}");
    let network = files.network_config.unwrap();
    assert!(network.contains("macaddress: \"bc:24:11:"), "{network}");
    let vm = hv.vms().into_values().next().unwrap();
    assert_eq!(
        vm.config["ide2"],
        format!("{},media=cdrom", desired::seed_volid("local", UID))
    );
}

#[tokio::test]
async fn a_crash_between_clone_start_and_status_write_adopts_the_vm() {
    let hv = FakePve::new(2);
    hv.set_task_polls(3);
    let spec = spec();
    let input = input(&spec, None);
    let reservations = VmidReservations::default();
    // Persisted state before the crash: VMID chosen, clone not recorded.
    let steps = drive(&hv, &input, Phase::SelectNode, &reservations, |p| {
        matches!(p, Phase::Clone(_))
    })
    .await
    .unwrap();
    let persisted = steps.last().unwrap().phase.clone();
    let started = provision_step(&hv, &input, persisted.clone(), Some(&bootstrap()), &reservations)
        .await
        .unwrap();
    assert!(matches!(started.phase, Phase::WaitClone(..)));
    // Crash: the WaitClone phase is never written. A new process (fresh reservations) resumes.
    let fresh = VmidReservations::default();
    let waiting = provision_step(&hv, &input, persisted.clone(), Some(&bootstrap()), &fresh)
        .await
        .unwrap();
    assert_eq!(waiting.phase, persisted, "waits while the clone lock is held");
    assert!(waiting.waiting.unwrap().contains("being cloned"));
    hv.finish_all_tasks();
    let adopted = provision_step(&hv, &input, persisted, Some(&bootstrap()), &fresh)
        .await
        .unwrap();
    assert!(
        matches!(adopted.phase, Phase::Configure(_, None)),
        "{:?}",
        adopted.phase
    );
    assert_eq!(
        adopted.events.iter().map(|e| e.0).collect::<Vec<_>>(),
        ["Adopted"]
    );
    drive(&hv, &input, adopted.phase, &fresh, provisioned)
        .await
        .unwrap();
    assert_eq!(hv.vms().len(), 1, "never two VMs for one machine");
    assert_eq!(hv.calls().iter().filter(|c| *c == "clone_vm").count(), 1);
}

#[tokio::test]
async fn a_foreign_vm_at_the_chosen_vmid_is_left_alone_and_another_vmid_is_used() {
    let hv = FakePve::new(1);
    let spec = spec();
    let input = input(&spec, None);
    let foreign = FakeVm {
        node: "pve1".into(),
        config: [("name".to_owned(), "someone-else".to_owned())].into(),
        running: true,
        agent_ips: None,
        cloud_init: None,
    };
    hv.insert_vm(150, foreign.clone());
    let loc = VmLocation {
        node: "pve1".into(),
        vmid: 150,
    };
    let step = provision_step(
        &hv,
        &input,
        Phase::Clone(loc),
        Some(&bootstrap()),
        &VmidReservations::default(),
    )
    .await
    .unwrap();
    assert_eq!(step.phase, Phase::AllocateVmid { node: "pve1".into() });
    assert_eq!(step.events[0].0, "VMIDTaken");
    drive(&hv, &input, step.phase, &VmidReservations::default(), provisioned)
        .await
        .unwrap();
    assert_eq!(hv.vm(150), Some(foreign), "the foreign VM is untouched");
    assert_eq!(hv.vms().len(), 2);
}

#[tokio::test]
async fn concurrent_machines_get_distinct_vmids_from_reservations() {
    let hv = FakePve::new(1);
    let spec = spec();
    let reservations = VmidReservations::default();
    let a = with_owner(input(&spec, None), |o| o.uid = "uid-a");
    let b = with_owner(input(&spec, None), |o| o.uid = "uid-b");
    let node = || Phase::AllocateVmid { node: "pve1".into() };
    let pa = provision_step(&hv, &a, node(), None, &reservations)
        .await
        .unwrap()
        .phase;
    let pb = provision_step(&hv, &b, node(), None, &reservations)
        .await
        .unwrap()
        .phase;
    let (Phase::Clone(la), Phase::Clone(lb)) = (pa, pb) else {
        panic!("both allocate")
    };
    assert_ne!(la.vmid, lb.vmid);
    assert_eq!(
        hv.calls().iter().filter(|c| *c == "vmid_is_free").count(),
        1,
        "the first takes the VMID PVE proposed without asking again; the second starts above \
         the first one's reservation instead of probing it"
    );
}

#[tokio::test]
async fn hundreds_of_machines_allocating_at_once_get_distinct_vmids_without_wasted_probes() {
    let hv = FakePve::new(1);
    hv.set_yielding(true);
    // A foreign VM in the middle of the range the machines will take.
    hv.insert_vm(
        250,
        FakeVm {
            node: "pve1".into(),
            config: [("name".to_owned(), "foreign".to_owned())].into(),
            running: false,
            agent_ips: None,
            cloud_init: None,
        },
    );
    let spec = spec();
    let reservations = VmidReservations::default();
    let uids: Vec<String> = (0..400).map(|i| format!("uid-{i}")).collect();
    let allocations = futures::future::join_all(uids.iter().map(|uid| {
        let input = with_owner(input(&spec, None), |o| o.uid = uid);
        let (hv, reservations) = (&hv, &reservations);
        async move {
            provision_step(
                hv,
                &input,
                Phase::AllocateVmid { node: "pve1".into() },
                None,
                reservations,
            )
            .await
            .map(|step| step.phase)
        }
    }))
    .await;
    let mut vmids: Vec<u32> = allocations
        .into_iter()
        .map(|phase| match phase {
            Ok(Phase::Clone(loc)) => loc.vmid,
            other => panic!("allocation failed: {other:?}"),
        })
        .collect();
    vmids.sort_unstable();
    vmids.dedup();
    assert_eq!(vmids.len(), 400, "every machine got its own VMID");
    assert!(!vmids.contains(&250), "the foreign VM's VMID is skipped");
    let probes = hv.calls().iter().filter(|c| *c == "vmid_is_free").count();
    assert_eq!(
        probes, 399,
        "one probe per machine but the one that took PVE's own proposal (the foreign VMID is \
         skipped from the listing)"
    );
}

/// The race the fleet benchmark met: a machine holds the VMID PVE proposes (reserved, its clone
/// not started yet) while many others have cloned the VMIDs above it and released their
/// reservations. A newcomer skips that run of taken VMIDs from the guest listing instead of
/// probing each one and giving up after [`VMID_PROBES`].
#[tokio::test]
async fn a_long_run_of_freshly_cloned_vmids_above_a_held_proposal_does_not_fail_allocation() {
    let hv = FakePve::new(1);
    let proposed = hv.next_vmid().await.unwrap();
    let taken = VMID_PROBES as u32 + 10;
    for vmid in proposed + 1..=proposed + taken {
        hv.insert_vm(
            vmid,
            FakeVm {
                node: "pve1".into(),
                config: [("name".to_owned(), format!("cloned-{vmid}"))].into(),
                running: false,
                agent_ips: None,
                cloud_init: None,
            },
        );
    }
    let spec = spec();
    let reservations = VmidReservations::default();
    assert!(reservations.reserve("uid-slow", proposed));
    let step = provision_step(
        &hv,
        &with_owner(input(&spec, None), |o| o.uid = "uid-new"),
        Phase::AllocateVmid { node: "pve1".into() },
        None,
        &reservations,
    )
    .await
    .unwrap();
    let Phase::Clone(loc) = step.phase else {
        panic!("allocation failed: {step:?}")
    };
    assert_eq!(loc.vmid, proposed + taken + 1, "the first VMID past the run");
    assert_eq!(
        hv.calls().iter().filter(|c| *c == "vmid_is_free").count(),
        1,
        "one probe, for the VMID it takes"
    );
}

/// A template kept once per node on node-local storage (the same name on pve2 and pve3): the
/// machine is placed on a node with a copy and cloned from that copy, without a cross-node
/// clone; a machine placed where no copy is says so.
#[tokio::test]
async fn a_template_kept_once_per_node_is_cloned_from_the_copy_on_the_chosen_node() {
    let hv = FakePve::new(3);
    hv.set_local_storages(&["local-lvm"]);
    let mut copy = hv.remove_vm(9000).unwrap();
    for (vmid, node) in [(9002, "pve2"), (9003, "pve3")] {
        copy.node = node.to_owned();
        hv.insert_vm(vmid, copy.clone());
    }
    let mut spec = spec();
    spec.source = ProxmoxTemplateSource {
        name: Some("ubuntu-2404-template".into()),
        ..ProxmoxTemplateSource::default()
    };
    let steps = drive(
        &hv,
        &input(&spec, None),
        Phase::SelectNode,
        &VmidReservations::default(),
        provisioned,
    )
    .await
    .unwrap();
    let node = steps.last().unwrap().phase.location().unwrap().node.clone();
    assert!(
        node == "pve2" || node == "pve3",
        "placed on {node}, which has no copy"
    );
    let vm = hv.vms().into_iter().find(|(v, _)| *v < 9000).unwrap().1;
    assert_eq!(vm.node, node, "cloned from the copy on its own node");

    // Placed by its failure domain on a node without a copy: told why.
    let err = drive(
        &hv,
        &with_owner(input(&spec, Some("pve1")), |o| o.uid = "another"),
        Phase::SelectNode,
        &VmidReservations::default(),
        provisioned,
    )
    .await
    .unwrap_err();
    assert_eq!(err.reason(), "TemplateNotFound");
    assert!(err.to_string().contains("not on node pve1"), "{err}");
}

#[tokio::test]
async fn vmid_range_is_honoured_and_exhaustion_is_permanent() {
    let hv = FakePve::new(1);
    let mut spec = spec();
    spec.vmid_range = Some(VmidRange {
        start: 9000,
        end: 9001,
    });
    let input = input(&spec, None);
    let reservations = VmidReservations::default();
    let step = provision_step(
        &hv,
        &input,
        Phase::AllocateVmid { node: "pve1".into() },
        None,
        &reservations,
    )
    .await
    .unwrap();
    assert_eq!(
        step.phase,
        Phase::Clone(VmLocation {
            node: "pve1".into(),
            vmid: 9001
        })
    );
    let other = with_owner(input, |o| o.uid = "other");
    let err = provision_step(
        &hv,
        &other,
        Phase::AllocateVmid { node: "pve1".into() },
        None,
        &reservations,
    )
    .await
    .unwrap_err();
    assert_eq!(err.reason(), "VMIDRangeExhausted");
}

/// `/cluster/resources` as the provider reads it lists QEMU guests only: a container holding a
/// VMID of the range is skipped (PVE is asked), never cloned over (REAL-PVE.md R8).
#[tokio::test]
async fn a_vmid_range_skips_a_container_s_vmid() {
    let hv = FakePve::new(1);
    hv.add_container(500);
    let mut spec = spec();
    spec.vmid_range = Some(VmidRange { start: 500, end: 510 });
    let input = input(&spec, None);
    let step = one_step(&hv, &input, Phase::AllocateVmid { node: "pve1".into() }).await;
    assert_eq!(step.phase.location().map(|l| l.vmid), Some(501));
}

#[rstest]
#[case::unknown_vmid(ProxmoxTemplateSource { vmid: Some(9999), ..Default::default() }, "TemplateNotFound", "vmid 9999")]
#[case::unknown_name(ProxmoxTemplateSource { name: Some("debian".into()), ..Default::default() }, "TemplateNotFound", "name \"debian\"")]
#[case::missing_tag(ProxmoxTemplateSource { tags: vec!["ubuntu".into(), "gpu".into()], ..Default::default() }, "TemplateNotFound", "tags ubuntu,gpu")]
#[tokio::test]
async fn a_bad_template_is_a_clear_permanent_error_and_no_vm(
    #[case] source: ProxmoxTemplateSource,
    #[case] reason: &str,
    #[case] text: &str,
) {
    let hv = FakePve::new(1);
    let mut spec = spec();
    spec.source = source;
    let input = input(&spec, None);
    let err = drive(
        &hv,
        &input,
        Phase::SelectNode,
        &VmidReservations::default(),
        provisioned,
    )
    .await
    .unwrap_err();
    assert_eq!(err.reason(), reason);
    assert!(err.to_string().contains(text), "{err}");
    assert!(matches!(err, StepError::Permanent { .. }));
    assert!(hv.vms().is_empty());
}

#[tokio::test]
async fn a_template_found_by_name_and_tags_is_cloned() {
    let hv = FakePve::new(1);
    let mut spec = spec();
    spec.source = ProxmoxTemplateSource {
        name: Some("ubuntu-2404-template".into()),
        tags: vec!["ubuntu".into()],
        ..Default::default()
    };
    let input = input(&spec, None);
    provision(&hv, &input).await;
    assert_eq!(hv.vms().len(), 1);
}

/// The steps up to and including the first that reports a failed task, and the first one.
fn first_failure(steps: &[Step]) -> (usize, &banlieue_provider_kit::progress::FailedTask) {
    steps
        .iter()
        .enumerate()
        .find_map(|(i, s)| s.failed.as_ref().map(|f| (i, f)))
        .expect("a step reports the failed task")
}

/// A clone task that failed on a lock timeout (REAL-PVE.md R1: parallel clones on one storage)
/// is not the end: the UPID is dropped, the clone starts again at the same VMID after a
/// backoff, and the machine ends with one VM.
#[tokio::test]
async fn a_clone_task_that_failed_on_a_lock_is_cloned_again() {
    let hv = FakePve::new(1);
    hv.fail_next_task(
        "clone_vm",
        "clone failed: can't lock file '/var/lock/pve-manager/pve-storage-local-lvm' - got timeout",
    );
    let spec = spec();
    let input = input(&spec, None);
    let steps = provision(&hv, &input).await;
    let (i, failed) = first_failure(&steps);
    assert_eq!(failed.reason, "ProxmoxBusy");
    assert!(failed.busy, "retried with backoff");
    assert!(failed.message.contains("got timeout"), "{}", failed.message);
    let Phase::WaitClone(cloned_to, _) = &steps[i - 1].phase else {
        panic!("the failure is the clone's: {:?}", steps[i - 1].phase)
    };
    assert_eq!(
        steps[i].phase,
        Phase::Clone(cloned_to.clone()),
        "same VMID, no UPID"
    );
    assert_eq!(
        hv.calls().iter().filter(|c| *c == "clone_vm").count(),
        2,
        "cloned once more"
    );
    assert_eq!(hv.vms().len(), 1, "one VM in the end");
}

/// A clone Proxmox refuses inside the task for a reason that needs a human (a storage that
/// does not exist) says so in PVE's words and is tried again only slowly.
#[tokio::test]
async fn a_clone_task_refused_for_good_says_why_and_is_retried_slowly() {
    let hv = FakePve::new(1);
    hv.fail_next_task("clone_vm", "storage 'fast' does not exist on node pve1");
    let spec = spec();
    let input = input(&spec, None);
    let steps = provision(&hv, &input).await;
    let (i, failed) = first_failure(&steps);
    assert_eq!(failed.reason, "CloningFailed");
    assert!(!failed.busy);
    assert!(
        failed.message.contains("storage 'fast' does not exist"),
        "{}",
        failed.message
    );
    assert_eq!(steps[i].requeue, crate::provision::PERMANENT_RETRY);
    assert!(matches!(steps[i].phase, Phase::Clone(_)), "{:?}", steps[i].phase);
    assert_eq!(
        hv.vms().len(),
        1,
        "the next try (the storage came back) provisions it"
    );
}

/// A clone whose VMID is taken by a guest on another node fails inside the task
/// (`File exists` from pmxcfs): a new VMID is chosen and nothing of that guest is touched.
#[tokio::test]
async fn a_clone_task_that_met_a_taken_vmid_chooses_another() {
    let hv = FakePve::new(1);
    hv.fail_next_task(
        "clone_vm",
        "clone failed: close (rename) atomic file '/etc/pve/nodes/pve2/qemu-server/100.conf' failed: File exists",
    );
    let spec = spec();
    let input = input(&spec, None);
    let steps = provision(&hv, &input).await;
    let i = steps
        .iter()
        .position(|s| s.events.first().is_some_and(|(r, _)| *r == "VMIDTaken"))
        .expect("a VMIDTaken event");
    assert!(
        matches!(steps[i].phase, Phase::AllocateVmid { .. }),
        "{:?}",
        steps[i].phase
    );
    assert!(
        steps.iter().all(|s| s.failed.is_none()),
        "not a failure a human must see"
    );
    assert_eq!(hv.vms().len(), 1);
}

/// A start refused because a backup holds the VM's lock (inside the task on a real PVE) is
/// retried: the next step looks at the VM (a failed start may still have started it).
#[tokio::test]
async fn a_start_blocked_by_a_backup_lock_is_retried() {
    let hv = FakePve::new(1);
    hv.fail_next_task("start_vm", "VM 100 is locked (backup)");
    let spec = spec();
    let input = input(&spec, None);
    let steps = provision(&hv, &input).await;
    let (i, failed) = first_failure(&steps);
    assert_eq!(failed.reason, "ProxmoxBusy");
    assert!(
        matches!(steps[i].phase, Phase::PowerOn(_, None)),
        "{:?}",
        steps[i].phase
    );
    assert_eq!(hv.calls().iter().filter(|c| *c == "start_vm").count(), 2);
    assert!(hv.vms().values().all(|vm| vm.running), "started in the end");
}

/// A failed task while a provisioned VM is updated is a day-2 problem: the update is looked at
/// again (no UPID kept), and Ready stays with the running VM.
#[tokio::test]
async fn a_failed_update_task_is_tried_again_without_its_upid() {
    let hv = FakePve::new(1);
    let spec = spec();
    let input = input(&spec, None);
    let steps = provision(&hv, &input).await;
    let provisioned_at = steps.last().unwrap().phase.clone();
    let mut bigger = spec.clone();
    bigger.disks[0].size_gib = 40;
    let input = crate::provision::MachineInput {
        spec: &bigger,
        ..input
    };
    hv.fail_next_task(
        "resize_disk",
        "can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout",
    );
    let started = one_step(&hv, &input, provisioned_at).await;
    assert!(
        matches!(started.phase, Phase::Update(_, _, Some(_))),
        "{:?}",
        started.phase
    );
    let failed = one_step(&hv, &input, started.phase).await;
    assert!(
        matches!(failed.phase, Phase::Update(_, _, None)),
        "{:?}",
        failed.phase
    );
    assert_eq!(failed.failed.as_ref().map(|f| f.reason), Some("ProxmoxBusy"));
}

/// Proxmox refuses to clone a template on node-local storage to another node: that needs a
/// human (placement or storage), so it is `CloneRefused`, not the retried `CloningFailed`.
#[tokio::test]
async fn a_clone_proxmox_refuses_for_good_is_clone_refused() {
    let hv = FakePve::new(1);
    hv.fail_next(
        "clone_vm",
        api_error(500, "can't clone VM to node 'pve2' (VM uses local storage)\n"),
    );
    let spec = spec();
    let input = input(&spec, None);
    let err = drive(
        &hv,
        &input,
        Phase::SelectNode,
        &VmidReservations::default(),
        provisioned,
    )
    .await
    .unwrap_err();
    assert_eq!(err.reason(), crate::provision::CLONE_REFUSED);
    assert!(banlieue_api::condition::needs_human(err.reason()));
    assert!(err.to_string().contains("VM uses local storage"), "{err}");
    assert!(hv.vms().is_empty(), "nothing was cloned");
}

#[rstest]
#[case::nodes("nodes")]
#[case::guests("guests")]
#[case::clone("clone_vm")]
#[case::config("set_config")]
#[case::start("start_vm")]
#[tokio::test]
async fn transient_faults_at_each_step_retry_to_success_without_duplicates(#[case] op: &'static str) {
    let hv = FakePve::new(2);
    hv.fail_next(op, api_error(503, "service unavailable"));
    let spec = spec();
    let input = input(&spec, None);
    let reservations = VmidReservations::default();
    let mut phase = Phase::SelectNode;
    let mut transient = 0;
    for _ in 0..60 {
        if provisioned(&phase) {
            break;
        }
        match provision_step(&hv, &input, phase.clone(), Some(&bootstrap()), &reservations).await {
            Ok(step) => phase = step.phase,
            Err(StepError::Transient { .. }) => transient += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert!(provisioned(&phase), "{phase:?}");
    assert_eq!(transient, 1, "the injected fault surfaced once as transient");
    assert_eq!(hv.vms().len(), 1);
}

#[tokio::test]
async fn a_vm_that_vanishes_during_configuration_is_recloned_at_the_same_vmid() {
    let hv = FakePve::new(1);
    let spec = spec();
    let input = input(&spec, None);
    let reservations = VmidReservations::default();
    let steps = drive(&hv, &input, Phase::SelectNode, &reservations, |p| {
        matches!(p, Phase::Configure(..))
    })
    .await
    .unwrap();
    let Phase::Configure(loc, _) = steps.last().unwrap().phase.clone() else {
        unreachable!()
    };
    hv.remove_vm(loc.vmid);
    let step = provision_step(
        &hv,
        &input,
        Phase::Configure(loc.clone(), None),
        Some(&bootstrap()),
        &reservations,
    )
    .await
    .unwrap();
    assert_eq!(step.phase, Phase::Clone(loc));
    assert_eq!(step.events[0].0, "VMVanished");
}

fn status_at(phase: &Phase) -> ProxmoxMachineStatus {
    let mut status = ProxmoxMachineStatus::default();
    phase.write(&mut status);
    status
}

async fn delete_all(hv: &FakePve, mut status: ProxmoxMachineStatus) -> (String, Vec<ProvisioningState>) {
    let reservations = VmidReservations::default();
    let mut states = Vec::new();
    for _ in 0..20 {
        match delete_step(hv, UID, "local", Some(&status), &reservations)
            .await
            .unwrap()
        {
            DeleteStep::Gone { note } => return (note, states),
            DeleteStep::InProgress { state, task, .. } => {
                states.push(state);
                status.provisioning = Some(ProvisioningStatus {
                    state,
                    task_id: task.map(|t| t.to_string()),
                    ..ProvisioningStatus::default()
                });
            }
        }
    }
    panic!("deletion did not finish");
}

#[tokio::test]
async fn deletion_stops_then_deletes_then_removes_the_seed() {
    let hv = FakePve::new(1);
    hv.set_task_polls(1);
    let spec = spec();
    let input = input(&spec, None);
    let steps = booting(&hv, &input).await;
    let phase = steps.last().unwrap().phase.clone();
    assert!(hv.vms().values().all(|vm| vm.running));
    assert_eq!(
        hv.volumes().len(),
        1,
        "seed still present before provisioning finished"
    );
    let before = hv.calls().len();
    let (note, states) = delete_all(&hv, status_at(&phase)).await;
    assert!(note.contains("deleted"), "{note}");
    // Looked up once, on its node (no cluster listing): the VM checked before the stop is
    // destroyed when the stop ends, and gone when the destroy ends.
    let calls = &hv.calls()[before..];
    let count = |op: &str| calls.iter().filter(|c| *c == op).count();
    assert_eq!((count("vm_config"), count("guests")), (1, 0), "{calls:?}");
    assert_eq!(
        states,
        [
            ProvisioningState::PoweringOff,
            ProvisioningState::PoweringOff,
            ProvisioningState::Deleting,
            ProvisioningState::Deleting
        ]
    );
    assert!(hv.vms().is_empty());
    assert!(hv.volumes().is_empty());
}

/// A restart after the clone started, when the token cannot see the new VM (no VM.Audit on it):
/// the listing leaves it out and PVE refuses the VMID. The machine does not clone a second VM
/// beside its hidden first one; it names the missing privilege.
#[tokio::test]
async fn a_clone_hidden_by_acls_is_not_cloned_twice() {
    let hv = FakePve::new(1);
    let spec = spec();
    let input = input(&spec, None);
    let steps = drive(
        &hv,
        &input,
        Phase::SelectNode,
        &VmidReservations::default(),
        |p| matches!(p, Phase::WaitClone(..)),
    )
    .await
    .unwrap();
    let Phase::WaitClone(loc, _) = steps.last().unwrap().phase.clone() else {
        panic!("cloning")
    };
    hv.finish_all_tasks();
    hv.hide_from_listings(loc.vmid);
    let err = provision_step(&hv, &input, Phase::Clone(loc), None, &VmidReservations::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("VM.Audit"), "{err}");
    assert_eq!(hv.vms().len(), 1, "the one clone, no second");
}

/// A token that lacks VM.Audit on the machine's VM does not see it in `/cluster/resources`
/// (REAL-PVE.md R2): deletion must not take that for "gone" and release the finalizer over a
/// VM it leaks; it names the missing privilege instead.
#[tokio::test]
async fn deletion_does_not_take_a_vm_hidden_by_acls_for_gone() {
    let spec = spec();
    let (hv, phase) = provisioned_vm(&spec).await;
    let vmid = phase.location().unwrap().vmid;
    hv.hide_from_listings(vmid);
    let err = delete_step(
        &hv,
        UID,
        "local",
        Some(&status_at(&phase)),
        &VmidReservations::default(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("VM.Audit"), "{err}");
    assert!(err.to_string().contains(&format!("/vms/{vmid}")), "{err}");
    assert_eq!(hv.vms().len(), 1, "the VM is still there, and still known");
}

/// Deleting a volume needs Datastore.Allocate, more than uploading one: a token without it
/// still finishes the deletion once the VM is gone, saying which seed ISO was left and why.
#[tokio::test]
async fn a_seed_iso_the_token_may_not_delete_does_not_keep_the_finalizer() {
    let hv = FakePve::new(1);
    let spec = spec();
    let input = input(&spec, None);
    let steps = booting(&hv, &input).await;
    let phase = steps.last().unwrap().phase.clone();
    hv.fail_next(
        "delete_volume",
        api_error(
            403,
            "Permission check failed (/storage/local, Datastore.Allocate)",
        ),
    );
    let (note, _) = delete_all(&hv, status_at(&phase)).await;
    assert!(hv.vms().is_empty(), "the VM is deleted");
    assert!(note.contains("left behind"), "{note}");
    assert!(note.contains("Datastore.Allocate on /storage/local"), "{note}");
}

/// A VM started again between the end of the stop task and the destroy (by a user, or HA) is
/// not destroyed running: Proxmox refuses, the deletion looks at the VM again and stops it.
#[tokio::test]
async fn a_vm_started_again_after_the_stop_is_stopped_again_before_the_destroy() {
    let spec = spec();
    let (hv, phase) = provisioned_vm(&spec).await;
    let reservations = VmidReservations::default();
    let mut status = status_at(&phase);
    let DeleteStep::InProgress { state, task, .. } =
        delete_step(&hv, UID, "local", Some(&status), &reservations)
            .await
            .unwrap()
    else {
        panic!("stopping")
    };
    assert_eq!(state, ProvisioningState::PoweringOff);
    let vmid = phase.location().unwrap().vmid;
    // The stop task ends; someone starts the VM again.
    let mut vm = hv.remove_vm(vmid).unwrap();
    vm.running = true;
    status.provisioning = Some(ProvisioningStatus {
        state,
        task_id: task.map(|t| t.to_string()),
        ..ProvisioningStatus::default()
    });
    hv.finish_all_tasks();
    hv.insert_vm(vmid, vm);
    let DeleteStep::InProgress { state, .. } = delete_step(&hv, UID, "local", Some(&status), &reservations)
        .await
        .unwrap()
    else {
        panic!("still deleting")
    };
    assert_eq!(
        state,
        ProvisioningState::PoweringOff,
        "stopped again, not destroyed running"
    );
    assert_eq!(hv.vms().len(), 1);
}

#[tokio::test]
async fn deleting_a_machine_whose_vm_is_already_gone_or_never_existed_succeeds() {
    let hv = FakePve::new(1);
    let (note, states) = delete_all(&hv, ProxmoxMachineStatus::default()).await;
    assert_eq!((note.as_str(), states.len()), ("no VM was created", 0));
    let gone = status_at(&Phase::Provisioned(VmLocation {
        node: "pve1".into(),
        vmid: 321,
    }));
    let (note, _) = delete_all(&hv, gone).await;
    assert!(note.contains("321 is gone"), "{note}");
}

#[tokio::test]
async fn deletion_never_touches_a_vm_it_did_not_create() {
    let hv = FakePve::new(1);
    let foreign = FakeVm {
        node: "pve1".into(),
        config: [("name".to_owned(), "db".to_owned())].into(),
        running: true,
        agent_ips: None,
        cloud_init: None,
    };
    hv.insert_vm(200, foreign.clone());
    let status = status_at(&Phase::Clone(VmLocation {
        node: "pve1".into(),
        vmid: 200,
    }));
    let (note, states) = delete_all(&hv, status).await;
    assert!(note.contains("left untouched"), "{note}");
    assert!(states.is_empty());
    assert_eq!(hv.vm(200), Some(foreign));
}

/// Provisions `spec` on a fresh fake and returns the fake and the provisioned phase.
async fn provisioned_vm(spec: &ProxmoxMachineSpec) -> (FakePve, Phase) {
    let hv = FakePve::new(1);
    let input = input(spec, None);
    let steps = provision(&hv, &input).await;
    (hv, steps.last().unwrap().phase.clone())
}

/// Runs update steps until the VM is back in `Provisioned` with `VMUpToDate` True.
async fn drive_update(hv: &FakePve, input: &MachineInput<'_>, phase: Phase) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut phase = phase;
    for _ in 0..30 {
        let step = provision_step(hv, input, phase, None, &VmidReservations::default())
            .await
            .unwrap();
        phase = step.phase.clone();
        let done = matches!(phase, Phase::Provisioned(_)) && step.up_to_date.as_ref().is_some_and(|u| u.ok);
        steps.push(step);
        if done {
            return steps;
        }
    }
    panic!("update did not converge; last phase {phase:?}");
}

fn events(steps: &[Step]) -> Vec<&str> {
    steps.iter().flat_map(|s| s.events.iter().map(|e| e.0)).collect()
}

#[tokio::test]
async fn a_provisioned_vm_in_sync_costs_two_reads_and_no_change() {
    let spec = spec();
    let (hv, phase) = provisioned_vm(&spec).await;
    let before = hv.calls().len();
    let steps = drive_update(&hv, &input(&spec, None), phase.clone()).await;
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].phase, phase);
    assert_eq!(steps[0].events, vec![], "no Event when nothing changes");
    assert_eq!(steps[0].power, Some(banlieue_api::common::PowerState::On));
    assert_eq!(hv.calls()[before..], ["vm_run_state", "vm_pending"]);
}

#[tokio::test]
async fn power_off_and_on_follow_the_spec() {
    let spec = spec();
    let (hv, phase) = provisioned_vm(&spec).await;
    let vmid = phase.location().unwrap().vmid;
    let off = ProxmoxMachineSpec {
        power_state: Some(banlieue_api::common::PowerState::Off),
        ..spec.clone()
    };
    let steps = drive_update(&hv, &input(&off, None), phase.clone()).await;
    assert!(!hv.vm(vmid).unwrap().running, "the VM is stopped");
    assert_eq!(events(&steps), ["PoweringOff", "Updated"]);
    assert_eq!(
        hv.calls().iter().filter(|c| *c == "shutdown_vm").count(),
        1,
        "a clean shutdown"
    );
    assert_eq!(
        steps.last().unwrap().power,
        Some(banlieue_api::common::PowerState::Off)
    );
    // Off and in sync: nothing more happens.
    let again = drive_update(&hv, &input(&off, None), steps.last().unwrap().phase.clone()).await;
    assert_eq!(events(&again), Vec::<&str>::new());
    // Back on.
    let steps = drive_update(&hv, &input(&spec, None), phase).await;
    assert!(hv.vm(vmid).unwrap().running);
    assert_eq!(events(&steps), ["PoweringOn", "Updated"]);
}

#[tokio::test]
async fn memory_and_cpu_changes_are_applied_cold_and_the_vm_restarted() {
    let spec = spec();
    let (hv, phase) = provisioned_vm(&spec).await;
    let vmid = phase.location().unwrap().vmid;
    hv.set_task_polls(1);
    let bigger = ProxmoxMachineSpec {
        cpu: Cpu::cores(4),
        memory_mib: 8192,
        disks: vec![Disk {
            name: "scsi0".into(),
            size_gib: 40,
            storage: None,
        }],
        restart_policy: Some(RestartPolicy::Automatic),
        ..spec.clone()
    };
    let steps = drive_update(&hv, &input(&bigger, None), phase.clone()).await;
    let vm = hv.vm(vmid).unwrap();
    assert_eq!(vm.config["memory"], "8192");
    assert_eq!(vm.config["cores"], "4");
    assert_eq!(vm.config["scsi0"], "local-lvm:base-9000-disk-0,size=40G");
    assert!(vm.running, "started again: spec.powerState is On");
    assert!(
        hv.pending_changes().is_empty(),
        "no CPU/memory change was written to a running VM: {:?}",
        hv.pending_changes()
    );
    assert_eq!(
        events(&steps),
        [
            "Resizing",
            "PoweringOff",
            "Reconfiguring",
            "PoweringOn",
            "Updated"
        ]
    );
    // Same VM, no clone.
    assert_eq!(hv.vms().len(), 1);
    assert_eq!(hv.calls().iter().filter(|c| *c == "clone_vm").count(), 1);
    // While it happened, VMUpToDate said why.
    let shutdown = steps
        .iter()
        .find(|s| s.events.first().is_some_and(|e| e.0 == "PoweringOff"))
        .unwrap();
    let up = shutdown.up_to_date.as_ref().unwrap();
    assert!(!up.ok);
    assert!(up.message.contains("memory 4096→8192"), "{}", up.message);
}

/// No surprise reboots: under the default restart policy (Manual) a CPU and memory change of a
/// running VM stops, writes and starts nothing; the disk still grows online, `VMUpToDate` says
/// `RestartRequired` with what waits, and looking again changes nothing. The user's power-off
/// applies it.
#[tokio::test]
async fn under_the_manual_restart_policy_a_cold_change_waits_for_the_user() {
    let spec = spec();
    let (hv, phase) = provisioned_vm(&spec).await;
    let vmid = phase.location().unwrap().vmid;
    let bigger = ProxmoxMachineSpec {
        cpu: Cpu::cores(4),
        memory_mib: 8192,
        disks: vec![Disk {
            name: "scsi0".into(),
            size_gib: 40,
            storage: None,
        }],
        ..spec.clone()
    };
    assert_eq!(bigger.restart_policy, None, "the default");
    let mut phase = phase;
    let mut steps = Vec::new();
    for _ in 0..10 {
        let step = provision_step(
            &hv,
            &input(&bigger, None),
            phase,
            None,
            &VmidReservations::default(),
        )
        .await
        .unwrap();
        phase = step.phase.clone();
        let waiting = step
            .up_to_date
            .as_ref()
            .is_some_and(|u| u.reason == banlieue_api::condition::RESTART_REQUIRED);
        steps.push(step);
        if waiting {
            break;
        }
    }
    let last = steps.last().unwrap();
    let up = last.up_to_date.as_ref().expect("VMUpToDate");
    assert_eq!(up.reason, "RestartRequired", "{steps:#?}");
    assert!(!up.ok);
    assert!(
        up.message.contains("cores 2→4")
            && up.message.contains("memory")
            && up.message.contains("spec.restartPolicy"),
        "{}",
        up.message
    );
    assert_eq!(events(&steps), ["Resizing"], "only the disk changed, online");
    let vm = hv.vm(vmid).unwrap();
    assert!(vm.running, "not restarted");
    assert_eq!(vm.config["cores"], "2");
    assert_eq!(vm.config["scsi0"], "local-lvm:base-9000-disk-0,size=40G");
    assert!(hv.pending_changes().is_empty(), "{:?}", hv.pending_changes());
    let calls = hv.calls().len();
    let again = provision_step(
        &hv,
        &input(&bigger, None),
        phase.clone(),
        None,
        &VmidReservations::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        again.up_to_date, last.up_to_date,
        "level-triggered: the same report"
    );
    assert!(
        !hv.calls()[calls..]
            .iter()
            .any(|c| c.contains("shutdown") || c.contains("stop") || c.contains("update")),
        "{:?}",
        &hv.calls()[calls..]
    );
    // The user powers it off: shut down as asked, the change applied, the VM left off.
    let off = ProxmoxMachineSpec {
        power_state: Some(PowerState::Off),
        ..bigger
    };
    drive_update(&hv, &input(&off, None), phase).await;
    let vm = hv.vm(vmid).unwrap();
    assert!(!vm.running);
    assert_eq!(vm.config["cores"], "4");
    assert_eq!(vm.config["memory"], "8192");
}

#[tokio::test]
async fn an_update_task_in_flight_survives_a_restart() {
    let spec = spec();
    let (hv, phase) = provisioned_vm(&spec).await;
    hv.set_task_polls(3);
    let off = ProxmoxMachineSpec {
        power_state: Some(banlieue_api::common::PowerState::Off),
        ..spec.clone()
    };
    let first = provision_step(&hv, &input(&off, None), phase, None, &VmidReservations::default())
        .await
        .unwrap();
    // Persist and read back, as a restarted controller would.
    let mut status = ProxmoxMachineStatus {
        initialization: banlieue_api::common::Initialization::provisioned(true),
        ..Default::default()
    };
    first.phase.write(&mut status);
    assert_eq!(
        status.provisioning.as_ref().map(|p| p.state),
        Some(ProvisioningState::PoweringOff)
    );
    let resumed = Phase::read(Some(&status)).unwrap();
    assert_eq!(resumed, first.phase);
    drive_update(&hv, &input(&off, None), resumed).await;
    assert_eq!(
        hv.calls().iter().filter(|c| *c == "shutdown_vm").count(),
        1,
        "not shut down twice"
    );
}

#[tokio::test]
async fn a_vm_deleted_behind_our_back_is_reported() {
    let spec = spec();
    let (hv, phase) = provisioned_vm(&spec).await;
    hv.remove_vm(phase.location().unwrap().vmid);
    let err = provision_step(
        &hv,
        &input(&spec, None),
        phase,
        None,
        &VmidReservations::default(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.reason(), "VMNotFound");
}

/// A change Proxmox keeps pending on a running VM (here a NIC change without network hotplug)
/// is recognised: the VM is restarted once to apply it, and then it is in sync, with no
/// re-apply loop.
#[tokio::test]
async fn a_change_proxmox_keeps_pending_is_applied_by_one_restart() {
    let spec = spec();
    let (hv, phase) = provisioned_vm(&spec).await;
    hv.keep_pending(&["net0"]);
    let mut changed = spec.clone();
    changed.networks = vec![banlieue_api::common::NetworkInterface::dhcp("net0", "vmbr1")];
    changed.restart_policy = Some(RestartPolicy::Automatic);
    let before = hv.calls().len();
    let steps = drive_update(&hv, &input(&changed, None), phase).await;
    let events: Vec<&str> = steps
        .iter()
        .flat_map(|s| s.events.iter().map(|(r, _)| *r))
        .collect();
    assert_eq!(events, ["Reconfiguring", "PoweringOff", "PoweringOn", "Updated"]);
    let applies = hv.calls()[before..]
        .iter()
        .filter(|c| *c == "update_config")
        .count();
    assert_eq!(applies, 1, "written once, not again and again");
    let why = &steps[1].events.first().unwrap().1;
    assert!(why.contains("net0") && why.contains("pending"), "{why}");
}

/// Moves VM `vmid` to `node` as a migration does (same VMID, same config).
fn migrate(hv: &FakePve, vmid: u32, node: &str) {
    let mut vm = hv.remove_vm(vmid).expect("the VM exists");
    vm.node = node.to_owned();
    hv.insert_vm(vmid, vm);
}

/// A provisioned VM migrated to another node (by a user, node maintenance or HA) is followed
/// there: no VMNotFound, no new clone, the same providerID, and the next step finds it in sync.
#[tokio::test]
async fn a_provisioned_vm_that_migrated_is_followed_to_its_new_node() {
    let hv = FakePve::new(2);
    let spec = spec();
    let input = input(&spec, Some("pve1"));
    let steps = provision(&hv, &input).await;
    let Phase::Provisioned(loc) = steps.last().unwrap().phase.clone() else {
        panic!("provisioned")
    };
    assert_eq!(loc.node, "pve1");
    migrate(&hv, loc.vmid, "pve2");
    let moved = one_step(&hv, &input, Phase::Provisioned(loc.clone())).await;
    let to = VmLocation {
        node: "pve2".into(),
        vmid: loc.vmid,
    };
    assert_eq!(moved.phase, Phase::Provisioned(to.clone()));
    assert_eq!(
        moved.events.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        ["VMMoved"]
    );
    let next = one_step(&hv, &input, moved.phase).await;
    assert_eq!(next.phase, Phase::Provisioned(to));
    assert!(next.up_to_date.as_ref().is_some_and(|u| u.ok), "{next:?}");
    assert_eq!(
        hv.calls().iter().filter(|c| *c == "clone_vm").count(),
        1,
        "never cloned again"
    );
}

/// A VM that migrates while the provider waits for its guest agent is followed too.
#[tokio::test]
async fn a_vm_that_migrated_while_booting_is_followed() {
    let hv = FakePve::new(2);
    let spec = spec();
    let input = input(&spec, Some("pve1"));
    let steps = booting(&hv, &input).await;
    let Phase::WaitGuest(loc) = steps.last().unwrap().phase.clone() else {
        panic!("waiting for the guest")
    };
    migrate(&hv, loc.vmid, "pve2");
    let moved = one_step(&hv, &input, Phase::WaitGuest(loc.clone())).await;
    assert_eq!(
        moved.phase,
        Phase::WaitGuest(VmLocation {
            node: "pve2".into(),
            vmid: loc.vmid
        })
    );
    assert_eq!(
        moved.events.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        ["VMMoved"]
    );
}

/// A guest listed at the VMID on another node that does not carry this machine's marker is not
/// followed: the machine's VM is reported gone.
#[tokio::test]
async fn a_vm_at_the_vmid_elsewhere_without_our_marker_is_not_followed() {
    let hv = FakePve::new(2);
    let spec = spec();
    let input = input(&spec, Some("pve1"));
    let steps = provision(&hv, &input).await;
    let phase = steps.last().unwrap().phase.clone();
    let vmid = phase.location().unwrap().vmid;
    let mut vm = hv.remove_vm(vmid).unwrap();
    vm.node = "pve2".into();
    vm.config.remove("description");
    vm.config.remove("tags");
    hv.insert_vm(vmid, vm);
    let err = provision_step(&hv, &input, phase, None, &VmidReservations::default())
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "VMNotFound");
}

/// A spec that wants the VM off from the start, with a static address on `net0`.
fn created_off() -> ProxmoxMachineSpec {
    ProxmoxMachineSpec {
        power_state: Some(banlieue_api::common::PowerState::Off),
        networks: vec![
            serde_json::from_value(serde_json::json!({
                "name": "net0", "network": "vmbr0",
                "ipv4": {"mode": "Static", "addresses": ["10.1.2.3/24"], "gateway": "10.1.2.1"}
            }))
            .unwrap(),
        ],
        ..spec()
    }
}

#[tokio::test]
async fn a_machine_created_powered_off_is_provisioned_without_booting() {
    let hv = FakePve::new(1);
    let spec = created_off();
    let steps = drive(
        &hv,
        &input(&spec, None),
        Phase::SelectNode,
        &VmidReservations::default(),
        provisioned,
    )
    .await
    .unwrap();
    let (vmid, vm) = hv.vms().into_iter().next().unwrap();
    assert!(!vm.running, "never started");
    let calls = hv.calls();
    assert!(
        !calls.iter().any(|c| c == "start_vm" || c == "guest_addresses"),
        "no start and no wait for the guest: {calls:?}"
    );
    assert_eq!(events(&steps), ["CloneStarted", "Cloned", "Provisioned"]);
    let last = steps.last().unwrap();
    assert_eq!(last.power, Some(banlieue_api::common::PowerState::Off));
    assert_eq!(last.up_to_date.as_ref().map(|u| u.ok), Some(true));
    let done = last.provisioned.as_ref().expect("provisioned");
    assert_eq!(
        done.provider_id,
        format!("proxmox://0000aaaa-0000-0000-0000-{vmid:012}")
    );
    let addresses: Vec<&str> = done
        .addresses
        .iter()
        .flatten()
        .map(|a| a.address.as_str())
        .collect();
    assert_eq!(
        addresses,
        ["m1", "10.1.2.3"],
        "hostname and the static address only"
    );
    // The seed stays attached for the first boot.
    let seed = desired::seed_volid("local", UID);
    assert!(desired::seed_attached(
        &banlieue_pve_client::VmConfig(vm.config.clone()),
        &seed
    ));
    assert_eq!(hv.volumes().len(), 1, "seed ISO kept");
    // Off and in sync: nothing happens on later reconciles.
    let again = drive_update(&hv, &input(&spec, None), last.phase.clone()).await;
    assert_eq!(events(&again), Vec::<&str>::new());
    assert!(!hv.vm(vmid).unwrap().running);

    // First power-on: started; once the guest reports, the seed goes and the addresses are the
    // guest's.
    let on = ProxmoxMachineSpec {
        power_state: Some(banlieue_api::common::PowerState::On),
        ..spec.clone()
    };
    let steps = drive_update(&hv, &input(&on, None), last.phase.clone()).await;
    assert_eq!(events(&steps), ["PoweringOn", "FirstBoot"]);
    let vm = hv.vm(vmid).unwrap();
    assert!(vm.running);
    assert_eq!(vm.config["ide2"], "none,media=cdrom", "seed ejected");
    assert!(hv.volumes().is_empty(), "seed ISO deleted");
    let refreshed = steps
        .last()
        .unwrap()
        .provisioned
        .as_ref()
        .expect("addresses refreshed");
    assert_eq!(refreshed.provider_id, done.provider_id);
    assert!(
        refreshed
            .addresses
            .iter()
            .flatten()
            .any(|a| a.address == format!("10.0.{}.{}", vmid / 250, vmid % 250)),
        "{:?}",
        refreshed.addresses
    );
    // Running and seedless: back to the two-read resync.
    let before = hv.calls().len();
    let again = drive_update(&hv, &input(&on, None), steps.last().unwrap().phase.clone()).await;
    assert_eq!(events(&again), Vec::<&str>::new());
    assert_eq!(hv.calls()[before..], ["vm_run_state", "vm_pending"]);
}

#[tokio::test]
async fn a_first_boot_waits_for_the_guest_before_removing_the_seed() {
    let hv = FakePve::new(1);
    let spec = created_off();
    let steps = drive(
        &hv,
        &input(&spec, None),
        Phase::SelectNode,
        &VmidReservations::default(),
        provisioned,
    )
    .await
    .unwrap();
    let phase = steps.last().unwrap().phase.clone();
    let vmid = phase.location().unwrap().vmid;
    hv.set_agent_ips(vmid, None);
    let on = ProxmoxMachineSpec {
        power_state: None,
        ..spec.clone()
    };
    let steps = drive_update(&hv, &input(&on, None), phase).await;
    assert_eq!(events(&steps), ["PoweringOn"]);
    let last = steps.last().unwrap();
    assert_eq!(last.provisioned, None);
    assert_eq!(last.requeue, crate::provision::GUEST_POLL, "looks again soon");
    assert_eq!(hv.volumes().len(), 1, "seed kept until the guest answers");
}

/// `input` marked for another owner (`change` sets its UID or name).
fn with_owner<'a>(input: MachineInput<'a>, change: impl FnOnce(&mut readopt::Owner<'a>)) -> MachineInput<'a> {
    let mut owner = input.owner;
    change(&mut owner);
    MachineInput { owner, ..input }
}

/// What `clusterctl move` leaves the target cluster's provider with: a ProxmoxMachine with the
/// same name and spec (providerID included), a new UID and no status.
const MOVED_UID: &str = "7d0c5e1a-2b3c-4d5e-8f90-a1b2c3d4e5f6";

fn moved_input<'a>(spec: &'a ProxmoxMachineSpec) -> MachineInput<'a> {
    with_owner(input(spec, None), |o| o.uid = MOVED_UID)
}

/// Provisions one machine and returns the spec as CAPI would see it afterwards (providerID set).
async fn provisioned_machine(hv: &FakePve) -> (ProxmoxMachineSpec, Step) {
    let spec = spec();
    let steps = drive(
        hv,
        &input(&spec, None),
        Phase::SelectNode,
        &VmidReservations::default(),
        provisioned,
    )
    .await
    .unwrap();
    let last = steps.into_iter().rev().find(|s| s.provisioned.is_some()).unwrap();
    let mut moved = spec;
    moved.provider_id = Some(last.provisioned.clone().unwrap().provider_id);
    (moved, last)
}

#[tokio::test]
async fn a_machine_created_anew_by_clusterctl_move_adopts_its_vm_by_provider_id() {
    let hv = FakePve::new(2);
    hv.set_task_polls(1);
    let (spec, before) = provisioned_machine(&hv).await;
    let clones = || hv.calls().iter().filter(|c| *c == "clone_vm").count();
    assert_eq!(clones(), 1);
    let (vmid, vm) = hv.vms().into_iter().next().unwrap();
    let calls_before = hv.calls().len();

    let input = moved_input(&spec);
    let steps = provision(&hv, &input).await;

    assert_eq!(clones(), 1, "never cloned again");
    assert_eq!(hv.vms().len(), 1);
    let after = hv.vms().remove(&vmid).unwrap();
    assert!(desired::is_owned_by(
        &banlieue_pve_client::VmConfig(after.config.clone()),
        MOVED_UID
    ));
    assert!(
        !desired::is_owned_by(&banlieue_pve_client::VmConfig(after.config.clone()), UID),
        "the old object's marker is gone"
    );
    assert_eq!(after.config["smbios1"], vm.config["smbios1"]);
    assert!(
        after.running,
        "the running VM was not restarted: {:?}",
        hv.calls()
    );
    let calls = hv.calls()[calls_before..].to_vec();
    assert!(
        !calls
            .iter()
            .any(|c| c == "start_vm" || c == "stop_vm" || c == "delete_vm"),
        "{calls:?}"
    );
    let events: Vec<&str> = steps.iter().flat_map(|s| &s.events).map(|e| e.0).collect();
    assert_eq!(events, ["Adopting", "Adopted", "Provisioned"], "{steps:#?}");
    let done = steps.iter().rev().find_map(|s| s.provisioned.clone()).unwrap();
    assert_eq!(done, before.provisioned.unwrap(), "same providerID and addresses");
    assert_eq!(steps.last().unwrap().phase.location().unwrap().vmid, vmid);

    // The re-created machine owns the VM: deleting it deletes the VM.
    let mut status = ProxmoxMachineStatus::default();
    steps.last().unwrap().phase.write(&mut status);
    let mut deleted = false;
    for _ in 0..20 {
        match delete_step(
            &hv,
            MOVED_UID,
            "local",
            Some(&status),
            &VmidReservations::default(),
        )
        .await
        .unwrap()
        {
            DeleteStep::Gone { .. } => {
                deleted = true;
                break;
            }
            DeleteStep::InProgress { state, task, .. } => {
                status.provisioning = Some(ProvisioningStatus {
                    state,
                    task_id: task.map(|t| t.to_string()),
                    ..ProvisioningStatus::default()
                });
                hv.finish_all_tasks();
            }
        }
    }
    assert!(deleted);
    assert!(hv.vms().is_empty(), "the adopted VM was deleted");
}

/// A stopped VM found by its providerID is adopted with one Event that says so, not one that
/// says it was provisioned (that happened where it was created).
#[tokio::test]
async fn a_stopped_vm_adopted_by_provider_id_is_announced_as_adopted_only() {
    let hv = FakePve::new(2);
    hv.set_task_polls(1);
    let (spec, _) = provisioned_machine(&hv).await;
    let (vmid, mut vm) = hv.vms().into_iter().next().unwrap();
    vm.running = false;
    hv.insert_vm(vmid, vm);

    let steps = provision(&hv, &moved_input(&spec)).await;

    let events: Vec<&str> = steps.iter().flat_map(|s| s.events.iter().map(|e| e.0)).collect();
    assert_eq!(events, ["Adopting", "Adopted"], "{steps:#?}");
    assert!(
        !hv.vm(vmid).unwrap().running,
        "adopted as it was: {:?}",
        hv.calls()
    );
}

#[tokio::test]
async fn a_provider_id_of_a_vm_created_for_another_machine_is_refused() {
    let hv = FakePve::new(1);
    hv.set_task_polls(1);
    let (spec, _) = provisioned_machine(&hv).await;
    let other = with_owner(moved_input(&spec), |o| o.name = "m2");
    let err = provision_step(
        &hv,
        &other,
        Phase::SelectNode,
        Some(&bootstrap()),
        &VmidReservations::default(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, StepError::Permanent { reason: "AdoptionFailed", message } if message.contains("was created by banlieue-proxmox for ProxmoxMachine ns/m1, not for ProxmoxMachine ns/m2; refusing to adopt it")),
        "{err}"
    );
    let vm = hv.vms().into_values().next().unwrap();
    assert!(
        desired::is_owned_by(&banlieue_pve_client::VmConfig(vm.config), UID),
        "left untouched"
    );
    assert_eq!(hv.calls().iter().filter(|c| *c == "clone_vm").count(), 1);
}

#[tokio::test]
async fn a_provider_id_without_a_vm_is_reported_and_never_recloned() {
    let hv = FakePve::new(1);
    let mut spec = spec();
    spec.provider_id = Some("proxmox://0000aaaa-0000-0000-0000-000000000777".into());
    let err = provision_step(
        &hv,
        &moved_input(&spec),
        Phase::SelectNode,
        Some(&bootstrap()),
        &VmidReservations::default(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, StepError::Permanent { reason: "VMNotFound", message } if message.contains("delete this machine to replace it")),
        "{err}"
    );
    assert!(!hv.calls().iter().any(|c| c == "clone_vm"));
}

/// Which steps let the next one run in the same reconcile: a fresh machine on instant tasks
/// stops (its status written) only where the VMID must be persisted before the clone, where a
/// task is still running, and once provisioned; the step into `Clone` never chains.
#[tokio::test]
async fn steps_chain_except_into_the_clone_and_where_something_runs() {
    let hv = FakePve::new(1);
    let spec = spec();
    let input = input(&spec, None);
    let reservations = VmidReservations::default();
    let mut phase = Phase::SelectNode;
    let mut stops = Vec::new();
    for _ in 0..60 {
        let from = phase.clone();
        let step = provision_step(&hv, &input, phase, Some(&bootstrap()), &reservations)
            .await
            .unwrap();
        let chains = crate::provision::next_now(&step, &from);
        if matches!(step.phase, Phase::Clone(_)) {
            assert!(!chains, "the VMID is persisted before the clone starts");
        }
        if from.task().is_none() && step.phase.task().is_some() {
            assert!(
                chains,
                "a task just started is polled at once: {from:?} → {:?}",
                step.phase
            );
        }
        if !chains {
            stops.push(step.phase.reason());
        }
        phase = step.phase;
        if provisioned(&phase) {
            break;
        }
    }
    assert_eq!(stops, ["Cloning", "Provisioned"], "where the status is written");

    // A poll that finds its task still running waits (the status says so).
    let loc = VmLocation {
        node: "pve1".into(),
        vmid: 100,
    };
    let upid: banlieue_pve_client::Upid = "UPID:pve1:00000001:00000002:00000003:qmstart:100:root@pam:"
        .parse()
        .unwrap();
    let waiting = Step {
        requeue: crate::provision::TASK_POLL,
        ..Step::to(Phase::PowerOn(loc.clone(), Some(upid.clone())))
    };
    assert!(!crate::provision::next_now(
        &waiting,
        &Phase::PowerOn(loc, Some(upid))
    ));
}

/// Tasks and the guest agent are polled soon after the wait begins and less often the longer it
/// lasts, never faster than `FIRST_POLL` nor slower than before (2 s tasks, 5 s agent).
#[tokio::test]
async fn polls_start_fast_and_back_off() {
    use crate::provision::{FIRST_POLL, GUEST_POLL, TASK_POLL, poll_after, task_poll};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};
    assert_eq!(poll_after(Duration::ZERO, TASK_POLL), FIRST_POLL);
    assert_eq!(
        poll_after(Duration::from_secs(4), TASK_POLL),
        Duration::from_secs(1)
    );
    assert_eq!(poll_after(Duration::from_secs(60), TASK_POLL), TASK_POLL);
    assert_eq!(poll_after(Duration::from_secs(60), GUEST_POLL), GUEST_POLL);

    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let upid_started = |secs_ago: u64| -> banlieue_pve_client::Upid {
        format!(
            "UPID:pve1:00000001:00000002:{:08X}:qmclone:100:root@pam:",
            now - secs_ago
        )
        .parse()
        .unwrap()
    };
    assert!(task_poll(&upid_started(0)) <= Duration::from_millis(750));
    assert_eq!(task_poll(&upid_started(600)), TASK_POLL);

    // The guest: asked again soon while it has just been started, at the old pace after a while.
    let hv = FakePve::new(1);
    let spec = spec();
    let steps = booting(&hv, &input(&spec, None)).await;
    let loc = steps.last().unwrap().phase.location().unwrap().clone();
    hv.set_agent_ips(loc.vmid, None);
    let waiting = |since: SystemTime| MachineInput {
        waiting_since: Some(since),
        ..input(&spec, None)
    };
    let fresh = provision_step(
        &hv,
        &waiting(SystemTime::now()),
        Phase::WaitGuest(loc.clone()),
        None,
        &VmidReservations::default(),
    )
    .await
    .unwrap();
    assert_eq!(fresh.requeue, FIRST_POLL, "{fresh:?}");
    let long = provision_step(
        &hv,
        &waiting(SystemTime::now() - Duration::from_secs(300)),
        Phase::WaitGuest(loc),
        None,
        &VmidReservations::default(),
    )
    .await
    .unwrap();
    assert_eq!(long.requeue, GUEST_POLL, "{long:?}");
}

/// The guest's cloud-init is asked once the VM is provisioned (the machine is provisioned
/// whatever it says), and again on later steps only while the machine's Ready waits on it;
/// `skipCloudInit` never asks.
#[tokio::test]
async fn cloud_init_is_asked_when_provisioned_and_while_the_machine_waits_on_it() {
    use banlieue_provider_kit::cloud_init::CloudInit;
    let hv = FakePve::new(1);
    let spec = spec();
    let steps = booting(&hv, &input(&spec, None)).await;
    let waiting = steps.last().unwrap().phase.clone();
    let vmid = waiting.location().unwrap().vmid;
    hv.set_cloud_init(vmid, None);

    let done = one_step(&hv, &input(&spec, None), waiting.clone()).await;
    assert!(done.provisioned.is_some(), "provisioned while cloud-init runs");
    assert_eq!(done.cloud_init, Some(CloudInit::Running));

    let pending = MachineInput {
        cloud_init_pending: true,
        ..input(&spec, None)
    };
    let again = one_step(&hv, &pending, done.phase.clone()).await;
    assert_eq!(again.cloud_init, Some(CloudInit::Running));
    hv.set_cloud_init(vmid, Some(r#"{"v1": {"errors": ["kubeadm join failed"]}}"#));
    let failed = one_step(&hv, &pending, done.phase.clone()).await;
    assert!(
        matches!(&failed.cloud_init, Some(CloudInit::Failed(e)) if e.contains("kubeadm join failed")),
        "{:?}",
        failed.cloud_init
    );
    hv.set_cloud_init(vmid, Some(crate::fake::CLOUD_INIT_DONE));
    let finished = one_step(&hv, &pending, done.phase.clone()).await;
    assert_eq!(finished.cloud_init, Some(CloudInit::Done));

    // Not waiting on it: not asked.
    let asked = || hv.calls().iter().filter(|c| *c == "cloud_init_result").count();
    let before = asked();
    let settled = one_step(&hv, &input(&spec, None), done.phase.clone()).await;
    assert_eq!(settled.cloud_init, None);
    assert_eq!(asked(), before);

    // skipCloudInit: provisioned without asking.
    let hv = FakePve::new(1);
    let skip = ProxmoxMachineSpec {
        readiness_checks: Some(banlieue_api::common::ReadinessChecks {
            skip_guest_agent: None,
            skip_cloud_init: Some(true),
        }),
        ..spec.clone()
    };
    let steps = provision(&hv, &input(&skip, None)).await;
    assert_eq!(steps.last().unwrap().cloud_init, None);
    assert!(
        !hv.calls().iter().any(|c| c == "cloud_init_result"),
        "{:?}",
        hv.calls()
    );
}

fn with_ha(rules: &[&str], max_restart: Option<u32>) -> ProxmoxMachineSpec {
    ProxmoxMachineSpec {
        high_availability: Some(banlieue_api::infrastructure::HighAvailability {
            rules: rules.iter().map(|r| (*r).to_owned()).collect(),
            max_restart,
            max_relocate: None,
        }),
        ..spec()
    }
}

/// A provisioned machine with `highAvailability` becomes an HA resource in its power state,
/// with its limits and the provider's comment, and joins the rules it names; the next step finds
/// it in sync and writes nothing.
#[tokio::test]
async fn a_provisioned_machine_with_high_availability_becomes_an_ha_resource_in_its_rule() {
    let hv = FakePve::new(2);
    hv.add_ha_rule("spread", "resource-affinity", &["vm:4242"]);
    let spec = with_ha(&["spread"], Some(3));
    let input = input(&spec, Some("pve1"));
    let steps = provision(&hv, &input).await;
    let Phase::Provisioned(loc) = steps.last().unwrap().phase.clone() else {
        panic!("provisioned")
    };
    let step = one_step(&hv, &input, Phase::Provisioned(loc.clone())).await;
    let (reason, message) = step.events.first().cloned().expect("an Event");
    assert_eq!(reason, "HighAvailability");
    assert!(
        message.contains(&format!("added vm:{} to HA rule spread", loc.vmid)),
        "{message}"
    );
    let resource = hv.ha_resource_now(loc.vmid).expect("an HA resource");
    assert_eq!(resource.state.as_deref(), Some("started"));
    assert_eq!(resource.max_restart, Some(3));
    assert_eq!(resource.comment.as_deref(), Some("banlieue: ns/m1"));
    let rule = hv.ha_rule_now("spread").expect("the rule");
    assert_eq!(
        rule.resource_ids(),
        vec!["vm:4242".to_owned(), format!("vm:{}", loc.vmid)]
    );
    assert!(step.up_to_date.as_ref().is_some_and(|u| u.ok), "{step:?}");

    let before = hv.calls().len();
    let again = one_step(&hv, &input, step.phase).await;
    assert_eq!(again.events, vec![]);
    let writes: Vec<String> = hv.calls()[before..]
        .iter()
        .filter(|c| {
            !matches!(
                c.as_str(),
                "vm_run_state" | "vm_pending" | "ha_resource" | "ha_rule"
            )
        })
        .cloned()
        .collect();
    assert_eq!(writes, Vec::<String>::new(), "in sync: reads only");
}

/// A rule the spec names that Proxmox lacks is said in `VMUpToDate` (the VM is still an HA
/// resource), and joined once it exists.
#[tokio::test]
async fn a_missing_ha_rule_is_reported_and_joined_once_it_exists() {
    let hv = FakePve::new(2);
    let spec = with_ha(&["spread"], None);
    let input = input(&spec, Some("pve1"));
    let steps = provision(&hv, &input).await;
    let phase = steps.last().unwrap().phase.clone();
    let vmid = phase.location().unwrap().vmid;
    let step = one_step(&hv, &input, phase).await;
    let up_to_date = step.up_to_date.clone().expect("VMUpToDate");
    assert!(!up_to_date.ok);
    assert_eq!(up_to_date.reason, "HARuleNotFound");
    assert!(
        up_to_date.message.contains("\"spread\""),
        "{}",
        up_to_date.message
    );
    assert!(hv.ha_resource_now(vmid).is_some(), "an HA resource all the same");

    hv.add_ha_rule("spread", "node-affinity", &["vm:4242"]);
    let step = one_step(&hv, &input, step.phase).await;
    assert!(step.up_to_date.as_ref().is_some_and(|u| u.ok), "{step:?}");
    assert!(
        hv.ha_rule_now("spread")
            .unwrap()
            .resource_ids()
            .contains(&format!("vm:{vmid}").as_str())
    );
}

/// Without the field, an HA resource the provider added is removed; one added in Proxmox by
/// hand is left alone.
#[tokio::test]
async fn dropping_high_availability_removes_only_the_resource_the_provider_added() {
    let hv = FakePve::new(2);
    let with = with_ha(&[], None);
    let input_with = input(&with, Some("pve1"));
    let steps = provision(&hv, &input_with).await;
    let phase = steps.last().unwrap().phase.clone();
    let vmid = phase.location().unwrap().vmid;
    let step = one_step(&hv, &input_with, phase).await;
    assert!(hv.ha_resource_now(vmid).is_some());

    let without = spec();
    let input_without = input(&without, Some("pve1"));
    let step = one_step(&hv, &input_without, step.phase).await;
    assert_eq!(hv.ha_resource_now(vmid), None, "removed");
    assert_eq!(
        step.events.first().map(|(r, m)| (*r, m.as_str())),
        Some(("HighAvailability", format!("removed vm:{vmid} from HA").as_str()))
    );

    let by_hand = banlieue_pve_client::HaResourceSettings {
        state: Some("started".into()),
        ..Default::default()
    };
    hv.create_ha_resource(vmid, &by_hand).await.unwrap();
    let step = one_step(&hv, &input_without, step.phase).await;
    assert!(hv.ha_resource_now(vmid).is_some(), "left alone");
    assert_eq!(step.events, vec![]);
}

/// Deleting an HA machine's VM takes it out of HA and out of its rules (PVE's `purge`).
#[tokio::test]
async fn deleting_an_ha_machine_takes_its_vm_out_of_ha() {
    let hv = FakePve::new(2);
    hv.add_ha_rule("spread", "resource-affinity", &["vm:4242"]);
    let spec = with_ha(&["spread"], None);
    let input = input(&spec, Some("pve1"));
    let steps = provision(&hv, &input).await;
    let phase = steps.last().unwrap().phase.clone();
    let vmid = phase.location().unwrap().vmid;
    let step = one_step(&hv, &input, phase).await;
    assert!(hv.ha_resource_now(vmid).is_some());
    delete_all(&hv, status_at(&step.phase)).await;
    assert_eq!(hv.vm(vmid), None);
    assert_eq!(hv.ha_resource_now(vmid), None);
    assert_eq!(hv.ha_rule_now("spread").unwrap().resource_ids(), vec!["vm:4242"]);
}

/// The VM a machine's status points at no longer carries the machine's owner marker (its VMID
/// was reused by someone else's VM after the machine's own went): configuring or updating it is
/// refused with a message naming the VM, and nothing is written to it.
#[rstest]
#[case::configuring(Phase::Configure(foreign_location(), None), "ConfigurationFailed")]
#[case::provisioned(Phase::Provisioned(foreign_location()), "UpdateFailed")]
#[tokio::test]
async fn a_vm_without_the_machines_owner_marker_is_never_modified(
    #[case] phase: Phase,
    #[case] reason: &str,
) {
    let hv = FakePve::new(1);
    let foreign = FakeVm {
        node: "pve1".into(),
        config: [
            ("name".to_owned(), "someone-else".to_owned()),
            ("description".to_owned(), "a database VM".to_owned()),
        ]
        .into(),
        running: true,
        agent_ips: None,
        cloud_init: None,
    };
    hv.insert_vm(150, foreign.clone());
    let spec = spec();
    let err = provision_step(
        &hv,
        &input(&spec, None),
        phase,
        Some(&bootstrap()),
        &VmidReservations::default(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.reason(), reason);
    assert!(
        err.to_string()
            .contains("VM 150 on pve1 does not carry this machine's owner marker; refusing to modify it"),
        "{err}"
    );
    assert_eq!(hv.vm(150), Some(foreign), "the VM is untouched");
    const WRITES: &[&str] = &[
        "update_config",
        "set_config",
        "resize_disk",
        "upload_iso",
        "delete_volume",
        "start_vm",
        "stop_vm",
        "shutdown_vm",
        "delete_vm",
        "create_ha_resource",
        "update_ha_resource",
    ];
    let calls = hv.calls();
    assert!(!calls.iter().any(|c| WRITES.contains(&c.as_str())), "{calls:?}");
}

fn foreign_location() -> VmLocation {
    VmLocation {
        node: "pve1".into(),
        vmid: 150,
    }
}
