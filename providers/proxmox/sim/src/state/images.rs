//! Images a VM is made from, as Proxmox VE 9 has them: a storage downloads a file from a URL
//! (`download-url`, a `download` task that verifies the checksum it was given), a VM is created
//! with a disk imported from it (`POST /nodes/{node}/qemu` with `import-from=`), and the VM is
//! made a template (`POST …/template`: its disks become `base-` volumes). Messages are PVE's
//! (`PVE::Tools::download_file_from_url`, `qemu-server`'s create and template handlers).
//!
//! The download itself is done by the server outside the state lock ([`State::take_fetches`],
//! [`State::fetched`]): the task runs until then.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{
    Action, ApiError, ApiResult, Request, State, Vm, Volume, format_size, is_disk_key, is_net_key, unix_now,
};

/// How long a download task may wait for its fetch before it is failed.
pub(super) const FETCH_DEADLINE: Duration = Duration::from_secs(3600);

/// The first bytes of a QCOW2 image.
const QCOW2_MAGIC: &[u8; 4] = b"QFI\xfb";

/// A download the server is to fetch.
#[derive(Debug, Clone)]
pub(crate) struct Fetch {
    /// The download task.
    pub upid: String,
    /// What to fetch.
    pub url: String,
    /// `sha256`, `sha512`, … with the expected digest, when asked.
    pub checksum: Option<(String, String)>,
    node: String,
    storage: String,
    /// Volume name (`import/<file>`).
    name: String,
    content: String,
    format: String,
}

/// The extensions a file of each content type may have, and its folder.
pub(super) fn content_dir(content: &str) -> (&'static str, &'static [&'static str]) {
    match content {
        "iso" => ("iso", &[".iso", ".img"]),
        "vztmpl" => ("vztmpl", &[".tar.gz", ".tar.xz", ".tar.zst"]),
        _ => ("import", &[".ova", ".qcow2", ".raw", ".vmdk", ".img"]),
    }
}

/// A file name as PVE normalises it: the last path component, anything but `[A-Za-z0-9_.-]`
/// replaced by `_`.
pub(super) fn normalize_filename(filename: &str) -> String {
    filename
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The size a disk imported from `data` has: a QCOW2 image's virtual size, else its length.
fn disk_bytes(data: &[u8]) -> u64 {
    if data.len() >= 32 && &data[..4] == QCOW2_MAGIC {
        let mut size = [0u8; 8];
        size.copy_from_slice(&data[24..32]);
        return u64::from_be_bytes(size);
    }
    data.len() as u64
}

/// The digest of `data` with PVE's algorithm name, `None` for one the simulator lacks.
fn digest(algorithm: &str, data: &[u8]) -> Option<String> {
    use sha2::Digest;
    Some(match algorithm {
        "sha256" => hex::encode(sha2::Sha256::digest(data)),
        "sha512" => hex::encode(sha2::Sha512::digest(data)),
        "sha224" => hex::encode(sha2::Sha224::digest(data)),
        "sha384" => hex::encode(sha2::Sha384::digest(data)),
        _ => return None,
    })
}

impl State {
    /// `POST /nodes/{node}/storage/{storage}/download-url`.
    pub(super) fn download_url(&mut self, req: &Request) -> ApiResult {
        let node = req.req("node")?;
        let storage = req.req("storage")?;
        let content = req.req("content")?;
        let url = req.req("url")?;
        let spec = self
            .storage(&storage)
            .ok_or_else(|| ApiError::internal(format!("storage '{storage}' does not exist")))?;
        if !spec.content.contains(&content) {
            return Err(ApiError::internal(format!(
                "storage '{storage}' is not configured for content-type '{content}'"
            )));
        }
        let (dir, extensions) = content_dir(&content);
        let file = normalize_filename(&req.req("filename")?);
        let Some(ext) = extensions.iter().find(|e| file.to_lowercase().ends_with(*e)) else {
            return Err(ApiError::param("filename", "wrong file extension"));
        };
        let name = format!("{dir}/{file}");
        if self
            .volumes
            .get(&(node.clone(), storage.clone()))
            .is_some_and(|v| v.contains_key(&name))
        {
            return Err(ApiError::internal(format!(
                "refusing to override existing file '/var/lib/vz/template/{name}'"
            )));
        }
        let checksum = match (req.opt("checksum-algorithm"), req.opt("checksum")) {
            (Some(algorithm), Some(sum)) => Some((algorithm, sum.trim().to_ascii_lowercase())),
            _ => None,
        };
        let log = vec![format!("downloading {url} to /var/lib/vz/template/{name}")];
        // Runs until the server has fetched the file (State::fetched).
        let upid = self.new_task(req, &node, "download", &storage, None, log);
        self.fetches.push(Fetch {
            upid: upid.clone(),
            url,
            checksum,
            node,
            storage,
            name,
            content,
            format: ext.trim_start_matches('.').to_owned(),
        });
        Ok(json!(upid))
    }

    /// The downloads started since the last call, for the server to fetch.
    pub(crate) fn take_fetches(&mut self) -> Vec<Fetch> {
        std::mem::take(&mut self.fetches)
    }

    /// Ends the download task of `fetch` with what was fetched (the file's bytes, or why not).
    pub(crate) fn fetched(&mut self, fetch: &Fetch, outcome: Result<Vec<u8>, String>) {
        let now = Instant::now();
        let Some(task) = self.tasks.get_mut(&fetch.upid) else {
            return;
        };
        if task.exitstatus.is_some() {
            return;
        }
        let checked = outcome.and_then(|data| match &fetch.checksum {
            None => Ok(data),
            Some((algorithm, expected)) => {
                task.log.push("calculating checksum...".into());
                let got = digest(algorithm, &data)
                    .ok_or_else(|| format!("checksum algorithm '{algorithm}' is not supported"))?;
                if &got != expected {
                    return Err(format!("checksum mismatch: got '{got}' != expect '{expected}'"));
                }
                task.log.push("checksum verified".into());
                Ok(data)
            }
        });
        match checked {
            Ok(data) => {
                task.log.push(format!(
                    "download of '{}' to '/var/lib/vz/template/{}' finished",
                    fetch.url, fetch.name
                ));
                task.action = Some(Action::StoreVolume {
                    node: fetch.node.clone(),
                    storage: fetch.storage.clone(),
                    name: fetch.name.clone(),
                    volume: Volume {
                        size: disk_bytes(&data),
                        content: fetch.content.clone(),
                        format: fetch.format.clone(),
                        ctime: unix_now(),
                        seed: None,
                    },
                });
            }
            Err(message) => {
                task.forced_failure.get_or_insert(message);
            }
        }
        task.end = now;
        self.advance(now);
    }

    /// `POST /nodes/{node}/qemu`: a new VM, its disks allocated or imported (`import-from`).
    pub(super) fn create_vm(&mut self, req: &Request) -> ApiResult {
        let node = req.req("node")?;
        let vmid = req.vmid("vmid")?;
        if let Some(existing) = self.vms.get(&vmid) {
            return Err(ApiError::internal(format!(
                "unable to create VM {vmid} - VM {vmid} already exists on node '{}'",
                existing.node
            )));
        }
        const NOT_CONFIG: [&str; 12] = [
            "node",
            "vmid",
            "start",
            "pool",
            "storage",
            "unique",
            "archive",
            "force",
            "live-restore",
            "bwlimit",
            "import-working-storage",
            "ha-managed",
        ];
        let mut config = BTreeMap::new();
        let mut log = Vec::new();
        let mut index = 0;
        for (key, value) in &req.params {
            if NOT_CONFIG.contains(&key.as_str()) {
                continue;
            }
            let text = super::value_text(value);
            let text = if is_disk_key(key) {
                match import_source(&text) {
                    Some((from_storage, from_volume)) => self.imported_disk(
                        &node,
                        vmid,
                        &text,
                        &from_storage,
                        &from_volume,
                        &mut index,
                        &mut log,
                    )?,
                    None => self.allocate_disk(key, &text, vmid, &mut index)?,
                }
            } else if is_net_key(key) {
                self.canonical_net(&text)
            } else {
                text
            };
            config.insert(key.clone(), text);
        }
        if !config.contains_key("smbios1") {
            config.insert("smbios1".into(), format!("uuid={}", self.new_uuid()));
        }
        config.insert("vmgenid".into(), self.new_uuid());
        self.vms.insert(
            vmid,
            Vm {
                node: node.clone(),
                config: BTreeMap::from([("lock".to_owned(), "create".to_owned())]),
                running: false,
                started_at: None,
                created_at: Instant::now(),
                pool: req.opt("pool"),
                ip: None,
                boot_seed: None,
                guest_interfaces: None,
                guest_files: BTreeMap::new(),
                pending: BTreeMap::new(),
            },
        );
        let action = Action::CloneDone { newid: vmid, config };
        Ok(json!(self.new_task(
            req,
            &node,
            "qmcreate",
            &vmid.to_string(),
            Some(action),
            log
        )))
    }

    /// A disk `<storage>:0,import-from=<storage>:<volume>,…` as the new VM's volume.
    #[allow(clippy::too_many_arguments)]
    fn imported_disk(
        &self,
        node: &str,
        vmid: u32,
        text: &str,
        from_storage: &str,
        from_volume: &str,
        index: &mut u32,
        log: &mut Vec<String>,
    ) -> ApiResult<String> {
        let Some(source) = self
            .volumes
            .get(&(node.to_owned(), from_storage.to_owned()))
            .and_then(|v| v.get(from_volume))
        else {
            return Err(ApiError::internal(format!(
                "volume '{from_storage}:{from_volume}' does not exist"
            )));
        };
        let file = text.split(',').next().unwrap_or_default();
        let Some((storage, _)) = file.split_once(':') else {
            return Err(ApiError::internal(format!(
                "invalid disk '{text}' to import into"
            )));
        };
        match self.storage(storage) {
            None => return Err(ApiError::internal(format!("storage '{storage}' does not exist"))),
            Some(spec) if !spec.content.iter().any(|c| c == "images") => {
                return Err(ApiError::internal(format!(
                    "storage '{storage}' does not support vm images"
                )));
            }
            Some(_) => {}
        }
        let name = format!("vm-{vmid}-disk-{index}");
        *index += 1;
        log.push(format!(
            "importing disk '{from_storage}:{from_volume}' to VM {vmid} ...\ntransferred {} of {} (100.00%)",
            format_size(source.size),
            format_size(source.size)
        ));
        let mut out = vec![format!("{storage}:{name}")];
        out.extend(
            text.split(',')
                .skip(1)
                .filter(|p| !p.starts_with("import-from=") && !p.starts_with("size="))
                .map(str::to_owned),
        );
        out.push(format!("size={}", format_size(source.size)));
        Ok(out.join(","))
    }

    /// `POST /nodes/{node}/qemu/{vmid}/template`.
    pub(super) fn make_template(&mut self, req: &Request) -> ApiResult {
        let vmid = self.vm_on_node(req)?;
        let node = req.req("node")?;
        self.check_unlocked(vmid)?;
        let vm = &self.vms[&vmid];
        if vm.running {
            return Err(ApiError::internal("you can't convert a running VM to template"));
        }
        let mut updates = vec![("template".to_owned(), Some("1".to_owned()))];
        let own = format!(":vm-{vmid}-disk-");
        for (key, value) in vm.config.iter().filter(|(k, _)| is_disk_key(k)) {
            if value.contains(&own) {
                updates.push((
                    key.clone(),
                    Some(value.replace(&own, &format!(":base-{vmid}-disk-"))),
                ));
            }
        }
        let action = Action::Config { vmid, updates };
        Ok(json!(self.new_task(
            req,
            &node,
            "qmtemplate",
            &vmid.to_string(),
            Some(action),
            Vec::new()
        )))
    }
}

/// The `import-from=<storage>:<volume>` of a disk value.
fn import_source(text: &str) -> Option<(String, String)> {
    let from = text.split(',').find_map(|p| p.strip_prefix("import-from="))?;
    let (storage, volume) = from.split_once(':')?;
    Some((storage.to_owned(), volume.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_qcow2_disk_has_its_virtual_size_anything_else_its_length() {
        let mut image = b"QFI\xfb\0\0\0\x03".to_vec();
        image.extend_from_slice(&[0; 16]);
        image.extend_from_slice(&(10u64 << 30).to_be_bytes());
        assert_eq!(disk_bytes(&image), 10 << 30);
        assert_eq!(disk_bytes(&[1, 2, 3]), 3);
    }

    #[test]
    fn import_from_is_read_from_a_disk_value() {
        assert_eq!(
            import_source("local-lvm:0,import-from=local:import/a.qcow2,discard=on"),
            Some(("local".into(), "import/a.qcow2".into()))
        );
        assert_eq!(import_source("local-lvm:8"), None);
    }
}
