//! Runs a binary's controllers the way a controller-runtime manager does: endpoints first
//! (`/healthz` at once, `/readyz` once the controllers run), then — with leader election — wait
//! for the Lease, run the controllers while renewing it, and release it after a graceful stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::http::{self, Probe};
use crate::leader::LeaderElector;
use crate::shutdown::Shutdown;
use crate::{Error, Result};

/// How long the controllers may take to drain after the shutdown signal before the process
/// stops anyway. Shorter than controller-runtime's 30 s so that the Lease is released before
/// Kubernetes kills the pod (`terminationGracePeriodSeconds`, 30 s by default); abandoning a
/// reconcile is safe because every reconciler survives a crash at any point.
pub const GRACEFUL_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `controllers` until they return, or until [`GRACEFUL_SHUTDOWN_TIMEOUT`] after
/// `shutdown` (a reconcile that hangs, or a controller that missed the signal).
async fn drain(controllers: impl Future<Output = ()>, shutdown: Shutdown) {
    let deadline = async {
        shutdown.await;
        tokio::time::sleep(GRACEFUL_SHUTDOWN_TIMEOUT).await;
    };
    tokio::select! {
        () = controllers => info!("controllers stopped"),
        () = deadline => warn!(timeout = ?GRACEFUL_SHUTDOWN_TIMEOUT, "controllers did not stop in time; stopping anyway"),
    }
}

/// The Lease of a leader election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Name of the Lease.
    pub name: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// This candidate's identity (see [`crate::leader::default_identity`]).
    pub identity: String,
}

/// What [`run`] serves and whether it elects a leader.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    /// Address of the endpoint (`/metrics`, and the probes).
    pub metrics_addr: SocketAddr,
    /// A second address for the same endpoint (the probe port), if different.
    pub health_addr: Option<SocketAddr>,
    /// Elect a leader on this Lease before running the controllers.
    pub leader: Option<LeaseSettings>,
}

/// Serves the endpoint, (optionally) waits for leadership, then runs `controllers` with
/// `shutdown` until they return. The controllers get `shutdown` to stop gracefully (they should
/// finish in-flight reconciles); afterwards the Lease is released so a standby takes over at
/// once.
///
/// Returns [`Error::LostLeadership`] as soon as the Lease is lost (the controllers are dropped
/// mid-flight: another replica now reconciles; the caller exits non-zero). A shutdown signal
/// while waiting for the Lease returns `Ok` without running the controllers.
pub async fn run<F, Fut>(
    client: kube::Client,
    config: ManagerConfig,
    probe: Arc<dyn Probe>,
    shutdown: Shutdown,
    controllers: F,
) -> Result<()>
where
    F: FnOnce(Shutdown) -> Fut,
    Fut: Future<Output = ()>,
{
    let (stop_http, http_stopped) = tokio::sync::watch::channel(false);
    let mut servers = Vec::new();
    for (what, addr) in [
        ("metrics", Some(config.metrics_addr)),
        ("health probe", config.health_addr),
    ] {
        let Some(addr) = addr else { continue };
        let listener = http::bind(what, addr).await?;
        info!(endpoint = what, addr = %listener.local_addr().unwrap_or(addr), "serving");
        let mut stopped = http_stopped.clone();
        servers.push(tokio::spawn(http::serve(listener, probe.clone(), async move {
            let _ = stopped.wait_for(|s| *s).await;
        })));
    }
    let result = lead(client, &config, shutdown, controllers).await;
    let _ = stop_http.send(true);
    for server in servers {
        let _ = server.await;
    }
    result
}

async fn lead<F, Fut>(
    client: kube::Client,
    config: &ManagerConfig,
    shutdown: Shutdown,
    controllers: F,
) -> Result<()>
where
    F: FnOnce(Shutdown) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(lease) = &config.leader else {
        drain(controllers(shutdown.clone()), shutdown).await;
        return Ok(());
    };
    let elector = LeaderElector::new(client, &lease.namespace, &lease.name, &lease.identity);
    info!(
        lease = lease.name,
        namespace = lease.namespace,
        identity = elector.identity,
        "waiting for leadership"
    );
    tokio::select! {
        () = elector.acquire() => {}
        () = shutdown.clone() => return Ok(()),
    }
    tokio::select! {
        () = drain(controllers(shutdown.clone()), shutdown) => {}
        () = elector.hold() => return Err(Error::LostLeadership(format!("{}/{}", lease.namespace, lease.name))),
    }
    if let Err(e) = elector.release().await {
        warn!(error = %e, "cannot release the Lease (a standby takes over after it expires)");
    }
    Ok(())
}
