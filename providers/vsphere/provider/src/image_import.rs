//! The template of `spec.source.image`: an OVA imported as `spec.source.template` when no VM has
//! that path. Once per template path, in the background (the kit's [`Imports`]):
//!
//! 1. the provider downloads the OVA and verifies its checksum (the kit's download);
//! 2. `CreateImportSpec` reads its descriptor, `ImportVApp` creates the VM under a staging name
//!    (`<name>-banlieue-importing`) in the machine's resource pool, datastore and the template's
//!    folder, and the disks are uploaded to the lease's URLs straight from the archive;
//! 3. the lease is completed, the VM renamed to its final name (so the template path appears only
//!    complete) and marked as a template.
//!
//! A staging VM left by an interrupted import is destroyed before the next one starts.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use banlieue_api::common::ImageDownload;
use banlieue_provider_kit::image::{
    self, ImportFailure, ImportProgress, Imports, download, failed, shown_url,
};
use banlieue_vsphere_client::vim::ConfigSpec;
use banlieue_vsphere_client::{Client, MoRef};

use crate::error::{OrFail, StepError};

/// The imports of this process.
static IMPORTS: LazyLock<Imports> = LazyLock::new(Imports::default);

/// extraConfig key of an imported template: `<algorithm>:<checksum>` of the image it is.
pub const IMAGE_KEY: &str = "banlieue.image.checksum";
/// Condition reason: the template path holds a template imported from another image.
pub const IMAGE_CONFLICT: &str = "ImageConflict";

/// `IMAGE_KEY`'s value for `image`.
pub fn image_marker(image: &ImageDownload) -> String {
    image::checksum_id(image, ':')
}

/// Refuses a template at the image's path that was imported from another image (a changed
/// checksum with the same `spec.source.template` would otherwise clone the old one silently).
/// A template without the marker (made another way) is used as it is.
pub async fn check_template(
    c: &Client,
    template: &MoRef,
    path: &str,
    image: &ImageDownload,
) -> Result<(), StepError> {
    let info = c.vm_info(template).await.or_fail("TemplateNotFound")?;
    let recorded = info.and_then(|i| i.extra_config.get(IMAGE_KEY).cloned());
    match recorded {
        Some(recorded) if recorded != image_marker(image) => Err(StepError::permanent(
            IMAGE_CONFLICT,
            format!(
                "template {path:?} was imported from another image ({recorded}), not spec.source.image's {}: \
                 name another spec.source.template for this image",
                image_marker(image)
            ),
        )),
        _ => Ok(()),
    }
}

/// Suffix of the name a VM is imported under until it is complete.
pub const STAGING_SUFFIX: &str = "-banlieue-importing";
/// Condition reason: an image is to be imported but no datastore is set.
pub const IMPORT_NEEDS_DATASTORE: &str = "ImportNeedsDatastore";
/// Longest a lease may take to become ready.
const LEASE_READY_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest the upload of one disk may take.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(4 * 3600);
/// How often a lease hears of the import's progress while a disk is uploaded.
const LEASE_KEEP_ALIVE: Duration = Duration::from_secs(60);
/// Longest the rename may take.
const TASK_TIMEOUT: Duration = Duration::from_secs(600);

/// Where to import: what the machine's placement resolved.
#[derive(Clone, Debug)]
pub struct Target {
    /// Inventory path of the template to create.
    pub template_path: String,
    /// Its folder.
    pub folder: MoRef,
    /// The resource pool the VM is imported into.
    pub pool: MoRef,
    /// The datastore of its disks.
    pub datastore: MoRef,
    /// The host, when the pool spans several.
    pub host: Option<MoRef>,
}

/// Where the import of `image` to `target` stands: `Some(progress)` while it runs; an error
/// once it failed (tried again after [`image::RETRY_AFTER`]).
pub fn ensure(c: &Client, image: &ImageDownload, target: Target) -> Result<String, StepError> {
    let key = format!("{}|{}", c.endpoint(), target.template_path);
    let (client, img) = (c.clone(), image.clone());
    let job =
        move |progress: Arc<ImportProgress>| async move { import(&client, &img, &target, &progress).await };
    Ok(IMPORTS.poll(&key, image, job)?)
}

/// The template path's last component.
fn name_of(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

async fn import(
    c: &Client,
    image: &ImageDownload,
    target: &Target,
    progress: &ImportProgress,
) -> Result<(), ImportFailure> {
    if c.find_by_inventory_path(&target.template_path)
        .await
        .map_err(|e| failed("looking for the template", e))?
        .is_some()
    {
        return Ok(());
    }
    let name = name_of(&target.template_path);
    let staging_path = format!("{}{STAGING_SUFFIX}", target.template_path);
    if let Some(stale) = c
        .find_by_inventory_path(&staging_path)
        .await
        .map_err(|e| failed("looking for an interrupted import", e))?
    {
        run_task(c, "destroying an interrupted import", c.destroy(&stale).await).await?;
    }
    let dir = image::download_dir().map_err(|e| failed("creating a folder for the download", e))?;
    let file = dir.path().join("image.ova");
    download::download(image, &file, &progress.download).await?;
    progress.set_stage(format!(
        "checksum verified; importing {} into vSphere",
        shown_url(&image.url)
    ));
    let ova = crate::ova::read(&file)
        .await
        .map_err(|e| ImportFailure::refused(format!("{}: {e}", shown_url(&image.url))))?;
    let spec = c
        .create_import_spec(
            &ova.descriptor,
            &target.pool,
            &target.datastore,
            &format!("{name}{STAGING_SUFFIX}"),
        )
        .await
        .map_err(|e| failed("CreateImportSpec", e))?;
    if !spec.errors.is_empty() {
        return Err(ImportFailure::refused(format!(
            "vSphere refuses the OVF descriptor of {}: {}",
            shown_url(&image.url),
            spec.errors.join("; ")
        )));
    }
    let lease = c
        .import_vapp(&target.pool, &spec.spec, &target.folder, target.host.as_ref())
        .await
        .map_err(|e| failed("ImportVApp", e))?;
    let uploaded = async {
        let devices = c
            .lease_ready(&lease, LEASE_READY_TIMEOUT)
            .await
            .map_err(|e| failed("waiting for the import lease", e))?;
        for (done, item) in spec.files.iter().enumerate() {
            let entry = ova.files.get(&item.path).ok_or_else(|| {
                ImportFailure::refused(format!(
                    "{} names {} but the OVA does not hold it",
                    shown_url(&image.url),
                    item.path
                ))
            })?;
            let device = devices
                .iter()
                .find(|d| d.import_key == item.device_id)
                .ok_or_else(|| failed("the import lease", format!("no upload URL for {}", item.path)))?;
            progress.set_stage(format!(
                "uploading {} ({} MiB) of {} to vSphere",
                item.path,
                entry.length >> 20,
                shown_url(&image.url)
            ));
            let upload = c.upload_to_lease(
                device,
                &file,
                entry.offset,
                entry.length,
                item.create,
                UPLOAD_TIMEOUT,
            );
            // vSphere ends a lease that hears nothing for its timeout (5 minutes by default):
            // its progress is reported every minute while a disk is uploaded.
            let before = (done * 100 / spec.files.len().max(1)) as u8;
            tokio::pin!(upload);
            let mut keep_alive = tokio::time::interval(LEASE_KEEP_ALIVE);
            keep_alive.tick().await;
            let sent = loop {
                tokio::select! {
                    sent = &mut upload => break sent,
                    _ = keep_alive.tick() => {
                        if let Err(e) = c.lease_progress(&lease, before).await {
                            tracing::warn!(error = %e, "keeping the import lease alive");
                        }
                    }
                }
            };
            sent.map_err(|e| failed(&format!("uploading {}", item.path), e))?;
            let percent = ((done + 1) * 100 / spec.files.len().max(1)) as u8;
            c.lease_progress(&lease, percent)
                .await
                .map_err(|e| failed("reporting the import's progress", e))?;
        }
        Ok::<_, ImportFailure>(())
    };
    if let Err(failure) = uploaded.await {
        if let Err(e) = c.lease_abort(&lease, &failure.message).await {
            tracing::warn!(error = %e, "aborting the import lease");
        }
        return Err(failure);
    }
    c.lease_complete(&lease)
        .await
        .map_err(|e| failed("completing the import lease", e))?;
    let vm = c
        .find_by_inventory_path(&staging_path)
        .await
        .map_err(|e| failed("finding the imported VM", e))?
        .ok_or_else(|| {
            failed(
                "finding the imported VM",
                format!("{staging_path} is not in the inventory"),
            )
        })?;
    let marking = ConfigSpec {
        extra_config: vec![(IMAGE_KEY.to_owned(), image_marker(image))],
        ..ConfigSpec::default()
    };
    let marked = c.reconfigure(&vm, &marking).await;
    run_task(c, "recording the image on the imported VM", marked).await?;
    c.mark_as_template(&vm)
        .await
        .map_err(|e| failed("marking the imported VM as a template", e))?;
    run_task(c, "renaming the imported template", c.rename(&vm, name).await).await
}

/// Waits for the task `started` (doing `what`) to end.
async fn run_task(
    c: &Client,
    what: &str,
    started: banlieue_vsphere_client::Result<MoRef>,
) -> Result<(), ImportFailure> {
    let task = started.map_err(|e| failed(what, e))?;
    c.wait_task(&task, Duration::from_secs(1), TASK_TIMEOUT)
        .await
        .map_err(|e| failed(what, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_name_is_the_path_s_last_component() {
        assert_eq!(name_of("/dc1/vm/templates/noble"), "noble");
        assert_eq!(name_of("noble"), "noble");
    }
}
