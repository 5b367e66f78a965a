//! Cluster API installed after the provider started.
//!
//! The controllers watch CAPI `Machine`s and `Cluster`s only when `cluster.x-k8s.io/v1beta2`
//! serves them (standalone mode works without CAPI). A kube-runtime controller's watches are
//! fixed once it runs, so [`run_until_shutdown`] runs a controller built for what discovery says
//! now and, while CAPI is not served, asks discovery again every
//! [`CAPI_DISCOVERY_INTERVAL`]: once CAPI appears it logs so, stops the controller gracefully
//! (in-flight reconciles finish) and runs it again with the CAPI watches. The restarted
//! controller lists everything again; reconciles are level-triggered, so that costs reads and
//! no writes.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::oneshot;

/// How often discovery is asked again while Cluster API is not installed.
pub const CAPI_DISCOVERY_INTERVAL: Duration = Duration::from_secs(30);

/// The stop signal handed to one controller run: the process shutdown, or CAPI appearing.
pub type Stop = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// Whether `cluster.x-k8s.io/v1beta2` serves `clusters` and `machines` (no log line: the
/// periodic re-check would repeat it; [`capi_served`] logs).
pub async fn capi_served_quietly(client: &kube::Client) -> bool {
    client
        .list_api_group_resources(banlieue_capi::contract::CLUSTER_API_VERSION)
        .await
        .is_ok_and(|list| {
            ["clusters", "machines"]
                .iter()
                .all(|r| list.resources.iter().any(|x| x.name == *r))
        })
}

/// Whether the apiserver serves CAPI's `clusters` and `machines` (`cluster.x-k8s.io/v1beta2`).
/// Without CAPI installed a provider serves standalone machines only, and does not watch them
/// until [`run_until_shutdown`] sees CAPI appear.
pub async fn capi_served(client: &kube::Client) -> bool {
    let served = capi_served_quietly(client).await;
    if !served {
        tracing::info!("Cluster API is not installed: serving standalone machines only");
    }
    served
}

/// Sends on `found` once CAPI is served, asking every `interval`; returns early when the
/// receiver is gone.
async fn wait_for_capi(client: kube::Client, interval: Duration, found: oneshot::Sender<()>) {
    loop {
        tokio::time::sleep(interval).await;
        if found.is_closed() {
            return;
        }
        if capi_served_quietly(&client).await {
            let _ = found.send(());
            return;
        }
    }
}

/// Runs `run_once(capi, stop)` — `controller` built with CAPI watches when `capi` — until
/// `shutdown`, running it again with CAPI watches once Cluster API gets installed (see the
/// module docs).
pub async fn run_until_shutdown<F, Fut>(
    client: kube::Client,
    controller: &'static str,
    interval: Duration,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    mut run_once: F,
) where
    F: FnMut(bool, Stop) -> Fut,
    Fut: Future<Output = ()>,
{
    let shutdown = shutdown.shared();
    loop {
        let capi = capi_served(&client).await;
        let (found, appeared) = oneshot::channel::<()>();
        let watcher = (!capi).then(|| tokio::spawn(wait_for_capi(client.clone(), interval, found)));
        // A dropped sender (CAPI already served) must not stop the controller.
        let appeared = appeared.then(|res| async move {
            if res.is_err() {
                futures::future::pending::<()>().await;
            }
        });
        let stop: Stop = Box::pin(futures::future::select(shutdown.clone(), Box::pin(appeared)).map(|_| ()));
        run_once(capi, stop).await;
        if let Some(watcher) = watcher {
            watcher.abort();
        }
        if shutdown.peek().is_some() {
            return;
        }
        tracing::info!(
            controller,
            "Cluster API is now installed: restarting the controller to watch Machines and Clusters"
        );
    }
}
