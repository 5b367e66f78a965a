//! The client's contract suite: the same scenarios against the simulator (default) and against a
//! real Proxmox VE (ignored unless `PROXMOX_URL`, `PROXMOX_TOKEN_ID`, `PROXMOX_SECRET` are set).

mod common;

use std::time::Duration;

use banlieue_pve_client::{Client, CloneRequest, ErrorClass, TaskOutcome, TlsVerification};
use banlieue_pve_sim::SimConfig;
use common::scenarios;
use common::target::{self, REAL_PVE};

#[tokio::test]
async fn sim_discovery() {
    scenarios::discovery(&target::sim_target().await).await;
}

#[tokio::test]
async fn sim_vm_lifecycle() {
    scenarios::vm_lifecycle(&target::sim_target().await).await;
}

#[tokio::test]
async fn sim_vm_lifecycle_with_default_timings() {
    // Default task durations (clone 3 s, start 1 s, …), guest agent after 5 s, resources lag:
    // the scenario must cope by polling tasks, never by assuming instant completion.
    let config = SimConfig {
        auth_failure_delay: Duration::ZERO,
        agent_delay: Duration::from_secs(2),
        ..SimConfig::default()
    };
    let t = target::sim_target_with(config).await;
    let started = std::time::Instant::now();
    scenarios::vm_lifecycle(&t).await;
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "tasks really took their time"
    );
    assert!(
        t.attempts("GET", "/agent/network-get-interfaces") >= 2,
        "the agent was polled until it answered"
    );
}

#[tokio::test]
async fn sim_clone_holds_the_clone_lock_while_running() {
    let mut config = SimConfig::fast();
    config
        .task_durations
        .insert("qmclone".into(), Duration::from_secs(2));
    let t = target::sim_target_with(config).await;
    let c = &t.client;
    let newid = c.next_id().await.unwrap();
    let req = CloneRequest {
        newid,
        name: Some("locked".into()),
        ..CloneRequest::default()
    };
    let task = c.clone_vm(&t.node, t.template, &req).await.unwrap();
    let during = c.vm_config(&t.node, newid).await.unwrap();
    assert_eq!(
        c.task_status(&task).await.unwrap().outcome(),
        TaskOutcome::Running
    );
    assert_eq!(during.lock(), Some("clone"));
    assert_eq!(during.name(), None, "only the lock exists while cloning");
    assert!(!c.is_vmid_free(newid).await.unwrap(), "the VMID is taken at once");
    let outcome = c
        .wait_task(&task, Duration::from_secs(10), Duration::from_millis(20))
        .await
        .unwrap();
    assert_eq!(outcome, TaskOutcome::Ok);
    let after = c.vm_config(&t.node, newid).await.unwrap();
    assert_eq!((after.lock(), after.name()), (None, Some("locked")));
}

#[tokio::test]
async fn sim_start_template_fails_in_task() {
    scenarios::start_template_fails_in_task(&target::sim_target().await).await;
}

#[tokio::test]
async fn sim_missing_objects() {
    scenarios::missing_objects(&target::sim_target().await).await;
}

#[tokio::test]
async fn sim_seed_iso_upload() {
    scenarios::seed_iso_upload(&target::sim_target().await).await;
}

#[tokio::test]
async fn sim_ticket_auth() {
    let t = target::sim_target().await;
    let sim = t.sim.as_ref().unwrap();
    let client = target::sim_builder(sim)
        .password(sim.username(), sim.password())
        .build()
        .unwrap();
    let newid = client.next_id().await.unwrap();
    assert!(client.is_vmid_free(newid).await.unwrap());
    let task = client
        .start_vm("pve1", sim.config().templates[0].vmid)
        .await
        .unwrap();
    assert_eq!(task.user, sim.username());

    let bad = target::sim_builder(sim)
        .password(sim.username(), "wrong")
        .build()
        .unwrap();
    let err = bad.version().await.unwrap_err();
    assert_eq!(
        (err.status(), err.class()),
        (Some(401), ErrorClass::Auth),
        "{err}"
    );

    let bad = target::sim_builder(sim)
        .token(sim.token_id(), "00000000-0000-0000-0000-000000000000")
        .build()
        .unwrap();
    assert_eq!(bad.version().await.unwrap_err().class(), ErrorClass::Auth);
}

#[tokio::test]
async fn sim_tls_modes() {
    let t = target::sim_target().await;
    let sim = t.sim.as_ref().unwrap();
    let with = |tls: TlsVerification| -> Client { target::sim_builder(sim).tls(tls).build().unwrap() };

    with(TlsVerification::Fingerprint(sim.fingerprint_sha256()))
        .version()
        .await
        .unwrap();
    with(TlsVerification::Fingerprint(
        sim.fingerprint_sha256().replace(':', "").to_lowercase(),
    ))
    .version()
    .await
    .unwrap();
    with(TlsVerification::CaBundle(sim.ca_pem()))
        .version()
        .await
        .unwrap();

    let wrong = "AA:".repeat(31) + "AA";
    let err = with(TlsVerification::Fingerprint(wrong))
        .version()
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Auth, "{err}");
    let err = with(TlsVerification::WebPki).version().await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Auth, "{err}");
}

#[tokio::test]
#[ignore = "needs a real Proxmox VE: set PROXMOX_URL, PROXMOX_TOKEN_ID, PROXMOX_SECRET (see tests/common/target.rs)"]
async fn real_pve_all_scenarios() {
    let t = target::real_target().expect(REAL_PVE);
    scenarios::all(&t).await;
}
