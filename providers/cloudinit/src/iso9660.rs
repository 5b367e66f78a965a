//! A minimal ISO 9660 image writer and reader for cloud-init seed images.
//!
//! The writer produces a single-directory image with a primary volume descriptor (ECMA-119) and a
//! Joliet supplementary volume descriptor (UCS-2 names), which is what Linux, cloud-init's NoCloud
//! datasource and `isoinfo` read. Output is deterministic: the same files give the same bytes
//! (no timestamps are recorded), so a seed's hash identifies its content.
//!
//! The reader understands images from this writer and from `genisoimage`/`xorriso` (primary and
//! Joliet root directories; nested directories are not needed for seeds and are not read).

use std::collections::BTreeMap;

use crate::{Error, Result};

const SECTOR: usize = 2048;
/// Sectors 0..16 are the system area.
const FIRST_DESCRIPTOR: usize = 16;
/// Joliet escape sequence for UCS-2 level 3.
const JOLIET_ESCAPE: &[u8; 3] = b"%/E";
/// Seed images hold a handful of small files; one directory sector holds ~40 entries.
const MAX_FILES: usize = 32;
const MAX_NAME_LEN: usize = 64;

/// One file of an image, by name (as the guest sees it through Joliet) and content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsoFile {
    pub name: String,
    pub data: Vec<u8>,
}

/// Builds an ISO 9660 + Joliet image holding `files` in its root directory.
///
/// Names must be 1–64 characters of ASCII letters, digits, `-`, `_` and `.`, unique ignoring case.
pub fn write_image(volume_id: &str, files: &[IsoFile]) -> Result<Vec<u8>> {
    validate(volume_id, files)?;
    let mut files: Vec<&IsoFile> = files.iter().collect();
    files.sort_by(|a, b| a.name.cmp(&b.name));

    // Fixed layout: descriptors, four path tables, two root directories, then file data.
    let pvd_sector = FIRST_DESCRIPTOR;
    let svd_sector = pvd_sector + 1;
    let terminator_sector = svd_sector + 1;
    let primary_l_table = terminator_sector + 1;
    let primary_m_table = primary_l_table + 1;
    let joliet_l_table = primary_m_table + 1;
    let joliet_m_table = joliet_l_table + 1;
    let primary_root = joliet_m_table + 1;
    let joliet_root = primary_root + 1;
    let mut next_sector = joliet_root + 1;

    let mut extents = Vec::with_capacity(files.len());
    for file in &files {
        extents.push(next_sector);
        next_sector += file.data.len().div_ceil(SECTOR);
    }
    let total_sectors = next_sector;

    let primary_entries: Vec<DirEntry> = files
        .iter()
        .zip(&extents)
        .map(|(file, &extent)| DirEntry {
            identifier: primary_identifier(&file.name),
            extent,
            size: file.data.len(),
        })
        .collect();
    let mut joliet_entries: Vec<DirEntry> = files
        .iter()
        .zip(&extents)
        .map(|(file, &extent)| DirEntry {
            identifier: ucs2(&file.name),
            extent,
            size: file.data.len(),
        })
        .collect();
    joliet_entries.sort_by(|a, b| a.identifier.cmp(&b.identifier));

    let mut image = vec![0u8; total_sectors * SECTOR];
    let sector = |n: usize| n * SECTOR..(n + 1) * SECTOR;

    let primary = VolumeDescriptor {
        kind: 1,
        volume_id: pad_ascii(volume_id, 32),
        escape: None,
        root_extent: primary_root,
        l_table: primary_l_table,
        m_table: primary_m_table,
        total_sectors,
        text_field: pad_ascii,
    };
    let joliet = VolumeDescriptor {
        kind: 2,
        volume_id: pad_ucs2(volume_id, 32),
        escape: Some(JOLIET_ESCAPE),
        root_extent: joliet_root,
        l_table: joliet_l_table,
        m_table: joliet_m_table,
        total_sectors,
        text_field: pad_ucs2,
    };
    let range = sector(pvd_sector);
    primary.write(&mut image[range]);
    let range = sector(svd_sector);
    joliet.write(&mut image[range]);
    let range = sector(terminator_sector);
    let terminator = &mut image[range];
    terminator[0] = 255;
    terminator[1..6].copy_from_slice(b"CD001");
    terminator[6] = 1;

    for (l, m, root) in [
        (primary_l_table, primary_m_table, primary_root),
        (joliet_l_table, joliet_m_table, joliet_root),
    ] {
        let range = sector(l);
        write_path_table(&mut image[range], root, Endian::Little);
        let range = sector(m);
        write_path_table(&mut image[range], root, Endian::Big);
    }

    for (root, entries) in [(primary_root, &primary_entries), (joliet_root, &joliet_entries)] {
        let range = sector(root);
        write_directory(&mut image[range], root, entries)?;
    }

    for (file, &extent) in files.iter().zip(&extents) {
        let start = extent * SECTOR;
        image[start..start + file.data.len()].copy_from_slice(&file.data);
    }
    Ok(image)
}

fn validate(volume_id: &str, files: &[IsoFile]) -> Result<()> {
    if volume_id.is_empty() || volume_id.len() > 16 || !volume_id.bytes().all(is_name_byte) {
        return Err(Error::InvalidIso(format!(
            "volume id {volume_id:?} must be 1-16 ASCII letters, digits, '-', '_' or '.'"
        )));
    }
    if files.len() > MAX_FILES {
        return Err(Error::InvalidIso(format!(
            "{} files given; a seed image holds at most {MAX_FILES}",
            files.len()
        )));
    }
    let mut seen = BTreeMap::new();
    for file in files {
        let name = &file.name;
        if name.is_empty() || name.len() > MAX_NAME_LEN || !name.bytes().all(is_name_byte) {
            return Err(Error::InvalidIso(format!(
                "file name {name:?} must be 1-{MAX_NAME_LEN} ASCII letters, digits, '-', '_' or '.'"
            )));
        }
        if name.starts_with('.') {
            return Err(Error::InvalidIso(format!(
                "file name {name:?} must not start with '.'"
            )));
        }
        if let Some(previous) = seen.insert(primary_identifier(name), name) {
            return Err(Error::InvalidIso(format!(
                "file names {previous:?} and {name:?} collide in the ISO 9660 namespace"
            )));
        }
        if u32::try_from(file.data.len()).is_err() {
            return Err(Error::InvalidIso(format!("file {name:?} is larger than 4 GiB")));
        }
    }
    Ok(())
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
}

/// The ISO 9660 (level 2) identifier for a name: upper case d-characters, one dot, version `;1`.
fn primary_identifier(name: &str) -> Vec<u8> {
    let (stem, extension) = match name.rfind('.') {
        Some(dot) => (&name[..dot], &name[dot + 1..]),
        None => (name, ""),
    };
    let map = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!("{}.{};1", map(stem), map(extension)).into_bytes()
}

fn ucs2(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_be_bytes).collect()
}

fn pad_ascii(s: &str, len: usize) -> Vec<u8> {
    let mut out = s.as_bytes().to_vec();
    out.resize(len, b' ');
    out
}

fn pad_ucs2(s: &str, len: usize) -> Vec<u8> {
    let mut out = ucs2(s);
    while out.len() + 2 <= len {
        out.extend_from_slice(&[0, b' ']);
    }
    out.resize(len, 0);
    out
}

#[derive(Clone, Copy)]
enum Endian {
    Little,
    Big,
}

fn both_u16(out: &mut [u8], value: u16) {
    out[..2].copy_from_slice(&value.to_le_bytes());
    out[2..4].copy_from_slice(&value.to_be_bytes());
}

fn both_u32(out: &mut [u8], value: usize) {
    let value = u32::try_from(value).unwrap_or(u32::MAX);
    out[..4].copy_from_slice(&value.to_le_bytes());
    out[4..8].copy_from_slice(&value.to_be_bytes());
}

struct VolumeDescriptor {
    kind: u8,
    volume_id: Vec<u8>,
    escape: Option<&'static [u8; 3]>,
    root_extent: usize,
    l_table: usize,
    m_table: usize,
    total_sectors: usize,
    text_field: fn(&str, usize) -> Vec<u8>,
}

impl VolumeDescriptor {
    fn write(&self, out: &mut [u8]) {
        out[0] = self.kind;
        out[1..6].copy_from_slice(b"CD001");
        out[6] = 1;
        out[8..40].copy_from_slice(&(self.text_field)("", 32));
        out[40..72].copy_from_slice(&self.volume_id);
        both_u32(&mut out[80..88], self.total_sectors);
        if let Some(escape) = self.escape {
            out[88..91].copy_from_slice(escape);
        }
        both_u16(&mut out[120..124], 1);
        both_u16(&mut out[124..128], 1);
        both_u16(&mut out[128..132], SECTOR as u16);
        both_u32(&mut out[132..140], ROOT_PATH_TABLE_LEN);
        out[140..144].copy_from_slice(&(self.l_table as u32).to_le_bytes());
        out[148..152].copy_from_slice(&(self.m_table as u32).to_be_bytes());
        write_record(&mut out[156..190], &[0], self.root_extent, SECTOR, true);
        out[190..318].copy_from_slice(&(self.text_field)("", 128));
        out[318..446].copy_from_slice(&(self.text_field)("", 128));
        out[446..574].copy_from_slice(&(self.text_field)("", 128));
        out[574..702].copy_from_slice(&(self.text_field)("BANLIEUE", 128));
        out[702..739].copy_from_slice(&(self.text_field)("", 37));
        out[739..776].copy_from_slice(&(self.text_field)("", 37));
        out[776..813].copy_from_slice(&(self.text_field)("", 37));
        // Dates "not specified": sixteen '0' digits and a zero offset.
        for start in [813, 830, 847, 864] {
            out[start..start + 16].fill(b'0');
            out[start + 16] = 0;
        }
        out[881] = 1;
    }
}

/// A path table with only the root directory: 8 bytes of header + 1-byte identifier + padding.
const ROOT_PATH_TABLE_LEN: usize = 10;

fn write_path_table(out: &mut [u8], root_extent: usize, endian: Endian) {
    out[0] = 1; // identifier length
    out[1] = 0; // extended attribute record length
    let extent = root_extent as u32;
    match endian {
        Endian::Little => {
            out[2..6].copy_from_slice(&extent.to_le_bytes());
            out[6..8].copy_from_slice(&1u16.to_le_bytes());
        }
        Endian::Big => {
            out[2..6].copy_from_slice(&extent.to_be_bytes());
            out[6..8].copy_from_slice(&1u16.to_be_bytes());
        }
    }
    out[8] = 0; // root identifier
}

struct DirEntry {
    identifier: Vec<u8>,
    extent: usize,
    size: usize,
}

fn record_len(identifier_len: usize) -> usize {
    33 + identifier_len + usize::from(identifier_len.is_multiple_of(2))
}

/// Writes one directory record; returns its length.
fn write_record(out: &mut [u8], identifier: &[u8], extent: usize, size: usize, directory: bool) -> usize {
    let len = record_len(identifier.len());
    out[0] = len as u8;
    out[1] = 0;
    both_u32(&mut out[2..10], extent);
    both_u32(&mut out[10..18], size);
    // Recording date: 1970-01-01 00:00:00 UTC (years since 1900, month, day, h, m, s, offset).
    out[18..25].copy_from_slice(&[70, 1, 1, 0, 0, 0, 0]);
    out[25] = if directory { 0x02 } else { 0x00 };
    out[26] = 0;
    out[27] = 0;
    both_u16(&mut out[28..32], 1);
    out[32] = identifier.len() as u8;
    out[33..33 + identifier.len()].copy_from_slice(identifier);
    len
}

fn write_directory(out: &mut [u8], own_extent: usize, entries: &[DirEntry]) -> Result<()> {
    let mut offset = 0;
    offset += write_record(&mut out[offset..], &[0], own_extent, SECTOR, true);
    offset += write_record(&mut out[offset..], &[1], own_extent, SECTOR, true);
    for entry in entries {
        let len = record_len(entry.identifier.len());
        if offset + len > SECTOR {
            return Err(Error::InvalidIso(
                "the root directory does not fit in one sector".into(),
            ));
        }
        offset += write_record(
            &mut out[offset..],
            &entry.identifier,
            entry.extent,
            entry.size,
            false,
        );
    }
    Ok(())
}

/// Reads the files of an image's root directory, by their Joliet names when the image has a
/// Joliet descriptor, else by their ISO 9660 names with the `;1` version and a trailing dot removed
/// and lower-cased (as Linux shows them with `map=normal`).
pub fn read_root_files(image: &[u8]) -> Result<Vec<IsoFile>> {
    let mut primary_root = None;
    let mut joliet_root = None;
    for index in FIRST_DESCRIPTOR.. {
        let descriptor = image
            .get(index * SECTOR..(index + 1) * SECTOR)
            .ok_or_else(|| Error::InvalidIso("no volume descriptor set terminator".into()))?;
        if &descriptor[1..6] != b"CD001" {
            return Err(Error::InvalidIso(format!(
                "sector {index} is not a volume descriptor"
            )));
        }
        match descriptor[0] {
            1 => primary_root = Some(parse_record(&descriptor[156..190])?),
            2 if &descriptor[88..91] == b"%/@"
                || &descriptor[88..91] == b"%/C"
                || &descriptor[88..91] == b"%/E" =>
            {
                joliet_root = Some(parse_record(&descriptor[156..190])?)
            }
            255 => break,
            _ => {}
        }
    }
    let (root, joliet) = match (joliet_root, primary_root) {
        (Some(root), _) => (root, true),
        (None, Some(root)) => (root, false),
        (None, None) => return Err(Error::InvalidIso("no primary volume descriptor".into())),
    };
    let directory = slice(image, root.extent * SECTOR, root.size)?;
    let mut files = Vec::new();
    let mut offset = 0;
    while offset < directory.len() {
        let len = directory[offset] as usize;
        if len == 0 {
            // Records never span sectors: skip to the next one.
            offset = (offset / SECTOR + 1) * SECTOR;
            continue;
        }
        let record = parse_record(slice(directory, offset, len)?)?;
        offset += len;
        if record.directory || record.identifier == [0] || record.identifier == [1] {
            continue;
        }
        let name = if joliet {
            decode_ucs2(&record.identifier)?
        } else {
            decode_primary(&record.identifier)
        };
        let data = slice(image, record.extent * SECTOR, record.size)?.to_vec();
        files.push(IsoFile { name, data });
    }
    Ok(files)
}

struct Record {
    extent: usize,
    size: usize,
    directory: bool,
    identifier: Vec<u8>,
}

fn parse_record(bytes: &[u8]) -> Result<Record> {
    if bytes.len() < 34 {
        return Err(Error::InvalidIso("truncated directory record".into()));
    }
    let extent = u32::from_le_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]) as usize;
    let size = u32::from_le_bytes([bytes[10], bytes[11], bytes[12], bytes[13]]) as usize;
    let identifier_len = bytes[32] as usize;
    let identifier = slice(bytes, 33, identifier_len)?.to_vec();
    Ok(Record {
        extent,
        size,
        directory: bytes[25] & 0x02 != 0,
        identifier,
    })
}

fn slice(bytes: &[u8], start: usize, len: usize) -> Result<&[u8]> {
    start
        .checked_add(len)
        .and_then(|end| bytes.get(start..end))
        .ok_or_else(|| Error::InvalidIso(format!("extent {start}+{len} lies outside the image")))
}

fn strip_version(name: &str) -> &str {
    let name = name.split(';').next().unwrap_or(name);
    name.strip_suffix('.').unwrap_or(name)
}

fn decode_ucs2(bytes: &[u8]) -> Result<String> {
    let units: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|pair| u16::from_be_bytes([pair[0], pair[1]]))
        .collect();
    let name =
        String::from_utf16(&units).map_err(|_| Error::InvalidIso("invalid Joliet file name".into()))?;
    Ok(strip_version(&name).to_string())
}

fn decode_primary(bytes: &[u8]) -> String {
    strip_version(&String::from_utf8_lossy(bytes)).to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, data: &str) -> IsoFile {
        IsoFile {
            name: name.into(),
            data: data.as_bytes().to_vec(),
        }
    }

    #[test]
    fn round_trips_files_through_joliet_names() {
        let big = "x".repeat(5000);
        let files = vec![
            file("user-data", "#cloud-config\n"),
            file("meta-data", "instance-id: a\n"),
            file("big", &big),
            file("empty", ""),
        ];
        let image = write_image("cidata", &files).unwrap();
        assert_eq!(image.len() % SECTOR, 0);
        let mut read = read_root_files(&image).unwrap();
        read.sort_by(|a, b| a.name.cmp(&b.name));
        let mut expected = files.clone();
        expected.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(read, expected);
    }

    #[test]
    fn output_is_deterministic_and_independent_of_input_order() {
        let a = write_image("cidata", &[file("a", "1"), file("b", "2")]).unwrap();
        let b = write_image("cidata", &[file("b", "2"), file("a", "1")]).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn primary_identifiers_are_d_characters_with_version() {
        assert_eq!(primary_identifier("user-data"), b"USER_DATA.;1");
        assert_eq!(primary_identifier("seed.iso"), b"SEED.ISO;1");
    }

    #[test]
    fn rejects_bad_names_and_collisions() {
        for bad in ["", "a/b", "naïve", ".hidden", &"n".repeat(65)] {
            let err = write_image("cidata", &[file(bad, "")]).unwrap_err();
            assert!(err.to_string().contains("file name"), "{bad:?}: {err}");
        }
        let err = write_image("cidata", &[file("user-data", ""), file("user_data", "")]).unwrap_err();
        assert!(err.to_string().contains("collide"), "{err}");
        let err = write_image("has space", &[]).unwrap_err();
        assert!(err.to_string().contains("volume id"), "{err}");
    }

    #[test]
    fn reader_rejects_garbage_without_panicking() {
        assert!(read_root_files(&[]).is_err());
        assert!(read_root_files(&vec![0u8; 40 * SECTOR]).is_err());
        let mut image = write_image("cidata", &[file("a", "1")]).unwrap();
        // Point the Joliet root at a sector past the end.
        image[17 * SECTOR + 156 + 2..17 * SECTOR + 156 + 6].copy_from_slice(&9999u32.to_le_bytes());
        assert!(read_root_files(&image).is_err());
    }
}
