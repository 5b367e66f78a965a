//! Fault tests against the simulator's fault injector: each injected fault maps to the right error
//! class; retries (with backoff) happen only for transient faults of idempotent requests; never on
//! 4xx. Attempts are counted with the client's request hook.

mod common;

use std::time::{Duration, Instant};

use banlieue_pve_client::{CloneRequest, Error, ErrorClass, RetryPolicy};
use banlieue_pve_sim::FaultRule;
use common::target::{self, Target};

async fn sim() -> Target {
    target::sim_target().await
}

fn faults(t: &Target) -> banlieue_pve_sim::FaultInjector {
    t.sim.as_ref().unwrap().faults()
}

#[tokio::test]
async fn http_500_on_get_is_transient_and_retried_until_it_clears() {
    let t = sim().await;
    faults(&t)
        .add(
            FaultRule::status(500, "internal error")
                .method("GET")
                .path_prefix("/version")
                .first(2),
        )
        .unwrap();
    let started = Instant::now();
    t.client.version().await.unwrap();
    assert_eq!(t.attempts("GET", "/version"), 3, "two failures, then success");
    assert!(
        started.elapsed() >= Duration::from_millis(5),
        "backed off between attempts"
    );
}

#[tokio::test]
async fn http_503_everywhere_exhausts_the_bounded_retries() {
    let t = sim().await;
    faults(&t)
        .add(FaultRule::status(503, "Service Unavailable").path_prefix("/nodes"))
        .unwrap();
    let err = t.client.nodes().await.unwrap_err();
    assert_eq!(
        (err.status(), err.class()),
        (Some(503), ErrorClass::Transient),
        "{err}"
    );
    assert_eq!(err.message(), Some("Service Unavailable"));
    assert_eq!(
        t.attempts("GET", "/nodes"),
        1 + target::fast_retry().max_retries as usize
    );
}

#[tokio::test]
async fn transient_faults_on_posts_are_not_retried() {
    let t = sim().await;
    faults(&t)
        .add(
            FaultRule::status(500, "internal error")
                .method("POST")
                .path_regex("/clone$"),
        )
        .unwrap();
    let req = CloneRequest {
        newid: 150,
        ..CloneRequest::default()
    };
    let err = t.client.clone_vm(&t.node, t.template, &req).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Transient);
    assert_eq!(t.attempts("POST", "/clone"), 1);
}

#[tokio::test]
async fn client_errors_are_never_retried() {
    let t = sim().await;
    faults(&t)
        .add(FaultRule::status(403, "Permission check failed (/vms/100, VM.Audit)").method("GET"))
        .unwrap();
    let err = t.client.vm_status(&t.node, 100).await.unwrap_err();
    assert_eq!((err.status(), err.class()), (Some(403), ErrorClass::Auth));
    assert_eq!(t.records().len(), 1);
    faults(&t).clear();

    // Real refusals from the simulator: a taken VMID, and a parameter the schema rejects.
    let req = CloneRequest {
        newid: t.template,
        ..CloneRequest::default()
    };
    let err = t.client.clone_vm(&t.node, t.template, &req).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::AlreadyExists, "{err}");
    let req = CloneRequest {
        newid: 151,
        name: Some("not a dns name!".into()),
        ..CloneRequest::default()
    };
    let err = t.client.clone_vm(&t.node, t.template, &req).await.unwrap_err();
    assert_eq!(
        (err.status(), err.class()),
        (Some(400), ErrorClass::Invalid),
        "{err}"
    );
    assert!(err.param_errors().unwrap().contains_key("name"), "{err}");
    assert_eq!(t.attempts("POST", "/clone"), 2);
    assert!(!t.client.is_vmid_free(t.template).await.unwrap());
    assert_eq!(t.attempts("GET", "/cluster/nextid"), 1);
}

#[tokio::test]
async fn latency_beyond_the_timeout_is_a_transient_timeout() {
    let t = sim().await;
    let sim = t.sim.as_ref().unwrap();
    faults(&t)
        .add(FaultRule::latency(Duration::from_secs(3)).path_prefix("/version"))
        .unwrap();
    let (builder, records) = target::recording(target::sim_builder(sim).timeout(Duration::from_millis(200)));
    let client = builder
        .retry(RetryPolicy {
            max_retries: 1,
            ..target::fast_retry()
        })
        .build()
        .unwrap();
    let started = Instant::now();
    let err = client.version().await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert_eq!(err.class(), ErrorClass::Transient);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(records.lock().unwrap().len(), 2, "one retry");
}

#[tokio::test]
async fn dropped_connections_are_transient() {
    let t = sim().await;
    faults(&t)
        .add(
            FaultRule::drop_connection()
                .method("GET")
                .path_prefix("/cluster/resources")
                .nth(1),
        )
        .unwrap();
    let vms = t.client.cluster_resources(None).await.unwrap();
    assert!(!vms.is_empty());
    assert_eq!(t.attempts("GET", "/cluster/resources"), 2);

    faults(&t)
        .add(
            FaultRule::drop_connection()
                .method("POST")
                .path_regex("/status/start$"),
        )
        .unwrap();
    let err = t.client.start_vm(&t.node, t.template).await.unwrap_err();
    assert!(matches!(err, Error::Transport { .. }), "{err:?}");
    assert_eq!(err.class(), ErrorClass::Transient);
    assert_eq!(
        t.attempts("POST", "/status/start"),
        1,
        "a POST that may have been received is not repeated"
    );
}

#[tokio::test]
async fn expired_tickets_cause_one_relogin() {
    let t = sim().await;
    let sim = t.sim.as_ref().unwrap();
    let (builder, records) =
        target::recording(target::sim_builder(sim).password(sim.username(), sim.password()));
    let client = builder.build().unwrap();
    client.version().await.unwrap();
    faults(&t).expire_all_tickets();
    let newid = client.next_id().await.unwrap();
    let req = CloneRequest {
        newid,
        ..CloneRequest::default()
    };
    faults(&t).expire_all_tickets();
    client.clone_vm(&t.node, t.template, &req).await.unwrap();
    let records = records.lock().unwrap().clone();
    let logins = records.iter().filter(|r| r.path == "/access/ticket").count();
    assert_eq!(logins, 3, "initial login plus one per expiry: {records:#?}");
    assert_eq!(records.iter().filter(|r| r.path == "/cluster/nextid").count(), 2);
    assert_eq!(records.iter().filter(|r| r.path.ends_with("/clone")).count(), 2);
}

#[tokio::test]
async fn task_failures_surface_as_task_failed_with_the_exit_status() {
    let t = sim().await;
    faults(&t)
        .add(FaultRule::task_failure("clone failed: no space left on device").path_regex("/clone$"))
        .unwrap();
    let newid = t.client.next_id().await.unwrap();
    let upid = t
        .client
        .clone_vm(
            &t.node,
            t.template,
            &CloneRequest {
                newid,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let err = t
        .client
        .wait_task(&upid, Duration::from_secs(10), Duration::from_millis(20))
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::TaskFailed);
    assert_eq!(err.message(), Some("clone failed: no space left on device"));
    assert_eq!(t.attempts("POST", "/clone"), 1);

    faults(&t).clear();
    let newid = t.client.next_id().await.unwrap();
    let req = CloneRequest {
        newid,
        ..Default::default()
    };
    let upid = t.client.clone_vm(&t.node, t.template, &req).await.unwrap();
    t.client
        .wait_task(&upid, Duration::from_secs(10), Duration::from_millis(20))
        .await
        .unwrap();
    faults(&t)
        .add(FaultRule::task_failure("VM 101 is locked (clone)").path_regex("/status/start$"))
        .unwrap();
    let upid = t.client.start_vm(&t.node, newid).await.unwrap();
    let err = t
        .client
        .wait_task(&upid, Duration::from_secs(10), Duration::from_millis(20))
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Locked, "{err}");
}

#[tokio::test]
async fn agent_not_running_is_its_own_class_and_not_retried() {
    let mut config = banlieue_pve_sim::SimConfig::fast();
    config.agent_delay = Duration::from_secs(60);
    let t = target::sim_target_with(config).await;
    let newid = t.client.next_id().await.unwrap();
    let c = &t.client;
    let upid = c
        .clone_vm(
            &t.node,
            t.template,
            &CloneRequest {
                newid,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    c.wait_task(&upid, Duration::from_secs(10), Duration::from_millis(20))
        .await
        .unwrap();
    let upid = c.start_vm(&t.node, newid).await.unwrap();
    c.wait_task(&upid, Duration::from_secs(10), Duration::from_millis(20))
        .await
        .unwrap();
    let err = c.agent_network_interfaces(&t.node, newid).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::AgentNotRunning, "{err}");
    assert_eq!(t.attempts("GET", "/agent/network-get-interfaces"), 1);
}
