//! The infra cluster object per (Provider, namespace): how a provider gets endpoint,
//! credentials, TLS trust and nodes for VirtualMachine-owned machines "the same way CAPI does"
//! (one code path in the provider for CAPI-owned and VirtualMachine-owned machines).
//!
//! [`InfraClusters::ensure`] server-side applies [`crate::build::desired_cluster`] only when
//! the object lacks something the controller owns. It looks first in a watch cache of the
//! objects the controller manages (label `app.kubernetes.io/managed-by=banlieue-controller`),
//! then, under a per-object lock, with a GET: many VirtualMachines created at once in one
//! namespace lead to one apply, not one per VirtualMachine.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use serde_json::Value;

use crate::build::{self, FIELD_MANAGER, Invalid};
use crate::mirror::ClusterView;
use crate::registry::BackendEntry;
use crate::{Error, Result};

/// Label selector of the infra cluster objects the controller manages.
pub fn managed_selector() -> String {
    format!("{}={}", build::MANAGED_BY_LABEL, build::MANAGED_BY)
}

/// What [`InfraClusters::ensure`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ensured {
    /// The object already held everything the controller owns: nothing was sent.
    Unchanged,
    /// The object was created or patched (one server-side apply).
    Applied,
    /// An object of that name exists and is not controlled by the Provider (made by hand, by
    /// CAPI, or for an earlier Provider of the same name): never touched.
    Conflict(Invalid),
}

/// Watch caches of the managed infra cluster objects (one per registered cluster kind) and the
/// per-object locks.
pub struct InfraClusters {
    stores: Vec<(&'static str, Store<DynamicObject>)>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl InfraClusters {
    /// The caches, by cluster kind (filled by reflectors the caller runs).
    pub fn new(stores: Vec<(&'static str, Store<DynamicObject>)>) -> Self {
        Self {
            stores,
            locks: Mutex::new(HashMap::new()),
        }
    }

    fn cached(&self, entry: &BackendEntry, namespace: &str, name: &str) -> Option<Arc<DynamicObject>> {
        let (_, store) = self.stores.iter().find(|(k, _)| *k == entry.cluster_kind)?;
        store.get(&ObjectRef::new_with(name, entry.cluster_api_resource()).within(namespace))
    }

    /// The cached infra cluster `namespace/name` of `entry`'s kind, as the mirror reads it
    /// (its `Ready` condition); `None` when the cache does not hold it (yet).
    pub fn view(&self, entry: &BackendEntry, namespace: &str, name: &str) -> Option<ClusterView> {
        let cached = self.cached(entry, namespace, name)?;
        serde_json::to_value(cached.as_ref())
            .ok()
            .map(|v| ClusterView::from_object(&v))
    }

    /// Makes sure the infra cluster object `desired` (built by
    /// [`crate::build::desired_cluster`]) exists with the controller's fields.
    pub async fn ensure(&self, client: &Client, entry: &BackendEntry, desired: &Value) -> Result<Ensured> {
        let meta = &desired["metadata"];
        let namespace = meta["namespace"].as_str().unwrap_or_default();
        let name = meta["name"].as_str().unwrap_or_default();
        let owner_uid = meta["ownerReferences"][0]["uid"].as_str().unwrap_or_default();
        let holds = |obj: &DynamicObject| -> Option<Ensured> {
            let value = serde_json::to_value(obj).ok()?;
            if !build::controlled_by(value["metadata"].get("ownerReferences"), owner_uid) {
                return Some(Ensured::Conflict(Invalid::InfraClusterConflict {
                    kind: entry.cluster_kind,
                    name: name.to_owned(),
                }));
            }
            build::contains(&value, desired).then_some(Ensured::Unchanged)
        };
        if let Some(found) = self.cached(entry, namespace, name).and_then(|o| holds(&o)) {
            return Ok(found);
        }
        let key = format!("{}/{namespace}/{name}", entry.cluster_kind);
        let lock = self
            .locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default()
            .clone();
        let _held = lock.lock().await;
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &entry.cluster_api_resource());
        let existing = api
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format!("reading {} {namespace}/{name}", entry.cluster_kind), e))?;
        if let Some(found) = existing.as_ref().and_then(holds) {
            return Ok(found);
        }
        let applied = api
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(desired),
            )
            .await
            .map_err(|e| Error::kube(format!("applying {} {namespace}/{name}", entry.cluster_kind), e))?;
        tracing::info!(
            kind = entry.cluster_kind,
            namespace,
            name = applied.name_any(),
            created = existing.is_none(),
            "applied infra cluster"
        );
        Ok(Ensured::Applied)
    }
}

/// Tells which watch events of managed infra cluster objects change what VirtualMachines show:
/// a deletion (the controller applies the object again) or a change of its `Ready` condition's
/// status, reason or message (the VirtualMachines of that Provider mirror the cluster's cause).
/// Other changes (the provider's periodic status writes with the same `Ready`, metadata) are
/// ignored, so the "reconcile every VirtualMachine" trigger fires rarely.
#[derive(Debug, Default)]
pub struct ReadyChanges {
    seen: HashMap<String, Option<(String, String, String)>>,
}

impl ReadyChanges {
    /// Records `event`; returns whether VirtualMachines must be reconciled.
    pub fn observe(&mut self, event: &kube::runtime::watcher::Event<DynamicObject>) -> bool {
        use kube::runtime::watcher::Event;
        let key = |o: &DynamicObject| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any());
        match event {
            Event::Delete(obj) => {
                self.seen.remove(&key(obj));
                true
            }
            Event::Apply(obj) | Event::InitApply(obj) => {
                let ready = serde_json::to_value(obj)
                    .ok()
                    .and_then(|v| ClusterView::from_object(&v).ready)
                    .map(|c| (c.status, c.reason, c.message));
                self.seen.insert(key(obj), ready.clone()) != Some(ready)
            }
            Event::Init | Event::InitDone => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::*;

    fn obj(ready: Option<(&str, &str)>) -> DynamicObject {
        let conditions: Vec<Value> = ready
            .into_iter()
            .map(|(s, r)| {
                json!({"type": "Ready", "status": s, "reason": r, "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z"})
            })
            .collect();
        serde_json::from_value(json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1",
            "kind": "ProxmoxCluster", "metadata": {"name": "banlieue-p", "namespace": "ns"},
            "status": {"conditions": conditions}}))
        .expect("valid object")
    }

    #[test]
    fn only_ready_changes_and_deletions_trigger() {
        let mut changes = ReadyChanges::default();
        assert!(changes.observe(&Event::InitApply(obj(None))));
        assert!(!changes.observe(&Event::InitDone));
        assert!(!changes.observe(&Event::Apply(obj(None))));
        assert!(changes.observe(&Event::Apply(obj(Some(("False", "AuthenticationFailed"))))));
        assert!(!changes.observe(&Event::Apply(obj(Some(("False", "AuthenticationFailed"))))));
        assert!(changes.observe(&Event::Apply(obj(Some(("True", "Provisioned"))))));
        assert!(changes.observe(&Event::Delete(obj(Some(("True", "Provisioned"))))));
    }
}
