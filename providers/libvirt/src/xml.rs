//! Pure generation of libvirt domain and storage volume XML, and reading back the ownership
//! metadata banlieue puts into every domain it defines.
//!
//! The domain XML always carries: `<uuid>` = the SMBIOS system uuid (stable, what the guest reads
//! from `/sys/class/dmi/id/product_uuid`), `<features><acpi/></features>` (QEMU ≥ 8 with
//! libvirt 9.0 refuses a domain without it; ACPI is also how `shutdown` reaches the guest), a
//! serial console (`pty`, logged to a file when [`DomainConfig::serial_log`] is set), the
//! `org.qemu.guest_agent.0` virtio channel, and a `<metadata>` element in banlieue's namespace
//! naming the owner object (UID, namespace, name) for crash adoption.

use std::fmt::Write as _;

/// XML namespace of banlieue's domain metadata.
pub const METADATA_NS: &str = "https://banlieue.io/libvirt/v1alpha1";
/// Prefix used for the metadata element.
pub const METADATA_PREFIX: &str = "banlieue";

/// libvirt domain type: `kvm` (hardware acceleration) or `qemu` (TCG emulation, e.g. in nested
/// environments without VT-x).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DomainType {
    /// Hardware virtualization.
    #[default]
    Kvm,
    /// Software emulation (TCG).
    Qemu,
}

impl DomainType {
    /// The `type` attribute of `<domain>`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Qemu => "qemu",
        }
    }
}

impl std::str::FromStr for DomainType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kvm" => Ok(Self::Kvm),
            "qemu" => Ok(Self::Qemu),
            other => Err(format!("domain type {other:?}: expected kvm or qemu")),
        }
    }
}

/// Who a domain belongs to (stored in its `<metadata>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// UID of the LibvirtMachine.
    pub uid: String,
    /// Namespace of the LibvirtMachine.
    pub namespace: String,
    /// Name of the LibvirtMachine.
    pub name: String,
}

/// A disk of a domain: a volume in a storage pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    /// Storage pool.
    pub pool: String,
    /// Volume name in the pool.
    pub volume: String,
    /// Guest device name (`vda`, `vdb`, …; `sda` or `hdc` for the cdrom).
    pub target: String,
    /// A read-only cdrom (the NoCloud seed) instead of a virtio disk.
    pub cdrom: bool,
    /// The bus: `virtio` for disks; `sata`, `scsi` (a virtio-scsi controller is added) or
    /// `ide` for the cdrom.
    pub bus: &'static str,
    /// Volume format (`qcow2`, `raw`).
    pub format: String,
}

/// A network interface of a domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicConfig {
    /// What it attaches to.
    pub source: NicSource,
    /// MAC address (always set: generated deterministically when the spec has none, so the
    /// guest's network-config can match it).
    pub mac: String,
    /// Device model, `virtio` by default.
    pub model: String,
    /// MTU, when set.
    pub mtu: Option<u32>,
    /// 802.1Q VLAN tag (only honoured by Open vSwitch bridges and some network types).
    pub vlan: Option<u16>,
}

/// Where a NIC attaches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NicSource {
    /// A libvirt network by name.
    Network(String),
    /// A host bridge by name.
    Bridge(String),
}

/// Firmware of a domain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FirmwareConfig {
    /// SeaBIOS.
    #[default]
    Bios,
    /// OVMF, selected by libvirt's firmware auto-selection.
    Uefi,
    /// OVMF with Secure Boot and the default keys enrolled, on a q35 machine with SMM (what
    /// libvirt's auto-selection needs to pick a secure-boot build).
    UefiSecureBoot,
}

/// Direct kernel boot (used by tests with a tiny kernel + initramfs guest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelBoot {
    /// Path of the kernel on the libvirt host.
    pub kernel: String,
    /// Path of the initramfs on the libvirt host.
    pub initrd: String,
    /// Kernel command line.
    pub cmdline: String,
}

/// Everything the domain XML is generated from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainConfig {
    /// Domain name (unique per host).
    pub name: String,
    /// Domain uuid, also the SMBIOS system uuid.
    pub uuid: String,
    /// `kvm` or `qemu`.
    pub domain_type: DomainType,
    /// Virtual CPU sockets.
    pub sockets: u32,
    /// Cores per socket.
    pub cores: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Disks, boot disk first.
    pub disks: Vec<DiskConfig>,
    /// NICs, in order.
    pub nics: Vec<NicConfig>,
    /// Firmware.
    pub firmware: FirmwareConfig,
    /// CPU model (`None`: host-passthrough on KVM, QEMU's default on TCG; `host`:
    /// host-passthrough) and flags (`+aes` required, `-pcid` disabled).
    pub cpu_model: Option<String>,
    /// CPU flags with their sign.
    pub cpu_flags: Vec<String>,
    /// An emulated TPM 2.0 (swtpm).
    pub tpm: bool,
    /// Host PCI devices passed through, by address (`0000:01:00.0`).
    pub pci_devices: Vec<String>,
    /// Direct kernel boot instead of booting the first disk.
    pub kernel_boot: Option<KernelBoot>,
    /// File the serial console is also logged to.
    pub serial_log: Option<String>,
    /// The owner, stored in `<metadata>`.
    pub owner: Owner,
    /// The UID of the object the domain was taken over from (attribute [`ADOPTED_FROM`] of the
    /// owner element), kept when the domain is redefined.
    pub adopted_from: Option<String>,
}

/// Escapes text for XML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Kept as they are through attribute-value normalization.
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            '\t' => out.push_str("&#9;"),
            c => out.push(c),
        }
    }
    out
}

/// Reverses [`escape`] (and the numeric entities libvirt may emit).
pub fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let Some(end) = rest.find(';') else { break };
        let entity = &rest[1..end];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            e if e.starts_with("#x") => u32::from_str_radix(&e[2..], 16).ok().and_then(char::from_u32),
            e if e.starts_with('#') => e[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The `<metadata>` child element (without the surrounding `<metadata>`), as found inside the
/// domain XML ([`owner_metadata`] is the form `virDomainSetMetadata` takes).
pub fn owner_element(owner: &Owner, adopted_from: Option<&str>) -> String {
    format!(
        "<{p}:owner xmlns:{p}=\"{ns}\" {}/>",
        owner_attributes(owner, adopted_from),
        p = METADATA_PREFIX,
        ns = METADATA_NS,
    )
}

/// Attribute of the owner element naming the UID of the object a domain was taken over from
/// (re-marked for a copy made by `clusterctl move` or a restore): that object must never take
/// the domain back while it still exists.
pub const ADOPTED_FROM: &str = "adopted-from";

/// The owner element's attributes.
fn owner_attributes(owner: &Owner, adopted_from: Option<&str>) -> String {
    let adopted = adopted_from.map(|uid| format!(" {ADOPTED_FROM}=\"{}\"", escape(uid)));
    format!(
        "uid=\"{}\" namespace=\"{}\" name=\"{}\"{}",
        escape(&owner.uid),
        escape(&owner.namespace),
        escape(&owner.name),
        adopted.unwrap_or_default()
    )
}

/// The owner element as `virDomainSetMetadata` takes it: without a prefix or namespace
/// declaration (libvirt puts it in [`METADATA_NS`] with prefix [`METADATA_PREFIX`] itself and
/// refuses an element that declares them).
pub fn owner_metadata(owner: &Owner, adopted_from: Option<&str>) -> String {
    format!("<owner {}/>", owner_attributes(owner, adopted_from))
}

/// Value of attribute `name` in the start tag `tag` (e.g. `<banlieue:owner uid="…"`), read
/// attribute by attribute (so a value that contains ` name=` is not mistaken for one).
fn attribute(tag: &str, name: &str) -> Option<String> {
    // Past the element name.
    let mut rest = tag.trim_start_matches('<');
    rest = &rest[rest.find(char::is_whitespace)?..];
    loop {
        rest = rest.trim_start();
        let eq = rest.find('=')?;
        let key = rest[..eq].trim_end();
        let after = rest[eq + 1..].trim_start();
        let quote = after.chars().next().filter(|q| *q == '"' || *q == '\'')?;
        let value = &after[1..];
        let end = value.find(quote)?;
        if key == name {
            return Some(unescape(&value[..end]));
        }
        rest = &value[end + 1..];
    }
}

/// The owner recorded in a domain's XML (or in the element returned by `virDomainGetMetadata`),
/// if banlieue defined it. Tolerates any prefix libvirt chose for our namespace.
pub fn owner_from_xml(xml: &str) -> Option<Owner> {
    let tag = owner_tag(xml)?;
    Some(Owner {
        uid: attribute(tag, "uid")?,
        namespace: attribute(tag, "namespace")?,
        name: attribute(tag, "name")?,
    })
}

/// The start tag of the banlieue owner element in a domain's XML.
fn owner_tag(xml: &str) -> Option<&str> {
    let ns_pos = xml.find(METADATA_NS)?;
    let tag_start = xml[..ns_pos].rfind('<')?;
    let tag_end = ns_pos + xml[ns_pos..].find('>')?;
    Some(&xml[tag_start..tag_end])
}

/// The UID the domain was taken over from ([`ADOPTED_FROM`]), if it was re-marked.
pub fn adopted_from_xml(xml: &str) -> Option<String> {
    attribute(owner_tag(xml)?, ADOPTED_FROM).filter(|u| !u.is_empty())
}

/// CPU topology and memory of a domain definition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizing {
    /// CPU sockets.
    pub sockets: u32,
    /// Cores per socket.
    pub cores: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
}

fn element_text<'a>(xml: &'a str, tag: &str) -> Option<(&'a str, &'a str)> {
    let open = format!("<{tag}");
    let mut from = 0;
    loop {
        let i = from + xml[from..].find(&open)?;
        let after = xml[i + open.len()..].chars().next()?;
        if after == '>' || after == ' ' {
            let head_end = i + xml[i..].find('>')?;
            let close = head_end + xml[head_end..].find(&format!("</{tag}>"))?;
            return Some((&xml[i..head_end], xml[head_end + 1..close].trim()));
        }
        from = i + open.len();
    }
}

/// The CPU topology and memory of a domain XML (`<topology>` sockets × cores, else `<vcpu>`
/// cores on one socket; `<memory>` in any libvirt unit). `None` when unreadable.
pub fn sizing_from_xml(xml: &str) -> Option<Sizing> {
    let (mem_head, mem) = element_text(xml, "memory")?;
    let mem: u64 = mem.parse().ok()?;
    let unit = attribute(mem_head, "unit").unwrap_or_else(|| "KiB".into());
    let bytes = match unit.as_str() {
        "b" | "bytes" => mem,
        "KB" => mem.saturating_mul(1000),
        "k" | "KiB" => mem.saturating_mul(1 << 10),
        "MB" => mem.saturating_mul(1_000_000),
        "M" | "MiB" => mem.saturating_mul(1 << 20),
        "GB" => mem.saturating_mul(1_000_000_000),
        "G" | "GiB" => mem.saturating_mul(1 << 30),
        _ => return None,
    };
    let (_, vcpus) = element_text(xml, "vcpu")?;
    let vcpus: u32 = vcpus.parse().ok()?;
    let topology = xml.find("<topology ").and_then(|i| {
        let end = i + xml[i..].find('>')?;
        let tag = &xml[i..end];
        Some((
            attribute(tag, "sockets")?.parse::<u32>().ok()?,
            attribute(tag, "cores")?.parse::<u32>().ok()?,
        ))
    });
    let (sockets, cores) = topology.unwrap_or((1, vcpus));
    Some(Sizing {
        sockets,
        cores,
        memory_mib: bytes >> 20,
    })
}

/// The first `<mac address='…'/>` values of a domain XML, in order.
pub fn macs_from_xml(xml: &str) -> Vec<String> {
    let mut macs = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find("<mac ") {
        rest = &rest[i..];
        let end = rest.find('>').unwrap_or(rest.len());
        if let Some(mac) = attribute(&rest[..end], "address") {
            macs.push(mac.to_ascii_lowercase());
        }
        rest = &rest[end..];
    }
    macs
}

/// The `<cpu>` element: the model asked for (with its required and disabled features), else
/// host-passthrough on KVM and QEMU's default model on TCG; the topology.
fn cpu_element(c: &DomainConfig) -> String {
    let mut x = String::new();
    match c.cpu_model.as_deref() {
        Some("host") => x.push_str("  <cpu mode='host-passthrough'>\n"),
        Some(model) => {
            x.push_str("  <cpu mode='custom' match='exact'>\n");
            let _ = writeln!(x, "    <model fallback='forbid'>{}</model>", escape(model));
        }
        None => match c.domain_type {
            DomainType::Kvm => x.push_str("  <cpu mode='host-passthrough'>\n"),
            DomainType::Qemu => x.push_str("  <cpu mode='custom'>\n"),
        },
    }
    for flag in &c.cpu_flags {
        let (policy, name) = match flag.split_at_checked(1) {
            Some(("-", name)) => ("disable", name),
            Some(("+", name)) => ("require", name),
            _ => ("require", flag.as_str()),
        };
        let _ = writeln!(x, "    <feature policy='{policy}' name='{}'/>", escape(name));
    }
    let _ = writeln!(
        x,
        "    <topology sockets='{}' dies='1' cores='{}' threads='1'/>\n  </cpu>",
        c.sockets.max(1),
        c.cores.max(1)
    );
    x
}

/// Renders the domain XML.
pub fn domain_xml(c: &DomainConfig) -> String {
    let mut x = String::new();
    let vcpus = c.sockets.max(1) * c.cores.max(1);
    let memory_kib = c.memory_mib.saturating_mul(1024);
    let _ = writeln!(x, "<domain type='{}'>", c.domain_type.as_str());
    let _ = writeln!(x, "  <name>{}</name>", escape(&c.name));
    let _ = writeln!(x, "  <uuid>{}</uuid>", escape(&c.uuid));
    let _ = writeln!(
        x,
        "  <metadata>\n    {}\n  </metadata>",
        owner_element(&c.owner, c.adopted_from.as_deref())
    );
    let _ = writeln!(x, "  <memory unit='KiB'>{memory_kib}</memory>");
    let _ = writeln!(x, "  <currentMemory unit='KiB'>{memory_kib}</currentMemory>");
    let _ = writeln!(x, "  <vcpu placement='static'>{vcpus}</vcpu>");
    let _ = writeln!(
        x,
        "  <sysinfo type='smbios'>\n    <system>\n      <entry name='manufacturer'>banlieue</entry>\n      <entry name='product'>libvirt</entry>\n      <entry name='uuid'>{}</entry>\n    </system>\n  </sysinfo>",
        escape(&c.uuid)
    );
    match c.firmware {
        FirmwareConfig::Bios => x.push_str("  <os>\n    <type arch='x86_64' machine='pc'>hvm</type>\n"),
        FirmwareConfig::Uefi => {
            x.push_str("  <os firmware='efi'>\n    <type arch='x86_64' machine='pc'>hvm</type>\n");
        }
        FirmwareConfig::UefiSecureBoot => x.push_str(
            "  <os firmware='efi'>\n    <type arch='x86_64' machine='q35'>hvm</type>\n    <firmware>\n      <feature enabled='yes' name='secure-boot'/>\n      <feature enabled='yes' name='enrolled-keys'/>\n    </firmware>\n",
        ),
    }
    match &c.kernel_boot {
        Some(k) => {
            let _ = writeln!(x, "    <kernel>{}</kernel>", escape(&k.kernel));
            let _ = writeln!(x, "    <initrd>{}</initrd>", escape(&k.initrd));
            let _ = writeln!(x, "    <cmdline>{}</cmdline>", escape(&k.cmdline));
        }
        None => x.push_str("    <boot dev='hd'/>\n"),
    }
    x.push_str("    <smbios mode='sysinfo'/>\n  </os>\n");
    x.push_str("  <features>\n    <acpi/>\n    <apic/>\n");
    if c.firmware == FirmwareConfig::UefiSecureBoot {
        // Secure Boot's variables are only writable in System Management Mode.
        x.push_str("    <smm state='on'/>\n");
    }
    x.push_str("  </features>\n");
    x.push_str(&cpu_element(c));
    x.push_str("  <clock offset='utc'/>\n  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>restart</on_reboot>\n  <on_crash>destroy</on_crash>\n");
    x.push_str("  <devices>\n");
    if c.disks.iter().any(|d| d.bus == "scsi") {
        x.push_str("    <controller type='scsi' index='0' model='virtio-scsi'/>\n");
    }
    for d in &c.disks {
        let device = if d.cdrom { "cdrom" } else { "disk" };
        let bus = d.bus;
        let _ = writeln!(x, "    <disk type='volume' device='{device}'>");
        let _ = writeln!(x, "      <driver name='qemu' type='{}'/>", escape(&d.format));
        let _ = writeln!(
            x,
            "      <source pool='{}' volume='{}'/>",
            escape(&d.pool),
            escape(&d.volume)
        );
        let _ = writeln!(x, "      <target dev='{}' bus='{bus}'/>", escape(&d.target));
        if d.cdrom {
            x.push_str("      <readonly/>\n");
        }
        x.push_str("    </disk>\n");
    }
    for (index, n) in c.nics.iter().enumerate() {
        let (kind, attr, name) = match &n.source {
            NicSource::Network(name) => ("network", "network", name),
            NicSource::Bridge(name) => ("bridge", "bridge", name),
        };
        let _ = writeln!(x, "    <interface type='{kind}'>");
        let _ = writeln!(x, "      <mac address='{}'/>", escape(&n.mac));
        let _ = writeln!(x, "      <source {attr}='{}'/>", escape(name));
        if let Some(tag) = n.vlan {
            let _ = writeln!(x, "      <vlan>\n        <tag id='{tag}'/>\n      </vlan>");
        }
        let _ = writeln!(x, "      <model type='{}'/>", escape(&n.model));
        if let Some(mtu) = n.mtu {
            let _ = writeln!(x, "      <mtu size='{mtu}'/>");
        }
        let _ = writeln!(
            x,
            "      <address type='pci' domain='0x0000' bus='0x00' slot='{:#04x}' function='0x0'/>",
            nic_pci_slot(index)
        );
        x.push_str("    </interface>\n");
    }
    x.push_str("    <serial type='pty'>\n");
    if let Some(log) = &c.serial_log {
        let _ = writeln!(x, "      <log file='{}' append='off'/>", escape(log));
    }
    x.push_str("      <target port='0'/>\n    </serial>\n");
    x.push_str("    <console type='pty'>\n      <target type='serial' port='0'/>\n    </console>\n");
    x.push_str("    <channel type='unix'>\n      <target type='virtio' name='org.qemu.guest_agent.0'/>\n    </channel>\n");
    for address in &c.pci_devices {
        x.push_str(&hostdev_element(address));
    }
    if c.tpm {
        x.push_str("    <tpm model='tpm-crb'>\n      <backend type='emulator' version='2.0'/>\n    </tpm>\n");
    }
    x.push_str("    <memballoon model='virtio'/>\n    <rng model='virtio'>\n      <backend model='random'>/dev/urandom</backend>\n    </rng>\n");
    x.push_str("  </devices>\n</domain>\n");
    x
}

/// A managed VFIO `<hostdev>` for the host PCI device at `address` (`domain:bus:slot.function`,
/// hexadecimal, as the schema checks); an address of another shape is written as nothing.
fn hostdev_element(address: &str) -> String {
    let parts: Option<(&str, &str, &str, &str)> = (|| {
        let (domain, rest) = address.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (slot, function) = rest.split_once('.')?;
        Some((domain, bus, slot, function))
    })();
    let Some((domain, bus, slot, function)) = parts else {
        return String::new();
    };
    let hex = |s: &str| s.chars().all(|c| c.is_ascii_hexdigit());
    if ![domain, bus, slot, function].iter().all(|p| hex(p)) {
        return String::new();
    }
    format!(
        "    <hostdev mode='subsystem' type='pci' managed='yes'>\n      <source>\n        <address domain='0x{domain}' bus='0x{bus}' slot='0x{slot}' function='0x{function}'/>\n      </source>\n    </hostdev>\n"
    )
}

/// The PCI slot of the domain's NIC number `index` (from 0): the NICs come first on the root
/// bus, slots 2, 3, … (slot 1 is the chipset's), so the guest names them after their slot
/// (Debian and Ubuntu: `ens2`, `ens3`, …) whichever other devices the domain has; the cluster
/// templates' `KUBE_VIP_INTERFACE` default (`ens2`) relies on it. At most 16 NICs (the CRD's
/// bound): slots 2–17.
pub fn nic_pci_slot(index: usize) -> usize {
    FIRST_NIC_PCI_SLOT + index
}

/// The first NIC's PCI slot on machine type `pc` (i440FX): 0 is the host bridge, 1 the
/// PIIX3 chipset.
pub const FIRST_NIC_PCI_SLOT: usize = 2;

/// A qcow2 volume of `capacity_gib` backed by `backing_path` (a copy-on-write overlay).
pub fn overlay_volume_xml(
    name: &str,
    capacity_bytes: u64,
    backing_path: &str,
    backing_format: &str,
) -> String {
    format!(
        "<volume>\n  <name>{}</name>\n  <capacity unit='bytes'>{capacity_bytes}</capacity>\n  <target>\n    <format type='qcow2'/>\n    <compat>1.1</compat>\n  </target>\n  <backingStore>\n    <path>{}</path>\n    <format type='{}'/>\n  </backingStore>\n</volume>\n",
        escape(name),
        escape(backing_path),
        escape(backing_format)
    )
}

/// An empty volume of `capacity_bytes` in `format` (`qcow2` data disks, `raw` seed images).
pub fn plain_volume_xml(name: &str, capacity_bytes: u64, format: &str) -> String {
    format!(
        "<volume>\n  <name>{}</name>\n  <capacity unit='bytes'>{capacity_bytes}</capacity>\n  <target>\n    <format type='{}'/>\n  </target>\n</volume>\n",
        escape(name),
        escape(format)
    )
}

/// The `<format type='…'/>` of a volume's XML (`raw` when absent).
pub fn volume_format(volume_xml: &str) -> String {
    let Some(target) = volume_xml.find("<target>") else {
        return "raw".into();
    };
    let rest = &volume_xml[target..];
    rest.find("<format ")
        .and_then(|i| {
            let end = rest[i..].find('>')? + i;
            attribute(&rest[i..end], "type")
        })
        .unwrap_or_else(|| "raw".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn sizing_reads_back_what_domain_xml_writes_and_libvirt_units() {
        let c = config();
        assert_eq!(
            sizing_from_xml(&domain_xml(&c)),
            Some(Sizing {
                sockets: c.sockets,
                cores: c.cores,
                memory_mib: c.memory_mib
            })
        );
        let plain = "<domain><memory unit='GiB'>2</memory><memoryBacking/><vcpu>3</vcpu></domain>";
        assert_eq!(
            sizing_from_xml(plain),
            Some(Sizing {
                sockets: 1,
                cores: 3,
                memory_mib: 2048
            })
        );
        assert_eq!(sizing_from_xml("<domain><vcpu>1</vcpu></domain>"), None);
    }

    fn config() -> DomainConfig {
        DomainConfig {
            name: "default_web-1".into(),
            uuid: "6f1b0b7e-1c7e-4a55-9d53-1f1f2a3b4c5d".into(),
            domain_type: DomainType::Qemu,
            sockets: 2,
            cores: 2,
            memory_mib: 2048,
            disks: vec![
                DiskConfig {
                    pool: "default".into(),
                    volume: "default_web-1-root.qcow2".into(),
                    target: "vda".into(),
                    cdrom: false,
                    bus: "virtio",
                    format: "qcow2".into(),
                },
                DiskConfig {
                    pool: "default".into(),
                    volume: "default_web-1-seed.iso".into(),
                    target: "sda".into(),
                    cdrom: true,
                    bus: "sata",
                    format: "raw".into(),
                },
            ],
            nics: vec![
                NicConfig {
                    source: NicSource::Network("lab".into()),
                    mac: "52:54:00:aa:bb:cc".into(),
                    model: "virtio".into(),
                    mtu: Some(1400),
                    vlan: None,
                },
                NicConfig {
                    source: NicSource::Bridge("br0".into()),
                    mac: "52:54:00:aa:bb:cd".into(),
                    model: "e1000".into(),
                    mtu: None,
                    vlan: Some(42),
                },
            ],
            firmware: FirmwareConfig::Bios,
            cpu_model: None,
            cpu_flags: vec![],
            tpm: false,
            pci_devices: vec![],
            kernel_boot: None,
            serial_log: Some("/var/log/libvirt/qemu/x.serial".into()),
            owner: Owner {
                uid: "uid-1".into(),
                namespace: "default".into(),
                name: "web-1 <&'\">".into(),
            },
            adopted_from: None,
        }
    }

    #[test]
    fn domain_xml_has_every_required_element() {
        let xml = domain_xml(&config());
        for needle in [
            "<domain type='qemu'>",
            "<name>default_web-1</name>",
            "<uuid>6f1b0b7e-1c7e-4a55-9d53-1f1f2a3b4c5d</uuid>",
            "<entry name='uuid'>6f1b0b7e-1c7e-4a55-9d53-1f1f2a3b4c5d</entry>",
            "<smbios mode='sysinfo'/>",
            "<memory unit='KiB'>2097152</memory>",
            "<vcpu placement='static'>4</vcpu>",
            "<topology sockets='2' dies='1' cores='2' threads='1'/>",
            "<acpi/>",
            "<boot dev='hd'/>",
            "<source pool='default' volume='default_web-1-root.qcow2'/>",
            "<target dev='vda' bus='virtio'/>",
            "<target dev='sda' bus='sata'/>",
            "<readonly/>",
            "<source network='lab'/>",
            "<source bridge='br0'/>",
            "<mac address='52:54:00:aa:bb:cc'/>",
            "<model type='e1000'/>",
            "<mtu size='1400'/>",
            "<tag id='42'/>",
            "<log file='/var/log/libvirt/qemu/x.serial' append='off'/>",
            "<target type='serial' port='0'/>",
            "name='org.qemu.guest_agent.0'",
        ] {
            assert!(xml.contains(needle), "missing {needle} in\n{xml}");
        }
        // The NICs in PCI slots 2 and 3, in their order (the guest's ens2, ens3).
        let first = xml.find("<source network='lab'/>").unwrap();
        let second = xml.find("<source bridge='br0'/>").unwrap();
        let slot2 = xml.find("slot='0x02'").unwrap();
        let slot3 = xml.find("slot='0x03'").unwrap();
        assert!(first < slot2 && slot2 < second && second < slot3, "{xml}");
        assert_eq!(xml.matches("<address ").count(), 2, "only the NICs are pinned");
        // cdrom after the boot disk, and exactly one of each
        assert!(xml.find("bus='virtio'").unwrap() < xml.find("bus='sata'").unwrap());
        assert_eq!(xml.matches("<interface ").count(), 2);
        assert_eq!(xml.matches("<disk ").count(), 2);
    }

    #[test]
    fn domain_type_kvm_uses_host_passthrough_and_uefi_sets_firmware() {
        let mut c = config();
        c.domain_type = DomainType::Kvm;
        c.firmware = FirmwareConfig::Uefi;
        let xml = domain_xml(&c);
        assert!(xml.starts_with("<domain type='kvm'>"));
        assert!(xml.contains("<cpu mode='host-passthrough'>"));
        assert!(xml.contains("<os firmware='efi'>"));
    }

    #[test]
    fn host_pci_devices_are_managed_vfio_hostdevs_by_address() {
        let mut c = config();
        c.pci_devices = vec!["0000:01:00.0".into(), "0000:65:1f.7".into(), "bad".into()];
        let xml = domain_xml(&c);
        assert_eq!(
            xml.matches("<hostdev mode='subsystem' type='pci' managed='yes'>")
                .count(),
            2,
            "{xml}"
        );
        assert!(
            xml.contains("<address domain='0x0000' bus='0x01' slot='0x00' function='0x0'/>"),
            "{xml}"
        );
        assert!(
            xml.contains("<address domain='0x0000' bus='0x65' slot='0x1f' function='0x7'/>"),
            "{xml}"
        );
    }

    #[test]
    fn secure_boot_asks_for_an_enrolled_ovmf_on_q35_with_smm() {
        let mut c = config();
        c.firmware = FirmwareConfig::UefiSecureBoot;
        let xml = domain_xml(&c);
        assert!(xml.contains("<os firmware='efi'>"), "{xml}");
        assert!(xml.contains("machine='q35'"), "{xml}");
        assert!(
            xml.contains("<feature enabled='yes' name='secure-boot'/>"),
            "{xml}"
        );
        assert!(
            xml.contains("<feature enabled='yes' name='enrolled-keys'/>"),
            "{xml}"
        );
        assert!(xml.contains("<smm state='on'/>"), "{xml}");
        // Without it: i440FX, no SMM, no firmware features.
        c.firmware = FirmwareConfig::Uefi;
        let xml = domain_xml(&c);
        assert!(xml.contains("machine='pc'") && !xml.contains("<smm") && !xml.contains("secure-boot"));
    }

    #[test]
    fn kernel_boot_replaces_the_boot_device() {
        let mut c = config();
        c.kernel_boot = Some(KernelBoot {
            kernel: "/k".into(),
            initrd: "/i".into(),
            cmdline: "console=ttyS0 a&b".into(),
        });
        let xml = domain_xml(&c);
        assert!(!xml.contains("<boot dev="));
        assert!(xml.contains("<kernel>/k</kernel>"));
        assert!(xml.contains("<cmdline>console=ttyS0 a&amp;b</cmdline>"));
    }

    #[test]
    fn owner_round_trips_through_the_domain_xml_with_special_characters() {
        let c = config();
        let xml = domain_xml(&c);
        assert_eq!(owner_from_xml(&xml), Some(c.owner.clone()));
        // libvirt rewrites the element with its own prefix and quoting
        let rewritten = "<metadata><lv:owner xmlns:lv=\"https://banlieue.io/libvirt/v1alpha1\" uid='u&amp;1' namespace='ns' name='n'/></metadata>";
        assert_eq!(
            owner_from_xml(rewritten),
            Some(Owner {
                uid: "u&1".into(),
                namespace: "ns".into(),
                name: "n".into()
            })
        );
        assert_eq!(owner_from_xml("<domain><name>x</name></domain>"), None);
    }

    #[test]
    fn adopted_from_round_trips_and_does_not_disturb_the_owner() {
        let mut c = config();
        assert_eq!(adopted_from_xml(&domain_xml(&c)), None);
        c.adopted_from = Some("old-uid".into());
        let xml = domain_xml(&c);
        assert_eq!(adopted_from_xml(&xml), Some("old-uid".into()));
        assert_eq!(owner_from_xml(&xml), Some(c.owner.clone()));
        let element = owner_metadata(&c.owner, Some("old-uid"));
        assert!(element.contains(" adopted-from=\"old-uid\""), "{element}");
        assert!(!owner_metadata(&c.owner, None).contains("adopted-from"));
    }

    #[test]
    fn escape_and_unescape_are_inverse() {
        for s in ["plain", "a<b>&c'd\"e", "&&;;", "é ü"] {
            assert_eq!(unescape(&escape(s)), s);
        }
        assert_eq!(unescape("&#65;&#x42;&bogus;"), "AB&bogus;");
    }

    #[test]
    fn macs_are_read_in_order() {
        assert_eq!(
            macs_from_xml(&domain_xml(&config())),
            vec!["52:54:00:aa:bb:cc", "52:54:00:aa:bb:cd"]
        );
    }

    #[test]
    fn volume_xml_overlay_and_plain() {
        let overlay = overlay_volume_xml("r.qcow2", 10 << 30, "/pool/base.qcow2", "qcow2");
        assert!(overlay.contains("<capacity unit='bytes'>10737418240</capacity>"));
        assert!(overlay.contains("<backingStore>\n    <path>/pool/base.qcow2</path>"));
        assert!(overlay.contains("<compat>1.1</compat>"));
        assert_eq!(volume_format(&overlay), "qcow2");
        let plain = plain_volume_xml("s.iso", 4096, "raw");
        assert!(!plain.contains("backingStore"));
        assert_eq!(volume_format(&plain), "raw");
        assert_eq!(volume_format("<volume/>"), "raw");
    }

    #[test]
    fn domain_type_parses() {
        assert_eq!("kvm".parse::<DomainType>(), Ok(DomainType::Kvm));
        assert_eq!("qemu".parse::<DomainType>(), Ok(DomainType::Qemu));
        assert!("xen".parse::<DomainType>().is_err());
    }
}
