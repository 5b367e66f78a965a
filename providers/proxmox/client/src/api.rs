//! The endpoints banlieue uses, as typed methods on [`Client`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;

use crate::client::{Client, Params, Payload, path_segment as seg};
use crate::config::{SizeChange, VmConfig};
use crate::de;
use crate::error::{Error, Result};
use crate::task::{TaskLogLine, TaskOutcome, TaskStatus, Upid};
use crate::types::{
    AgentInterface, AgentResult, ClusterResource, Node, NodeStatus, Pool, ResourceType, StorageContent,
    StorageInfo, UploadContent, Version, VmStatus, VmSummary,
};

/// Parameters of `POST /nodes/{node}/qemu/{vmid}/clone`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CloneRequest {
    /// VMID of the clone (required).
    pub newid: u32,
    /// Name of the clone.
    pub name: Option<String>,
    /// Target node (shared storage or same node).
    pub target: Option<String>,
    /// Full clone (default for non-templates); `Some(false)` = linked clone.
    pub full: Option<bool>,
    /// Target storage (full clones only).
    pub storage: Option<String>,
    /// Disk format (full clones only): `raw`, `qcow2`, `vmdk`.
    pub format: Option<String>,
    /// Add the clone to this pool.
    pub pool: Option<String>,
    /// Description.
    pub description: Option<String>,
    /// Clone from this snapshot.
    pub snapname: Option<String>,
}

/// A `download-url` request: a file the storage downloads itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DownloadUrlRequest {
    /// `import` (disk images), `iso` or `vztmpl`.
    pub content: String,
    /// The file to create (PVE normalises it).
    pub filename: String,
    /// Where to download from.
    pub url: String,
    /// `(algorithm, digest)`: PVE fails the task when the file's digest differs.
    pub checksum: Option<(String, String)>,
}

/// A config update: values to set and keys to delete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigUpdate {
    /// Options to set, e.g. `net0` → `virtio,bridge=vmbr0`.
    pub set: BTreeMap<String, String>,
    /// Options to delete.
    pub delete: Vec<String>,
    /// Only apply if the config still has this digest.
    pub digest: Option<String>,
}

impl ConfigUpdate {
    /// Adds an option to set.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.set.insert(key.into(), value.into());
        self
    }

    /// Adds an option to delete.
    pub fn delete(mut self, key: impl Into<String>) -> Self {
        self.delete.push(key.into());
        self
    }

    fn params(&self) -> Params {
        let mut p = Params::new();
        for (k, v) in &self.set {
            p = p.set(k, v);
        }
        if !self.delete.is_empty() {
            p = p.set("delete", self.delete.join(","));
        }
        p.opt("digest", self.digest.as_ref())
    }
}

/// Options of `DELETE /nodes/{node}/qemu/{vmid}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeleteVmOptions {
    /// Also remove the VMID from backup jobs, replication and HA.
    pub purge: bool,
    /// Also destroy disks not referenced by the config.
    pub destroy_unreferenced_disks: bool,
}

fn vm_path(node: &str, vmid: u32) -> String {
    format!("/nodes/{}/qemu/{vmid}", seg(node))
}

fn upid(raw: String) -> Result<Upid> {
    raw.parse()
}

impl Client {
    /// `GET /version`.
    pub async fn version(&self) -> Result<Version> {
        self.call(Method::GET, "/version", Params::new()).await
    }

    /// `GET /nodes`.
    pub async fn nodes(&self) -> Result<Vec<Node>> {
        self.call(Method::GET, "/nodes", Params::new()).await
    }

    /// `GET /nodes/{node}/status`.
    pub async fn node_status(&self, node: &str) -> Result<NodeStatus> {
        self.call(
            Method::GET,
            &format!("/nodes/{}/status", seg(node)),
            Params::new(),
        )
        .await
    }

    /// `GET /cluster/resources[?type=…]`.
    pub async fn cluster_resources(&self, filter: Option<ResourceType>) -> Result<Vec<ClusterResource>> {
        let params = Params::new().opt("type", filter.map(ResourceType::as_str));
        self.call(Method::GET, "/cluster/resources", params).await
    }

    /// `GET /cluster/nextid`: the next free VMID (PVE sends it as a string).
    pub async fn next_id(&self) -> Result<u32> {
        let v: serde_json::Value = self.call(Method::GET, "/cluster/nextid", Params::new()).await?;
        parse_vmid(v)
    }

    /// `GET /cluster/nextid?vmid=N`: `Ok(true)` if `vmid` is free, `Ok(false)` if PVE answers
    /// `VM N already exists`.
    pub async fn is_vmid_free(&self, vmid: u32) -> Result<bool> {
        let res: Result<serde_json::Value> = self
            .call(Method::GET, "/cluster/nextid", Params::new().set("vmid", vmid))
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(e) if e.class() == crate::ErrorClass::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `GET /nodes/{node}/qemu`.
    pub async fn list_vms(&self, node: &str) -> Result<Vec<VmSummary>> {
        self.call(Method::GET, &format!("/nodes/{}/qemu", seg(node)), Params::new())
            .await
    }

    /// `GET /nodes/{node}/qemu/{vmid}/status/current`.
    pub async fn vm_status(&self, node: &str, vmid: u32) -> Result<VmStatus> {
        self.call(
            Method::GET,
            &format!("{}/status/current", vm_path(node, vmid)),
            Params::new(),
        )
        .await
    }

    /// `GET /nodes/{node}/qemu/{vmid}/agent/file-read`: a file of the guest, through its QEMU
    /// guest agent (needs `VM.GuestAgent.FileRead`).
    pub async fn agent_file_read(&self, node: &str, vmid: u32, file: &str) -> Result<String> {
        #[derive(serde::Deserialize)]
        struct FileRead {
            content: String,
        }
        let read: FileRead = self
            .call(
                Method::GET,
                &format!("{}/agent/file-read", vm_path(node, vmid)),
                Params::new().set("file", file),
            )
            .await?;
        Ok(read.content)
    }

    /// `GET /nodes/{node}/qemu/{vmid}/pending`: the config with its pending changes, and which
    /// keys are pending (one call, as `GET …/config`).
    pub async fn vm_pending(&self, node: &str, vmid: u32) -> Result<crate::PendingConfig> {
        let items: Vec<crate::PendingItem> = self
            .call(
                Method::GET,
                &format!("{}/pending", vm_path(node, vmid)),
                Params::new(),
            )
            .await?;
        Ok(crate::PendingConfig::from_items(items))
    }

    /// `GET /nodes/{node}/qemu/{vmid}/config`: the config with pending changes applied (PVE's
    /// default; `current=1` would show the running values).
    pub async fn vm_config(&self, node: &str, vmid: u32) -> Result<VmConfig> {
        self.call(
            Method::GET,
            &format!("{}/config", vm_path(node, vmid)),
            Params::new(),
        )
        .await
    }

    /// `POST /nodes/{node}/qemu/{vmid}/config` (asynchronous): a task, or `None` when PVE finished
    /// within its background delay.
    pub async fn update_vm_config_async(
        &self,
        node: &str,
        vmid: u32,
        update: &ConfigUpdate,
    ) -> Result<Option<Upid>> {
        let raw: Option<String> = self
            .call(
                Method::POST,
                &format!("{}/config", vm_path(node, vmid)),
                update.params(),
            )
            .await?;
        raw.filter(|s| !s.is_empty()).map(upid).transpose()
    }

    /// `PUT /nodes/{node}/qemu/{vmid}/config` (synchronous).
    pub async fn update_vm_config(&self, node: &str, vmid: u32, update: &ConfigUpdate) -> Result<()> {
        self.call(
            Method::PUT,
            &format!("{}/config", vm_path(node, vmid)),
            update.params(),
        )
        .await
    }

    /// `POST /nodes/{node}/qemu/{vmid}/clone`.
    pub async fn clone_vm(&self, node: &str, vmid: u32, req: &CloneRequest) -> Result<Upid> {
        let params = Params::new()
            .set("newid", req.newid)
            .opt("name", req.name.as_ref())
            .opt("target", req.target.as_ref())
            .flag("full", req.full)
            .opt("storage", req.storage.as_ref())
            .opt("format", req.format.as_ref())
            .opt("pool", req.pool.as_ref())
            .opt("description", req.description.as_ref())
            .opt("snapname", req.snapname.as_ref());
        upid(
            self.call(Method::POST, &format!("{}/clone", vm_path(node, vmid)), params)
                .await?,
        )
    }

    /// `POST /nodes/{node}/qemu`: creates VM `vmid` with the options of `config` (a disk may be
    /// `<storage>:0,import-from=<volume id>`).
    pub async fn create_vm(&self, node: &str, vmid: u32, config: &ConfigUpdate) -> Result<Upid> {
        let params = config.params().set("vmid", vmid);
        upid(
            self.call(Method::POST, &format!("/nodes/{}/qemu", seg(node)), params)
                .await?,
        )
    }

    /// `POST /nodes/{node}/qemu/{vmid}/template`: makes the (stopped) VM a template.
    pub async fn make_template(&self, node: &str, vmid: u32) -> Result<Upid> {
        upid(
            self.call(
                Method::POST,
                &format!("{}/template", vm_path(node, vmid)),
                Params::new(),
            )
            .await?,
        )
    }

    /// `POST /nodes/{node}/storage/{storage}/download-url`: a `download` task.
    pub async fn download_url(&self, node: &str, storage: &str, req: &DownloadUrlRequest) -> Result<Upid> {
        let path = format!("/nodes/{}/storage/{}/download-url", seg(node), seg(storage));
        let mut params = Params::new()
            .set("content", &req.content)
            .set("filename", &req.filename)
            .set("url", &req.url);
        if let Some((algorithm, digest)) = &req.checksum {
            params = params
                .set("checksum-algorithm", algorithm)
                .set("checksum", digest);
        }
        upid(self.call(Method::POST, &path, params).await?)
    }

    /// `PUT /nodes/{node}/qemu/{vmid}/resize`: a task (PVE ≥ 8), or `None` on older versions.
    pub async fn resize_disk(
        &self,
        node: &str,
        vmid: u32,
        disk: &str,
        size: SizeChange,
    ) -> Result<Option<Upid>> {
        let params = Params::new().set("disk", disk).set("size", size);
        let raw: Option<String> = self
            .call(Method::PUT, &format!("{}/resize", vm_path(node, vmid)), params)
            .await?;
        raw.filter(|s| !s.is_empty()).map(upid).transpose()
    }

    async fn power(&self, node: &str, vmid: u32, action: &str, params: Params) -> Result<Upid> {
        upid(
            self.call(
                Method::POST,
                &format!("{}/status/{action}", vm_path(node, vmid)),
                params,
            )
            .await?,
        )
    }

    /// `POST …/status/start`.
    pub async fn start_vm(&self, node: &str, vmid: u32) -> Result<Upid> {
        self.power(node, vmid, "start", Params::new()).await
    }

    /// `POST …/status/stop` (hard stop).
    pub async fn stop_vm(&self, node: &str, vmid: u32) -> Result<Upid> {
        self.power(node, vmid, "stop", Params::new()).await
    }

    /// `POST …/status/shutdown` (ACPI / agent), optionally with a timeout in seconds after which
    /// PVE stops the VM when `force_stop` is set.
    pub async fn shutdown_vm(
        &self,
        node: &str,
        vmid: u32,
        timeout_secs: Option<u32>,
        force_stop: bool,
    ) -> Result<Upid> {
        let params = Params::new()
            .opt("timeout", timeout_secs)
            .flag("forceStop", force_stop.then_some(true));
        self.power(node, vmid, "shutdown", params).await
    }

    /// `POST …/status/reboot`.
    pub async fn reboot_vm(&self, node: &str, vmid: u32) -> Result<Upid> {
        self.power(node, vmid, "reboot", Params::new()).await
    }

    /// `DELETE /nodes/{node}/qemu/{vmid}`. Fails synchronously for a running VM.
    pub async fn delete_vm(&self, node: &str, vmid: u32, opts: DeleteVmOptions) -> Result<Upid> {
        let params = Params::new().flag("purge", opts.purge.then_some(true)).flag(
            "destroy-unreferenced-disks",
            opts.destroy_unreferenced_disks.then_some(true),
        );
        upid(self.call(Method::DELETE, &vm_path(node, vmid), params).await?)
    }

    /// `GET /nodes/{node}/tasks/{upid}/status` (the node comes from the UPID).
    pub async fn task_status(&self, upid: &Upid) -> Result<TaskStatus> {
        let path = format!("/nodes/{}/tasks/{}/status", seg(&upid.node), seg(upid.as_str()));
        self.call(Method::GET, &path, Params::new()).await
    }

    /// `GET /nodes/{node}/tasks/{upid}/log` from line `start` (0-based), at most `limit` lines.
    pub async fn task_log(&self, upid: &Upid, start: u64, limit: u64) -> Result<Vec<TaskLogLine>> {
        let path = format!("/nodes/{}/tasks/{}/log", seg(&upid.node), seg(upid.as_str()));
        self.call(
            Method::GET,
            &path,
            Params::new().set("start", start).set("limit", limit),
        )
        .await
    }

    /// Polls a task every `poll` until it stops or `deadline` passes. For tests and CLIs;
    /// controllers record the UPID and poll [`Client::task_status`] on requeue instead.
    ///
    /// Returns the outcome (`Ok`/`Warnings`), [`Error::TaskFailed`] or [`Error::TaskDeadline`].
    pub async fn wait_task(&self, upid: &Upid, deadline: Duration, poll: Duration) -> Result<TaskOutcome> {
        let started = Instant::now();
        loop {
            if let Some(outcome) = self.task_status(upid).await?.check(upid)? {
                return Ok(outcome);
            }
            if started.elapsed() >= deadline {
                return Err(Error::TaskDeadline {
                    upid: upid.to_string(),
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(poll.min(deadline.saturating_sub(started.elapsed()))).await;
        }
    }

    /// `GET /nodes/{node}/storage[?content=…]`.
    pub async fn list_storage(&self, node: &str, content: Option<&str>) -> Result<Vec<StorageInfo>> {
        self.call(
            Method::GET,
            &format!("/nodes/{}/storage", seg(node)),
            Params::new().opt("content", content),
        )
        .await
    }

    /// `GET /nodes/{node}/storage/{storage}/content[?content=…]`.
    pub async fn storage_content(
        &self,
        node: &str,
        storage: &str,
        content: Option<&str>,
    ) -> Result<Vec<StorageContent>> {
        let path = format!("/nodes/{}/storage/{}/content", seg(node), seg(storage));
        self.call(Method::GET, &path, Params::new().opt("content", content))
            .await
    }

    /// `POST /nodes/{node}/storage/{storage}/upload` (multipart: `content`, then the file part
    /// named `filename`). Uses the upload timeout; never retried. The volume id of the result is
    /// `{storage}:{content}/{file_name}`.
    pub async fn upload(
        &self,
        node: &str,
        storage: &str,
        content: UploadContent,
        file_name: &str,
        data: impl Into<Bytes>,
    ) -> Result<Upid> {
        if content == UploadContent::Iso && !file_name.to_ascii_lowercase().ends_with(".iso") {
            return Err(Error::parse("ISO file name", file_name, "must end in .iso"));
        }
        if file_name.is_empty() || file_name.contains(['/', '\\']) {
            return Err(Error::parse("file name", file_name, "must be a plain file name"));
        }
        let path = format!("/nodes/{}/storage/{}/upload", seg(node), seg(storage));
        let payload = Payload::Upload {
            params: Params::new().set("content", content.as_str()),
            file_name: file_name.to_owned(),
            data: data.into(),
        };
        upid(self.send(Method::POST, &path, payload).await?)
    }

    /// `DELETE /nodes/{node}/storage/{storage}/content/{volume}`: a task, or `None` when done.
    pub async fn delete_volume(&self, node: &str, storage: &str, volume: &str) -> Result<Option<Upid>> {
        let path = format!(
            "/nodes/{}/storage/{}/content/{}",
            seg(node),
            seg(storage),
            seg(volume)
        );
        let raw: Option<String> = self.call(Method::DELETE, &path, Params::new()).await?;
        raw.filter(|s| !s.is_empty()).map(upid).transpose()
    }

    /// `GET /pools`.
    pub async fn pools(&self) -> Result<Vec<Pool>> {
        self.call(Method::GET, "/pools", Params::new()).await
    }

    /// `GET /pools?poolid=…` (with members); [`crate::ErrorClass::NotFound`] if it does not exist.
    pub async fn pool(&self, poolid: &str) -> Result<Pool> {
        let mut pools: Vec<Pool> = self
            .call(Method::GET, "/pools", Params::new().set("poolid", poolid))
            .await?;
        match pools.iter().position(|p| p.poolid == poolid) {
            Some(i) => Ok(pools.swap_remove(i)),
            None => Err(Error::Api {
                method: Method::GET,
                path: "/pools".into(),
                status: 404,
                message: format!("pool '{poolid}' does not exist"),
                errors: BTreeMap::new(),
            }),
        }
    }

    /// `GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces`.
    /// [`crate::ErrorClass::AgentNotRunning`] until the agent answers.
    pub async fn agent_network_interfaces(&self, node: &str, vmid: u32) -> Result<Vec<AgentInterface>> {
        let path = format!("{}/agent/network-get-interfaces", vm_path(node, vmid));
        let res: AgentResult<Vec<AgentInterface>> = self.call(Method::GET, &path, Params::new()).await?;
        Ok(res.result)
    }
}

fn parse_vmid(v: serde_json::Value) -> Result<u32> {
    let shown = v.to_string();
    de::vmid(v).map_err(|e| Error::parse("VMID", &shown, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_id_accepts_string_or_number() {
        assert_eq!(parse_vmid(serde_json::json!("100")).unwrap(), 100);
        assert_eq!(parse_vmid(serde_json::json!(101)).unwrap(), 101);
        assert!(parse_vmid(serde_json::json!("x")).is_err());
        assert!(parse_vmid(serde_json::json!(null)).is_err());
    }

    #[test]
    fn config_update_params() {
        let update = ConfigUpdate::default()
            .set("net0", "virtio,bridge=vmbr0")
            .set("cores", "2")
            .delete("ide2")
            .delete("ipconfig1");
        let p = update.params().0;
        assert_eq!(
            p,
            vec![
                ("cores".to_string(), "2".to_string()),
                ("net0".to_string(), "virtio,bridge=vmbr0".to_string()),
                ("delete".to_string(), "ide2,ipconfig1".to_string()),
            ]
        );
    }
}
