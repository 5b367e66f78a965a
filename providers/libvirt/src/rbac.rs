//! The Kubernetes API rights `banlieue-libvirt` needs, as data: the kit's contract rules for the
//! `libvirt*` kinds (the single source for the generated RBAC manifests and the least-privilege
//! test). libvirt needs nothing beyond the contract.

banlieue_provider_kit::contract_rbac!("libvirt", extra: []);
