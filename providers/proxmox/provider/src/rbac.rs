//! The Kubernetes API rights `banlieue-proxmox` needs, as data: the kit's contract rules for the
//! `proxmox*` kinds (the single source for the generated RBAC manifests and the least-privilege
//! test) and the ConfigMaps a CA bundle may come from.

banlieue_provider_kit::contract_rbac!(
    "proxmox",
    extra: [
        banlieue_provider_kit::rbac::CA_BUNDLE_CONFIGMAPS,
    ]
);
