//! The client behaves as pveproxy expects (REAL-PVE.md R9, the Proxmox behaviour issue): no more
//! requests in flight than its limit, and a ticket renewed before PVE would refuse it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use banlieue_pve_client::{Client, RequestRecord, TlsVerification};
use banlieue_pve_sim::{FaultRule, SimConfig, SimHandle};

async fn sim(config: SimConfig) -> SimHandle {
    banlieue_pve_sim::start(config).await.expect("simulator starts")
}

/// Twelve calls at once through a client limited to three: the simulator never serves more
/// than three at a time, and does serve three (the limit is not a lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_requests_in_flight_than_the_limit() {
    let sim = sim(SimConfig::fast()).await;
    sim.faults()
        .add(FaultRule::latency(Duration::from_millis(100)))
        .unwrap();
    let client = Client::builder(sim.url())
        .token(sim.token_id(), sim.token_secret())
        .tls(TlsVerification::Fingerprint(sim.fingerprint_sha256()))
        .max_in_flight(3)
        .build()
        .unwrap();
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..12 {
        let client = client.clone();
        calls.spawn(async move { client.version().await });
    }
    while let Some(answer) = calls.join_next().await {
        answer
            .unwrap()
            .expect("every call is answered, some after waiting for a slot");
    }
    assert_eq!(sim.peak_in_flight(), 3);
    sim.shutdown().await;
}

/// A server that answers 503 (overloaded pveproxy, or a proxy before it) gets fewer requests at
/// once: after one overload answer, a client limited to six sends at most three at a time (four
/// calls: the fourth waits for a slot), where before it would have sent all four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_server_gets_half_as_many_requests_at_once() {
    let sim = sim(SimConfig::fast()).await;
    let client = Client::builder(sim.url())
        .token(sim.token_id(), sim.token_secret())
        .tls(TlsVerification::Fingerprint(sim.fingerprint_sha256()))
        .max_in_flight(6)
        .build()
        .unwrap();
    sim.faults()
        .add(FaultRule::status(503, "Service Unavailable").first(1))
        .unwrap();
    client
        .version()
        .await
        .expect("the GET is sent again after the 503, and answered");
    sim.faults()
        .add(FaultRule::latency(Duration::from_millis(200)))
        .unwrap();
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let client = client.clone();
        calls.spawn(async move { client.version().await });
    }
    while let Some(answer) = calls.join_next().await {
        answer.unwrap().expect("every call is answered");
    }
    assert_eq!(sim.peak_in_flight(), 3);
    sim.shutdown().await;
}

/// A ticket is renewed once three quarters of its lifetime have passed, before PVE refuses it:
/// the second call logs in again first (a client that waited for the 401 would not, at 80 % of
/// the lifetime) and is sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_is_renewed_before_it_expires() {
    let lifetime = Duration::from_secs(4);
    let sim = sim(SimConfig {
        ticket_lifetime: lifetime,
        ..SimConfig::fast()
    })
    .await;
    let attempts: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let seen = attempts.clone();
    let client = Client::builder(sim.url())
        .password(sim.username(), sim.password())
        .tls(TlsVerification::Fingerprint(sim.fingerprint_sha256()))
        .ticket_lifetime(lifetime)
        .on_request(move |r: &RequestRecord| {
            seen.lock().unwrap().push((r.path.clone(), r.attempt));
        })
        .build()
        .unwrap();
    client.version().await.unwrap();
    // Past three quarters of the lifetime, still before its end.
    tokio::time::sleep(lifetime.mul_f64(0.8)).await;
    client.version().await.unwrap();
    let attempts = attempts.lock().unwrap().clone();
    let count = |path: &str| attempts.iter().filter(|(p, _)| p == path).count();
    assert_eq!(
        count("/access/ticket"),
        2,
        "logged in again before the ticket expired: {attempts:?}"
    );
    assert_eq!(
        count("/version"),
        2,
        "no request had to be repeated: {attempts:?}"
    );
    sim.shutdown().await;
}
