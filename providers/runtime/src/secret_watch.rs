//! The Secret watch of the providers: a created or fixed credentials, CA bundle or user-data
//! Secret is acted on within seconds instead of at the next resync. Rights: `get`, `list` and
//! `watch` on Secrets ([`crate::rbac::SECRET_WATCH_VERBS`]).
//!
//! The watch is on Secret *metadata*: the stream is decoded as `PartialObjectMeta<Secret>`, so
//! no Secret content is kept in memory (kube-runtime's stable controller API watches full
//! objects; the data fields are skipped while decoding and dropped). Contents are still read
//! only by `get`, in the reconcile that needs them. Which object a Secret concerns is known to
//! the reconcilers, not to the Secret: each reconcile records the Secrets its object references
//! (resolved through its Provider or owner) in a [`SecretIndex`], and a Secret event triggers
//! exactly the objects recorded for it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};

/// A watched Secret as the watch decodes it: metadata only.
pub type SecretMeta = PartialObjectMeta<Secret>;

/// `namespace/name` of a Secret.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl SecretKey {
    /// The Secret `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// The Secrets each object of kind `K` references, and the reverse lookup. Cheap to clone
/// (shared).
pub struct SecretIndex<K: Resource<DynamicType = ()>> {
    inner: Arc<Mutex<Entries<K>>>,
}

struct Entries<K: Resource<DynamicType = ()>> {
    by_object: HashMap<ObjectRef<K>, BTreeSet<SecretKey>>,
}

impl<K: Resource<DynamicType = ()>> Clone for SecretIndex<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K: Resource<DynamicType = ()>> Default for SecretIndex<K> {
    fn default() -> Self {
        Self {
            inner: Arc::new(Mutex::new(Entries {
                by_object: HashMap::new(),
            })),
        }
    }
}

impl<K: Resource<DynamicType = ()>> SecretIndex<K> {
    /// Records that `object` references exactly `secrets` (replacing what it referenced
    /// before; empty forgets it).
    pub fn set(&self, object: ObjectRef<K>, secrets: impl IntoIterator<Item = SecretKey>) {
        let secrets: BTreeSet<SecretKey> = secrets.into_iter().collect();
        let mut entries = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if secrets.is_empty() {
            entries.by_object.remove(&object);
        } else {
            entries.by_object.insert(object, secrets);
        }
    }

    /// The objects referencing `secret`.
    pub fn referencing(&self, secret: &SecretKey) -> Vec<ObjectRef<K>> {
        let entries = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .by_object
            .iter()
            .filter(|(_, secrets)| secrets.contains(secret))
            .map(|(object, _)| object.clone())
            .collect()
    }

    /// The mapper for `Controller::watches`: a Secret event triggers the objects referencing it.
    pub fn mapper(&self) -> impl Fn(SecretMeta) -> Vec<ObjectRef<K>> + Send + Sync + 'static
    where
        K: 'static,
    {
        let index = self.clone();
        move |secret: SecretMeta| {
            index.referencing(&SecretKey::new(
                secret.namespace().unwrap_or_default(),
                secret.name_any(),
            ))
        }
    }
}

/// The Secrets API to watch: the controller's namespace, or all.
pub fn secrets_api(client: kube::Client, namespace: Option<&str>) -> Api<SecretMeta> {
    match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap as ProxmoxCluster;

    fn meta(ns: &str, name: &str) -> SecretMeta {
        let mut s = SecretMeta::default();
        s.metadata.namespace = Some(ns.into());
        s.metadata.name = Some(name.into());
        s
    }

    #[test]
    fn a_secret_event_triggers_exactly_the_objects_referencing_it() {
        let index = SecretIndex::<ProxmoxCluster>::default();
        let c1 = ObjectRef::new("c1").within("a");
        let c2 = ObjectRef::new("c2").within("b");
        index.set(
            c1.clone(),
            [SecretKey::new("a", "creds"), SecretKey::new("a", "ca")],
        );
        index.set(c2.clone(), [SecretKey::new("a", "creds")]);
        let map = index.mapper();
        let mut both = map(meta("a", "creds"));
        both.sort_by_key(|r| r.name.clone());
        assert_eq!(both, vec![c1.clone(), c2.clone()]);
        assert_eq!(map(meta("a", "ca")), vec![c1.clone()]);
        assert!(map(meta("b", "creds")).is_empty(), "same name, other namespace");
        // A new reference replaces the old ones; none forgets the object.
        index.set(c1.clone(), [SecretKey::new("a", "other")]);
        assert_eq!(map(meta("a", "ca")), Vec::<ObjectRef<ProxmoxCluster>>::new());
        index.set(c2, []);
        assert!(map(meta("a", "creds")).is_empty());
    }
}
