//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// An API for `crd`'s storage version: namespaced in `namespace` when the CRD is namespaced.
pub fn dynamic_api(
    client: kube::Client,
    crd: &CustomResourceDefinition,
    namespace: &str,
) -> Api<DynamicObject> {
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .unwrap_or_else(|| panic!("CRD {:?} has no storage version", crd.metadata.name));
    let group = &crd.spec.group;
    let resource = ApiResource {
        group: group.clone(),
        version: version.name.clone(),
        api_version: format!("{group}/{}", version.name),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    };
    if crd.spec.scope == "Namespaced" {
        Api::namespaced_with(client, namespace, &resource)
    } else {
        Api::all_with(client, &resource)
    }
}
