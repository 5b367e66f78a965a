//! Typed helpers for VM configuration values: `net[n]`, disks, `ipconfig[n]`, sizes, tags, sshkeys.
//!
//! PVE stores most options as *property strings* (`key=value,key=value`, with a default key that may
//! appear bare). These helpers parse what PVE returns and format what it accepts.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Deserialize, Deserializer};

use crate::de;
use crate::error::{Error, Result};

/// NIC models accepted by `net[n]` (the schema's `model` enum).
pub const NET_MODELS: &[&str] = &[
    "e1000",
    "e1000-82540em",
    "e1000-82544gc",
    "e1000-82545em",
    "e1000e",
    "i82551",
    "i82557b",
    "i82559er",
    "ne2k_isa",
    "ne2k_pci",
    "pcnet",
    "rtl8139",
    "virtio",
    "vmxnet3",
];

/// Splits a property string into `(key, value)` pairs; bare words have no value.
pub fn split_property_string(s: &str) -> Vec<(&str, Option<&str>)> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (p, None),
        })
        .collect()
}

fn parse_bool01(what: &'static str, input: &str, v: &str) -> Result<bool> {
    match v {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err(Error::parse(what, input, format!("expected 0 or 1, got {v:?}"))),
    }
}

/// A `net[n]` value, e.g. `virtio=BC:24:11:00:90:00,bridge=vmbr0,tag=20,mtu=1450`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetDevice {
    /// NIC model (`virtio`, `e1000`, …).
    pub model: String,
    /// MAC address; PVE generates one (prefix `BC:24:11`) when absent.
    pub mac: Option<String>,
    /// Bridge, e.g. `vmbr0`.
    pub bridge: Option<String>,
    /// VLAN tag (1–4094).
    pub tag: Option<u16>,
    /// MTU (1–65520, or 1 = use the bridge MTU).
    pub mtu: Option<u16>,
    /// Whether the PVE firewall applies.
    pub firewall: Option<bool>,
    /// Other options, kept in order (e.g. `queues=4`, `link_down=1`).
    pub extra: Vec<(String, String)>,
}

impl NetDevice {
    /// A virtio NIC on `bridge`.
    pub fn virtio(bridge: impl Into<String>) -> Self {
        Self {
            model: "virtio".into(),
            bridge: Some(bridge.into()),
            ..Self::default()
        }
    }
}

impl FromStr for NetDevice {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let mut dev = NetDevice::default();
        for (key, value) in split_property_string(s) {
            let need = |v: Option<&'_ str>| {
                v.map(str::to_owned)
                    .ok_or_else(|| Error::parse("net device", s, format!("{key} needs a value")))
            };
            match key {
                k if NET_MODELS.contains(&k) => {
                    dev.model = k.to_owned();
                    dev.mac = value.map(str::to_owned);
                }
                "model" => dev.model = need(value)?,
                "macaddr" => dev.mac = Some(need(value)?),
                "bridge" => dev.bridge = Some(need(value)?),
                "tag" => {
                    let tag = need(value)?.parse().ok().filter(|t| (1..=4094).contains(t));
                    dev.tag = Some(tag.ok_or_else(|| Error::parse("net device", s, "tag must be 1-4094"))?);
                }
                "mtu" => {
                    let mtu = need(value)?.parse().ok().filter(|m| (1..=65520).contains(m));
                    dev.mtu = Some(mtu.ok_or_else(|| Error::parse("net device", s, "mtu must be 1-65520"))?);
                }
                "firewall" => dev.firewall = Some(parse_bool01("net device", s, &need(value)?)?),
                _ => match value {
                    Some(v) => dev.extra.push((key.to_owned(), v.to_owned())),
                    None => return Err(Error::parse("net device", s, format!("unknown model {key:?}"))),
                },
            }
        }
        if dev.model.is_empty() {
            return Err(Error::parse("net device", s, "no NIC model"));
        }
        Ok(dev)
    }
}

impl fmt::Display for NetDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.model)?;
        if let Some(mac) = &self.mac {
            write!(f, "={mac}")?;
        }
        if let Some(bridge) = &self.bridge {
            write!(f, ",bridge={bridge}")?;
        }
        if let Some(fw) = self.firewall {
            write!(f, ",firewall={}", u8::from(fw))?;
        }
        if let Some(mtu) = self.mtu {
            write!(f, ",mtu={mtu}")?;
        }
        if let Some(tag) = self.tag {
            write!(f, ",tag={tag}")?;
        }
        for (k, v) in &self.extra {
            write!(f, ",{k}={v}")?;
        }
        Ok(())
    }
}

/// A size as PVE writes it (`32G`, `512M`, `1T`, or plain bytes). Units are binary (K = 1024).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Size(pub u64);

const UNITS: [(char, u64); 4] = [('T', 1 << 40), ('G', 1 << 30), ('M', 1 << 20), ('K', 1 << 10)];

impl Size {
    /// `n` gibibytes.
    pub const fn gib(n: u64) -> Self {
        Self(n << 30)
    }

    /// `n` mebibytes.
    pub const fn mib(n: u64) -> Self {
        Self(n << 20)
    }

    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for Size {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        let (num, mult) = match t.chars().last() {
            Some(c) if c.is_ascii_alphabetic() => {
                let unit = UNITS.iter().find(|(u, _)| *u == c.to_ascii_uppercase());
                let (_, mult) = unit.ok_or_else(|| Error::parse("size", s, "unit must be K, M, G or T"))?;
                (&t[..t.len() - 1], *mult)
            }
            _ => (t, 1),
        };
        let valid = !num.is_empty()
            && num.chars().all(|c| c.is_ascii_digit() || c == '.')
            && num.matches('.').count() <= 1
            && !num.starts_with('.')
            && !num.ends_with('.');
        if !valid {
            return Err(Error::parse(
                "size",
                s,
                "expected a number with an optional K/M/G/T unit",
            ));
        }
        let bytes = match num.split_once('.') {
            None => num.parse::<u64>().ok().and_then(|n| n.checked_mul(mult)),
            Some(_) => num
                .parse::<f64>()
                .ok()
                .map(|f| f * mult as f64)
                .filter(|b| *b < u64::MAX as f64)
                .map(|b| b as u64),
        };
        bytes
            .map(Size)
            .ok_or_else(|| Error::parse("size", s, "too large"))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 > 0 {
            for (unit, mult) in UNITS {
                if self.0.is_multiple_of(mult) {
                    return write!(f, "{}{unit}", self.0 / mult);
                }
            }
        }
        write!(f, "{}", self.0)
    }
}

/// The `size` argument of a disk resize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeChange {
    /// Grow by this much (`+10G`).
    Grow(Size),
    /// Grow to this absolute size (`32G`); PVE refuses to shrink.
    To(Size),
}

impl fmt::Display for SizeChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Grow(size) => write!(f, "+{size}"),
            Self::To(size) => write!(f, "{size}"),
        }
    }
}

/// True for the config keys that hold disks or cdroms (`scsi0`, `virtio1`, `ide2`, `sata0`,
/// `efidisk0`, `tpmstate0`, `unused3`).
pub fn is_disk_key(key: &str) -> bool {
    let ranges: [(&str, u32); 7] = [
        ("scsi", 30),
        ("virtio", 15),
        ("sata", 5),
        ("ide", 3),
        ("efidisk", 0),
        ("tpmstate", 0),
        ("unused", 255),
    ];
    ranges.iter().any(|(prefix, max)| {
        key.strip_prefix(prefix)
            .filter(|n| {
                !n.is_empty()
                    && n.chars().all(|c| c.is_ascii_digit())
                    && (n.len() == 1 || !n.starts_with('0'))
            })
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n <= *max)
    })
}

/// A disk value, e.g. `local-lvm:vm-101-disk-0,size=32G` or `local-lvm:vm-9000-cloudinit,media=cdrom`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DiskSpec {
    /// The volume (`storage:name`), or `none`/`cdrom` for an empty drive.
    pub volume: String,
    /// The `size` option.
    pub size: Option<Size>,
    /// The `media` option (`disk` or `cdrom`).
    pub media: Option<String>,
    /// Other options, kept in order.
    pub extra: Vec<(String, String)>,
}

impl DiskSpec {
    /// The storage part of the volume id, if it has one.
    pub fn storage(&self) -> Option<&str> {
        self.volume.split_once(':').map(|(s, _)| s)
    }

    /// The volume name without the storage prefix.
    pub fn volume_name(&self) -> &str {
        self.volume
            .split_once(':')
            .map_or(self.volume.as_str(), |(_, v)| v)
    }

    /// True for a cdrom drive.
    pub fn is_cdrom(&self) -> bool {
        self.media.as_deref() == Some("cdrom")
    }
}

impl FromStr for DiskSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let mut disk = DiskSpec::default();
        for (i, (key, value)) in split_property_string(s).into_iter().enumerate() {
            match (key, value) {
                (volume, None) if i == 0 => disk.volume = volume.to_owned(),
                ("file", Some(v)) => disk.volume = v.to_owned(),
                ("size", Some(v)) => disk.size = Some(v.parse()?),
                ("media", Some(v)) => disk.media = Some(v.to_owned()),
                (k, Some(v)) => disk.extra.push((k.to_owned(), v.to_owned())),
                (k, None) => return Err(Error::parse("disk", s, format!("unexpected bare option {k:?}"))),
            }
        }
        if disk.volume.is_empty() {
            return Err(Error::parse("disk", s, "no volume"));
        }
        Ok(disk)
    }
}

impl fmt::Display for DiskSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.volume)?;
        for (k, v) in &self.extra {
            write!(f, ",{k}={v}")?;
        }
        if let Some(media) = &self.media {
            write!(f, ",media={media}")?;
        }
        if let Some(size) = self.size {
            write!(f, ",size={size}")?;
        }
        Ok(())
    }
}

/// An address assignment in `ipconfig[n]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpAssign {
    /// `dhcp`.
    Dhcp,
    /// `auto` (SLAAC, IPv6 only).
    Auto,
    /// A static address in CIDR form, e.g. `10.0.0.5/24`.
    Static(String),
}

impl IpAssign {
    fn parse(s: &str, v: &str, v6: bool) -> Result<Self> {
        match v {
            "dhcp" => Ok(Self::Dhcp),
            "auto" if v6 => Ok(Self::Auto),
            cidr => {
                let (addr, prefix) = cidr
                    .split_once('/')
                    .ok_or_else(|| Error::parse("ipconfig", s, "address needs a /prefix"))?;
                let addr: std::net::IpAddr = addr
                    .parse()
                    .map_err(|_| Error::parse("ipconfig", s, format!("bad address {addr:?}")))?;
                let max = if addr.is_ipv6() { 128 } else { 32 };
                let ok = addr.is_ipv6() == v6 && prefix.parse::<u8>().is_ok_and(|p| p <= max);
                if !ok {
                    return Err(Error::parse("ipconfig", s, format!("bad CIDR {cidr:?}")));
                }
                Ok(Self::Static(cidr.to_owned()))
            }
        }
    }
}

impl fmt::Display for IpAssign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dhcp => f.write_str("dhcp"),
            Self::Auto => f.write_str("auto"),
            Self::Static(cidr) => f.write_str(cidr),
        }
    }
}

/// An `ipconfig[n]` value, e.g. `ip=10.0.0.5/24,gw=10.0.0.1` or `ip=dhcp,ip6=auto`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IpConfig {
    /// IPv4 assignment.
    pub ip: Option<IpAssign>,
    /// IPv4 gateway.
    pub gw: Option<String>,
    /// IPv6 assignment.
    pub ip6: Option<IpAssign>,
    /// IPv6 gateway.
    pub gw6: Option<String>,
}

impl FromStr for IpConfig {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let mut cfg = IpConfig::default();
        for (key, value) in split_property_string(s) {
            let v = value.ok_or_else(|| Error::parse("ipconfig", s, format!("{key} needs a value")))?;
            let gw = |v6: bool| {
                v.parse::<std::net::IpAddr>()
                    .ok()
                    .filter(|a| a.is_ipv6() == v6)
                    .map(|_| v.to_owned())
                    .ok_or_else(|| Error::parse("ipconfig", s, format!("bad gateway {v:?}")))
            };
            match key {
                "ip" => cfg.ip = Some(IpAssign::parse(s, v, false)?),
                "ip6" => cfg.ip6 = Some(IpAssign::parse(s, v, true)?),
                "gw" => cfg.gw = Some(gw(false)?),
                "gw6" => cfg.gw6 = Some(gw(true)?),
                other => return Err(Error::parse("ipconfig", s, format!("unknown key {other:?}"))),
            }
        }
        Ok(cfg)
    }
}

impl fmt::Display for IpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [
            self.ip.as_ref().map(|v| format!("ip={v}")),
            self.gw.as_ref().map(|v| format!("gw={v}")),
            self.ip6.as_ref().map(|v| format!("ip6={v}")),
            self.gw6.as_ref().map(|v| format!("gw6={v}")),
        ];
        f.write_str(&parts.into_iter().flatten().collect::<Vec<_>>().join(","))
    }
}

fn valid_tag(tag: &str) -> bool {
    let mut chars = tag.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '+' | '.'))
}

/// Normalises tags as PVE stores them: split on `,`, `;` and spaces, lower-cased, sorted,
/// de-duplicated; each must match `[a-z0-9_][a-z0-9_\-+.]*`.
pub fn normalize_tags(input: &str) -> Result<Vec<String>> {
    let mut tags: Vec<String> = input
        .split([',', ';', ' ', '\t', '\n'])
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
        .collect();
    if let Some(bad) = tags.iter().find(|t| !valid_tag(t)) {
        return Err(Error::parse("tags", input, format!("invalid tag {bad:?}")));
    }
    tags.sort();
    tags.dedup();
    Ok(tags)
}

/// Joins tags the way PVE stores them (`;`-separated), normalising first.
pub fn format_tags<I, S>(tags: I) -> Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let joined = tags
        .into_iter()
        .map(|t| t.as_ref().to_owned())
        .collect::<Vec<_>>()
        .join(";");
    Ok(normalize_tags(&joined)?.join(";"))
}

const SSHKEYS_ESCAPE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Percent-encodes `sshkeys` as PVE requires (space `%20`, `+` `%2B`, `/` `%2F`, `=` `%3D`,
/// newline `%0A`, …).
pub fn encode_sshkeys(keys: &str) -> String {
    utf8_percent_encode(keys, SSHKEYS_ESCAPE).to_string()
}

/// One line of `GET …/pending`: a config key with its current value and the value Proxmox VE
/// keeps pending until the VM restarts (or a pending deletion).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PendingItem {
    /// The config key.
    pub key: String,
    /// The current value.
    #[serde(default, deserialize_with = "de::opt_string")]
    pub value: Option<String>,
    /// The pending value.
    #[serde(default, deserialize_with = "de::opt_string")]
    pub pending: Option<String>,
    /// A pending deletion (`1`, `2` forced).
    #[serde(default, deserialize_with = "de::opt_int")]
    pub delete: Option<i64>,
}

/// A VM's configuration from `GET …/pending`: what it will be once pending changes apply, and
/// which keys wait for the VM to restart.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PendingConfig {
    /// The config with the pending changes applied (what `GET …/config` shows).
    pub config: VmConfig,
    /// Keys whose change or deletion is pending, sorted.
    pub pending: Vec<String>,
}

impl PendingConfig {
    /// Folds the lines of `GET …/pending`.
    pub fn from_items(items: Vec<PendingItem>) -> Self {
        let mut out = Self::default();
        for item in items {
            let deleted = item.delete.is_some_and(|d| d > 0);
            if deleted || item.pending.is_some() {
                out.pending.push(item.key.clone());
            }
            if deleted {
                continue;
            }
            if let Some(value) = item.pending.or(item.value) {
                out.config.0.insert(item.key, value);
            }
        }
        out.pending.sort();
        out
    }
}

/// A VM configuration as returned by `GET …/config`: every value as the string PVE would print
/// (`1` for true, numbers in decimal), with typed accessors.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VmConfig(pub BTreeMap<String, String>);

impl<'a> Deserialize<'a> for VmConfig {
    fn deserialize<D: Deserializer<'a>>(d: D) -> std::result::Result<Self, D::Error> {
        let raw = BTreeMap::<String, serde_json::Value>::deserialize(d)?;
        Ok(Self(
            raw.into_iter()
                .filter_map(|(k, v)| de::scalar_to_string(v).map(|v| (k, v)))
                .collect(),
        ))
    }
}

impl VmConfig {
    /// This config with `update` applied as written: what PVE stores for options it keeps
    /// verbatim. (Devices are not: PVE gives a new NIC a MAC and allocates a new disk's
    /// volume, so a caller re-reads the config after changing those.)
    pub fn with_update(&self, update: &crate::ConfigUpdate) -> Self {
        let mut out = self.0.clone();
        for key in &update.delete {
            out.remove(key);
        }
        out.extend(update.set.iter().map(|(k, v)| (k.clone(), v.clone())));
        Self(out)
    }

    /// A raw value.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// `name`.
    pub fn name(&self) -> Option<&str> {
        self.get("name")
    }

    /// `template: 1`.
    pub fn is_template(&self) -> bool {
        self.get("template") == Some("1")
    }

    /// `lock` (e.g. `clone` while a clone runs).
    pub fn lock(&self) -> Option<&str> {
        self.get("lock")
    }

    /// `digest`, for optimistic concurrency on updates.
    pub fn digest(&self) -> Option<&str> {
        self.get("digest")
    }

    /// `memory` in MiB (PVE ≥ 8.1 sends it as a string; it may also be a property string
    /// `current=2048`).
    pub fn memory_mib(&self) -> Option<u64> {
        let v = self.get("memory")?;
        v.parse().ok().or_else(|| {
            split_property_string(v)
                .into_iter()
                .find_map(|(k, v)| match (k, v) {
                    ("current", Some(n)) => n.parse().ok(),
                    (n, None) => n.parse().ok(),
                    _ => None,
                })
        })
    }

    /// Normalised `tags`.
    pub fn tags(&self) -> Result<Vec<String>> {
        self.get("tags").map_or(Ok(Vec::new()), normalize_tags)
    }

    /// Whether `agent` enables the QEMU guest agent (`1`, `enabled=1`, `1,fstrim_cloned_disks=1`);
    /// PVE's default, without the option, is off.
    pub fn agent_enabled(&self) -> bool {
        self.get("agent").is_some_and(|v| {
            split_property_string(v)
                .into_iter()
                .any(|(k, v)| matches!((k, v), ("1", None) | ("enabled", Some("1"))))
        })
    }

    /// The `uuid` of `smbios1`.
    pub fn smbios_uuid(&self) -> Option<&str> {
        split_property_string(self.get("smbios1")?)
            .into_iter()
            .find_map(|(k, v)| (k == "uuid").then_some(v)?)
    }

    /// `net{index}`, parsed.
    pub fn net(&self, index: u8) -> Result<Option<NetDevice>> {
        self.get(&format!("net{index}")).map(str::parse).transpose()
    }

    /// All `net[n]` devices, by index.
    pub fn nets(&self) -> Result<BTreeMap<u8, NetDevice>> {
        self.0
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("net")?.parse::<u8>().ok()?, v)))
            .map(|(i, v)| Ok((i, v.parse()?)))
            .collect()
    }

    /// `ipconfig{index}`, parsed.
    pub fn ipconfig(&self, index: u8) -> Result<Option<IpConfig>> {
        self.get(&format!("ipconfig{index}")).map(str::parse).transpose()
    }

    /// All disk and cdrom drives, by key.
    pub fn disks(&self) -> Result<BTreeMap<String, DiskSpec>> {
        self.0
            .iter()
            .filter(|(k, _)| is_disk_key(k))
            .map(|(k, v)| Ok((k.clone(), v.parse()?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn pending_lines_fold_into_the_coming_config_and_the_pending_keys() {
        // As PVE 9 answers `GET …/pending` (numbers stay numbers, Perl typing).
        let items: Vec<PendingItem> = serde_json::from_value(serde_json::json!([
            {"key": "cores", "value": 2, "pending": 4},
            {"key": "memory", "value": "2048"},
            {"key": "net0", "value": "virtio=BC:24:11:00:00:01,bridge=vmbr0", "pending": "e1000=BC:24:11:00:00:01,bridge=vmbr0"},
            {"key": "ide0", "value": "local-lvm:vm-101-cloudinit,media=cdrom", "delete": 1},
            {"key": "tags", "pending": "k8s"},
        ]))
        .unwrap();
        let p = PendingConfig::from_items(items);
        assert_eq!(p.pending, ["cores", "ide0", "net0", "tags"]);
        assert_eq!(p.config.get("cores"), Some("4"));
        assert_eq!(p.config.get("memory"), Some("2048"));
        assert_eq!(p.config.get("net0"), Some("e1000=BC:24:11:00:00:01,bridge=vmbr0"));
        assert_eq!(p.config.get("ide0"), None, "a pending deletion is applied");
        assert_eq!(p.config.get("tags"), Some("k8s"));
    }

    use super::*;
    use pretty_assertions::assert_eq;
    use rstest::rstest;

    #[test]
    fn parses_net_as_pve_returns_it() {
        let dev: NetDevice = "virtio=BC:24:11:00:90:00,bridge=vmbr0,firewall=1,tag=20,mtu=1450,queues=4"
            .parse()
            .unwrap();
        assert_eq!(dev.model, "virtio");
        assert_eq!(dev.mac.as_deref(), Some("BC:24:11:00:90:00"));
        assert_eq!(dev.bridge.as_deref(), Some("vmbr0"));
        assert_eq!(
            (dev.tag, dev.mtu, dev.firewall),
            (Some(20), Some(1450), Some(true))
        );
        assert_eq!(dev.extra, vec![("queues".to_string(), "4".to_string())]);
        assert_eq!(
            dev.to_string(),
            "virtio=BC:24:11:00:90:00,bridge=vmbr0,firewall=1,mtu=1450,tag=20,queues=4"
        );
    }

    #[rstest]
    #[case("virtio,bridge=vmbr0", "virtio,bridge=vmbr0")]
    #[case(
        "model=e1000,macaddr=BC:24:11:AA:BB:CC,bridge=vmbr1",
        "e1000=BC:24:11:AA:BB:CC,bridge=vmbr1"
    )]
    #[case(
        "bridge=vmbr0,virtio=BC:24:11:00:00:01",
        "virtio=BC:24:11:00:00:01,bridge=vmbr0"
    )]
    fn net_round_trips_to_canonical_form(#[case] input: &str, #[case] canonical: &str) {
        let dev: NetDevice = input.parse().unwrap();
        assert_eq!(dev.to_string(), canonical);
        assert_eq!(canonical.parse::<NetDevice>().unwrap(), dev);
    }

    #[rstest]
    #[case("bridge=vmbr0")]
    #[case("virtio,tag=0")]
    #[case("virtio,tag=5000")]
    #[case("virtio,mtu=abc")]
    #[case("virtio,firewall=yes")]
    #[case("bogus,bridge=vmbr0")]
    #[case("")]
    fn rejects_bad_net(#[case] input: &str) {
        assert!(input.parse::<NetDevice>().is_err(), "{input:?}");
    }

    #[rstest]
    #[case("32G", 32 << 30, "32G")]
    #[case("512M", 512 << 20, "512M")]
    #[case("1536M", 1536 << 20, "1536M")]
    #[case("1T", 1 << 40, "1T")]
    #[case("4k", 4096, "4K")]
    #[case("1.5G", 1536 << 20, "1536M")]
    #[case("1000", 1000, "1000")]
    #[case("0", 0, "0")]
    fn parses_and_formats_sizes(#[case] input: &str, #[case] bytes: u64, #[case] formatted: &str) {
        let size: Size = input.parse().unwrap();
        assert_eq!(size.bytes(), bytes);
        assert_eq!(size.to_string(), formatted);
    }

    #[rstest]
    #[case("")]
    #[case("G")]
    #[case("12X")]
    #[case("-1G")]
    #[case("1..5G")]
    #[case(".5G")]
    #[case("99999999999999999999T")]
    fn rejects_bad_sizes(#[case] input: &str) {
        assert!(input.parse::<Size>().is_err(), "{input:?}");
    }

    #[test]
    fn formats_resize_arguments() {
        assert_eq!(SizeChange::Grow(Size::gib(10)).to_string(), "+10G");
        assert_eq!(SizeChange::To(Size::gib(32)).to_string(), "32G");
    }

    #[test]
    fn parses_disks() {
        let disk: DiskSpec = "local-lvm:vm-101-disk-0,discard=on,size=32G".parse().unwrap();
        assert_eq!(disk.storage(), Some("local-lvm"));
        assert_eq!(disk.volume_name(), "vm-101-disk-0");
        assert_eq!(disk.size, Some(Size::gib(32)));
        assert_eq!(disk.to_string(), "local-lvm:vm-101-disk-0,discard=on,size=32G");
        let cd: DiskSpec = "local-lvm:vm-9000-cloudinit,media=cdrom".parse().unwrap();
        assert!(cd.is_cdrom());
        let empty: DiskSpec = "none,media=cdrom".parse().unwrap();
        assert_eq!(empty.storage(), None);
        let file: DiskSpec = "file=local:iso/seed.iso,media=cdrom".parse().unwrap();
        assert_eq!(file.volume, "local:iso/seed.iso");
        assert!("size=32G".parse::<DiskSpec>().is_err());
        assert!("local:x,size=big".parse::<DiskSpec>().is_err());
    }

    #[rstest]
    #[case("scsi0", true)]
    #[case("scsi30", true)]
    #[case("scsi31", false)]
    #[case("virtio15", true)]
    #[case("ide2", true)]
    #[case("ide4", false)]
    #[case("sata5", true)]
    #[case("efidisk0", true)]
    #[case("unused7", true)]
    #[case("scsihw", false)]
    #[case("scsi01", false)]
    #[case("net0", false)]
    fn recognises_disk_keys(#[case] key: &str, #[case] want: bool) {
        assert_eq!(is_disk_key(key), want);
    }

    #[rstest]
    #[case("ip=10.0.0.5/24,gw=10.0.0.1")]
    #[case("ip=dhcp")]
    #[case("ip=dhcp,ip6=auto")]
    #[case("ip=192.168.1.10/24,gw=192.168.1.1,ip6=fd00::5/64,gw6=fd00::1")]
    fn ipconfig_round_trips(#[case] input: &str) {
        let cfg: IpConfig = input.parse().unwrap();
        assert_eq!(cfg.to_string(), input);
    }

    #[test]
    fn ipconfig_fields() {
        let cfg: IpConfig = "ip=10.0.0.5/24,gw=10.0.0.1".parse().unwrap();
        assert_eq!(cfg.ip, Some(IpAssign::Static("10.0.0.5/24".into())));
        assert_eq!(cfg.gw.as_deref(), Some("10.0.0.1"));
    }

    #[rstest]
    #[case("ip=10.0.0.5")]
    #[case("ip=10.0.0.5/33")]
    #[case("ip=auto")]
    #[case("ip=fd00::1/64")]
    #[case("ip6=10.0.0.1/24")]
    #[case("gw=nope")]
    #[case("mtu=1500")]
    #[case("ip")]
    fn rejects_bad_ipconfig(#[case] input: &str) {
        assert!(input.parse::<IpConfig>().is_err(), "{input:?}");
    }

    #[test]
    fn normalises_tags_like_pve() {
        assert_eq!(
            normalize_tags("Web, db;web  k8s_v1.30").unwrap(),
            vec!["db", "k8s_v1.30", "web"]
        );
        assert_eq!(
            format_tags(["template", "Ubuntu", "ubuntu"]).unwrap(),
            "template;ubuntu"
        );
        assert_eq!(normalize_tags("").unwrap(), Vec::<String>::new());
        assert!(normalize_tags("-bad").is_err());
        assert!(normalize_tags("sp@ce").is_err());
    }

    #[test]
    fn encodes_sshkeys() {
        assert_eq!(
            encode_sshkeys("ssh-ed25519 AAAA+b/c= me@host\n"),
            "ssh-ed25519%20AAAA%2Bb%2Fc%3D%20me%40host%0A"
        );
    }

    #[test]
    fn vm_config_accessors_tolerate_perl_types() {
        let cfg: VmConfig = serde_json::from_str(
            r#"{"name":"web-1","memory":"2048","cores":2,"template":1,"agent":"1","lock":"clone",
                "tags":"ubuntu;template","smbios1":"uuid=5c6b2c3e-0000-4000-8000-000000000001",
                "net0":"virtio=BC:24:11:00:90:00,bridge=vmbr0","ipconfig0":"ip=dhcp",
                "scsi0":"local-lvm:base-9000-disk-0,size=8G","ide2":"local-lvm:vm-9000-cloudinit,media=cdrom",
                "scsihw":"virtio-scsi-pci","digest":"abc","numa":0}"#,
        )
        .unwrap();
        assert_eq!(cfg.name(), Some("web-1"));
        assert_eq!(cfg.memory_mib(), Some(2048));
        assert_eq!(cfg.get("cores"), Some("2"));
        assert!(cfg.is_template());
        assert_eq!(cfg.lock(), Some("clone"));
        assert_eq!(cfg.tags().unwrap(), vec!["template", "ubuntu"]);
        assert_eq!(cfg.smbios_uuid(), Some("5c6b2c3e-0000-4000-8000-000000000001"));
        assert_eq!(cfg.net(0).unwrap().unwrap().bridge.as_deref(), Some("vmbr0"));
        assert_eq!(cfg.net(1).unwrap(), None);
        assert_eq!(
            cfg.ipconfig(0).unwrap(),
            Some(IpConfig {
                ip: Some(IpAssign::Dhcp),
                ..IpConfig::default()
            })
        );
        let disks = cfg.disks().unwrap();
        assert_eq!(disks.keys().collect::<Vec<_>>(), vec!["ide2", "scsi0"]);
        assert_eq!(disks["scsi0"].size, Some(Size::gib(8)));
        let mem: VmConfig = serde_json::from_str(r#"{"memory":"current=4096"}"#).unwrap();
        assert_eq!(mem.memory_mib(), Some(4096));
    }
}
