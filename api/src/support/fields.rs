//! The declarations: every spec field of every kind, per backend. Shared shapes (CPU, disks,
//! network interfaces, TLS trust, references) are declared once and placed under their
//! prefix.

use super::{Field, Kind, Refused, Support};
use crate::common::Backend;

use Support::{Honoured, NotApplicable, RefusedAtAdmission};

fn refused(values: Refused, why: &'static str) -> Support {
    Support::Refused { values, why }
}

fn under(prefix: &str, fields: Vec<Field>) -> Vec<Field> {
    fields
        .into_iter()
        .map(|f| Field::new(format!("{prefix}.{}", f.path), f.support))
        .collect()
}

fn field(path: &str, support: Support) -> Field {
    Field::new(path, support)
}

fn cpu() -> Vec<Field> {
    vec![
        field(
            "cores",
            Honoured("cores per socket; a change is applied with the VM off (restartPolicy)"),
        ),
        field(
            "sockets",
            Honoured("sockets (default 1); a change is applied with the VM off (restartPolicy)"),
        ),
    ]
}

fn disks(backend: Backend) -> Vec<Field> {
    match backend {
        Backend::Proxmox => vec![
            field(
                "name",
                Honoured(
                    "the device slot (`scsi0`, `virtio1`); the first disk may name the template's boot disk; another name is refused at reconcile (ConfigurationFailed)",
                ),
            ),
            field(
                "sizeGiB",
                Honoured(
                    "grown (never shrunk), online when PVE can; a slot the template lacks is created at this size",
                ),
            ),
            field(
                "storage",
                Honoured(
                    "storage of a new disk; the first disk's is the full clone's target when spec.storage is unset; an existing disk on another storage is refused with a condition (never moved)",
                ),
            ),
        ],
        Backend::Libvirt => vec![
            field(
                "name",
                Honoured(
                    "part of the volume's name (`<machine>-<disk>`); the first disk is the boot disk, the others are new volumes",
                ),
            ),
            field(
                "sizeGiB",
                Support::AtCreation("volume capacity (the boot disk at least the base volume's)"),
            ),
            field(
                "storage",
                Support::AtCreation("the volume's storage pool (default spec.storagePool)"),
            ),
        ],
        Backend::Vsphere => vec![
            field(
                "name",
                Honoured("a label: disks are matched by position, the first is the template's first disk"),
            ),
            field(
                "sizeGiB",
                Honoured("grown (never shrunk); a disk beyond the template's is added thin at this size"),
            ),
            field(
                "storage",
                Honoured(
                    "the datastore of a disk added beyond the template's; a template disk cloned to another datastore than asked is refused before the VM's first power-on (UnsupportedField; a disk is never moved)",
                ),
            ),
        ],
    }
}

fn ip_addressing(backend: Backend) -> Vec<Field> {
    let how = match backend {
        Backend::Vsphere => {
            "written to the guest's network configuration (guestinfo metadata) when the VM is created; a later change is not applied"
        }
        _ => {
            "written to the guest's network configuration (NoCloud seed) when the VM is created; a later change is not applied"
        }
    };
    vec![
        field("mode", Support::AtCreation(how)),
        field("addresses", Support::AtCreation(how)),
        field("gateway", Support::AtCreation(how)),
        field(
            "poolRef.apiGroup",
            Support::AtCreation(
                "an IPAddressClaim from this pool, made and awaited before the VM is configured",
            ),
        ),
        field(
            "poolRef.kind",
            Support::AtCreation(
                "an IPAddressClaim from this pool, made and awaited before the VM is configured",
            ),
        ),
        field(
            "poolRef.name",
            Support::AtCreation(
                "an IPAddressClaim from this pool, made and awaited before the VM is configured",
            ),
        ),
    ]
}

fn networks(backend: Backend) -> Vec<Field> {
    let mut fields = match backend {
        Backend::Proxmox => vec![
            field(
                "name",
                Honoured(
                    "the NIC slot (`net0`…`net31`; another name is refused at reconcile); the guest interface's name",
                ),
            ),
            field(
                "network",
                Honoured("the bridge; a change is applied (hot-plugged or pending, restartPolicy)"),
            ),
            field("vlan", Honoured("the NIC's `tag`")),
            field(
                "mtu",
                Honoured("the NIC's `mtu` (virtio) and the guest's network configuration"),
            ),
            field("macAddress", Honoured("the NIC's MAC address")),
            field(
                "model",
                Honoured("the NIC model (`virtio`, `e1000`…); a template NIC keeps its model when unset"),
            ),
        ],
        Backend::Libvirt => vec![
            field(
                "name",
                Support::AtCreation("the guest interface's name in its network configuration"),
            ),
            field(
                "network",
                Support::AtCreation("the libvirt network (or `bridge:<name>`)"),
            ),
            field(
                "vlan",
                Support::AtCreation(
                    "the interface's `<vlan>` tag (Open vSwitch bridges and some network types)",
                ),
            ),
            field(
                "mtu",
                Support::AtCreation("the interface's `<mtu>` and the guest's network configuration"),
            ),
            field("macAddress", Support::AtCreation("the interface's MAC address")),
            field(
                "model",
                Support::AtCreation("the interface's `<model>` (default virtio)"),
            ),
        ],
        Backend::Vsphere => vec![
            field(
                "name",
                Support::AtCreation("the guest interface's name in its network configuration"),
            ),
            field(
                "network",
                Honoured("the port group of the adapter at this position"),
            ),
            field(
                "vlan",
                refused(
                    Refused::Any,
                    "a vSphere VLAN belongs to the port group: name a port group on that VLAN in networks[].network and remove vlan",
                ),
            ),
            field(
                "mtu",
                Support::AtCreation("the guest's network configuration (the port group's MTU is vCenter's)"),
            ),
            field("macAddress", Honoured("the adapter's manual MAC address")),
            field(
                "model",
                Honoured(
                    "the adapter type of an added adapter (vmxnet3, e1000, e1000e; another is refused at reconcile)",
                ),
            ),
        ],
    };
    fields.extend(under("ipv4", ip_addressing(backend)));
    fields.extend(under("ipv6", ip_addressing(backend)));
    fields.push(field(
        "dnsServers",
        Support::AtCreation("written to the guest's network configuration when the VM is created"),
    ));
    fields
}

fn readiness_checks(backend: Backend) -> Vec<Field> {
    let agent = match backend {
        Backend::Proxmox => {
            "Ready without the QEMU guest agent's answer; status.addresses are the spec's static addresses"
        }
        Backend::Libvirt => "Ready without a DHCP lease; status.addresses are the spec's static addresses",
        Backend::Vsphere => "Ready without VMware Tools' guest IP",
    };
    vec![
        field("skipGuestAgent", Honoured(agent)),
        field(
            "skipCloudInit",
            match backend {
                Backend::Proxmox => Honoured(
                    "provisioned once the guest reports an address, Ready (True) only once cloud-init's report (/run/cloud-init/result.json, read through the guest agent) says it finished: WaitingForCloudInit until then, CloudInitFailed with its errors; set true for a guest without cloud-init",
                ),
                Backend::Libvirt => Honoured(
                    "provisioned once the guest has a DHCP lease, Ready (True) only once cloud-init's report (/run/cloud-init/result.json, read through the QEMU guest agent with guest-file-open/read) says it finished: WaitingForCloudInit until then, CloudInitFailed with its errors; set true for a guest without cloud-init or qemu-guest-agent",
                ),
                Backend::Vsphere => Honoured(
                    "provisioned once VMware Tools reports an address, Ready (True) only once the guest has published cloud-init's report in guestinfo.banlieue.cloud-init (the vendor data every clone gets waits for /run/cloud-init/result.json and sets it with vmware-rpctool): WaitingForCloudInit until then, CloudInitFailed with its errors; set true for a guest without cloud-init or VMware Tools",
                ),
            },
        ),
    ]
}

fn machine_common(backend: Backend) -> Vec<Field> {
    let mut fields = vec![
        field(
            "providerID",
            NotApplicable("set by the provider once the VM exists"),
        ),
        field(
            "providerRef.name",
            Honoured(
                "the Provider whose infra cluster a VirtualMachine-owned machine uses (a CAPI machine uses its Cluster's)",
            ),
        ),
        field(
            "memoryMiB",
            Honoured("memory; a change is applied with the VM off (restartPolicy)"),
        ),
        field(
            "powerState",
            Honoured("started or shut down (ACPI, then a hard stop)"),
        ),
        field(
            "restartPolicy",
            Honoured("whether a change that needs the VM off restarts it"),
        ),
    ];
    fields.extend(under("cpu", cpu()));
    fields.extend(under("disks[]", disks(backend)));
    fields.extend(under("networks[]", networks(backend)));
    fields.extend(under("readinessChecks", readiness_checks(backend)));
    fields
}

/// The infrastructure machine's fields on `backend` (also its template's
/// `spec.template.spec`).
pub fn machine_fields(backend: Backend) -> Vec<Field> {
    let mut fields = machine_common(backend);
    let own = match backend {
        Backend::Proxmox => vec![
            field("source.vmid", Honoured("the template VM cloned (immutable)")),
            field(
                "tagsFromLabels",
                Honoured("the listed labels as VM tags (<name>.<value>), replaced when a value changes"),
            ),
            field("source.name", Honoured("the template found by name (immutable)")),
            field(
                "source.image.url",
                Honoured("downloaded by the storage (download-url), imported into a template once per node"),
            ),
            field(
                "source.image.checksumAlgorithm",
                Honoured("download-url's checksum-algorithm"),
            ),
            field(
                "source.image.checksum",
                Honoured("download-url's checksum: Proxmox VE fails a mismatch (ImageChecksumMismatch)"),
            ),
            field(
                "source.imageStorage",
                Honoured("the storage the image is downloaded to (content import)"),
            ),
            field(
                "source.tags",
                Honoured("the template found by its tags (immutable)"),
            ),
            field(
                "source.node",
                Honoured("where the template is looked for (immutable)"),
            ),
            field("targetNode", Support::AtCreation("the node the VM is cloned to")),
            field(
                "allowedNodes",
                Support::AtCreation("the nodes the VM may be placed on"),
            ),
            field(
                "storage",
                Support::AtCreation("the full clone's target storage and new disks' default"),
            ),
            field("cloneMode", Support::AtCreation("full or linked clone")),
            field(
                "pool",
                Support::AtCreation("the PVE resource pool the clone joins"),
            ),
            field(
                "tags",
                Honoured("added to the VM's tags (a removed tag stays on the VM)"),
            ),
            field(
                "seedDriveBus",
                Support::AtCreation("the bus of the CD-ROM the bootstrap seed is attached on"),
            ),
            field(
                "firmware",
                Support::AtCreation(
                    "bios seabios or ovmf, with an EFI disk on storage (else the boot disk's)",
                ),
            ),
            field(
                "secureBoot",
                Support::AtCreation("the EFI disk with Microsoft's keys enrolled (needs firmware UEFI)"),
            ),
            field("tpm", Support::AtCreation("a TPM 2.0 state volume (tpmstate0)")),
            field("cpuType", Support::AtCreation("the cpu option's model")),
            field("cpuFlags", Support::AtCreation("the cpu option's flags")),
            field(
                "pciDevices[].mapping",
                Support::AtCreation("hostpciN by resource mapping (Mapping.Use)"),
            ),
            field(
                "pciDevices[].pcie",
                Support::AtCreation("pcie=1, on a q35 machine"),
            ),
            field("pciDevices[].primaryGpu", Support::AtCreation("x-vga=1")),
            field(
                "highAvailability.rules",
                Honoured("HA rules the VM's HA resource joins (a rule left out later keeps it)"),
            ),
            field(
                "highAvailability.maxRestart",
                Honoured("the HA resource's max_restart"),
            ),
            field(
                "highAvailability.maxRelocate",
                Honoured("the HA resource's max_relocate"),
            ),
            field(
                "vmidRange.start",
                Support::AtCreation("the range the VMID is allocated from"),
            ),
            field(
                "vmidRange.end",
                Support::AtCreation("the range the VMID is allocated from"),
            ),
        ],
        Backend::Libvirt => vec![
            field(
                "source.volume",
                Honoured("the base volume cloned for the boot disk (immutable)"),
            ),
            field(
                "source.image.url",
                Honoured("downloaded by the provider, uploaded once per host and pool as the base volume"),
            ),
            field(
                "source.image.checksumAlgorithm",
                Honoured("the digest computed while downloading"),
            ),
            field(
                "source.image.checksum",
                Honoured("compared before the upload; a mismatch is refused (ImageChecksumMismatch)"),
            ),
            field(
                "seedDriveBus",
                Support::AtCreation(
                    "the bus of the seed CD-ROM in the domain definition (sda on SATA or SCSI, hdc on IDE)",
                ),
            ),
            field(
                "cpuType",
                Support::AtCreation("the domain's <cpu> model (host: host-passthrough)"),
            ),
            field(
                "cpuFlags",
                Support::AtCreation("<feature policy='require'|'disable'> of the <cpu>"),
            ),
            field(
                "tpm",
                Support::AtCreation("a tpm-crb device with the swtpm emulator, TPM 2.0"),
            ),
            field("source.pool", Honoured("the base volume's pool (immutable)")),
            field(
                "storagePool",
                Support::AtCreation("the pool of the VM's volumes and seed"),
            ),
            field("firmware", Support::AtCreation("BIOS (SeaBIOS) or UEFI (OVMF)")),
            field(
                "secureBoot",
                Support::AtCreation(
                    "an OVMF with Secure Boot and enrolled keys (<firmware> features), q35 with SMM; needs UEFI (CEL)",
                ),
            ),
            field(
                "pciDevices[].address",
                Support::AtCreation("a managed VFIO <hostdev> of the host's PCI device at this address"),
            ),
        ],
        Backend::Vsphere => vec![
            field(
                "tagsFromLabels",
                Honoured("the listed labels as vSphere tags, one category per key (vAPI tagging)"),
            ),
            field("source.template", Honoured("the template VM cloned (immutable)")),
            field(
                "source.image.url",
                Honoured("an OVA downloaded by the provider and imported as the template when it is missing"),
            ),
            field(
                "source.image.checksumAlgorithm",
                Honoured("the digest computed while downloading"),
            ),
            field(
                "source.image.checksum",
                Honoured("compared before the import; a mismatch is refused (ImageChecksumMismatch)"),
            ),
            field(
                "firmware",
                Support::AtCreation("config.firmware bios or efi, set before the first power-on"),
            ),
            field(
                "secureBoot",
                Support::AtCreation("bootOptions.efiSecureBootEnabled (needs UEFI)"),
            ),
            field(
                "tpm",
                Support::AtCreation(
                    "a VirtualTPM added before the first power-on (needs UEFI and a key provider in vCenter)",
                ),
            ),
            field(
                "pciDevices[].vendorId",
                Support::AtCreation(
                    "a VirtualPCIPassthrough with Dynamic DirectPath I/O (allowedDevice), memory reservation locked",
                ),
            ),
            field(
                "pciDevices[].deviceId",
                Support::AtCreation("the allowedDevice's device ID"),
            ),
            field(
                "pciDevices[].customLabel",
                Support::AtCreation("the Dynamic DirectPath hardware label"),
            ),
            field(
                "pciDevices[].vgpuProfile",
                Support::AtCreation("a VirtualPCIPassthrough with an NVIDIA vGPU profile (vmiop backing)"),
            ),
            field(
                "datacenter",
                Support::AtCreation("the datacenter the VM is placed in and its networks resolved in"),
            ),
            field("datastore", Support::AtCreation("the clone's datastore")),
            field("folder", Support::AtCreation("the VM folder the clone goes to")),
            field(
                "resourcePool",
                Support::AtCreation("the resource pool (a failure domain's wins)"),
            ),
            field("cloneMode", Support::AtCreation("full or linked clone")),
        ],
    };
    fields.extend(own);
    fields
}

fn tls() -> Vec<Field> {
    vec![
        field(
            "caBundleRef.kind",
            Honoured("the CA bundle's kind (Secret or ConfigMap)"),
        ),
        field(
            "caBundleRef.name",
            Honoured("the CA bundle verifying the server's certificate"),
        ),
        field("caBundleRef.namespace", Honoured("the CA bundle's namespace")),
        field("caBundleRef.key", Honoured("the CA bundle's key")),
        field(
            "sha256Fingerprint",
            Honoured("the server certificate's pinned SHA-256 fingerprint"),
        ),
        field(
            "insecureSkipVerify",
            Honoured("no verification; the cluster says ConnectedWithoutTLSVerification"),
        ),
        field(
            "serverName",
            Honoured("the name the certificate is verified against"),
        ),
    ]
}

fn secret_ref(what: &'static str) -> Vec<Field> {
    // (An infra cluster naming a Provider takes the Provider's: CLUSTER_PROVIDER_REF_RULE.)
    vec![field("name", Honoured(what)), field("namespace", Honoured(what))]
}

/// The infrastructure cluster's fields on `backend` (also its template's
/// `spec.template.spec`).
pub fn cluster_fields(backend: Backend) -> Vec<Field> {
    let mut fields = vec![
        field(
            "controlPlaneEndpoint.host",
            Honoured("the workload cluster's API endpoint (from the Cluster when unset)"),
        ),
        field(
            "controlPlaneEndpoint.port",
            Honoured("the workload cluster's API endpoint (from the Cluster when unset)"),
        ),
        field(
            "providerRef.name",
            Honoured("the Provider whose endpoint, credentials and trust are used"),
        ),
    ];
    match backend {
        Backend::Proxmox => {
            fields.push(field("endpoint", Honoured("the Proxmox VE API URL")));
            fields.extend(under(
                "credentialsRef",
                secret_ref("the API token or user Secret"),
            ));
            fields.extend(under("tls", tls()));
            fields.push(field(
                "allowedNodes",
                Honoured("the nodes machines may use (the failure domains)"),
            ));
            fields.push(field(
                "vmidRange.start",
                Honoured("the range new VMIDs come from"),
            ));
            fields.push(field("vmidRange.end", Honoured("the range new VMIDs come from")));
            fields.push(field("endpoints[].name", Honoured("the failure domain's name")));
            fields.push(field(
                "endpoints[].providerRef.name",
                Honoured("the Provider whose endpoint, credentials and trust this failure domain uses"),
            ));
            fields.push(field(
                "endpoints[].endpoint",
                Honoured("the failure domain's Proxmox VE API URL"),
            ));
            fields.extend(under(
                "endpoints[].credentialsRef",
                secret_ref("the failure domain's API token or user Secret"),
            ));
            fields.extend(under("endpoints[].tls", tls()));
            fields.push(field(
                "endpoints[].allowedNodes",
                Honoured("the nodes of the failure domain machines may use"),
            ));
            fields.push(field(
                "endpoints[].controlPlane",
                Honoured("published in the failure domain for CAPI's control plane placement"),
            ));
        }
        Backend::Libvirt => {
            fields.push(field("uri", Honoured("the single host's libvirt URI")));
            fields.extend(under(
                "credentialsRef",
                secret_ref("the SSH key or TLS client Secret of every host"),
            ));
            fields.push(field("hosts[].name", Honoured("the failure domain's name")));
            fields.push(field("hosts[].uri", Honoured("the host's libvirt URI")));
            fields.extend(under(
                "hosts[].credentialsRef",
                secret_ref("the host's own credentials Secret"),
            ));
            fields.push(field(
                "hosts[].controlPlane",
                Honoured("published in the failure domain for CAPI's control plane placement"),
            ));
        }
        Backend::Vsphere => {
            fields.push(field("server", Honoured("the vCenter address")));
            fields.extend(under("credentialsRef", secret_ref("the vCenter user Secret")));
            fields.extend(under("tls", tls()));
            fields.push(field(
                "datacenter",
                Honoured("the default datacenter of the machines"),
            ));
            fields.push(field(
                "failureDomains[].name",
                Honoured("the failure domain's name"),
            ));
            fields.push(field(
                "failureDomains[].computeCluster",
                Honoured("the compute cluster of the failure domain's machines"),
            ));
            fields.push(field(
                "failureDomains[].resourcePool",
                Honoured("the resource pool of the failure domain's machines"),
            ));
            fields.push(field(
                "failureDomains[].datastore",
                Honoured("the datastore of the failure domain's machines"),
            ));
            fields.push(field(
                "failureDomains[].controlPlane",
                Honoured("published in the failure domain for CAPI's control plane placement"),
            ));
            fields.push(field(
                "failureDomains[].attributes",
                Honoured("published in the failure domain (informational)"),
            ));
            fields.push(field(
                "failureDomains[].server",
                Honoured("the failure domain's own vCenter"),
            ));
            fields.push(field(
                "failureDomains[].providerRef.name",
                Honoured("the Provider whose vCenter, credentials and trust this failure domain uses"),
            ));
            fields.extend(under(
                "failureDomains[].credentialsRef",
                secret_ref("the failure domain's vCenter user Secret"),
            ));
            fields.extend(under("failureDomains[].tls", tls()));
            fields.push(field(
                "failureDomains[].datacenter",
                Honoured("the datacenter of the failure domain's machines"),
            ));
        }
    }
    fields
}

/// A neutral field copied onto the infrastructure machine's `path`: the machine's decision.
fn via_machine(backend: Backend, neutral: &str, machine_path: &str) -> Field {
    let support = machine_fields(backend)
        .into_iter()
        .find(|f| f.path == machine_path)
        .map(|f| f.support)
        .unwrap_or(NotApplicable("not declared for the machine"));
    Field::new(neutral, support)
}

fn image_source(backend: Backend, prefix: &str) -> Vec<Field> {
    let this = |b: Backend, path: &str| {
        if b == backend {
            via_machine(
                backend,
                &format!("{prefix}.{}.{path}", b.as_str()),
                &format!("source.{path}"),
            )
        } else {
            Field::new(
                format!("{prefix}.{}.{path}", b.as_str()),
                NotApplicable("another backend's entry: used only on that backend"),
            )
        }
    };
    vec![
        this(Backend::Proxmox, "vmid"),
        this(Backend::Proxmox, "name"),
        this(Backend::Proxmox, "tags"),
        this(Backend::Proxmox, "node"),
        this(Backend::Proxmox, "image.url"),
        this(Backend::Proxmox, "image.checksumAlgorithm"),
        this(Backend::Proxmox, "image.checksum"),
        this(Backend::Proxmox, "imageStorage"),
        this(Backend::Libvirt, "volume"),
        this(Backend::Libvirt, "pool"),
        this(Backend::Libvirt, "image.url"),
        this(Backend::Libvirt, "image.checksumAlgorithm"),
        this(Backend::Libvirt, "image.checksum"),
        this(Backend::Vsphere, "template"),
        this(Backend::Vsphere, "image.url"),
        this(Backend::Vsphere, "image.checksumAlgorithm"),
        this(Backend::Vsphere, "image.checksum"),
    ]
}

fn label_selector(what: &'static str) -> Vec<Field> {
    vec![
        field("matchLabels", Honoured(what)),
        field("matchExpressions[].key", Honoured(what)),
        field("matchExpressions[].operator", Honoured(what)),
        field("matchExpressions[].values", Honoured(what)),
    ]
}

/// The fields of a neutral kind (not [`Kind::Machine`] or [`Kind::Cluster`]) on `backend`.
pub fn neutral_fields(kind: Kind, backend: Backend) -> Vec<Field> {
    match kind {
        Kind::VirtualMachine => virtual_machine(backend),
        Kind::VirtualMachineClass => {
            let mut fields = vec![
                via_machine(backend, "cpu.cores", "cpu.cores"),
                via_machine(backend, "cpu.sockets", "cpu.sockets"),
                via_machine(backend, "memoryMiB", "memoryMiB"),
            ];
            for leaf in ["name", "sizeGiB", "storage"] {
                fields.push(via_machine(
                    backend,
                    &format!("disks[].{leaf}"),
                    &format!("disks[].{leaf}"),
                ));
            }
            fields
        }
        Kind::VirtualMachineImage => {
            let mut fields = vec![
                field("displayName", NotApplicable("shown to humans only")),
                field(
                    "osType",
                    refused(
                        Refused::Values(&["Windows"]),
                        "Windows guests (cloudbase-init) are not supported yet: every backend delivers cloud-init data",
                    ),
                ),
                field(
                    "sources[].provider",
                    Honoured("the entry applies to this Provider only"),
                ),
                match backend {
                    Backend::Vsphere => field(
                        "seedDriveBus",
                        NotApplicable("vSphere passes cloud-init data through guestinfo: no seed drive"),
                    ),
                    _ => via_machine(backend, "seedDriveBus", "seedDriveBus"),
                },
                via_machine(backend, "firmware", "firmware"),
            ];
            fields.extend(image_source(backend, "sources[]"));
            fields
        }
        Kind::Provider => provider(backend),
        Kind::Machine | Kind::Cluster => Vec::new(),
    }
}

fn virtual_machine(backend: Backend) -> Vec<Field> {
    let mut fields = vec![
        field(
            "providerRef.name",
            Honoured("the Provider the VM runs on (controller)"),
        ),
        field(
            "classRef.name",
            Honoured("the class whose CPU, memory and disks the VM's own fields override (controller)"),
        ),
        field(
            "imageRef.name",
            Honoured("the image whose entry for the Provider's backend is the machine's source (controller)"),
        ),
        field(
            "userDataSecretRef.name",
            Honoured("the Secret whose user data the provider delivers (cloud-config)"),
        ),
        field(
            "userDataSecretRef.key",
            Honoured("the Secret's key holding the user data"),
        ),
        via_machine(backend, "memoryMiB", "memoryMiB"),
        via_machine(backend, "powerState", "powerState"),
        via_machine(backend, "restartPolicy", "restartPolicy"),
        via_machine(
            backend,
            "readinessChecks.skipGuestAgent",
            "readinessChecks.skipGuestAgent",
        ),
        via_machine(
            backend,
            "readinessChecks.skipCloudInit",
            "readinessChecks.skipCloudInit",
        ),
        field(
            "placement.failureDomain",
            Honoured("the failure domain of the Provider the VM is placed in"),
        ),
    ];
    fields.extend(under(
        "placement.providerSelector",
        label_selector("selects the Provider by its labels (controller)"),
    ));
    fields.push(match backend {
        Backend::Proxmox => via_machine(backend, "placement.node", "targetNode"),
        Backend::Libvirt | Backend::Vsphere => field(
            "placement.node",
            refused(
                Refused::Any,
                "this backend has no node to pin a VM to: use placement.failureDomain (a libvirt host, a vSphere failure domain)",
            ),
        ),
    });
    fields.extend(image_source(backend, "source"));
    for leaf in ["cores", "sockets"] {
        fields.push(via_machine(
            backend,
            &format!("cpu.{leaf}"),
            &format!("cpu.{leaf}"),
        ));
    }
    for f in machine_fields(backend) {
        if f.path.starts_with("disks[].") || f.path.starts_with("networks[].") {
            fields.push(f);
        }
    }
    fields
}

fn provider(backend: Backend) -> Vec<Field> {
    let only = |on: &[Backend], path: &str, how: &'static str, refusal: &'static str| {
        if on.contains(&backend) {
            field(path, Honoured(how))
        } else {
            field(path, RefusedAtAdmission(refusal))
        }
    };
    let mut fields = vec![
        field(
            "backend",
            Honoured("the backend of every VM placed on the Provider (immutable)"),
        ),
        field(
            "endpoint",
            Honoured("the hypervisor's API URL (libvirt: its URI)"),
        ),
        field(
            "capacity.virtualMachines",
            Honoured("no more VMs are placed on the Provider beyond it (controller)"),
        ),
        field(
            "capacity.vcpus",
            Honoured("no VM is placed on the Provider beyond it: cores × sockets of its VMs (controller)"),
        ),
        field(
            "capacity.memoryMiB",
            Honoured("no VM is placed on the Provider beyond it: the memory of its VMs (controller)"),
        ),
        field(
            "capacity.storageGiB",
            Honoured(
                "no VM is placed on the Provider beyond it: the sizes of the disks its VMs declare (a VM that declares none is refused, StorageNotDeclared) (controller)",
            ),
        ),
        only(
            &[Backend::Proxmox],
            "nodes",
            "the nodes VMs may be placed on",
            PROVIDER_NODES_RULE,
        ),
        field(
            "defaults.storage",
            Honoured(
                "the default storage (Proxmox storage, libvirt pool, vSphere datastore) of VMs created while it is set; an existing VM keeps its own",
            ),
        ),
        field(
            "defaults.network",
            Honoured("the network of a VM that names none"),
        ),
        only(
            &[Backend::Proxmox, Backend::Vsphere],
            "defaults.resourcePool",
            "the pool (Proxmox resource pool, vSphere resource pool) of VMs created while it is set; an existing VM keeps its own",
            PROVIDER_RESOURCE_POOL_RULE,
        ),
        only(
            &[Backend::Vsphere],
            "defaults.datacenter",
            "the datacenter of VMs created while it is set; an existing VM keeps its own",
            PROVIDER_VSPHERE_DEFAULTS_RULE,
        ),
        only(
            &[Backend::Vsphere],
            "defaults.folder",
            "the VM folder of VMs created while it is set; an existing VM keeps its own",
            PROVIDER_VSPHERE_DEFAULTS_RULE,
        ),
    ];
    fields.extend(under("credentialsRef", secret_ref("the credentials Secret")));
    fields.extend(under(
        "namespaceSelector",
        label_selector("the namespaces whose VMs may use the Provider"),
    ));
    let tls_fields = tls().into_iter().map(|f| match backend {
        Backend::Libvirt => Field::new(f.path, RefusedAtAdmission(PROVIDER_TLS_RULE)),
        Backend::Proxmox | Backend::Vsphere => f,
    });
    fields.extend(under("tls", tls_fields.collect()));
    fields
}

/// Message of the infra cluster's rule refusing its own credentials or trust beside a Provider.
pub const CLUSTER_PROVIDER_REF_RULE: &str = "with spec.providerRef, the Provider's credentials and TLS trust are used: remove spec.credentialsRef and spec.tls";
/// Message of the Provider's rule refusing `tls` on libvirt.
pub const PROVIDER_TLS_RULE: &str =
    "spec.tls is not used by a libvirt Provider (its URI's transport carries the trust): remove it";
/// Message of the Provider's rule refusing `nodes` outside Proxmox.
pub const PROVIDER_NODES_RULE: &str = "spec.nodes is only used by a proxmox Provider: remove it (libvirt: one host per Provider; vSphere: use failure domains)";
/// Message of the Provider's rule refusing `defaults.resourcePool` on libvirt.
pub const PROVIDER_RESOURCE_POOL_RULE: &str =
    "spec.defaults.resourcePool is not used by a libvirt Provider: remove it";
/// Message of the Provider's rule refusing vSphere-only defaults elsewhere.
pub const PROVIDER_VSPHERE_DEFAULTS_RULE: &str =
    "spec.defaults.datacenter and spec.defaults.folder are only used by a vsphere Provider: remove them";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_neutral_field_copied_to_the_machine_has_the_machines_decision() {
        let vm = virtual_machine(Backend::Vsphere);
        let vlan = vm.iter().find(|f| f.path == "networks[].vlan").map(|f| f.support);
        assert!(matches!(vlan, Some(Support::Refused { .. })), "{vlan:?}");
        let proxmox = virtual_machine(Backend::Proxmox);
        let node = proxmox
            .iter()
            .find(|f| f.path == "placement.node")
            .map(|f| f.support);
        assert_eq!(node, Some(Support::AtCreation("the node the VM is cloned to")));
    }
}
