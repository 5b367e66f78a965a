//! Every CustomResourceDefinition of banlieue, generated from the Rust types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::banlieue::{Provider, VirtualMachine, VirtualMachineClass, VirtualMachineImage};
use crate::infrastructure::{
    LibvirtCluster, LibvirtClusterTemplate, LibvirtMachine, LibvirtMachineTemplate, ProxmoxCluster,
    ProxmoxClusterTemplate, ProxmoxMachine, ProxmoxMachineTemplate, VSphereCluster, VSphereClusterTemplate,
    VSphereMachine, VSphereMachineTemplate,
};

/// Every CRD, in a stable order: the `banlieue.io` kinds, then the infrastructure kinds per
/// backend.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        VirtualMachine::crd(),
        Provider::crd(),
        VirtualMachineClass::crd(),
        VirtualMachineImage::crd(),
        ProxmoxCluster::crd(),
        ProxmoxMachine::crd(),
        ProxmoxClusterTemplate::crd(),
        ProxmoxMachineTemplate::crd(),
        LibvirtCluster::crd(),
        LibvirtMachine::crd(),
        LibvirtClusterTemplate::crd(),
        LibvirtMachineTemplate::crd(),
        VSphereCluster::crd(),
        VSphereMachine::crd(),
        VSphereClusterTemplate::crd(),
        VSphereMachineTemplate::crd(),
    ]
}

/// The CRD of the given kind, if it is one of banlieue's.
pub fn by_kind(kind: &str) -> Option<CustomResourceDefinition> {
    all().into_iter().find(|crd| crd.spec.names.kind == kind)
}

/// The `openAPIV3Schema` of the CRD of the given kind, as JSON.
pub fn schema_of(kind: &str) -> Option<serde_json::Value> {
    let crd = by_kind(kind)?;
    let schema = crd
        .spec
        .versions
        .first()?
        .schema
        .as_ref()?
        .open_api_v3_schema
        .as_ref()?;
    serde_json::to_value(schema).ok()
}

/// File name of a CRD under `config/crd/`: `<crd name>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"))
}

/// Renders a CRD as one YAML document (without a leading `---`), safe for YAML 1.1 readers
/// such as `kubectl` and `clusterctl` ([`crate::yaml`]).
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml::Error> {
    crate::yaml::to_string(crd)
}
