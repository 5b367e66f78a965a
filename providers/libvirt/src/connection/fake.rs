//! What tests tell and ask a `test:///` connection (see the parent module's docs): the bytes
//! uploaded to a volume, and the leases and cloud-init report of a domain.

use banlieue_provider_kit::lock;

use super::VirtHypervisor;
use crate::hypervisor::GuestAddress;

impl VirtHypervisor {
    /// Bytes uploaded to a volume on the `test` driver (which cannot store them).
    pub fn uploaded(&self, pool: &str, name: &str) -> Option<Vec<u8>> {
        lock(&self.uploads)
            .get(&(pool.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Records the DHCP leases a guest of the `test` driver holds (what libvirt's own network
    /// would report for a real domain); ignored on every other driver.
    pub fn report_leases(&self, uuid: &str, leases: Vec<GuestAddress>) {
        if self.test_driver {
            lock(&self.leases).insert(uuid.to_ascii_lowercase(), leases);
        }
    }

    /// Records what the guest agent of a `test` driver domain reads from cloud-init's report
    /// (`None`: not written yet); ignored on every other driver. A domain nobody reported on
    /// reads [`super::TEST_DRIVER_CLOUD_INIT_DONE`].
    pub fn report_cloud_init(&self, uuid: &str, result: Option<String>) {
        if self.test_driver {
            lock(&self.cloud_init).insert(uuid.to_ascii_lowercase(), result);
        }
    }
}
