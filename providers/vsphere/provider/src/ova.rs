//! The files of an OVA: a tar archive (ustar, with GNU long names and PAX `path` and `size`
//! records)
//! holding the OVF descriptor and its disks. Only the headers are read; a file is where it lies
//! in the archive (offset and length), so a disk is uploaded straight from the download.

use std::collections::BTreeMap;
use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncSeekExt};

const BLOCK: u64 = 512;
/// Longest OVF descriptor read into memory.
const MAX_DESCRIPTOR: u64 = 8 << 20;

/// Where a file lies in the archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Byte offset of its content.
    pub offset: u64,
    /// Its length.
    pub length: u64,
}

/// An OVA's descriptor and files.
#[derive(Debug)]
pub struct Ova {
    /// The `.ovf` descriptor's text.
    pub descriptor: String,
    /// Every regular file by its path in the archive.
    pub files: BTreeMap<String, Entry>,
}

/// Why an OVA cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OvaError {
    /// Reading the file failed.
    #[error("reading the OVA: {0}")]
    Io(#[from] std::io::Error),
    /// The archive is not a tar archive, or is cut short.
    #[error("the image is not an OVA (a tar archive): {0}")]
    NotTar(String),
    /// No `.ovf` descriptor in it.
    #[error("the OVA holds no .ovf descriptor (files: {0})")]
    NoDescriptor(String),
}

/// A header field as text, up to its first NUL.
fn text(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// A header's octal size field (or GNU base-256 for large files).
fn size_of(field: &[u8]) -> Result<u64, OvaError> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        return field[1..]
            .iter()
            .try_fold(0u64, |n, &b| n.checked_mul(256).map(|n| n | u64::from(b)))
            .ok_or_else(|| OvaError::NotTar("a size beyond 64 bits".into()));
    }
    let digits = text(field);
    let digits = digits.trim_matches(|c: char| c == ' ' || c == '\0');
    if digits.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(digits, 8).map_err(|_| OvaError::NotTar(format!("bad size field {digits:?}")))
}

/// The `path` and `size` records of a PAX extended header (each record is
/// `<length> <key>=<value>\n`, its length counting itself); what does not parse is left out.
fn pax_records(mut records: &[u8]) -> (Option<String>, Option<u64>) {
    let (mut path, mut size) = (None, None);
    while let Some(space) = records.iter().position(|&b| b == b' ') {
        let Some(length) = std::str::from_utf8(&records[..space])
            .ok()
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| n > space && n <= records.len())
        else {
            break;
        };
        let record = String::from_utf8_lossy(&records[space + 1..length]);
        let record = record.trim_end_matches('\n');
        if let Some(value) = record.strip_prefix("path=") {
            path = Some(value.to_owned());
        } else if let Some(value) = record.strip_prefix("size=") {
            size = value.parse().ok();
        }
        records = &records[length..];
    }
    (path, size)
}

/// The first 64 KiB at most of `length` bytes at `offset` (a long name, PAX records).
async fn read_at(file: &mut tokio::fs::File, offset: u64, length: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; length.min(64 << 10) as usize];
    file.seek(std::io::SeekFrom::Start(offset)).await?;
    file.read_exact(&mut buf).await?;
    Ok(buf)
}

/// Reads the archive's headers and its descriptor.
pub async fn read(path: &Path) -> Result<Ova, OvaError> {
    let mut file = tokio::fs::File::open(path).await?;
    let total = file.metadata().await?.len();
    let mut files = BTreeMap::new();
    let mut offset = 0u64;
    // What a GNU long name or a PAX header says of the entry after it.
    let (mut long_name, mut pax_size): (Option<String>, Option<u64>) = (None, None);
    while offset + BLOCK <= total {
        let mut header = [0u8; BLOCK as usize];
        file.seek(std::io::SeekFrom::Start(offset)).await?;
        file.read_exact(&mut header).await?;
        if header.iter().all(|&b| b == 0) {
            break;
        }
        let kind = header[156];
        // A PAX `size` replaces the header's (0 for files of 8 GiB and more).
        let length = match (kind, pax_size) {
            (b'0' | 0, Some(size)) => size,
            _ => size_of(&header[124..136])?,
        };
        let data = offset + BLOCK;
        if data.checked_add(length).is_none_or(|end| end > total) {
            return Err(OvaError::NotTar(format!(
                "an entry runs past the end ({total} bytes)"
            )));
        }
        match kind {
            b'L' => long_name = Some(text(&read_at(&mut file, data, length).await?)),
            b'x' => {
                let (path, size) = pax_records(&read_at(&mut file, data, length).await?);
                long_name = path;
                pax_size = size;
            }
            b'0' | 0 => {
                let name = long_name.take().unwrap_or_else(|| {
                    let prefix = text(&header[345..500]);
                    let name = text(&header[..100]);
                    // Only POSIX ustar has a name prefix there (GNU keeps times in it).
                    if &header[257..263] == b"ustar\0" && !prefix.is_empty() {
                        format!("{prefix}/{name}")
                    } else {
                        name
                    }
                });
                pax_size = None;
                files.insert(
                    name.trim_start_matches("./").to_owned(),
                    Entry { offset: data, length },
                );
            }
            _ => (long_name, pax_size) = (None, None),
        }
        offset = data + length.div_ceil(BLOCK) * BLOCK;
    }
    let (_, descriptor) = files
        .iter()
        .find(|(name, _)| name.to_ascii_lowercase().ends_with(".ovf"))
        .ok_or_else(|| OvaError::NoDescriptor(files.keys().cloned().collect::<Vec<_>>().join(", ")))?;
    if descriptor.length > MAX_DESCRIPTOR {
        return Err(OvaError::NotTar(format!(
            "a descriptor of {} bytes",
            descriptor.length
        )));
    }
    let mut text = vec![0u8; descriptor.length as usize];
    file.seek(std::io::SeekFrom::Start(descriptor.offset)).await?;
    file.read_exact(&mut text).await?;
    Ok(Ova {
        descriptor: String::from_utf8_lossy(&text).into_owned(),
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_testenv::files::ustar as pack;

    #[tokio::test]
    async fn the_descriptor_and_the_disks_are_found_where_they_lie() {
        let disk = vec![7u8; 1300];
        let archive = pack(&[("noble.ovf", b"<Envelope/>"), ("noble-disk1.vmdk", &disk)]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.ova");
        std::fs::write(&path, &archive).unwrap();
        let ova = read(&path).await.unwrap();
        assert_eq!(ova.descriptor, "<Envelope/>");
        let entry = ova.files["noble-disk1.vmdk"];
        assert_eq!(entry.length, 1300);
        assert_eq!(&archive[entry.offset as usize..][..1300], disk.as_slice());
    }

    #[tokio::test]
    async fn a_broken_archive_is_an_error_never_a_panic() {
        let valid = pack(&[("a.ovf", b"<Envelope/>"), ("disk.vmdk", &[1u8; 2000])]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.ova");
        let mut cases: Vec<Vec<u8>> = (0..valid.len())
            .step_by(61)
            .map(|cut| valid[..cut].to_vec())
            .collect();
        for (i, byte) in [
            (124usize, b'9'),
            (130, 0xff),
            (156, b'L'),
            (156, b'x'),
            (0, 0),
            (257, b'u'),
            (345, b'/'),
        ] {
            let mut broken = valid.clone();
            broken[i] = byte;
            cases.push(broken);
        }
        // A size field claiming more than the archive holds, and GNU base-256 sizes.
        let mut huge = valid.clone();
        huge[124..136].copy_from_slice(b"77777777777\0");
        cases.push(huge);
        let mut base256 = valid.clone();
        base256[124] = 0x80;
        base256[125..136].fill(0xff);
        cases.push(base256);
        for case in cases {
            std::fs::write(&path, &case).unwrap();
            if let Ok(ova) = read(&path).await {
                for entry in ova.files.values() {
                    assert!(
                        entry.offset + entry.length <= case.len() as u64,
                        "an entry inside the file"
                    );
                }
            }
        }
    }

    #[test]
    fn pax_records_are_read_by_their_length() {
        let records = b"31 path=disks/noble-disk1.vmdk\n19 size=8589934592\n";
        assert_eq!(
            pax_records(records),
            (Some("disks/noble-disk1.vmdk".to_owned()), Some(8_589_934_592))
        );
        assert_eq!(
            pax_records(b"999 path=x\n"),
            (None, None),
            "a length beyond the records"
        );
    }

    #[tokio::test]
    async fn a_pax_size_replaces_the_header_s() {
        // As Go's and Python's tar write a file too large for the header: size 0 there, the real
        // one in a PAX record before it.
        let disk = vec![3u8; 700];
        let mut archive = pack(&[("a.ovf", b"<Envelope/>")]);
        archive.truncate(archive.len() - 2 * BLOCK as usize);
        let pax = pack(&[("PaxHeaders/disk.vmdk", b"12 size=700\n")]);
        let mut pax = pax[..pax.len() - 2 * BLOCK as usize].to_vec();
        pax[156] = b'x';
        pax[148..156].copy_from_slice(b"        ");
        let sum: u32 = pax[..BLOCK as usize].iter().map(|&b| u32::from(b)).sum();
        pax[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        archive.extend_from_slice(&pax);
        let entry = pack(&[("disk.vmdk", &disk)]);
        let mut header = entry[..BLOCK as usize].to_vec();
        header[124..135].copy_from_slice(b"00000000000");
        archive.extend_from_slice(&header);
        archive.extend_from_slice(&entry[BLOCK as usize..]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.ova");
        std::fs::write(&path, &archive).unwrap();
        let ova = read(&path).await.unwrap();
        assert_eq!(ova.files["disk.vmdk"].length, 700);
        let e = ova.files["disk.vmdk"];
        assert_eq!(&archive[e.offset as usize..][..700], disk.as_slice());
    }

    #[tokio::test]
    async fn what_is_not_an_ova_is_said_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.img");
        std::fs::write(&path, b"QFI\xfb not a tar archive at all").unwrap();
        assert!(matches!(
            read(&path).await,
            Err(OvaError::NoDescriptor(_) | OvaError::NotTar(_))
        ));
        let only_disk = dir.path().join("b.ova");
        std::fs::write(&only_disk, pack(&[("disk.vmdk", b"x")])).unwrap();
        assert!(matches!(read(&only_disk).await, Err(OvaError::NoDescriptor(f)) if f == "disk.vmdk"));
    }
}
