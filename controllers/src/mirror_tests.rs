use k8s_openapi::jiff::Timestamp;
use pretty_assertions::assert_eq;
use rstest::rstest;
use serde_json::{Value, json};

use super::*;

fn at(s: i64) -> Time {
    Time(Timestamp::from_second(s).expect("valid"))
}

fn machine(obj: Value) -> MachineView {
    MachineView::from_object(&obj)
}

fn cond<'a>(s: &'a VirtualMachineStatus, t: &str) -> (&'a str, &'a str) {
    let c = condition::find(&s.conditions, t).expect("condition present");
    (c.status.as_str(), c.reason.as_str())
}

fn ready_cond(status: &str, reason: &str) -> Value {
    json!({"type": "Ready", "status": status, "reason": reason, "message": format!("{reason} msg"),
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

#[rstest]
#[case::no_machine(None, VirtualMachinePhase::Pending, ("False", "WaitingForInfrastructure"), ("False", "WaitingForInfrastructure"), ("False", "WaitingForInfrastructure"))]
#[case::empty_status(Some(json!({})), VirtualMachinePhase::Provisioning, ("False", "Pending"), ("False", "Pending"), ("Unknown", "ReadyNotReported"))]
#[case::cloning(Some(json!({"status": {"provisioning": {"state": "Cloning", "message": "cloning 9000"},
    "conditions": [ready_cond("False", "Cloning")]}})),
    VirtualMachinePhase::Provisioning, ("False", "Cloning"), ("False", "Cloning"), ("False", "Cloning"))]
#[case::running(Some(json!({"spec": {"providerID": "proxmox://c/101"}, "status": {"initialization": {"provisioned": true},
    "powerState": "On", "provisioning": {"state": "Ready"}, "conditions": [ready_cond("True", "Ready")]}})),
    VirtualMachinePhase::Running, ("True", "Ready"), ("True", "Provisioned"), ("True", "Ready"))]
#[case::stopped(Some(json!({"status": {"initialization": {"provisioned": true}, "powerState": "Off",
    "conditions": [ready_cond("False", "PoweredOff")]}})),
    VirtualMachinePhase::Stopped, ("False", "PoweredOff"), ("True", "Provisioned"), ("False", "PoweredOff"))]
#[case::failed(Some(json!({"status": {"provisioning": {"state": "Failed", "message": "template 9000 not found"},
    "conditions": [ready_cond("False", "TemplateNotFound")]}})),
    VirtualMachinePhase::Failed, ("False", "TemplateNotFound"), ("False", "Failed"), ("False", "TemplateNotFound"))]
#[case::malformed_status(Some(json!({"status": {"conditions": "not a list"}})), VirtualMachinePhase::Provisioning, ("False", "Pending"), ("False", "Pending"), ("Unknown", "ReadyNotReported"))]
fn mirror_table(
    #[case] obj: Option<Value>,
    #[case] phase: VirtualMachinePhase,
    #[case] ready: (&str, &str),
    #[case] provisioned: (&str, &str),
    #[case] infra: (&str, &str),
) {
    let view = obj.map(machine);
    let input = MirrorInput {
        generation: Some(3),
        machine: view.as_ref(),
        ..Default::default()
    };
    let s = mirror(None, &input, &at(10));
    assert_eq!(s.phase, Some(phase));
    assert_eq!(cond(&s, "Ready"), ready);
    assert_eq!(cond(&s, "Provisioned"), provisioned);
    assert_eq!(cond(&s, "InfrastructureReady"), infra);
    assert!(s.conditions.iter().all(|c| c.observed_generation == Some(3)));
    assert_eq!(s.observed_generation, Some(3));
}

#[test]
fn copies_contract_fields_and_the_providers_message() {
    let view = machine(json!({"spec": {"providerID": "proxmox://c/101"}, "status": {
        "initialization": {"provisioned": true}, "powerState": "On", "node": "pve1", "failureDomain": "pve1",
        "addresses": [{"type": "InternalIP", "address": "192.0.2.10"}],
        "conditions": [ready_cond("True", "Ready")]}}));
    let infra = ContractReference {
        api_group: "infrastructure.banlieue.io".into(),
        kind: "ProxmoxMachine".into(),
        name: "web".into(),
    };
    let input = MirrorInput {
        generation: Some(1),
        provider: Some("pve-a"),
        infrastructure_ref: Some(infra.clone()),
        machine: Some(&view),
        ..Default::default()
    };
    let s = mirror(None, &input, &at(10));
    assert_eq!(s.provider_id.as_deref(), Some("proxmox://c/101"));
    assert_eq!(s.addresses[0].address, "192.0.2.10");
    assert_eq!(s.power_state, Some(PowerState::On));
    assert_eq!(s.node.as_deref(), Some("pve1"));
    assert_eq!(s.failure_domain.as_deref(), Some("pve1"));
    assert_eq!(s.provider.as_deref(), Some("pve-a"));
    assert_eq!(s.infrastructure_ref, Some(infra));
    assert_eq!(
        condition::find(&s.conditions, "Ready").map(|c| c.message.as_str()),
        Some("Ready msg")
    );
}

#[test]
fn invalid_input_wins_over_the_machine_and_keeps_the_recorded_provider() {
    let invalid = Invalid::ClassNotFound("small".into());
    let before = VirtualMachineStatus {
        provider: Some("pve-a".into()),
        ..Default::default()
    };
    let input = MirrorInput {
        generation: Some(2),
        invalid: Some(&invalid),
        ..Default::default()
    };
    let s = mirror(Some(&before), &input, &at(10));
    let ready = condition::find(&s.conditions, "Ready").expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "ClassNotFound")
    );
    assert!(ready.message.contains("VirtualMachineClass small not found"));
    assert_eq!(s.provider.as_deref(), Some("pve-a"));
}

#[test]
fn second_mirror_is_a_no_op_and_keeps_transition_times() {
    let view = machine(json!({"status": {"provisioning": {"state": "Cloning"}}}));
    let input = MirrorInput {
        generation: Some(1),
        machine: Some(&view),
        ..Default::default()
    };
    let first = mirror(None, &input, &at(10));
    let second = mirror(Some(&first), &input, &at(99));
    assert_eq!(first, second);

    let done = machine(
        json!({"status": {"initialization": {"provisioned": true}, "conditions": [ready_cond("True", "Ready")]}}),
    );
    let third = mirror(
        Some(&second),
        &MirrorInput {
            machine: Some(&done),
            ..input.clone()
        },
        &at(200),
    );
    let t = |s: &VirtualMachineStatus, ty: &str| {
        condition::find(&s.conditions, ty)
            .map(|c| c.last_transition_time.clone())
            .expect("present")
    };
    assert_eq!(t(&third, "Ready"), at(200));
    assert_eq!(t(&third, "Provisioned"), at(200));
    assert_eq!(t(&third, "InfrastructureReady"), at(200));
    // A condition someone else owns (Paused) survives.
    let mut with_paused = third.clone();
    with_paused.conditions.push(condition::new_condition(
        "Paused",
        ConditionStatus::False,
        "NotPaused",
        "",
        Some(1),
        at(1),
    ));
    let fourth = mirror(Some(&with_paused), &input, &at(300));
    assert!(condition::find(&fourth.conditions, "Paused").is_some());
}

#[test]
fn deletion_shows_in_phase_and_ready() {
    let view = machine(
        json!({"status": {"initialization": {"provisioned": true}, "conditions": [ready_cond("True", "Ready")]}}),
    );
    let input = MirrorInput {
        deleting: true,
        machine: Some(&view),
        ..Default::default()
    };
    let s = mirror(None, &input, &at(1));
    assert_eq!(s.phase, Some(VirtualMachinePhase::Deleting));
    assert_eq!(cond(&s, "Ready"), ("False", "Deleting"));
}

#[rstest]
#[case::not_yet_deleted(json!({"status": {"conditions": [ready_cond("True", "Ready")]}}),
    "deleting the infrastructure machine")]
#[case::provider_not_reporting(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
    "status": {"conditions": [ready_cond("True", "Ready")]}}),
    "waiting for the provider to delete the infrastructure machine")]
#[case::provider_progress(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
    "status": {"conditions": [ready_cond("False", "Deleting")]}}),
    "Deleting msg")]
#[case::provider_problem(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
    "status": {"conditions": [ready_cond("False", "DeletionFailed")]}}),
    "DeletionFailed: DeletionFailed msg")]
fn deletion_shows_the_providers_progress(#[case] obj: Value, #[case] message: &str) {
    let view = machine(obj);
    let input = MirrorInput {
        deleting: true,
        machine: Some(&view),
        ..Default::default()
    };
    let s = mirror(None, &input, &at(1));
    let ready = condition::find(&s.conditions, "Ready").expect("Ready");
    assert_eq!(
        (ready.reason.as_str(), ready.message.as_str()),
        ("Deleting", message)
    );
    let gone = mirror(
        Some(&s),
        &MirrorInput {
            deleting: true,
            ..Default::default()
        },
        &at(2),
    );
    assert_eq!(
        condition::find(&gone.conditions, "Ready").map(|c| c.message.as_str()),
        Some("the infrastructure machine is gone")
    );
}
