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
