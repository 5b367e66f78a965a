//! The base volume of a machine: an existing volume (`spec.source.volume`), or an image imported
//! from a URL (`spec.source.image`) into the pool as `banlieue-image-<algorithm>-<checksum>`.
//!
//! An import runs once per host, pool and checksum, in the background (the kit's
//! [`Imports`]): download to a local temporary file, checksum verified, upload into a volume
//! named `<name>.part`, then a copy under the final name and the `.part` deleted. The final name
//! appears only complete, so a crash at any point is repaired by starting again: the next
//! reconcile finds no final volume and no running import.

use std::path::Path;
use std::sync::Arc;

use banlieue_api::common::ImageDownload;
use banlieue_api::infrastructure::LibvirtVolumeSource;
use banlieue_provider_kit::image::{
    IMAGE_IMPORT_FAILED, ImportFailure, ImportProgress, ImportState, Imports, download,
};

use crate::error::StepError;
use crate::hypervisor::{HvError, Hypervisor, VolumeInfo};
use crate::xml;

/// The first bytes of a QCOW2 image.
const QCOW2_MAGIC: &[u8; 4] = b"QFI\xfb";

/// The base volume of a machine, or what it waits for.
#[derive(Debug)]
pub enum Base {
    /// The volume to clone.
    Ready(VolumeInfo),
    /// An import is running; how far it is.
    Importing(String),
}

/// The name of the volume an image is imported as.
pub fn volume_name(image: &ImageDownload) -> String {
    format!(
        "banlieue-image-{}-{}",
        image.checksum_algorithm.as_str(),
        image.checksum.to_ascii_lowercase()
    )
}

/// The volume an import is uploaded to before it is complete.
fn part_name(name: &str) -> String {
    format!("{name}.part")
}

/// The base volume of `source` on the host `host` (`hv`), starting its import when needed.
pub async fn base_volume<H: Hypervisor>(
    hv: &Arc<H>,
    host: &str,
    source: &LibvirtVolumeSource,
    imports: &Imports,
    lookup_failed: impl Fn(HvError) -> StepError,
) -> Result<Base, StepError> {
    let pool = &source.pool;
    let (name, image) = match (&source.volume, &source.image) {
        (Some(volume), _) => (volume.clone(), None),
        (None, Some(image)) => (volume_name(image), Some(image)),
        (None, None) => {
            return Err(StepError::permanent(
                "BaseVolumeNotFound",
                "spec.source names neither a volume nor an image",
            ));
        }
    };
    let key = format!("{host}/{pool}/{name}");
    // The final volume is listed while libvirt copies into it: not used before the import ends.
    let copying = image.is_some() && imports.is_running(&key);
    if let Some(found) = hv.volume(pool, &name).await.map_err(&lookup_failed)?
        && !copying
    {
        return Ok(Base::Ready(found));
    }
    let Some(image) = image else {
        return Err(StepError::permanent(
            "BaseVolumeNotFound",
            format!("base volume {name:?} not found in storage pool {pool:?}: upload it or fix spec.source"),
        ));
    };
    let task = {
        let (hv, pool, image) = (hv.clone(), pool.clone(), image.clone());
        move |progress: Arc<ImportProgress>| async move { import(&*hv, &pool, &image, &progress).await }
    };
    match imports.poll(&key, image, task) {
        ImportState::Running(how_far) => Ok(Base::Importing(format!(
            "{how_far} (pool {pool:?} on host {host})"
        ))),
        ImportState::Failed(failure) => Err(failure.step_error()),
    }
}

fn hv_failure(e: HvError) -> ImportFailure {
    ImportFailure {
        reason: IMAGE_IMPORT_FAILED,
        message: e.to_string(),
        permanent: false,
    }
}

/// Downloads, verifies and uploads `image` as its volume in `pool`; nothing when it is there.
async fn import<H: Hypervisor>(
    hv: &H,
    pool: &str,
    image: &ImageDownload,
    progress: &ImportProgress,
) -> Result<(), ImportFailure> {
    let name = volume_name(image);
    if hv.volume(pool, &name).await.map_err(hv_failure)?.is_some() {
        return Ok(());
    }
    let local_failure = |what: &str, e: std::io::Error| ImportFailure {
        reason: IMAGE_IMPORT_FAILED,
        message: format!("{what}: {e}"),
        permanent: false,
    };
    let dir = tempfile::Builder::new()
        .prefix("banlieue-image-")
        .tempdir()
        .map_err(|e| local_failure("creating a temporary folder for the download", e))?;
    let file = dir.path().join("image");
    let length = download::download(image, &file, &progress.download).await?;
    progress
        .uploading
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let (format, capacity) = image_facts(&file, length)
        .await
        .map_err(|e| local_failure("reading the downloaded image", e))?;
    let part = part_name(&name);
    hv.delete_volume(pool, &part).await.map_err(hv_failure)?;
    hv.create_volume(pool, &xml::plain_volume_xml(&part, capacity, format))
        .await
        .map_err(hv_failure)?;
    hv.upload_volume_file(pool, &part, &file, length)
        .await
        .map_err(hv_failure)?;
    hv.clone_volume(pool, &xml::plain_volume_xml(&name, capacity, format), &part)
        .await
        .map_err(hv_failure)?;
    hv.delete_volume(pool, &part).await.map_err(hv_failure)?;
    Ok(())
}

/// The format (`qcow2` or `raw`) and the virtual size in bytes of a downloaded image.
async fn image_facts(path: &Path, length: u64) -> std::io::Result<(&'static str, u64)> {
    use tokio::io::AsyncReadExt;
    let mut header = [0u8; 32];
    let mut file = tokio::fs::File::open(path).await?;
    let mut read = 0;
    while read < header.len() {
        let n = file.read(&mut header[read..]).await?;
        if n == 0 {
            break;
        }
        read += n;
    }
    Ok(qcow2_virtual_size(&header[..read]).map_or(("raw", length), |size| ("qcow2", size)))
}

/// The virtual size of a QCOW2 header, `None` when `header` is not one.
fn qcow2_virtual_size(header: &[u8]) -> Option<u64> {
    if header.len() < 32 || &header[..4] != QCOW2_MAGIC {
        return None;
    }
    let mut size = [0u8; 8];
    size.copy_from_slice(&header[24..32]);
    Some(u64::from_be_bytes(size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_volume_is_named_after_the_checksum() {
        let image = ImageDownload {
            url: "http://x/a.img".into(),
            checksum_algorithm: banlieue_api::common::ChecksumAlgorithm::Sha512,
            checksum: "AB".repeat(64),
        };
        assert_eq!(
            volume_name(&image),
            format!("banlieue-image-sha512-{}", "ab".repeat(64))
        );
        assert_eq!(part_name("v"), "v.part");
    }

    #[test]
    fn a_qcow2_header_gives_the_virtual_size_anything_else_is_raw() {
        let mut header = b"QFI\xfb".to_vec();
        header.extend_from_slice(&[0, 0, 0, 3]);
        header.extend_from_slice(&[0; 16]);
        header.extend_from_slice(&(5u64 << 30).to_be_bytes());
        assert_eq!(qcow2_virtual_size(&header), Some(5 << 30));
        assert_eq!(qcow2_virtual_size(&[0; 32]), None);
        assert_eq!(qcow2_virtual_size(b"QFI\xfb"), None);
    }
}
