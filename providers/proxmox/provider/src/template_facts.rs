//! Where a template's disks live, remembered per Proxmox cluster for a few minutes. Every
//! machine the provider places asks it (a template on node-local storage clones only to its
//! node), and a template's disks seldom change: one read of its config serves the machines
//! created in a burst. Only a cache of what Proxmox says, so a restart loses nothing.
//!
//! Should a template's disk move from shared to node-local storage, machines placed within
//! [`KEPT_FOR`] may pick another node, and Proxmox refuses their clone (`CloneRefused` says
//! why); the other way round they only stay on the template's node a little longer.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use banlieue_provider_kit::lock;

use crate::hypervisor::{Hypervisor, PveError};

/// How long an answer is used.
pub const KEPT_FOR: Duration = Duration::from_secs(300);

/// (cluster endpoint, node, VMID) → when read, and the storages of its disks.
type Remembered = HashMap<(String, String, u32), (Instant, Vec<String>)>;

static DISK_STORAGES: LazyLock<Mutex<Remembered>> = LazyLock::new(Mutex::default);

fn remembered() -> MutexGuard<'static, Remembered> {
    lock(&DISK_STORAGES)
}

/// The storages holding the disks (not the CD-ROMs) of template `vmid` on `node`; `None` when
/// it is not there.
pub async fn disk_storages<H: Hypervisor>(
    hv: &H,
    node: &str,
    vmid: u32,
) -> Result<Option<Vec<String>>, PveError> {
    let key = (hv.endpoint(), node.to_owned(), vmid);
    if let Some((read_at, storages)) = remembered().get(&key)
        && read_at.elapsed() < KEPT_FOR
    {
        return Ok(Some(storages.clone()));
    }
    let Some(config) = hv.vm_config(node, vmid).await? else {
        remembered().remove(&key);
        return Ok(None);
    };
    let storages: Vec<String> = config
        .disks()
        .unwrap_or_default()
        .values()
        .filter(|d| !d.is_cdrom())
        .filter_map(|d| d.storage().map(str::to_owned))
        .collect();
    let mut all = remembered();
    all.retain(|_, (read_at, _)| read_at.elapsed() < KEPT_FOR);
    all.insert(key, (Instant::now(), storages.clone()));
    Ok(Some(storages))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakePve;

    fn count(fake: &FakePve, call: &str) -> usize {
        fake.calls().iter().filter(|c| *c == call).count()
    }

    #[tokio::test]
    async fn one_read_serves_the_machines_of_a_burst_per_cluster() {
        let (one, other) = (FakePve::new(2), FakePve::new(2));
        for _ in 0..3 {
            let storages = disk_storages(&one, "pve1", 9000).await.unwrap();
            assert_eq!(storages, Some(vec!["local-lvm".to_owned()]));
        }
        assert_eq!(count(&one, "vm_config"), 1, "read once for three machines");
        disk_storages(&other, "pve1", 9000).await.unwrap();
        assert_eq!(
            count(&other, "vm_config"),
            1,
            "another cluster is asked on its own"
        );
        assert_eq!(disk_storages(&one, "pve1", 4242).await.unwrap(), None);
    }
}
