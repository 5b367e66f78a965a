//! libvirt: `LibvirtCluster`, `LibvirtMachine` and their templates.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{
    ApiEndpoint, Cpu, Disk, FailureDomain, Firmware, ImageDownload, Initialization, MachineAddress,
    MachineTemplateStatus, NetworkInterface, ObjectMetaTemplate, PowerState, ProviderReference,
    ProvisioningStatus, ReadinessChecks, RestartPolicy, SecretReference, SeedDriveBus,
};

/// The libvirt base volume a machine's boot disk is cloned from (copy-on-write backing file):
/// an existing volume (`volume`), or an image the provider imports from a URL (`image`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.volume) != has(self.image)",
        "message": "set exactly one of volume (an existing base volume) or image (a URL to import)"
    }
]))]
pub struct LibvirtVolumeSource {
    /// Name of an existing base volume, e.g. `ubuntu-24.04.qcow2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub volume: Option<String>,
    /// Storage pool holding the base volume (or receiving the import), e.g. `default`.
    #[schemars(length(min = 1, max = 253))]
    pub pool: String,
    /// An image to import into `pool` as the base volume
    /// `banlieue-image-<algorithm>-<checksum>`: downloaded by the provider, verified, uploaded
    /// once per host and pool, and kept when its machines are deleted (delete the volume to
    /// reclaim the space).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageDownload>,
}

/// One libvirt host of a LibvirtCluster: a failure domain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LibvirtHost {
    /// Failure-domain name (a DNS label): what `Machine.spec.failureDomain` names, the
    /// `<host>` of the `libvirt://<host>/<domain uuid>` providerID, and `status.node`.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// libvirt connection URI, e.g. `qemu+ssh://root@kvm1.example.com/system`.
    #[schemars(
        length(min = 7, max = 2048),
        regex(pattern = r"^(qemu|qemu\+ssh|qemu\+libssh|qemu\+libssh2|qemu\+tls|qemu\+tcp|test)://")
    )]
    pub uri: String,
    /// Secret with this host's credentials (same keys as the cluster's `credentialsRef`, which
    /// it replaces for this host). Unset: the cluster's `credentialsRef`, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_ref: Option<SecretReference>,
    /// Whether control plane machines may be placed on this host (default `true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
}

/// A libvirt host hosting a Cluster API workload cluster.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "LibvirtCluster",
    plural = "libvirtclusters",
    namespaced,
    status = "LibvirtClusterStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "lvcluster",
    category = "banlieue",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "Cluster API infrastructure cluster on a libvirt host.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",
        description = "Cluster API Cluster"
    ),
    printcolumn(
        name = "Provisioned",
        type_ = "boolean",
        json_path = ".status.initialization.provisioned"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".spec.controlPlaneEndpoint.host"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "[has(self.providerRef), has(self.uri), has(self.hosts)].exists_one(x, x)",
        "message": "set exactly one of spec.providerRef (a banlieue Provider), spec.uri (one host) or spec.hosts (several hosts, each a failure domain)"
    },
    {
        "rule": "!has(oldSelf.controlPlaneEndpoint) || (has(self.controlPlaneEndpoint) && self.controlPlaneEndpoint == oldSelf.controlPlaneEndpoint)",
        "message": "spec.controlPlaneEndpoint is immutable once set"
    }
]))]
pub struct LibvirtClusterSpec {
    /// Endpoint of the workload cluster's API server; copied to the Cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// A banlieue `Provider` (backend `libvirt`) giving the URI and credentials. Mutually
    /// exclusive with `uri`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ProviderReference>,
    /// libvirt connection URI of a single host, e.g. `qemu+ssh://root@host.example.com/system`;
    /// the failure domain is named after the URI's host part (`localhost` for local URIs).
    /// Mutually exclusive with `hosts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 7, max = 2048),
        regex(pattern = r"^(qemu|qemu\+ssh|qemu\+libssh|qemu\+libssh2|qemu\+tls|qemu\+tcp|test)://")
    )]
    pub uri: Option<String>,
    /// Several libvirt hosts, keyed by name; each is a failure domain. Mutually exclusive with
    /// `uri`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub hosts: Vec<LibvirtHost>,
    /// Secret (in the LibvirtCluster's namespace unless `namespace` is set) with the connection
    /// credentials: `ssh-privatekey` and `known_hosts` for `qemu+ssh`/`qemu+libssh` URIs, or
    /// `ca.crt`, `tls.crt`, `tls.key` for `qemu+tls` URIs. The provider writes them to 0600 files
    /// and passes their paths as URI parameters (`keyfile`, `known_hosts`, `pkipath`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_ref: Option<SecretReference>,
}

/// Observed state of a LibvirtCluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LibvirtClusterStatus {
    /// `provisioned: true` once the cluster infrastructure is ready; omitted before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Failure domains, copied to the Cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub failure_domains: Vec<FailureDomain>,
    /// Conditions, keyed by type; `Ready` is mirrored as the Cluster's `InfrastructureReady`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The libvirt version of the daemon of the first host that answered, from the last connection check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// A libvirt domain backing a Cluster API Machine (or a banlieue VirtualMachine).
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "LibvirtMachine",
    plural = "libvirtmachines",
    namespaced,
    status = "LibvirtMachineStatus",
    derive = "PartialEq",
    shortname = "lvmachine",
    category = "banlieue",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "Cluster API infrastructure machine on libvirt.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",
        description = "Cluster API Cluster"
    ),
    printcolumn(name = "State", type_ = "string", json_path = ".status.provisioning.state"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.node"),
    printcolumn(
        name = "IP",
        type_ = "string",
        json_path = ".status.addresses[?(@.type==\"InternalIP\")].address"
    ),
    printcolumn(
        name = "ProviderID",
        type_ = "string",
        json_path = ".spec.providerID",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(oldSelf.providerID) || (has(self.providerID) && self.providerID == oldSelf.providerID)",
        "message": "spec.providerID is immutable once set"
    },
    {
        "rule": "self.source == oldSelf.source",
        "message": "spec.source is immutable: create a new machine to change the base volume"
    },
    {
        "rule": "!has(self.secureBoot) || !self.secureBoot || (has(self.firmware) && self.firmware == 'UEFI')",
        "message": "secureBoot needs firmware: UEFI"
    },
    {
        "rule": "!has(self.secureBoot) || !self.secureBoot || !has(self.seedDriveBus) || self.seedDriveBus != 'IDE'",
        "message": "secureBoot runs on a q35 machine, which has no IDE controller: use seedDriveBus SATA or SCSI"
    }
]))]
pub struct LibvirtMachineSpec {
    /// `libvirt://<host>/<domain uuid>` once the domain exists (`<host>` = the failure-domain
    /// name of the libvirt host, `<domain uuid>` = lower-case, also the guest's SMBIOS system
    /// uuid); must equal the workload Node's `spec.providerID`. Set by the provider; immutable
    /// once set.
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub provider_id: Option<String>,
    /// A banlieue `Provider` to take the URI and credentials from, for machines without a CAPI
    /// Cluster. Unset: use the Cluster's LibvirtCluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ProviderReference>,
    /// Base volume the boot disk is cloned from. Immutable.
    pub source: LibvirtVolumeSource,
    /// Storage pool for the machine's volumes; defaults to the source's pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_pool: Option<String>,
    /// Virtual CPU topology.
    pub cpu: Cpu,
    /// Memory in MiB (at least 128).
    #[serde(rename = "memoryMiB")]
    #[schemars(range(min = 128, max = 16777216))]
    pub memory_mib: u64,
    /// Disks, keyed by name; the first is the boot disk, resized from the base volume. A disk
    /// may grow but never shrink. `storage` is a libvirt pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub disks: Vec<Disk>,
    /// Network interfaces, keyed by name; `network` is a libvirt network name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub networks: Vec<NetworkInterface>,
    /// `BIOS` (default) or `UEFI`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    /// Guest readiness checks; skip them for guests without qemu-guest-agent or cloud-init.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_checks: Option<ReadinessChecks>,
    /// Desired power state: `On` (default when unset) or `Off`. Set by the banlieue controller
    /// from a VirtualMachine's `spec.powerState`; unset for machines of CAPI Machines. The
    /// provider powers a provisioned machine on or off to match and reports `status.powerState`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<PowerState>,
    /// Whether the provider may restart the running VM to apply a change that needs it (CPU,
    /// memory): `Manual` (default when unset: the change waits for the next power-off and
    /// `VMUpToDate` says `RestartRequired`) or `Automatic`. Set by the banlieue controller from a
    /// VirtualMachine's `spec.restartPolicy`; a CAPI machine is replaced by CAPI, not changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,
    /// Bus of the CD-ROM drive the bootstrap seed is attached on: `SATA` (default when unset,
    /// `sda`), `SCSI` (`sda` on a virtio-scsi controller) or `IDE` (`hdc`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_drive_bus: Option<SeedDriveBus>,
    /// CPU model the guest sees: `host` (host-passthrough) or a libvirt model name
    /// (`Skylake-Server`, `EPYC-Rome`, `qemu64`…). Unset: host-passthrough on KVM, QEMU's default
    /// on TCG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"))]
    pub cpu_type: Option<String>,
    /// CPU features to require (`+aes`) or disable (`-pcid`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        inner(length(min = 2, max = 64), regex(pattern = r"^[+-][a-z0-9_.-]+$"))
    )]
    pub cpu_flags: Vec<String>,
    /// An emulated TPM 2.0 (`tpm-crb` with libvirt's swtpm emulator; the host needs swtpm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<bool>,
    /// UEFI Secure Boot: libvirt picks an OVMF build with Secure Boot and Microsoft's keys
    /// enrolled (`<firmware>` features `secure-boot`, `enrolled-keys`), on a q35 machine with SMM.
    /// Needs `firmware: UEFI` and a seed drive on SATA or SCSI (q35 has no IDE); the host needs
    /// such an OVMF build (Debian: `ovmf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
    /// Host PCI devices (GPUs, NICs) passed through with VFIO (`<hostdev managed='yes'>`:
    /// libvirt detaches each from its host driver while the domain runs). The addresses are the
    /// host's, so a machine with PCI devices belongs on a host (failure domain) that has them
    /// free; the host needs an IOMMU (`intel_iommu=on` / `amd_iommu=on`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub pci_devices: Vec<LibvirtPciDevice>,
}

/// A host PCI device passed through to a libvirt domain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LibvirtPciDevice {
    /// The device's PCI address on the host, `domain:bus:slot.function` as `lspci -D` shows
    /// it, e.g. `0000:01:00.0`.
    #[schemars(regex(pattern = r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$"))]
    pub address: String,
}

/// Observed state of a LibvirtMachine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LibvirtMachineStatus {
    /// `provisioned: true` once the domain runs and `spec.providerID` is set; omitted before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Addresses of the domain, copied to the Machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub addresses: Vec<MachineAddress>,
    /// Failure domain the domain was placed in, copied to the Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub failure_domain: Option<String>,
    /// Conditions, keyed by type; `Ready` is mirrored as the Machine's `InfrastructureReady`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// UUID of the libvirt domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_uuid: Option<String>,
    /// Host the domain runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Observed power state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<PowerState>,
    /// Persisted provisioning progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning: Option<ProvisioningStatus>,
}

/// `spec.template` of a LibvirtClusterTemplate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LibvirtClusterTemplateResource {
    /// Labels and annotations for the LibvirtClusters created from the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// Spec of the LibvirtClusters created from the template.
    pub spec: LibvirtClusterSpec,
}

/// A template of LibvirtClusters, for ClusterClasses.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "LibvirtClusterTemplate",
    plural = "libvirtclustertemplates",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    shortname = "lvct",
    category = "banlieue",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "Template of libvirt infrastructure clusters, for ClusterClasses.",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct LibvirtClusterTemplateSpec {
    /// The LibvirtCluster to create.
    pub template: LibvirtClusterTemplateResource,
}

/// `spec.template` of a LibvirtMachineTemplate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.spec.providerID)",
        "message": "spec.template.spec.providerID must not be set in a template: each machine gets its own"
    }
]))]
pub struct LibvirtMachineTemplateResource {
    /// Labels and annotations for the LibvirtMachines created from the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// Spec of the LibvirtMachines created from the template.
    pub spec: LibvirtMachineSpec,
}

/// A template of LibvirtMachines.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "LibvirtMachineTemplate",
    plural = "libvirtmachinetemplates",
    namespaced,
    status = "MachineTemplateStatus",
    derive = "PartialEq",
    shortname = "lvmt",
    category = "banlieue",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "Template of libvirt infrastructure machines.",
    printcolumn(
        name = "Cores",
        type_ = "integer",
        json_path = ".spec.template.spec.cpu.cores"
    ),
    printcolumn(
        name = "Memory (MiB)",
        type_ = "integer",
        json_path = ".spec.template.spec.memoryMiB"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
// `spec.template.spec` is immutable, but not to CAPI's topology controller's dry-run requests
// (ClusterClass): a CEL rule cannot tell those apart, an admission policy can
// (`crate::policies::immutable_templates`).
pub struct LibvirtMachineTemplateSpec {
    /// The LibvirtMachine to create.
    pub template: LibvirtMachineTemplateResource,
}
