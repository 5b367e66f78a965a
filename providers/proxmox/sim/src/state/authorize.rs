//! What the token may do, checked before a handler runs (the schema's `permissions.check`, then
//! what PVE's handlers check in code), and what listings leave out. Without an ACL
//! ([`State::set_acl`]) the token is root: everything passes, as before ACLs existed here.

use serde_json::Value;

use super::{ApiError, ApiResult, NOT_OPTIONS, Request, State, is_cdrom, is_disk_key, value_text};
use crate::acl::{self, Acl, Denied};

fn refused(d: Denied) -> ApiError {
    ApiError::new(403, d.message())
}

/// The storage of a volume id (`local-lvm:vm-100-disk-0` → `local-lvm`); `None` for a size-only
/// allocation value's storage is handled by the caller.
fn storage_of(value: &str) -> Option<&str> {
    let volume = value.split(',').next()?;
    volume.split_once(':').map(|(s, _)| s).filter(|s| !s.is_empty())
}

/// Whether a drive option is a PVE cloud-init drive (`local-lvm:vm-100-cloudinit,media=cdrom`).
fn is_cloudinit(value: &str) -> bool {
    value.split(',').next().is_some_and(|v| v.contains("cloudinit"))
}

/// The privilege a config option needs, as the drive it sets or deletes is: a cloud-init drive
/// needs `VM.Config.Cloudinit`.
fn option_privilege(key: &str, value: Option<&str>, current: Option<&str>) -> &'static str {
    let drive = [value, current].into_iter().flatten();
    if is_disk_key(key) && drive.clone().any(is_cloudinit) {
        return "VM.Config.Cloudinit";
    }
    acl::config_privilege(key, drive.clone().any(is_cdrom))
}

/// The bridge of a NIC option (`virtio=…,bridge=vmbr0`).
fn bridge_of(value: &str) -> Option<&str> {
    value.split(',').find_map(|p| p.strip_prefix("bridge="))
}

impl State {
    /// Sets (or with `None` removes) the token's ACL.
    pub(crate) fn set_acl(&mut self, acl: Option<Acl>) {
        self.acl = acl;
    }

    fn pool_of(&self, vmid: &str) -> Option<String> {
        vmid.parse::<u32>()
            .ok()
            .and_then(|id| self.vms.get(&id))
            .and_then(|vm| vm.pool.clone())
    }

    fn require(&self, path: &str, privileges: &[&str], any: bool) -> ApiResult<()> {
        let Some(acl) = &self.acl else { return Ok(()) };
        let pool = path.strip_prefix("/vms/").and_then(|id| self.pool_of(id));
        acl.require(path, privileges, any, pool.as_deref())
            .map_err(refused)
    }

    /// Whether the token sees VM `vmid` (VM.Audit): listings leave the others out.
    pub(super) fn sees_vm(&self, vmid: u32) -> bool {
        !self.hidden.contains(&vmid)
            && self
                .require(&format!("/vms/{vmid}"), &["VM.Audit"], false)
                .is_ok()
    }

    /// Whether the token sees storage `id` (`Datastore.Audit` or `Datastore.AllocateSpace`).
    pub(super) fn sees_storage(&self, id: &str) -> bool {
        self.require(
            &format!("/storage/{id}"),
            &["Datastore.Audit", "Datastore.AllocateSpace"],
            true,
        )
        .is_ok()
    }

    /// Whether the token may read `node`'s statistics (`Sys.Audit`): without it, node entries
    /// carry no memory or CPU figures.
    pub(super) fn sees_node_stats(&self, node: &str) -> bool {
        self.require(&format!("/nodes/{node}"), &["Sys.Audit"], false)
            .is_ok()
    }

    /// Whether the token sees pool `pool` (`Pool.Audit`).
    pub(super) fn sees_pool(&self, pool: &str) -> bool {
        self.require(&format!("/pool/{pool}"), &["Pool.Audit"], false)
            .is_ok()
    }

    /// Refuses `req` with PVE's 403 when the token lacks a privilege it needs.
    pub(crate) fn authorize(&self, permissions: Option<&Value>, req: &Request) -> ApiResult<()> {
        let Some(acl) = &self.acl else { return Ok(()) };
        acl::check(acl, permissions, &req.params, &|id| self.pool_of(id)).map_err(refused)?;
        let vm_path = || format!("/vms/{}", req.opt("vmid").unwrap_or_default());
        let current = |key: &str| {
            req.opt("vmid")
                .and_then(|id| id.parse::<u32>().ok())
                .and_then(|id| self.vms.get(&id))
                .and_then(|vm| vm.config.get(key).cloned())
        };
        match (req.method.as_str(), req.template.as_str()) {
            ("POST", "/nodes/{node}/qemu/{vmid}/clone") => {
                let Some(source) = req.vmid("vmid").ok().and_then(|id| self.vms.get(&id)) else {
                    return Ok(());
                };
                for (key, value) in &source.config {
                    if is_disk_key(key) && !is_cdrom(value) {
                        let storage = req
                            .opt("storage")
                            .or_else(|| storage_of(value).map(str::to_owned));
                        if let Some(storage) = storage {
                            self.require(
                                &format!("/storage/{storage}"),
                                &["Datastore.AllocateSpace"],
                                false,
                            )?;
                        }
                    }
                    if key.starts_with("net")
                        && let Some(bridge) = bridge_of(value)
                    {
                        self.require(&format!("/sdn/zones/localnetwork/{bridge}"), &["SDN.Use"], false)?;
                    }
                }
            }
            ("POST" | "PUT", "/nodes/{node}/qemu/{vmid}/config") => {
                let deleted: Vec<String> = req
                    .opt("delete")
                    .map(|d| {
                        d.split([',', ';', ' '])
                            .filter(|k| !k.is_empty())
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                for (key, value) in req
                    .params
                    .iter()
                    .filter(|(k, _)| !NOT_OPTIONS.contains(&k.as_str()))
                {
                    let value = value_text(value);
                    let was = current(key);
                    let cdrom = is_cdrom(&value) || was.as_deref().is_some_and(is_cdrom);
                    self.require(
                        &vm_path(),
                        &[option_privilege(key, Some(&value), was.as_deref())],
                        false,
                    )?;
                    if key.starts_with("net")
                        && let Some(bridge) = bridge_of(&value)
                    {
                        self.require(&format!("/sdn/zones/localnetwork/{bridge}"), &["SDN.Use"], false)?;
                    }
                    // A mapped PCI device needs Mapping.Use on its mapping (a raw host address,
                    // root itself: not modelled).
                    if key.starts_with("hostpci")
                        && let Some(mapping) = value.split(',').find_map(|p| p.strip_prefix("mapping="))
                    {
                        self.require(&format!("/mapping/pci/{mapping}"), &["Mapping.Use"], false)?;
                    }
                    if is_disk_key(key)
                        && let Some(storage) = storage_of(&value)
                    {
                        if cdrom {
                            // An ISO may be sensitive: reading it needs access to its storage.
                            self.require(
                                &format!("/storage/{storage}"),
                                &["Datastore.AllocateSpace", "Datastore.Audit"],
                                true,
                            )?;
                        } else if current(key).as_deref().and_then(storage_of) != Some(storage) {
                            self.require(
                                &format!("/storage/{storage}"),
                                &["Datastore.AllocateSpace"],
                                false,
                            )?;
                        }
                    }
                }
                for key in &deleted {
                    let was = current(key);
                    self.require(&vm_path(), &[option_privilege(key, None, was.as_deref())], false)?;
                }
            }
            ("POST", "/nodes/{node}/qemu") => {
                // qemu-server's create: every option as a config change, a disk's storage, an
                // imported volume's storage (read access, as an ISO's), a NIC's bridge.
                for (key, value) in req.params.iter().filter(|(k, _)| {
                    !NOT_OPTIONS.contains(&k.as_str()) && !matches!(k.as_str(), "pool" | "start")
                }) {
                    let value = value_text(value);
                    self.require(&vm_path(), &[option_privilege(key, Some(&value), None)], false)?;
                    if key.starts_with("net")
                        && let Some(bridge) = bridge_of(&value)
                    {
                        self.require(&format!("/sdn/zones/localnetwork/{bridge}"), &["SDN.Use"], false)?;
                    }
                    if is_disk_key(key) && !is_cdrom(&value) {
                        if let Some(storage) = storage_of(&value) {
                            self.require(
                                &format!("/storage/{storage}"),
                                &["Datastore.AllocateSpace"],
                                false,
                            )?;
                        }
                        if let Some(from) = value.split(',').find_map(|p| p.strip_prefix("import-from="))
                            && let Some(storage) = storage_of(from)
                        {
                            self.require(
                                &format!("/storage/{storage}"),
                                &["Datastore.AllocateSpace", "Datastore.Audit"],
                                true,
                            )?;
                        }
                    }
                }
            }
            ("PUT", "/nodes/{node}/qemu/{vmid}/resize") => {
                if let Some(storage) = req
                    .opt("disk")
                    .and_then(|d| current(&d))
                    .as_deref()
                    .and_then(storage_of)
                {
                    self.require(
                        &format!("/storage/{storage}"),
                        &["Datastore.AllocateSpace"],
                        false,
                    )?;
                }
            }
            ("DELETE", "/nodes/{node}/storage/{storage}/content/{volume}") => {
                let storage = req.opt("storage").unwrap_or_default();
                self.require(&format!("/storage/{storage}"), &["Datastore.Allocate"], false)?;
            }
            _ => {}
        }
        Ok(())
    }
}
