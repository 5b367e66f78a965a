//! The hosts a clone into a resource pool may land on, and how much memory each has left, for
//! placement by free capacity: the pool's owner (a cluster or a standalone host's compute
//! resource) names the hosts; a cluster with DRS enabled places VMs itself.
//!
//! A host's memory left is its physical memory less the configured memory of every VM (not
//! templates) registered on it, powered on or not: committed memory, which counts a VM from the
//! moment it is cloned rather than once its guest uses memory, so machines created together
//! spread too.

use std::collections::HashMap;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::objects::MoRef;
use crate::vim::Props;

/// One host a VM may be placed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRoom {
    /// The HostSystem.
    pub host: MoRef,
    /// Its name.
    pub name: String,
    /// Connected and not in maintenance mode.
    pub usable: bool,
    /// Physical memory, MiB (`summary.hardware.memorySize`).
    pub memory_mib: u64,
    /// Configured memory of the VMs registered on it, MiB.
    pub committed_mib: u64,
}

impl HostRoom {
    /// Memory not committed to a VM, MiB.
    pub fn free_mib(&self) -> u64 {
        self.memory_mib.saturating_sub(self.committed_mib)
    }
}

/// Who places a VM cloned into a resource pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolHosts {
    /// The pool belongs to a cluster with DRS enabled: vCenter chooses the host.
    Drs,
    /// The caller chooses among the hosts of the pool's owner.
    Hosts(Vec<HostRoom>),
}

const HOST_PROPERTIES: &[&str] = &[
    "name",
    "summary.hardware.memorySize",
    "runtime.connectionState",
    "runtime.inMaintenanceMode",
];

fn text<'a>(props: &'a Props, path: &str) -> Option<&'a str> {
    props.get(path).map(|e| e.text.trim())
}

impl Client {
    /// The hosts of `pool`'s owner with their memory left, or [`PoolHosts::Drs`].
    pub async fn pool_hosts(&self, pool: &MoRef) -> Result<PoolHosts> {
        let owner = self
            .properties(pool, &["owner"])
            .await?
            .and_then(|p| p.get("owner").and_then(MoRef::from_xml))
            .ok_or_else(|| Error::Config(format!("resource pool {pool} has no owner")))?;
        let mut paths = vec!["host"];
        let cluster = owner.kind == "ClusterComputeResource";
        if cluster {
            paths.push("configurationEx");
        }
        let props = self
            .properties(&owner, &paths)
            .await?
            .ok_or_else(|| Error::Config(format!("the owner {owner} of resource pool {pool} is gone")))?;
        let drs = props
            .get("configurationEx")
            .and_then(|c| c.path(&["drsConfig", "enabled"]))
            .is_some_and(|e| e.text.trim() == "true");
        if cluster && drs {
            return Ok(PoolHosts::Drs);
        }
        let hosts: Vec<MoRef> = props
            .get("host")
            .map(|h| h.children.iter().filter_map(MoRef::from_xml).collect())
            .unwrap_or_default();
        let mut committed: HashMap<String, u64> = HashMap::new();
        for (_, vm) in self
            .all_vms(&["runtime.host", "config.template", "config.hardware.memoryMB"])
            .await?
        {
            let template = text(&vm, "config.template") == Some("true");
            let host = vm.get("runtime.host").and_then(MoRef::from_xml);
            let memory = text(&vm, "config.hardware.memoryMB").and_then(|m| m.parse::<u64>().ok());
            if let (false, Some(host), Some(memory)) = (template, host, memory) {
                *committed.entry(host.value).or_default() += memory;
            }
        }
        let mut rooms = Vec::with_capacity(hosts.len());
        for host in hosts {
            let Some(p) = self.properties(&host, HOST_PROPERTIES).await? else {
                continue;
            };
            let bytes = text(&p, "summary.hardware.memorySize").and_then(|m| m.parse::<u64>().ok());
            rooms.push(HostRoom {
                name: text(&p, "name").unwrap_or(&host.value).to_owned(),
                usable: text(&p, "runtime.connectionState") == Some("connected")
                    && text(&p, "runtime.inMaintenanceMode") != Some("true"),
                memory_mib: bytes.unwrap_or(0) / (1024 * 1024),
                committed_mib: committed.get(&host.value).copied().unwrap_or(0),
                host,
            });
        }
        Ok(PoolHosts::Hosts(rooms))
    }
}
