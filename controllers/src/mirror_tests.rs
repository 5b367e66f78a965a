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
fn a_day2_problem_shows_as_up_to_date_and_goes_when_the_machine_reports_none() {
    let failing = machine(json!({"status": {
        "initialization": {"provisioned": true}, "powerState": "On",
        "conditions": [ready_cond("True", "Provisioned"),
            {"type": "VMUpToDate", "status": "False", "reason": "ResizeFailed", "message": "disk cannot shrink",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}));
    let input = MirrorInput {
        generation: Some(1),
        machine: Some(&failing),
        ..Default::default()
    };
    let s = mirror(None, &input, &at(10));
    assert_eq!(cond(&s, "UpToDate"), ("False", "ResizeFailed"));
    assert_eq!(cond(&s, "Ready"), ("True", "Provisioned"), "the VM still runs");
    let none = machine(json!({"status": {"conditions": [ready_cond("False", "Cloning")]}}));
    let again = mirror(
        Some(&s),
        &MirrorInput {
            machine: Some(&none),
            ..input
        },
        &at(20),
    );
    assert!(condition::find(&again.conditions, "UpToDate").is_none());
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

fn waiting_for_cluster() -> MachineView {
    machine(json!({"status": {"conditions": [ready_cond("False", "WaitingForClusterInfrastructure")]}}))
}

fn cluster(status: &str, reason: &str, message: &str) -> ClusterView {
    ClusterView::from_object(&json!({"status": {"conditions": [
        {"type": "Ready", "status": status, "reason": reason, "message": message,
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
}

fn ready_of(s: &VirtualMachineStatus) -> (&str, &str, &str) {
    let c = condition::find(&s.conditions, "Ready").expect("Ready");
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

/// The machine only waits for its infra cluster: the VirtualMachine shows the cluster's cause,
/// naming the Provider; the phase is Failed only when that cause needs a human.
#[rstest]
#[case::auth("False", "AuthenticationFailed", "401 invalid token", VirtualMachinePhase::Failed,
    ("False", "AuthenticationFailed", "Provider pve-sim: 401 invalid token"))]
#[case::tls("False", "TLSVerificationFailed", "certificate signed by unknown authority", VirtualMachinePhase::Failed,
    ("False", "TLSVerificationFailed", "Provider pve-sim: certificate signed by unknown authority"))]
#[case::unreachable("False", "Unreachable", "connection refused", VirtualMachinePhase::Provisioning,
    ("False", "Unreachable", "Provider pve-sim: connection refused"))]
#[case::no_message("Unknown", "NoOnlineNode", "", VirtualMachinePhase::Provisioning,
    ("False", "NoOnlineNode", "Provider pve-sim: NoOnlineNode"))]
#[case::cluster_ready_keeps_the_machines_reason("True", "Provisioned", "", VirtualMachinePhase::Provisioning,
    ("False", "WaitingForClusterInfrastructure", "WaitingForClusterInfrastructure msg"))]
fn the_infra_clusters_cause_reaches_the_virtual_machine(
    #[case] status: &str,
    #[case] reason: &str,
    #[case] message: &str,
    #[case] phase: VirtualMachinePhase,
    #[case] ready: (&str, &str, &str),
) {
    let view = waiting_for_cluster();
    let cluster = cluster(status, reason, message);
    let input = MirrorInput {
        generation: Some(1),
        provider: Some("pve-sim"),
        machine: Some(&view),
        cluster: Some(&cluster),
        ..Default::default()
    };
    let s = mirror(None, &input, &at(10));
    assert_eq!(ready_of(&s), ready);
    assert_eq!(s.phase, Some(phase));
    // InfrastructureReady stays the machine's own condition.
    assert_eq!(
        cond(&s, "InfrastructureReady"),
        ("False", "WaitingForClusterInfrastructure")
    );
}

#[test]
fn the_cluster_is_not_the_cause_while_the_machine_reports_its_own_progress() {
    let view = machine(json!({"status": {"conditions": [ready_cond("False", "Cloning")]}}));
    let cluster = cluster("False", "AuthenticationFailed", "401");
    let input = MirrorInput {
        provider: Some("pve-sim"),
        machine: Some(&view),
        cluster: Some(&cluster),
        ..Default::default()
    };
    let s = mirror(None, &input, &at(10));
    assert_eq!(cond(&s, "Ready"), ("False", "Cloning"));
    assert_eq!(s.phase, Some(VirtualMachinePhase::Provisioning));
    assert_eq!(warning(None, &s, &input), None);
}

#[test]
fn a_cluster_without_ready_or_with_a_malformed_status_is_no_cause() {
    assert_eq!(
        ClusterView::from_object(&json!({"status": {"conditions": 7}})),
        ClusterView::default()
    );
    let view = waiting_for_cluster();
    let cluster = ClusterView::default();
    let input = MirrorInput {
        machine: Some(&view),
        cluster: Some(&cluster),
        ..Default::default()
    };
    let s = mirror(None, &input, &at(10));
    assert_eq!(cond(&s, "Ready"), ("False", "WaitingForClusterInfrastructure"));
}

/// A reason that needs a human makes the phase Failed, without a Failed provisioning state;
/// fixing the cause brings the phase back.
#[rstest]
#[case::template(json!({"status": {"provisioning": {"state": "Cloning"},
    "conditions": [ready_cond("False", "TemplateNotFound")]}}))]
#[case::user_data(json!({"status": {"conditions": [ready_cond("False", "BootstrapDataInvalid")]}}))]
#[case::credentials(json!({"status": {"conditions": [ready_cond("False", "ProxmoxCredentialsInvalid")]}}))]
fn a_cause_that_needs_a_human_fails_the_phase_until_fixed(#[case] obj: Value) {
    let view = machine(obj);
    let input = MirrorInput {
        generation: Some(1),
        machine: Some(&view),
        ..Default::default()
    };
    let failed = mirror(None, &input, &at(10));
    assert_eq!(failed.phase, Some(VirtualMachinePhase::Failed));

    let cloning = machine(json!({"status": {"provisioning": {"state": "Cloning"},
        "conditions": [ready_cond("False", "Cloning")]}}));
    let retried = mirror(
        Some(&failed),
        &MirrorInput {
            machine: Some(&cloning),
            ..input.clone()
        },
        &at(20),
    );
    assert_eq!(retried.phase, Some(VirtualMachinePhase::Provisioning));
    let running = machine(
        json!({"status": {"initialization": {"provisioned": true}, "powerState": "On",
        "conditions": [ready_cond("True", "Ready")]}}),
    );
    let fixed = mirror(
        Some(&retried),
        &MirrorInput {
            machine: Some(&running),
            ..input
        },
        &at(30),
    );
    assert_eq!(fixed.phase, Some(VirtualMachinePhase::Running));
    assert_eq!(
        condition::find(&fixed.conditions, "Ready").map(|c| c.last_transition_time.clone()),
        Some(at(30))
    );
}

#[test]
fn transient_and_progress_reasons_do_not_fail_the_phase() {
    for reason in [
        "CloningFailed",
        "Unreachable",
        "WaitingForBootstrapData",
        "PoweringOn",
    ] {
        let view = machine(json!({"status": {"conditions": [ready_cond("False", reason)]}}));
        let input = MirrorInput {
            machine: Some(&view),
            ..Default::default()
        };
        assert_eq!(
            mirror(None, &input, &at(1)).phase,
            Some(VirtualMachinePhase::Provisioning),
            "{reason}"
        );
    }
}

#[test]
fn invalid_input_fails_the_phase() {
    let invalid = Invalid::ProviderNotFound("gone".into());
    let input = MirrorInput {
        invalid: Some(&invalid),
        ..Default::default()
    };
    assert_eq!(
        mirror(None, &input, &at(1)).phase,
        Some(VirtualMachinePhase::Failed)
    );
}

/// Every reason the controller itself reports for invalid input needs a human, but a full
/// Provider, which the VM waits for.
#[test]
fn every_invalid_reason_needs_a_human() {
    assert!(!condition::needs_human(
        Invalid::ProviderFull {
            provider: "p".into(),
            shortfall: crate::provider_use::Shortfall {
                field: "vcpus",
                capacity: 1,
                used: 1,
                wanted: 1,
            },
        }
        .reason()
    ));
    let all = [
        Invalid::ProviderNotFound("p".into()),
        Invalid::NoProviderMatches,
        Invalid::BadSelector("x".into()),
        Invalid::NamespaceNotAllowed("p".into()),
        Invalid::UnsupportedBackend("x"),
        Invalid::ClassNotFound("c".into()),
        Invalid::ImageNotFound("i".into()),
        Invalid::NoSourceForBackend {
            backend: "proxmox",
            provider: "p".into(),
        },
        Invalid::MachineConflict {
            kind: "ProxmoxMachine",
            name: "n".into(),
        },
        Invalid::InfraClusterConflict {
            kind: "ProxmoxCluster",
            name: "n".into(),
        },
        Invalid::NoSize,
        Invalid::KindNotInstalled {
            kind: "ProxmoxMachine",
            backend: "proxmox",
            provider: "p".into(),
        },
        Invalid::ProviderDeleting("p".into()),
        Invalid::StorageNotDeclared("p".into()),
    ];
    for invalid in all {
        assert!(condition::needs_human(invalid.reason()), "{}", invalid.reason());
    }
}

/// One Warning per new cause: none on a repeated mirror, none for progress, one for the
/// cluster's cause even when it is transient, none while deleting.
#[test]
fn warnings_only_when_the_cause_changes() {
    let view = waiting_for_cluster();
    let auth = cluster("False", "AuthenticationFailed", "401");
    let input = MirrorInput {
        provider: Some("pve-sim"),
        machine: Some(&view),
        cluster: Some(&auth),
        ..Default::default()
    };
    let first = mirror(None, &input, &at(1));
    assert_eq!(
        warning(None, &first, &input),
        Some((
            "AuthenticationFailed".to_owned(),
            "Provider pve-sim: 401".to_owned()
        ))
    );
    let second = mirror(Some(&first), &input, &at(2));
    assert_eq!(warning(Some(&first), &second, &input), None);

    let unreachable = cluster("False", "Unreachable", "connection refused");
    let input2 = MirrorInput {
        cluster: Some(&unreachable),
        ..input.clone()
    };
    let third = mirror(Some(&second), &input2, &at(3));
    assert_eq!(
        warning(Some(&second), &third, &input2).map(|w| w.0),
        Some("Unreachable".to_owned())
    );

    let deleting = MirrorInput {
        deleting: true,
        ..input.clone()
    };
    assert_eq!(warning(None, &mirror(None, &deleting, &at(4)), &deleting), None);
    let recovered = machine(json!({"status": {"conditions": [ready_cond("True", "Ready")]}}));
    let ok = MirrorInput {
        machine: Some(&recovered),
        ..input
    };
    assert_eq!(
        warning(Some(&third), &mirror(Some(&third), &ok, &at(5)), &ok),
        None
    );
}

/// A VirtualMachine has no bootstrap provider: a machine waiting for bootstrap data waits for
/// the user-data Secret the VM names, which someone must create.
#[test]
fn a_missing_user_data_secret_needs_a_human() {
    let waiting = machine(
        json!({"status": {"conditions": [{"type": "Ready", "status": "False",
        "reason": "WaitingForBootstrapData", "message": "Secret ns/cloud-init not found",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
    );
    let input = MirrorInput {
        machine: Some(&waiting),
        user_data_secret: Some("cloud-init"),
        ..Default::default()
    };
    let s = mirror(None, &input, &at(1));
    let (status, reason, message) = ready_of(&s);
    assert_eq!((status, reason), ("False", "UserDataSecretNotFound"));
    assert!(
        message.contains("user-data Secret cloud-init") && message.contains("Secret ns/cloud-init not found"),
        "{message}"
    );
    assert_eq!(s.phase, Some(VirtualMachinePhase::Failed));
    assert_eq!(
        warning(None, &s, &input).map(|w| w.0),
        Some("UserDataSecretNotFound".to_owned())
    );
    // Without a user-data Secret on the VM (e.g. CAPI-style waiting), the reason is kept.
    let no_secret = MirrorInput {
        user_data_secret: None,
        ..input
    };
    let s = mirror(None, &no_secret, &at(1));
    assert_eq!(cond(&s, "Ready"), ("False", "WaitingForBootstrapData"));
    assert_eq!(s.phase, Some(VirtualMachinePhase::Provisioning));
}

/// A user follows the lifecycle in Events: one Normal Event per new phase, and per new
/// provisioning step; none when nothing changed, none for Pending or Failed.
#[test]
fn lifecycle_events_follow_phases_and_provisioning_steps() {
    fn status(phase: VirtualMachinePhase, ready: Option<(&str, &str, &str)>) -> VirtualMachineStatus {
        VirtualMachineStatus {
            phase: Some(phase),
            conditions: ready
                .map(|(st, reason, message)| {
                    vec![condition::new_condition(
                        condition::READY,
                        parse_status(st),
                        reason,
                        message,
                        Some(1),
                        at(1),
                    )]
                })
                .unwrap_or_default(),
            ..Default::default()
        }
    }
    let cloning = status(
        VirtualMachinePhase::Provisioning,
        Some(("False", "Cloning", "clone task")),
    );
    assert_eq!(
        lifecycle(None, &cloning),
        Some((
            "Cloning".to_owned(),
            "provisioning: Cloning: clone task".to_owned()
        ))
    );
    assert_eq!(lifecycle(Some(&cloning), &cloning), None);
    let powering = status(
        VirtualMachinePhase::Provisioning,
        Some(("False", "PoweringOn", "")),
    );
    assert_eq!(
        lifecycle(Some(&cloning), &powering).map(|e| e.0),
        Some("PoweringOn".to_owned())
    );
    let running = status(VirtualMachinePhase::Running, Some(("True", "Provisioned", "")));
    assert_eq!(
        lifecycle(Some(&powering), &running),
        Some((
            "Running".to_owned(),
            "the VM is provisioned and powered on".to_owned()
        ))
    );
    let deleting = status(VirtualMachinePhase::Deleting, Some(("False", "Deleting", "")));
    assert_eq!(
        lifecycle(Some(&running), &deleting).map(|e| e.0),
        Some("Deleting".to_owned())
    );
    assert_eq!(lifecycle(None, &status(VirtualMachinePhase::Pending, None)), None);
    assert_eq!(
        lifecycle(
            None,
            &status(
                VirtualMachinePhase::Failed,
                Some(("False", "TemplateNotFound", "x"))
            )
        ),
        None
    );
}

/// Only provisioning news may wait for the next news: the first `Provisioning`, a next step;
/// never Ready, a problem, a failure, deletion or invalid input.
#[test]
fn only_provisioning_news_is_progress() {
    let mirrored = |before: Option<&VirtualMachineStatus>, obj: Value| {
        let view = machine(obj);
        let input = MirrorInput {
            generation: Some(1),
            machine: Some(&view),
            ..Default::default()
        };
        let after = mirror(before, &input, &at(10));
        (only_progress(before, &after, &input), after)
    };
    let cloning = json!({"status": {"provisioning": {"state": "Cloning"}, "conditions": [ready_cond("False", "Cloning")]}});
    let (first, cloning_status) = mirrored(None, cloning.clone());
    assert!(first, "the first Provisioning status is progress");
    let (next, _) = mirrored(
        Some(&cloning_status),
        json!({"status": {"provisioning": {"state": "PoweringOn"}, "conditions": [ready_cond("False", "PoweringOn")]}}),
    );
    assert!(next, "a next provisioning step is progress");
    let (ready, running) = mirrored(
        Some(&cloning_status),
        json!({"status": {"initialization": {"provisioned": true}, "powerState": "On",
                          "conditions": [ready_cond("True", "Ready")]}}),
    );
    assert!(!ready, "Running and Ready is written at once");
    let (failed, _) = mirrored(
        Some(&cloning_status),
        json!({"status": {"provisioning": {"state": "Failed"}, "conditions": [ready_cond("False", "TemplateNotFound")]}}),
    );
    assert!(!failed, "a failure is written at once");
    let (after_running, _) = mirrored(Some(&running), cloning);
    assert!(
        !after_running,
        "a provisioned VM going back to provisioning is written at once"
    );

    let view = machine(json!({"status": {"conditions": [ready_cond("False", "Cloning")]}}));
    let deleting = MirrorInput {
        generation: Some(1),
        deleting: true,
        machine: Some(&view),
        ..Default::default()
    };
    let after = mirror(Some(&cloning_status), &deleting, &at(10));
    assert!(
        !only_progress(Some(&cloning_status), &after, &deleting),
        "deletion is written at once"
    );
    let invalid = Invalid::ProviderNotFound("gone".to_owned());
    let refused = MirrorInput {
        generation: Some(1),
        invalid: Some(&invalid),
        ..Default::default()
    };
    let after = mirror(None, &refused, &at(10));
    assert!(
        !only_progress(None, &after, &refused),
        "invalid input is written at once"
    );
}
