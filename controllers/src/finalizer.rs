//! The VirtualMachine finalizer [`FINALIZER`] (`banlieue.io/virtual-machine`): added before
//! the first infrastructure object is created, removed once the infrastructure machine is gone.
//!
//! The patches are JSON patches guarded by a `test` of the current list, so the controller
//! never drops or duplicates someone else's finalizer when the list changed since it was read
//! (the apiserver answers 422 and the reconcile retries on the fresh object).

use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::{Error, Result};

pub use crate::build::FINALIZER;

/// Whether `finalizers` holds the controller's finalizer.
pub fn has(finalizers: &[String]) -> bool {
    has_named(FINALIZER, finalizers)
}

/// Whether `finalizers` holds `name`.
pub fn has_named(name: &str, finalizers: &[String]) -> bool {
    finalizers.iter().any(|f| f == name)
}

/// The JSON patch that adds [`FINALIZER`] to an object whose list is `finalizers`, or `None`
/// when it is already there.
pub fn add_patch(finalizers: &[String]) -> Option<Value> {
    add_named_patch(FINALIZER, finalizers)
}

/// The JSON patch that adds finalizer `name` to an object whose list is `finalizers`, or `None`
/// when it is already there.
pub fn add_named_patch(name: &str, finalizers: &[String]) -> Option<Value> {
    if has_named(name, finalizers) {
        return None;
    }
    Some(if finalizers.is_empty() {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [name]},
        ])
    } else {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
            {"op": "add", "path": "/metadata/finalizers/-", "value": name},
        ])
    })
}

/// The JSON patch that removes [`FINALIZER`] from an object whose list is `finalizers`, or
/// `None` when it is not there.
pub fn remove_patch(finalizers: &[String]) -> Option<Value> {
    remove_named_patch(FINALIZER, finalizers)
}

/// The JSON patch that removes finalizer `name` from an object whose list is `finalizers`, or
/// `None` when it is not there.
pub fn remove_named_patch(name: &str, finalizers: &[String]) -> Option<Value> {
    let index = finalizers.iter().position(|f| f == name)?;
    Some(json!([
        {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": name},
        {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
    ]))
}

/// Sends one of the patches above to object `name` of `api`; `context` says what it does (for
/// errors). Returns the patched object.
pub async fn send<K>(api: &Api<K>, name: &str, patch: Value, context: String) -> Result<K>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = match serde_json::from_value(patch) {
        Ok(patch) => patch,
        Err(source) => return Err(Error::Patch { context, source }),
    };
    api.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .map_err(|e| Error::kube(context, e))
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    fn list(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn adds_to_an_empty_or_missing_list() {
        assert_eq!(
            add_patch(&[]),
            Some(json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": ["banlieue.io/virtual-machine"]},
            ]))
        );
    }

    #[test]
    fn appends_after_others_and_guards_their_list() {
        assert_eq!(
            add_patch(&list(&["other.io/x"])),
            Some(json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["other.io/x"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "banlieue.io/virtual-machine"},
            ]))
        );
    }

    #[test]
    fn present_means_nothing_to_add_and_absent_nothing_to_remove() {
        assert_eq!(add_patch(&list(&["a", FINALIZER])), None);
        assert_eq!(remove_patch(&list(&["a"])), None);
        assert_eq!(remove_patch(&[]), None);
    }

    #[test]
    fn removes_only_its_own_entry() {
        assert_eq!(
            remove_patch(&list(&["a", FINALIZER, "b"])),
            Some(json!([
                {"op": "test", "path": "/metadata/finalizers/1", "value": "banlieue.io/virtual-machine"},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ]))
        );
    }
}
