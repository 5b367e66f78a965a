//! Templates made from an image (`spec.source.image`): Proxmox VE does the work. Once per
//! node, storage and checksum, in the background (the kit's [`Imports`]):
//!
//! 1. the storage downloads the file (`download-url`, content `import`, with the checksum:
//!    Proxmox VE verifies it and fails the task on a mismatch, leaving no file);
//! 2. a VM is created with its `scsi0` imported from the file (`import-from`) and the image's
//!    tag ([`image_tag`]);
//! 3. the VM is made a template, and the import waits until the cluster lists it as one.
//!
//! The machine then clones it like any template found by tags ([`effective_spec`]). Every step
//! looks first: a template of the image on the node ends the import, a VM of the image not yet a
//! template (an import interrupted by a restart) is made one, a file already downloaded is not
//! downloaded again. The registry is per process (a cache: what exists is read from Proxmox).

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use banlieue_api::common::ImageDownload;
use banlieue_api::infrastructure::{ProxmoxMachineSpec, VmidRange};
use banlieue_provider_kit::image::{
    self, IMAGE_CHECKSUM_MISMATCH, IMAGE_IMPORT_FAILED, ImportFailure, ImportProgress, Imports, shown_url,
};
use banlieue_pve_client::{ConfigUpdate, DownloadUrlRequest, TaskOutcome, Upid};

use crate::error::StepError;
use crate::hypervisor::{Hypervisor, PveError};

/// The imports of this process.
static IMPORTS: LazyLock<Imports> = LazyLock::new(Imports::default);

/// Storage an image is downloaded to when `spec.source.imageStorage` is unset.
pub const DEFAULT_IMAGE_STORAGE: &str = "local";
/// Storage of the template's disk when neither `spec.storage` nor the first disk's says it: the
/// VM storage of a default Proxmox VE installation.
pub const DEFAULT_DISK_STORAGE: &str = "local-lvm";
/// How often a running task of an import is looked at.
const TASK_POLL: Duration = Duration::from_secs(1);
/// Longest a download may take.
const DOWNLOAD_DEADLINE: Duration = Duration::from_secs(4 * 3600);
/// Longest the VM creation (the disk import) or the template conversion may take.
const TASK_DEADLINE: Duration = Duration::from_secs(3600);
/// Longest the cluster may take to list a new template as one (pvestatd's lag).
const LISTING_DEADLINE: Duration = Duration::from_secs(120);

/// The tag of the template made from `image`: `banlieue-<algorithm>-<first 48 digits>`
/// (a tag is at most 64 characters here).
pub fn image_tag(image: &ImageDownload) -> String {
    let sum: String = image.checksum.to_ascii_lowercase().chars().take(48).collect();
    format!("banlieue-{}-{sum}", image.checksum_algorithm.as_str())
}

/// The file the storage downloads `image` to: named after the checksum, with the extension
/// Proxmox VE reads the format from (`.raw` or `.vmdk` when the URL's path ends so, else
/// `.qcow2`, what cloud images are).
pub fn file_name(image: &ImageDownload) -> String {
    let path = image
        .url
        .split(['?', '#'])
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let ext = if path.ends_with(".raw") {
        "raw"
    } else if path.ends_with(".vmdk") {
        "vmdk"
    } else {
        "qcow2"
    };
    format!("banlieue-{}.{ext}", image::checksum_id(image, '-'))
}

/// The spec as the template search sees it: the template of an image is found by its tag.
pub fn effective_spec(spec: &ProxmoxMachineSpec) -> Cow<'_, ProxmoxMachineSpec> {
    match &spec.source.image {
        Some(image) => {
            let mut spec = spec.clone();
            spec.source.tags = vec![image_tag(image)];
            Cow::Owned(spec)
        }
        None => Cow::Borrowed(spec),
    }
}

/// Where the template of `spec.source.image` stands on `node`: `Ok(None)` when it is there,
/// `Ok(Some(progress))` while it is being made, an error when making it failed.
/// The template's VMID comes from `vmid_range` when one is given (the machine's, else its
/// cluster's), else from Proxmox's next free VMID.
pub fn ensure<H: Hypervisor>(
    hv: &H,
    guests: &[crate::hypervisor::Guest],
    node: &str,
    spec: &ProxmoxMachineSpec,
    vmid_range: Option<&VmidRange>,
) -> Result<Option<String>, StepError> {
    let Some(image) = &spec.source.image else {
        return Ok(None);
    };
    let tag = image_tag(image);
    if guests
        .iter()
        .any(|g| g.node == node && g.template && g.tags.contains(&tag))
    {
        return Ok(None);
    }
    let storage = spec
        .source
        .image_storage
        .clone()
        .unwrap_or_else(|| DEFAULT_IMAGE_STORAGE.to_owned());
    let disk_storage =
        crate::desired::full_clone_storage(spec).unwrap_or_else(|| DEFAULT_DISK_STORAGE.to_owned());
    // One import per node and image, whatever the storages asked (two would make two templates
    // with the same tag, which no machine could choose between).
    let key = format!("{}/{node}/{tag}", hv.endpoint());
    let job = Job {
        hv: hv.clone(),
        node: node.to_owned(),
        storage,
        disk_storage,
        image: image.clone(),
        vmid_range: vmid_range.cloned(),
    };
    let start = move |progress: Arc<ImportProgress>| async move { job.run(&progress).await };
    Ok(Some(IMPORTS.poll(&key, image, start)?))
}

fn failed(what: &str, e: PveError) -> ImportFailure {
    image::failed(what, crate::error::describe(&e))
}

/// What [`Job::vm_of_image`] saw on the node.
enum Seen {
    /// The import's VM, and whether it is a template yet.
    Ours { vmid: u32, template: bool },
    /// A VM still being created, which may be it.
    BeingCreated(u32),
    /// Neither.
    None,
}

/// The name of the VM (then template) made from `image`: `banlieue-image-<12 digits>`.
fn template_vm_name(image: &ImageDownload) -> String {
    let sum: String = image.checksum.to_ascii_lowercase().chars().take(12).collect();
    format!("banlieue-image-{sum}")
}

/// One import, with what it needs.
struct Job<H> {
    hv: H,
    node: String,
    storage: String,
    disk_storage: String,
    image: ImageDownload,
    vmid_range: Option<VmidRange>,
}

impl<H: Hypervisor> Job<H> {
    async fn run(&self, progress: &ImportProgress) -> Result<(), ImportFailure> {
        let (hv, node) = (&self.hv, self.node.as_str());
        let tag = image_tag(&self.image);
        // A VM being created may be an earlier import's (this process restarted): its creation
        // is waited for, then looked at again (twice at most).
        for _ in 0..3 {
            match self.vm_of_image(&tag).await? {
                Seen::Ours { template: true, .. } => return Ok(()),
                Seen::Ours {
                    vmid,
                    template: false,
                } => {
                    progress.set_stage(format!(
                        "making VM {vmid} on {node} (imported from {}) a template",
                        shown_url(&self.image.url)
                    ));
                    return self.to_template(vmid, &tag).await;
                }
                Seen::BeingCreated(vmid) => {
                    progress.set_stage(format!(
                        "VM {vmid} on {node} is being created (lock: create): waiting to see whether it is this image's template"
                    ));
                    self.wait_unlocked(vmid).await?;
                }
                Seen::None => break,
            }
        }
        let file = file_name(&self.image);
        let volid = format!("{}:import/{file}", self.storage);
        let present = hv
            .has_volume(node, &self.storage, &volid)
            .await
            .map_err(|e| failed("listing the image storage", e))?;
        if !present {
            let request = DownloadUrlRequest {
                content: "import".into(),
                filename: file.clone(),
                url: self.image.url.clone(),
                checksum: Some((
                    self.image.checksum_algorithm.as_str().to_owned(),
                    self.image.checksum.to_ascii_lowercase(),
                )),
            };
            let upid = hv
                .download_url(node, &self.storage, &request)
                .await
                .map_err(|e| {
                    failed(
                        &format!("download-url on storage {} of node {node}", self.storage),
                        e,
                    )
                })?;
            progress.set_stage(format!(
                "Proxmox VE downloads {} to {volid} on {node} (task {upid})",
                shown_url(&self.image.url)
            ));
            self.wait(&upid, DOWNLOAD_DEADLINE).await.map_err(|text| {
                let mismatch = text.contains("checksum mismatch");
                ImportFailure {
                    reason: if mismatch {
                        IMAGE_CHECKSUM_MISMATCH
                    } else {
                        IMAGE_IMPORT_FAILED
                    },
                    message: format!(
                        "downloading {} on node {node}: {text}",
                        shown_url(&self.image.url)
                    ),
                    permanent: mismatch,
                }
            })?;
        }
        let vmid = self.free_vmid().await?;
        let sum = self.image.checksum.to_ascii_lowercase();
        let config = ConfigUpdate::default()
            .set("name", template_vm_name(&self.image))
            .set("tags", tag.clone())
            .set(
                "description",
                format!(
                    "banlieue: template made from {} ({} {sum})",
                    shown_url(&self.image.url),
                    self.image.checksum_algorithm.as_str()
                ),
            )
            .set("scsihw", "virtio-scsi-single")
            .set("scsi0", format!("{}:0,import-from={volid}", self.disk_storage))
            .set("boot", "order=scsi0")
            .set("ostype", "l26")
            // The machine's spec.networks replace it; without them, the usual bridge.
            .set("net0", "virtio,bridge=vmbr0")
            .set("agent", "1");
        progress.set_stage(format!(
            "creating template VM {vmid} on {node} from {volid} (disk on {})",
            self.disk_storage
        ));
        let upid = hv
            .create_vm(node, vmid, &config)
            .await
            .map_err(|e| failed(&format!("creating VM {vmid} on {node}"), e))?;
        self.wait(&upid, TASK_DEADLINE)
            .await
            .map_err(|text| image::failed(&format!("creating VM {vmid} on {node} from {volid}"), text))?;
        self.to_template(vmid, &tag).await
    }

    /// A free VMID for the template: the first free one of the range, else Proxmox's proposal.
    async fn free_vmid(&self) -> Result<u32, ImportFailure> {
        let hv = &self.hv;
        let Some(range) = &self.vmid_range else {
            return hv.next_vmid().await.map_err(|e| failed("choosing a VMID", e));
        };
        let used: std::collections::HashSet<u32> = hv
            .guests()
            .await
            .map_err(|e| failed("listing guests", e))?
            .iter()
            .map(|g| g.vmid)
            .collect();
        for id in (range.start..=range.end).filter(|id| !used.contains(id)) {
            // Asked of Proxmox too: a container may hold it (the listing has QEMU guests only).
            if hv
                .vmid_is_free(id)
                .await
                .map_err(|e| failed("checking a VMID", e))?
            {
                return Ok(id);
            }
        }
        Err(ImportFailure::refused(format!(
            "no free VMID in vmidRange {}-{} for the image's template: widen the range or free a VMID",
            range.start, range.end
        )))
    }

    /// The VM this import makes on the node, if there is one. Only the import's own VM counts:
    /// its name and tag, and no machine's owner tag (clones inherit the template's tags, so a
    /// machine's VM carries the image's tag too). A VM still being created (`lock: create`, whose
    /// config PVE writes only when its disk import ends) may be it.
    async fn vm_of_image(&self, tag: &str) -> Result<Seen, ImportFailure> {
        let guests = self.hv.guests().await.map_err(|e| failed("listing guests", e))?;
        let name = template_vm_name(&self.image);
        let mut creating = None;
        for g in guests.iter().filter(|g| g.node == self.node) {
            let candidate = !g.reported || g.tags.iter().any(|t| t == tag);
            if !candidate {
                continue;
            }
            let Some(config) = self
                .hv
                .vm_config(&self.node, g.vmid)
                .await
                .map_err(|e| failed("reading a guest's config", e))?
            else {
                continue;
            };
            let tags: Vec<&str> = config
                .get("tags")
                .map(|t| t.split([';', ',', ' ']).filter(|t| !t.is_empty()).collect())
                .unwrap_or_default();
            let ours = config.get("name") == Some(name.as_str())
                && tags.iter().any(|t| t.eq_ignore_ascii_case(tag))
                && !tags.iter().any(|t| t.starts_with("banlieue-uid-"));
            if ours {
                return Ok(Seen::Ours {
                    vmid: g.vmid,
                    template: config.get("template") == Some("1"),
                });
            }
            if config.lock() == Some("create") && tags.is_empty() {
                creating = Some(g.vmid);
            }
        }
        Ok(creating.map_or(Seen::None, Seen::BeingCreated))
    }

    /// Waits (at most [`TASK_DEADLINE`]) until `vmid` is not locked any more.
    async fn wait_unlocked(&self, vmid: u32) -> Result<(), ImportFailure> {
        let (hv, node) = (&self.hv, self.node.as_str());
        let started = Instant::now();
        loop {
            let config = hv
                .vm_config(node, vmid)
                .await
                .map_err(|e| failed(&format!("reading VM {vmid}"), e))?;
            match config.as_ref().and_then(|c| c.lock().map(str::to_owned)) {
                Some(lock) if started.elapsed() < TASK_DEADLINE => {
                    tracing::debug!(vmid, lock, "waiting for VM to be unlocked");
                    tokio::time::sleep(TASK_POLL).await;
                }
                Some(lock) => {
                    return Err(ImportFailure::failed(format!(
                        "VM {vmid} on {node} stays locked ({lock})"
                    )));
                }
                None => return Ok(()),
            }
        }
    }

    /// Makes `vmid` a template once its creation is over, then waits until it is listed so.
    async fn to_template(&self, vmid: u32, tag: &str) -> Result<(), ImportFailure> {
        let (hv, node) = (&self.hv, self.node.as_str());
        self.wait_unlocked(vmid).await?;
        let upid = hv
            .make_template(node, vmid)
            .await
            .map_err(|e| failed(&format!("making VM {vmid} on {node} a template"), e))?;
        self.wait(&upid, TASK_DEADLINE)
            .await
            .map_err(|text| image::failed(&format!("making VM {vmid} on {node} a template"), text))?;
        let listed = Instant::now();
        while listed.elapsed() < LISTING_DEADLINE {
            let guests = hv.guests().await.map_err(|e| failed("listing guests", e))?;
            if guests
                .iter()
                .any(|g| g.vmid == vmid && g.template && g.tags.iter().any(|t| t == tag))
            {
                return Ok(());
            }
            tokio::time::sleep(TASK_POLL).await;
        }
        Err(ImportFailure::failed(format!(
            "template {vmid} on {node} is not listed as a template with tag {tag} after {}s",
            LISTING_DEADLINE.as_secs()
        )))
    }

    /// Waits for a task; `Err` with its exit status when it failed or did not end in time.
    async fn wait(&self, upid: &Upid, deadline: Duration) -> Result<(), String> {
        let started = Instant::now();
        loop {
            match self.hv.task(upid).await {
                Ok(TaskOutcome::Ok | TaskOutcome::Warnings(_)) => return Ok(()),
                Ok(TaskOutcome::Failed(text)) => return Err(text),
                Ok(TaskOutcome::Running) => {}
                // The API may be briefly unreachable: asked again until the deadline.
                Err(e) => tracing::debug!(%upid, error = %e, "task status"),
            }
            if started.elapsed() >= deadline {
                return Err(format!("task {upid} did not end within {}s", deadline.as_secs()));
            }
            tokio::time::sleep(TASK_POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::common::ChecksumAlgorithm;

    fn image(url: &str) -> ImageDownload {
        ImageDownload {
            url: url.into(),
            checksum_algorithm: ChecksumAlgorithm::Sha512,
            checksum: "Ab".repeat(64),
        }
    }

    #[test]
    fn the_tag_fits_a_proxmox_tag_and_names_the_checksum() {
        let tag = image_tag(&image("https://x/a.img"));
        assert_eq!(tag, format!("banlieue-sha512-{}", "ab".repeat(24)));
        assert!(tag.len() <= 64);
    }

    #[test]
    fn the_file_keeps_the_format_proxmox_reads_from_its_extension() {
        let sum = "ab".repeat(64);
        assert_eq!(
            file_name(&image("https://x/a.img")),
            format!("banlieue-sha512-{sum}.qcow2")
        );
        assert_eq!(
            file_name(&image("https://x/a.RAW?sig=1")),
            format!("banlieue-sha512-{sum}.raw")
        );
        assert_eq!(
            file_name(&image("http://x/disk.vmdk")),
            format!("banlieue-sha512-{sum}.vmdk")
        );
    }

    #[test]
    fn an_image_source_is_searched_by_its_tag() {
        let mut spec = ProxmoxMachineSpec::new(Default::default(), banlieue_api::common::Cpu::cores(1), 1024);
        assert!(matches!(effective_spec(&spec), Cow::Borrowed(_)));
        spec.source.image = Some(image("https://x/a.img"));
        assert_eq!(
            effective_spec(&spec).source.tags,
            [image_tag(spec.source.image.as_ref().unwrap())]
        );
    }
}
