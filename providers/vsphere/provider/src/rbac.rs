//! The Kubernetes API rights `banlieue-vsphere` needs, as data: the kit's contract rules for
//! the `vsphere*` kinds (the single source for the generated RBAC manifests and the
//! least-privilege test), and the ConfigMaps a CA bundle may come from.

banlieue_provider_kit::contract_rbac!("vsphere", extra: [banlieue_provider_kit::rbac::CA_BUNDLE_CONFIGMAPS]);
