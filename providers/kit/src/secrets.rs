//! The Secrets one reconcile reads or waits for, kept in the Secret watch's index
//! ([`banlieue_provider_runtime::secret_watch`]) so that a credentials or user-data Secret
//! created or fixed after the fact triggers the objects waiting for it within seconds.
//!
//! A [`ReadSecrets`] lives for one reconcile. Each Secret is recorded *before* it is read (a
//! Secret missing now is exactly what the watch waits for: recorded after the read, one
//! created in between would be missed until the next requeue). When the reconcile ends (the
//! value is dropped, whichever way it returns) the index holds exactly the Secrets this
//! reconcile read: an object that no longer references a Secret, or is gone, is forgotten.

use std::collections::BTreeSet;
use std::sync::Mutex;

use banlieue_provider_runtime::secret_watch::{SecretIndex, SecretKey};
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use tracing::trace;

/// The Secrets read by one reconcile of an object of kind `K`.
pub struct ReadSecrets<K: Resource<DynamicType = ()>> {
    index: SecretIndex<K>,
    object: ObjectRef<K>,
    keys: Mutex<BTreeSet<SecretKey>>,
}

impl<K: Resource<DynamicType = ()>> ReadSecrets<K> {
    /// Starts recording for `object` (the index keeps what the previous reconcile recorded
    /// until this one records something or ends).
    pub fn new(index: &SecretIndex<K>, object: ObjectRef<K>) -> Self {
        Self {
            index: index.clone(),
            object,
            keys: Mutex::default(),
        }
    }

    /// Records `secrets` as read by this reconcile (call before reading them).
    pub fn record(&self, secrets: impl IntoIterator<Item = SecretKey>) {
        let mut keys = crate::lock(&self.keys);
        keys.extend(secrets);
        trace!(object = %self.object, secrets = ?*keys, "watching Secrets");
        self.index.set(self.object.clone(), keys.iter().cloned());
    }

    /// Forgets the object (its finalizer is gone: nothing of it is reconciled again).
    pub fn forget(&self) {
        crate::lock(&self.keys).clear();
        self.index.set(self.object.clone(), []);
    }
}

impl<K: Resource<DynamicType = ()>> Drop for ReadSecrets<K> {
    fn drop(&mut self) {
        let keys = std::mem::take(self.keys.get_mut().unwrap_or_else(|e| e.into_inner()));
        self.index.set(self.object.clone(), keys);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::infrastructure::LibvirtMachine;

    fn key(name: &str) -> SecretKey {
        SecretKey::new("ns", name)
    }

    #[test]
    fn the_index_holds_what_the_last_reconcile_read() {
        let index = SecretIndex::<LibvirtMachine>::default();
        let m: ObjectRef<LibvirtMachine> = ObjectRef::new("m").within("ns");
        {
            let read = ReadSecrets::new(&index, m.clone());
            read.record([key("creds")]);
            // Recorded at once, before the read: a missing Secret is what the watch waits for.
            assert_eq!(index.referencing(&key("creds")), vec![m.clone()]);
            read.record([key("user-data")]);
            assert_eq!(index.referencing(&key("creds")), vec![m.clone()]);
        }
        assert_eq!(index.referencing(&key("user-data")), vec![m.clone()]);
        {
            // The next reconcile reads only the credentials (the machine is provisioned).
            let read = ReadSecrets::new(&index, m.clone());
            read.record([key("creds")]);
            assert!(index.referencing(&key("user-data")).is_empty());
        }
        assert!(index.referencing(&key("user-data")).is_empty());
        assert_eq!(index.referencing(&key("creds")), vec![m.clone()]);
        // A released object is forgotten, even though its last reconcile read Secrets.
        let read = ReadSecrets::new(&index, m.clone());
        read.record([key("creds")]);
        read.forget();
        assert!(index.referencing(&key("creds")).is_empty());
        drop(read);
        assert!(index.referencing(&key("creds")).is_empty());
        // So is one whose reconcile reads nothing (gone, or waiting for something else).
        let read = ReadSecrets::new(&index, m.clone());
        read.record([key("creds")]);
        drop(read);
        assert_eq!(index.referencing(&key("creds")), vec![m.clone()]);
        drop(ReadSecrets::new(&index, m));
        assert!(index.referencing(&key("creds")).is_empty());
    }
}
