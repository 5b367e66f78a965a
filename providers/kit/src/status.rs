//! Writes, made only when something changed: `/status` by server-side apply, finalizers by a
//! merge patch guarded by `resourceVersion` (a concurrent change makes it fail and the reconcile
//! run again, never lose the other writer's finalizer). And conditions stamped with the time of
//! now.

use banlieue_api::condition::{self, Condition, ConditionStatus};
use banlieue_api::infrastructure::kinds::NamespacedKind;
use banlieue_provider_runtime::metrics::Metrics;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde::Serialize;

use crate::error::{Error, Result};

/// The time of now, for `lastTransitionTime`.
pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// A condition of `type_` observed at `generation`, stamped now.
pub fn condition(
    type_: &str,
    status: impl Into<ConditionStatus>,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> Condition {
    condition::new_condition(type_, status.into(), reason, message, generation, now())
}

/// Sets the condition in `conditions` (its transition time kept unless its status flips).
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: impl Into<ConditionStatus>,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) {
    condition::set(conditions, condition(type_, status, reason, message, generation));
}

/// Applies `new` as the object's `/status` (server-side apply as `field_manager`) unless it
/// equals `old`; returns the object as written when it wrote.
pub async fn write_status<K: NamespacedKind, S: Serialize + PartialEq + Default>(
    api: &Api<K>,
    object: &K,
    old: Option<&S>,
    new: &S,
    field_manager: &str,
    metrics: &Metrics,
) -> Result<Option<K>> {
    let unchanged = match old {
        Some(old) => old == new,
        None => *new == S::default(),
    };
    if unchanged {
        return Ok(None);
    }
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": new,
    });
    let written = api
        .patch_status(
            &object.name_any(),
            &PatchParams::apply(field_manager).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|e| Error::kube(format!("writing {} status", K::kind(&())), e))?;
    metrics.count_write("status");
    Ok(Some(written))
}

/// Whether the object carries `finalizer`.
pub fn has_finalizer<K: kube::Resource>(object: &K, finalizer: &str) -> bool {
    object.finalizers().iter().any(|f| f == finalizer)
}

/// `finalizers` with `finalizer` once (`present`) or not at all, the others kept in order.
pub fn finalizers_with(finalizers: &[String], finalizer: &str, present: bool) -> Vec<String> {
    let mut out: Vec<String> = finalizers.iter().filter(|f| *f != finalizer).cloned().collect();
    if present {
        out.push(finalizer.to_owned());
    }
    out
}

/// Adds (`present`) or removes `finalizer`, unless that is already so; returns whether it wrote.
pub async fn set_finalizer<K: NamespacedKind>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
    present: bool,
    metrics: &Metrics,
) -> Result<bool> {
    if has_finalizer(object, finalizer) == present {
        return Ok(false);
    }
    let finalizers = finalizers_with(object.finalizers(), finalizer, present);
    let patch = serde_json::json!({
        "metadata": {"finalizers": finalizers, "resourceVersion": object.resource_version()}
    });
    api.patch(&object.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| {
            let verb = if present { "adding" } else { "removing" };
            Error::kube(format!("{verb} the {} finalizer", K::kind(&())), e)
        })?;
    metrics.count_write("finalizer");
    Ok(true)
}
