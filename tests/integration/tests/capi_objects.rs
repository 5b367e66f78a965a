//! The generated CAPI types serialise objects that CAPI's own published CRDs accept: realistic
//! fixtures go YAML → Rust type → JSON → the real apiserver with CAPI's CRDs (`api/capi/crds`).

mod common;

use kube::api::{DynamicObject, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use banlieue_testenv::TestEnv;

fn through_rust<T: DeserializeOwned + Serialize>(fixture: &str) -> DynamicObject {
    let path = common::repo_root().join("api/capi/tests/fixtures").join(fixture);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let typed: T = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{fixture}: {e}"));
    let mut object: DynamicObject = serde_json::from_value(serde_json::to_value(&typed).unwrap()).unwrap();
    // Server-managed metadata from the fixture cannot be created.
    let name = object.metadata.name.clone();
    let labels = object.metadata.labels.clone();
    let annotations = object.metadata.annotations.clone();
    object.metadata = Default::default();
    object.metadata.name = name;
    object.metadata.labels = labels;
    object.metadata.annotations = annotations;
    object
}

#[tokio::test]
async fn capi_fixtures_built_from_rust_types_validate_against_capi_crds() -> anyhow::Result<()> {
    let env = TestEnv::shared().await?;
    let files = banlieue_capi::crds::files()?;
    let crds = banlieue_testenv::crds_from_files(&files)?;
    env.install_crds(&crds).await?;
    let namespace = env.namespace("capi-objects").await?;
    let client = env.client().await?;

    let objects = [
        (
            "cluster.yaml",
            through_rust::<banlieue_capi::Cluster>("cluster.yaml"),
        ),
        (
            "machine.yaml",
            through_rust::<banlieue_capi::Machine>("machine.yaml"),
        ),
        (
            "machine_set.yaml",
            through_rust::<banlieue_capi::MachineSet>("machine_set.yaml"),
        ),
        (
            "machine_deployment.yaml",
            through_rust::<banlieue_capi::MachineDeployment>("machine_deployment.yaml"),
        ),
        (
            "kubeadm_config.yaml",
            through_rust::<banlieue_capi::KubeadmConfig>("kubeadm_config.yaml"),
        ),
        (
            "kubeadm_control_plane.yaml",
            through_rust::<banlieue_capi::KubeadmControlPlane>("kubeadm_control_plane.yaml"),
        ),
        (
            "ip_address_claim.yaml",
            through_rust::<banlieue_capi::IpAddressClaim>("ip_address_claim.yaml"),
        ),
        (
            "ip_address.yaml",
            through_rust::<banlieue_capi::IpAddress>("ip_address.yaml"),
        ),
    ];
    let mut failures = Vec::new();
    for (fixture, object) in objects {
        let types = object.types.clone().expect("fixtures carry apiVersion and kind");
        let crd = crds
            .iter()
            .find(|crd| crd.spec.names.kind == types.kind && types.api_version.starts_with(&crd.spec.group))
            .unwrap_or_else(|| panic!("no CAPI CRD for {}", types.kind));
        let api = common::dynamic_api(client.clone(), crd, &namespace);
        let result = api
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &object,
            )
            .await;
        if let Err(error) = result {
            failures.push(format!("{fixture}: {error}"));
        }
    }
    assert!(
        failures.is_empty(),
        "CAPI's CRDs reject objects from our types:\n{}",
        failures.join("\n")
    );
    Ok(())
}
