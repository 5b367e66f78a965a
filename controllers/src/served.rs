//! Which providers' kinds are installed.
//!
//! A management cluster usually has only some providers installed (`clusterctl init
//! --infrastructure banlieue-proxmox` installs the Proxmox kinds only). A watch on a kind the
//! apiserver does not serve fails forever (`404 page not found`), and kube-runtime's watches are
//! fixed once a controller runs. So the controller watches only the [`registry`] entries whose
//! machine and cluster kinds are served now ([`served_entries`]), and [`wait_for_change`] tells
//! it when that set changes (a provider installed or removed; the same new answer twice in a row), so
//! that it restarts with the
//! right watches. Restarting lists everything again; reconciles are level-triggered, so that
//! costs reads and no writes.

use std::time::Duration;

use crate::registry::{self, BackendEntry};

/// How often discovery is asked whether the served providers changed.
pub const DISCOVERY_INTERVAL: Duration = Duration::from_secs(30);

/// The registry entries whose machine and cluster kinds are served; `None` when discovery
/// itself failed (the caller keeps what it had, or assumes none).
pub async fn served_entries(client: &kube::Client) -> Option<Vec<&'static BackendEntry>> {
    let group_version = format!("{}/{}", banlieue_api::INFRASTRUCTURE_GROUP, banlieue_api::VERSION);
    let resources = match client.list_api_group_resources(&group_version).await {
        Ok(list) => list.resources,
        // The group is not served at all: no provider is installed.
        Err(kube::Error::Api(e)) if e.code == 404 => Vec::new(),
        Err(_) => return None,
    };
    let served = |plural: &str| resources.iter().any(|r| r.name == plural);
    Some(
        registry::REGISTRY
            .iter()
            .filter(|e| served(e.plural) && served(e.cluster_plural))
            .collect(),
    )
}

/// The kinds of `entries`, for logs and comparisons.
pub fn kinds(entries: &[&'static BackendEntry]) -> Vec<&'static str> {
    entries.iter().map(|e| e.kind).collect()
}

/// Returns once discovery reports the same set of served entries, different from `current`,
/// twice in a row (asking every `interval`; failed discovery calls are ignored). One odd answer
/// (e.g. an apiserver replica that just restarted) does not restart the controller.
pub async fn wait_for_change(client: kube::Client, current: Vec<&'static str>, interval: Duration) {
    let mut candidate: Option<Vec<&'static str>> = None;
    loop {
        tokio::time::sleep(interval).await;
        let Some(now) = served_entries(&client).await.map(|e| kinds(&e)) else {
            continue;
        };
        if now == current {
            candidate = None;
        } else if candidate.as_ref() == Some(&now) {
            return;
        } else {
            candidate = Some(now);
        }
    }
}

/// Whether a kube error means the kind itself is not served (the apiserver's plain `404 page
/// not found`, as opposed to an object that does not exist).
pub fn is_kind_not_served(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(e) if e.code == 404 && e.reason != "NotFound")
}
