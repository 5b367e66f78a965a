//! The Kubernetes API rights `banlieue-proxmox` needs, as data: the kit's contract rules for the
//! `proxmox*` kinds (the single source for the generated RBAC manifests and the least-privilege
//! test), the ConfigMaps a CA bundle may come from, and CAPI IPAM.

banlieue_provider_kit::contract_rbac!(
    "proxmox",
    extra: [
        banlieue_provider_kit::rbac::CA_BUNDLE_CONFIGMAPS,
        Rule {
            api_groups: &["infrastructure.banlieue.io"],
            resources: &["proxmoxmachines/finalizers"],
            verbs: &["update"],
            why: "IPAddressClaims are owned by their ProxmoxMachine with blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement admission plugin allows only to who may update the owner's finalizers",
        },
        Rule {
            api_groups: &["ipam.cluster.x-k8s.io"],
            resources: &["ipaddressclaims"],
            verbs: &["get", "create"],
            why: "CAPI IPAM: claim an address per `mode: Pool` interface and family, read the claim's addressRef (by name; the owner reference lets the garbage collector delete them)",
        },
        Rule {
            api_groups: &["ipam.cluster.x-k8s.io"],
            resources: &["ipaddresses"],
            verbs: &["get"],
            why: "CAPI IPAM: read the IPAddress a claim points at (by name, polled while waiting)",
        },
    ]
);
