//! Kind-name dispatch shared by the integration tests.
#![allow(dead_code)] // each test binary uses a subset

use banlieue_api::banlieue::{Provider, VirtualMachine, VirtualMachineClass, VirtualMachineImage};
use banlieue_api::infrastructure::{
    LibvirtCluster, LibvirtClusterTemplate, LibvirtMachine, LibvirtMachineTemplate, ProxmoxCluster,
    ProxmoxClusterTemplate, ProxmoxMachine, ProxmoxMachineTemplate, VSphereCluster, VSphereClusterTemplate,
    VSphereMachine, VSphereMachineTemplate,
};
use serde_json::Value;

fn rt<T: serde::de::DeserializeOwned + serde::Serialize>(value: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

/// Parses `value` as the Rust type of `kind` and serializes it back.
pub fn through_rust(kind: &str, value: &Value) -> Result<Value, String> {
    match kind {
        "VirtualMachine" => rt::<VirtualMachine>(value),
        "Provider" => rt::<Provider>(value),
        "VirtualMachineClass" => rt::<VirtualMachineClass>(value),
        "VirtualMachineImage" => rt::<VirtualMachineImage>(value),
        "ProxmoxCluster" => rt::<ProxmoxCluster>(value),
        "ProxmoxMachine" => rt::<ProxmoxMachine>(value),
        "ProxmoxClusterTemplate" => rt::<ProxmoxClusterTemplate>(value),
        "ProxmoxMachineTemplate" => rt::<ProxmoxMachineTemplate>(value),
        "LibvirtCluster" => rt::<LibvirtCluster>(value),
        "LibvirtMachine" => rt::<LibvirtMachine>(value),
        "LibvirtClusterTemplate" => rt::<LibvirtClusterTemplate>(value),
        "LibvirtMachineTemplate" => rt::<LibvirtMachineTemplate>(value),
        "VSphereCluster" => rt::<VSphereCluster>(value),
        "VSphereMachine" => rt::<VSphereMachine>(value),
        "VSphereClusterTemplate" => rt::<VSphereClusterTemplate>(value),
        "VSphereMachineTemplate" => rt::<VSphereMachineTemplate>(value),
        other => Err(format!("unknown kind {other}")),
    }
}

/// True when `v` contains a JSON `null` anywhere.
pub fn contains_null(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.iter().any(contains_null),
        Value::Object(o) => o.values().any(contains_null),
        _ => false,
    }
}
