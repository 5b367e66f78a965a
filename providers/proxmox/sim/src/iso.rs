//! A minimal ISO 9660 reader for NoCloud seed images: lists the files of the root directory with
//! their names from Joliet (preferred), Rock Ridge `NM` entries, or plain ISO 9660 names.

use std::collections::BTreeMap;

const SECTOR: usize = 2048;
const FIRST_DESCRIPTOR: usize = 16;
/// Seed files are tiny; refuse to materialise anything larger than this per file.
const MAX_FILE: usize = 16 * 1024 * 1024;

/// Why an image could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IsoError {
    /// The image ends before a structure it references.
    #[error("ISO image truncated at byte {0}")]
    Truncated(usize),
    /// No primary volume descriptor (`CD001`, type 1) was found.
    #[error("not an ISO 9660 image (no primary volume descriptor)")]
    NoPrimaryDescriptor,
    /// A directory record is malformed.
    #[error("malformed directory record at byte {0}")]
    BadRecord(usize),
    /// A file is larger than the reader accepts.
    #[error("file {name} is {size} bytes, larger than the {MAX_FILE} bytes a seed file may have")]
    TooLarge {
        /// File name.
        name: String,
        /// Declared size.
        size: usize,
    },
}

/// A decoded image: its volume id and root-directory files by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IsoImage {
    /// Volume identifier of the primary descriptor (e.g. `cidata`), trimmed.
    pub volume_id: String,
    /// Root directory files: name → content.
    pub files: BTreeMap<String, Vec<u8>>,
    /// The image itself, byte for byte.
    pub image: Vec<u8>,
}

/// Reads the root directory of an ISO 9660 image.
pub fn read_image(image: &[u8]) -> Result<IsoImage, IsoError> {
    let mut primary = None;
    let mut joliet = None;
    for index in FIRST_DESCRIPTOR..FIRST_DESCRIPTOR + 32 {
        let desc = slice(image, index * SECTOR, SECTOR)?;
        if &desc[1..6] != b"CD001" {
            break;
        }
        match desc[0] {
            1 if primary.is_none() => primary = Some(desc),
            2 if matches!(&desc[88..91], b"%/@" | b"%/C" | b"%/E") => joliet = Some(desc),
            255 => break,
            _ => {}
        }
    }
    let primary = primary.ok_or(IsoError::NoPrimaryDescriptor)?;
    let volume_id = String::from_utf8_lossy(&primary[40..72]).trim().to_owned();
    let files = match joliet {
        Some(desc) => read_root(image, desc, NameSource::Joliet)?,
        None => read_root(image, primary, NameSource::Primary)?,
    };
    Ok(IsoImage {
        volume_id,
        files,
        image: image.to_vec(),
    })
}

#[derive(Clone, Copy)]
enum NameSource {
    Joliet,
    Primary,
}

fn read_root(image: &[u8], desc: &[u8], names: NameSource) -> Result<BTreeMap<String, Vec<u8>>, IsoError> {
    let root = &desc[156..190];
    let extent = le32(root, 2) as usize;
    let length = le32(root, 10) as usize;
    let dir = slice(image, extent * SECTOR, length)?;
    let mut files = BTreeMap::new();
    let mut pos = 0;
    while pos < dir.len() {
        let len = dir[pos] as usize;
        if len == 0 {
            // Records never cross sectors; skip the padding to the next sector.
            pos = (pos / SECTOR + 1) * SECTOR;
            continue;
        }
        let rec = dir
            .get(pos..pos + len)
            .ok_or(IsoError::BadRecord(extent * SECTOR + pos))?;
        if len < 34 {
            return Err(IsoError::BadRecord(extent * SECTOR + pos));
        }
        let name_len = rec[32] as usize;
        let raw_name = rec
            .get(33..33 + name_len)
            .ok_or(IsoError::BadRecord(extent * SECTOR + pos))?;
        let is_dir = rec[25] & 0x02 != 0;
        let special = name_len == 1 && (raw_name[0] == 0 || raw_name[0] == 1);
        if !is_dir && !special {
            let name = match names {
                NameSource::Joliet => joliet_name(raw_name),
                NameSource::Primary => {
                    let su_start = 33 + name_len + usize::from(name_len.is_multiple_of(2));
                    rock_ridge_name(rec.get(su_start..).unwrap_or_default())
                        .unwrap_or_else(|| plain_name(raw_name))
                }
            };
            let size = le32(rec, 10) as usize;
            if size > MAX_FILE {
                return Err(IsoError::TooLarge { name, size });
            }
            let data = slice(image, le32(rec, 2) as usize * SECTOR, size)?;
            files.insert(name, data.to_vec());
        }
        pos += len;
    }
    Ok(files)
}

fn slice(image: &[u8], start: usize, len: usize) -> Result<&[u8], IsoError> {
    image
        .get(start..start.saturating_add(len))
        .ok_or(IsoError::Truncated(start.saturating_add(len)))
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn strip_version(name: &str) -> String {
    let base = name.split(';').next().unwrap_or(name);
    base.strip_suffix('.').unwrap_or(base).to_owned()
}

fn joliet_name(raw: &[u8]) -> String {
    let units: Vec<u16> = raw
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    strip_version(&String::from_utf16_lossy(&units))
}

fn plain_name(raw: &[u8]) -> String {
    strip_version(&String::from_utf8_lossy(raw)).to_lowercase()
}

/// Finds a Rock Ridge `NM` (alternate name) entry in a System Use area.
fn rock_ridge_name(mut su: &[u8]) -> Option<String> {
    let mut name = String::new();
    while su.len() >= 4 {
        let len = su[2] as usize;
        if len < 4 || len > su.len() {
            break;
        }
        if &su[0..2] == b"NM" && len >= 5 {
            name.push_str(&String::from_utf8_lossy(&su[5..len]));
            if su[4] & 0x01 == 0 {
                return Some(name);
            }
        }
        su = &su[len..];
    }
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_garbage_without_panicking() {
        assert_eq!(
            read_image(b"not an iso"),
            Err(IsoError::Truncated(FIRST_DESCRIPTOR * SECTOR + SECTOR))
        );
        let zeros = vec![0u8; 40 * SECTOR];
        assert_eq!(read_image(&zeros), Err(IsoError::NoPrimaryDescriptor));
    }

    #[test]
    fn reads_rock_ridge_names() {
        let mut su = b"PX\x0c\x01aaaaaaaa".to_vec();
        su.extend_from_slice(b"NM\x0e\x01\x00user-data");
        assert_eq!(rock_ridge_name(&su).as_deref(), Some("user-data"));
        assert_eq!(plain_name(b"USER_DAT.;1"), "user_dat");
    }
}
