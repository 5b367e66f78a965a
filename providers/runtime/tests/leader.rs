//! Lease leader election and the manager against a real apiserver (`banlieue-testenv`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use banlieue_provider_runtime::http::{self, Probe as _, Probes};
use banlieue_provider_runtime::leader::LeaderElector;
use banlieue_provider_runtime::manager::{self, LeaseSettings, ManagerConfig};
use banlieue_provider_runtime::shutdown;
use banlieue_testenv::TestEnv;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

#[tokio::test]
async fn one_leader_at_a_time_takeover_after_expiry_and_release() -> anyhow::Result<()> {
    let env = TestEnv::shared().await?;
    let ns = env.namespace("leader").await?;
    let client = env.client().await?;
    let candidate = |id: &str| {
        let mut c = LeaderElector::new(client.clone(), &ns, "lease", id);
        c.lease_duration = Duration::from_secs(2);
        c.renew_every = Duration::from_millis(500);
        c
    };
    let (a, b) = (candidate("a"), candidate("b"));
    assert!(a.try_acquire_or_renew().await?, "a takes the free Lease");
    assert!(!b.try_acquire_or_renew().await?, "b waits while a holds it");
    assert!(a.try_acquire_or_renew().await?, "a renews");
    assert!(!b.try_acquire_or_renew().await?, "b still waits after a renewed");
    // a stops renewing: after the lease duration b takes over, and a has lost it.
    tokio::time::sleep(Duration::from_millis(3100)).await;
    assert!(b.try_acquire_or_renew().await?, "b takes the expired Lease");
    assert!(!a.try_acquire_or_renew().await?, "a no longer holds it");
    // A clean shutdown releases the Lease: a takes it at once, without waiting for expiry.
    a.release().await?; // not the holder: no-op
    assert!(
        !a.try_acquire_or_renew().await?,
        "releasing someone else's Lease does nothing"
    );
    b.release().await?;
    assert!(
        a.try_acquire_or_renew().await?,
        "a takes the released Lease immediately"
    );
    let spec = Api::<Lease>::namespaced(client.clone(), &ns)
        .get("lease")
        .await?
        .spec
        .context("spec")?;
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_transitions, Some(2), "a → b → a");
    Ok(())
}

/// A manager in this process: its controllers mark the probe ready and wait for shutdown.
struct Candidate {
    probes: Arc<Probes>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<banlieue_provider_runtime::Result<()>>,
    addr: std::net::SocketAddr,
}

fn start(client: kube::Client, ns: &str, identity: &str) -> anyhow::Result<Candidate> {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = ManagerConfig {
        metrics_addr: addr,
        health_addr: None,
        leader: Some(LeaseSettings {
            name: "manager".into(),
            namespace: ns.to_owned(),
            identity: identity.to_owned(),
        }),
    };
    let probes = Arc::new(Probes::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let p = probes.clone();
    let task = tokio::spawn(async move {
        let stopped = shutdown::on(async move {
            let _ = stopped.await;
        });
        manager::run(client, config, p.clone(), stopped, |shutdown| async move {
            p.set_ready(true);
            shutdown.await;
        })
        .await
    });
    Ok(Candidate {
        probes,
        stop,
        task,
        addr,
    })
}

async fn get(addr: std::net::SocketAddr, path: &'static str) -> anyhow::Result<u16> {
    Ok(tokio::task::spawn_blocking(move || http::get(addr, path))
        .await??
        .0)
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !f() {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "{what}: not within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test]
async fn two_managers_one_runs_the_controllers_and_hands_over_on_shutdown() -> anyhow::Result<()> {
    let env = TestEnv::shared().await?;
    let ns = env.namespace("manager").await?;
    let leases = Api::<Lease>::namespaced(env.client().await?, &ns);
    let a = start(env.client().await?, &ns, "a")?;
    wait_until("a leads", || a.probes.ready()).await?;
    let b = start(env.client().await?, &ns, "b")?;
    // b serves its endpoint but is not ready while a holds the Lease.
    wait_until("b serves", || std::net::TcpStream::connect(b.addr).is_ok()).await?;
    assert_eq!(get(b.addr, "/healthz").await?, 200);
    assert_eq!(get(b.addr, "/readyz").await?, 503, "b waits for the Lease");
    assert_eq!(get(a.addr, "/readyz").await?, 200);
    tokio::time::sleep(Duration::from_secs(3)).await; // b retries; a keeps renewing
    assert!(!b.probes.ready(), "never two leaders");
    let holder = |l: Lease| l.spec.and_then(|s| s.holder_identity);
    assert_eq!(holder(leases.get("manager").await?).as_deref(), Some("a"));
    // a stops gracefully: its controllers return, it releases the Lease, b takes it at once.
    drop(a.stop);
    a.task.await??;
    wait_until("b leads", || b.probes.ready()).await?;
    assert_eq!(holder(leases.get("manager").await?).as_deref(), Some("b"));
    let _ = b.stop.send(());
    b.task.await??;
    assert_eq!(holder(leases.get("manager").await?), None, "released on shutdown");
    Ok(())
}
