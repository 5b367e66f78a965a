//! The controllers' cache of their own kind, kept lean: `metadata.managedFields` is dropped from
//! every cached object.
//!
//! A controller's cache holds every object it watches for as long as it runs; server-side apply's
//! field ownership (`managedFields`: one entry per writer, each a tree of the fields it set) is
//! most of a small object's size, and no reconciler reads it (it applies its own fields and lets
//! the API server track who owns what). At 1,000 machines it is megabytes of each manager's
//! memory (the fleet benchmark, `tests/devenv/examples/e2e-bench/`).

use std::fmt::Debug;
use std::hash::Hash;

use futures::Stream;
use kube::runtime::{Controller, WatchStreamExt, reflector, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// A [`Controller`] of `api`'s kind, as [`Controller::new`] makes it, whose cache
/// ([`Controller::store`]) keeps each object without its managed fields ([`forget_field_owners`]).
pub fn lean_controller<K>(api: Api<K>, config: watcher::Config) -> Controller<K>
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    let (reader, events) = lean_watch(api, config);
    Controller::for_stream(events.applied_objects(), reader)
}

/// [`lean_controller`] whose reconciles are triggered only when `predicate` changes for an
/// object (e.g. not by status writes, its own included); the cache still follows every change.
pub fn lean_controller_on<K, P>(api: Api<K>, config: watcher::Config, predicate: P) -> Controller<K>
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
    P: kube::runtime::Predicate<K> + Send + 'static,
{
    let (reader, events) = lean_watch(api, config);
    let objects = events
        .applied_objects()
        .predicate_filter(predicate, Default::default());
    Controller::for_stream(objects, reader)
}

/// A watch of `api`'s kind and the cache it fills, each object kept without its managed fields
/// ([`forget_field_owners`]): the cache follows the stream as the stream is polled.
pub fn lean_watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (
    reflector::Store<K>,
    impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
)
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    let writer = reflector::store::Writer::<K>::default();
    let reader = writer.as_reader();
    let events = reflector(writer, watcher(api, config).modify(forget_field_owners));
    (reader, events)
}

/// Drops `metadata.managedFields`, the record of which field manager set which field.
pub fn forget_field_owners<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

    #[test]
    fn a_cached_object_keeps_everything_but_its_field_owners() {
        let mut object = ConfigMap {
            metadata: ObjectMeta {
                name: Some("vm-1".into()),
                namespace: Some("team-a".into()),
                resource_version: Some("42".into()),
                finalizers: Some(vec!["infrastructure.banlieue.io/machine".into()]),
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some("banlieue".into()),
                    operation: Some("Apply".into()),
                    ..ManagedFieldsEntry::default()
                }]),
                ..ObjectMeta::default()
            },
            data: Some([("k".to_owned(), "v".to_owned())].into()),
            ..ConfigMap::default()
        };
        let mut expected = object.clone();
        expected.metadata.managed_fields = None;

        forget_field_owners(&mut object);

        assert_eq!(object, expected);
    }
}
