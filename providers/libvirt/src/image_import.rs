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
use banlieue_provider_kit::image::{self, ImportFailure, ImportProgress, Imports, download, shown_url};

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
    format!("banlieue-image-{}", image::checksum_id(image, '-'))
}

/// The volume an import is uploaded to before it is complete.
fn part_name(name: &str) -> String {
    format!("{name}.part")
}

/// The empty volume created once the copy to `name` is complete.
fn marker_name(name: &str) -> String {
    format!("{name}.ok")
}

/// The base volume of `source` on the host `host` (`hv`, reached at `uri`), starting its import
/// when needed.
pub async fn base_volume<H: Hypervisor>(
    hv: &Arc<H>,
    (host, uri): (&str, &str),
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
    // One import per volume of a host, told apart by its URI (without the credential file
    // parameters): two clusters may give different hosts the same name.
    let uri = uri.split('?').next().unwrap_or_default();
    let key = format!("{uri}/{pool}/{name}");
    // An imported volume is complete once its marker exists (libvirt lists it while it copies
    // into it, also after a restart of either side).
    let complete = match image {
        None => true,
        Some(_) => {
            !imports.is_running(&key)
                && hv
                    .volume(pool, &marker_name(&name))
                    .await
                    .map_err(&lookup_failed)?
                    .is_some()
        }
    };
    if complete && let Some(found) = hv.volume(pool, &name).await.map_err(&lookup_failed)? {
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
    let how_far = imports.poll(&key, image, task)?;
    Ok(Base::Importing(format!(
        "{how_far} (pool {pool:?} on host {host})"
    )))
}

impl From<HvError> for ImportFailure {
    fn from(e: HvError) -> Self {
        ImportFailure::failed(e.to_string())
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
    let marker = marker_name(&name);
    if hv.volume(pool, &marker).await?.is_some() {
        if hv.volume(pool, &name).await?.is_some() {
            return Ok(());
        }
        hv.delete_volume(pool, &marker).await?;
    }
    // A final volume without its marker is a copy that did not end: made again.
    hv.delete_volume(pool, &name).await?;
    let dir = image::download_dir().map_err(|e| image::failed("creating a folder for the download", e))?;
    let file = dir.path().join("image");
    let length = download::download(image, &file, &progress.download).await?;
    progress.set_stage(format!(
        "checksum verified; writing {} to the storage",
        shown_url(&image.url)
    ));
    let (format, capacity) = image_facts(&file, length)
        .await
        .map_err(|e| image::failed("reading the downloaded image", e))?
        .map_err(|refusal| ImportFailure::refused(format!("{}: {refusal}", shown_url(&image.url))))?;
    let part = part_name(&name);
    hv.delete_volume(pool, &part).await?;
    hv.create_volume(pool, &xml::plain_volume_xml(&part, capacity, format))
        .await?;
    hv.upload_volume_file(pool, &part, &file, length).await?;
    hv.clone_volume(pool, &xml::plain_volume_xml(&name, capacity, format), &part)
        .await?;
    hv.create_volume(pool, &xml::plain_volume_xml(&marker, 512, "raw"))
        .await?;
    hv.delete_volume(pool, &part).await?;
    Ok(())
}

/// The format (`qcow2` or `raw`) and the virtual size in bytes of a downloaded image, or why it
/// is refused.
async fn image_facts(path: &Path, length: u64) -> std::io::Result<Result<(&'static str, u64), String>> {
    use tokio::io::AsyncReadExt;
    let mut header = Vec::with_capacity(104);
    tokio::fs::File::open(path)
        .await?
        .take(104)
        .read_to_end(&mut header)
        .await?;
    Ok(classify(&header, length))
}

/// Compressed files the image may be by mistake: their first bytes and names.
const COMPRESSED: [(&[u8], &str); 4] = [
    (b"\x1f\x8b", "gzip"),
    (b"\xfd7zXZ\0", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"BZh", "bzip2"),
];

fn be_u64(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    buf.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(buf)
}

/// What a downloaded image is, from its first bytes: QCOW2 (version 2 or 3, no backing file and
/// no external data file: either would make libvirt's copy read a file of the host) with its
/// virtual size, a compressed file (refused: the URL should name the image itself), or raw.
fn classify(header: &[u8], length: u64) -> Result<(&'static str, u64), String> {
    if let Some((_, kind)) = COMPRESSED.iter().find(|(magic, _)| header.starts_with(magic)) {
        return Err(format!(
            "the file is {kind}-compressed: give the URL of the uncompressed image (QCOW2 or raw)"
        ));
    }
    if !header.starts_with(QCOW2_MAGIC) {
        return Ok(("raw", length));
    }
    if header.len() < 104 {
        return Err("a QCOW2 header cut short".into());
    }
    let version = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    if !(2..=3).contains(&version) {
        return Err(format!("QCOW2 version {version} (2 or 3 are read)"));
    }
    if be_u64(&header[8..16]) != 0 {
        return Err("the QCOW2 image names a backing file: only self-contained images are imported".into());
    }
    if version == 3 && be_u64(&header[72..80]) & 0b100 != 0 {
        return Err(
            "the QCOW2 image uses an external data file: only self-contained images are imported".into(),
        );
    }
    Ok(("qcow2", be_u64(&header[24..32])))
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

    /// A QCOW2 version 3 header of `size` bytes, with a backing file offset and incompatible
    /// features as given.
    fn qcow2(size: u64, backing_offset: u64, incompatible: u64) -> Vec<u8> {
        let mut header = b"QFI\xfb\0\0\0\x03".to_vec();
        header.extend_from_slice(&backing_offset.to_be_bytes());
        header.extend_from_slice(&[0; 8]);
        header.extend_from_slice(&size.to_be_bytes());
        header.resize(72, 0);
        header.extend_from_slice(&incompatible.to_be_bytes());
        header.resize(104, 0);
        header
    }

    #[test]
    fn a_self_contained_qcow2_gives_its_virtual_size_anything_else_is_raw() {
        assert_eq!(classify(&qcow2(5 << 30, 0, 0), 1000), Ok(("qcow2", 5 << 30)));
        assert_eq!(classify(&[0; 104], 1000), Ok(("raw", 1000)));
        assert_eq!(classify(b"", 0), Ok(("raw", 0)));
    }

    #[test]
    fn an_image_that_would_read_host_files_or_is_compressed_is_refused() {
        for (header, why) in [
            (qcow2(1 << 30, 512, 0), "backing file"),
            (qcow2(1 << 30, 0, 0b100), "external data file"),
            (
                b"QFI\xfb\0\0\0\x09".iter().copied().chain([0; 96]).collect(),
                "version 9",
            ),
            (b"QFI\xfb\0\0\0\x03".to_vec(), "cut short"),
            (b"\x1f\x8b\x08\0".to_vec(), "gzip"),
            (b"\xfd7zXZ\0\0".to_vec(), "xz"),
        ] {
            let refusal = classify(&header, 100).unwrap_err();
            assert!(refusal.contains(why), "{refusal}");
        }
    }
}
