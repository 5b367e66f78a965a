//! Runs a built kube-runtime controller: bounded concurrency, graceful shutdown, every reconcile
//! observed in the provider's metrics, its `controller` label the kind in lower case
//! (`proxmoxmachine`, `libvirtcluster`, `vspheremachinetemplate`).

use std::future::Future;
use std::sync::Arc;

use banlieue_api::infrastructure::kinds::NamespacedKind;
use banlieue_provider_runtime::metrics::Metrics;
use futures::StreamExt;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::{Predicate, WatchStreamExt, predicates, watcher};

use banlieue_capi::contract;

use crate::error::{Error, Result};

/// The API of `K` in one namespace, or (`None`) in all.
pub(crate) fn api<K: NamespacedKind>(client: &kube::Client, namespace: Option<&str>) -> kube::Api<K> {
    match namespace {
        Some(ns) => kube::Api::namespaced(client.clone(), ns),
        None => kube::Api::all(client.clone()),
    }
}

/// The objects of `K` (in `namespace`, or all) whose `read` changed: the watch of a kind that
/// wakes reconciles only for what they read of it. CAPI writes its own objects' status many
/// times per machine (conditions, counts), which would each wake a reconcile for nothing.
pub(crate) fn changes_of<K, P>(
    client: &kube::Client,
    namespace: Option<&str>,
    read: P,
) -> impl futures::Stream<Item = std::result::Result<K, watcher::Error>> + Send + 'static
where
    K: NamespacedKind,
    P: Predicate<K> + Send + 'static,
{
    watcher(api::<K>(client, namespace), watcher::Config::default())
        .default_backoff()
        .touched_objects()
        .predicate_filter(read, Default::default())
}

/// What a provider reads of an owner (a CAPI Machine or Cluster, a VirtualMachine) besides its
/// status: its spec (the generation, which its deletion also bumps), labels and annotations.
pub(crate) fn spec_labels_annotations<K: kube::Resource>(object: &K) -> Option<u64> {
    predicates::generation
        .combine(predicates::labels)
        .combine(predicates::annotations)
        .hash_property(object)
}

/// The watch of a controller's own kind: every object, or (`watch_filter`) only those labelled
/// [`contract::WATCH_FILTER_LABEL`] with that value, as CAPI's `--watch-filter` selects.
pub(crate) fn primary_watch(watch_filter: Option<&str>) -> kube::runtime::watcher::Config {
    let config = kube::runtime::watcher::Config::default();
    match watch_filter {
        Some(value) => config.labels(&format!("{}={value}", contract::WATCH_FILTER_LABEL)),
        None => config,
    }
}

/// Runs `controller` until `shutdown`, `concurrency` reconciles at a time (0: unbounded).
pub(crate) async fn drive<K, C, R, Fut, P>(
    controller: Controller<K>,
    concurrency: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    metrics: Metrics,
    reconcile: R,
    error_policy: P,
    ctx: Arc<C>,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    C: Send + Sync + 'static,
    R: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = Result<Action>> + Send + 'static,
    P: Fn(Arc<K>, &Error, Arc<C>) -> Action + Send + Sync + 'static,
{
    let name = K::kind(&()).to_lowercase();
    controller
        .with_config(Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown)
        .run(
            move |obj, ctx| {
                let (metrics, name, reconcile) = (metrics.clone(), name.clone(), reconcile.clone());
                async move {
                    metrics
                        .observe(&name, Error::metric_label, reconcile(obj, ctx))
                        .await
                }
            },
            error_policy,
            ctx,
        )
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "controller event");
            }
        })
        .await;
}
