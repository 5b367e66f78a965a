//! The validation table (`tests/validation/*.yaml`) against a real kube-apiserver: install every
//! CRD from `config/crd/`, create each case's object (after its `old_object` for update cases)
//! and assert the apiserver's accept/reject and that its message contains the case's `message`.
//!
//! Needs the control plane binaries built by `tests/controlplane/build.sh` (or
//! `BANLIEUE_TEST_KUBECONFIG` pointing at a cluster).

use std::path::Path;

use banlieue_api::{crds, validation};
use banlieue_testenv::TestEnv;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;

fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => status.message.clone(),
        other => format!("{other:#}"),
    }
}

#[tokio::test]
async fn table_holds_against_the_real_apiserver() -> anyhow::Result<()> {
    let env = TestEnv::shared().await?;
    let files: Vec<_> = crds::all()
        .iter()
        .map(|crd| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../config/crd")
                .join(crds::file_name(crd))
        })
        .collect();
    env.install_crd_files(&files).await?;
    let ns = env.namespace("api-validation").await?;
    let client = env.client().await?;

    let cases = validation::load()?;
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let id = format!("{}: {}", case.kind, case.name);
        let crd = crds::by_kind(&case.kind).ok_or_else(|| anyhow::anyhow!("{id}: unknown kind"))?;
        let gvk = GroupVersionKind::gvk(&crd.spec.group, &crd.spec.versions[0].name, &case.kind);
        let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
        let api: Api<DynamicObject> = if crd.spec.scope == "Namespaced" {
            Api::namespaced_with(client.clone(), ns.name(), &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        // Unique per case, and as long as the case's own name (rules on metadata.name size).
        let wanted = case.object["metadata"]["name"].as_str().map_or(0, str::len);
        let mut name = format!("case-{i}");
        while name.len() < wanted {
            name.push('x');
        }
        let with_name = |v: &Value| -> anyhow::Result<DynamicObject> {
            let mut v = v.clone();
            v["metadata"]["name"] = Value::from(name.as_str());
            Ok(serde_json::from_value(v)?)
        };
        let result = match &case.old_object {
            None => {
                api.create(&PostParams::default(), &with_name(&case.object)?)
                    .await
            }
            Some(old) => {
                let created = match api.create(&PostParams::default(), &with_name(old)?).await {
                    Ok(created) => created,
                    Err(e) => {
                        failures.push(format!(
                            "{id}: the object to update is rejected: {}",
                            api_error(&e)
                        ));
                        continue;
                    }
                };
                let mut new = with_name(&case.object)?;
                new.metadata.resource_version = created.metadata.resource_version.clone();
                api.replace(&name, &PostParams::default(), &new).await
            }
        };
        match (case.valid, result) {
            (true, Err(e)) => failures.push(format!("{id}: expected valid, got {}", api_error(&e))),
            (false, Ok(_)) => failures.push(format!("{id}: expected rejection, got acceptance")),
            (false, Err(e)) => {
                let message = api_error(&e);
                let expected = case.message.as_deref().unwrap_or_default();
                if !message.contains(expected) {
                    failures.push(format!(
                        "{id}: expected a message containing {expected:?}, got {message:?}"
                    ));
                }
            }
            (true, Ok(_)) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    Ok(())
}

async fn env_with_crds() -> anyhow::Result<&'static TestEnv> {
    let env = TestEnv::shared().await?;
    let files: Vec<_> = crds::all()
        .iter()
        .map(|crd| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../config/crd")
                .join(crds::file_name(crd))
        })
        .collect();
    env.install_crd_files(&files).await?;
    Ok(env)
}

/// Every example under `examples/` is accepted by the apiserver.
#[tokio::test]
async fn examples_are_accepted() -> anyhow::Result<()> {
    let env = env_with_crds().await?;
    let ns = env.namespace("api-examples").await?;
    let client = env.client().await?;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut applied = 0;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let mut object: DynamicObject = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
        let kind = object.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
        let crd = crds::by_kind(&kind).ok_or_else(|| anyhow::anyhow!("{}: unknown kind", path.display()))?;
        let gvk = GroupVersionKind::gvk(&crd.spec.group, &crd.spec.versions[0].name, &kind);
        let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
        let api: Api<DynamicObject> = if crd.spec.scope == "Namespaced" {
            object.metadata.namespace = Some(ns.name().to_owned());
            Api::namespaced_with(client.clone(), ns.name(), &resource)
        } else {
            // Cluster-scoped: keep names unique per run.
            object.metadata.name = Some(format!(
                "{}-{}",
                object.metadata.name.unwrap_or_default(),
                ns.name()
            ));
            Api::all_with(client.clone(), &resource)
        };
        api.create(&PostParams::default(), &object)
            .await
            .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), api_error(&e)))?;
        applied += 1;
    }
    assert_eq!(applied, crds::all().len());
    Ok(())
}

/// A realistic provider-written status goes through the status subresource unchanged.
#[tokio::test]
async fn machine_status_is_accepted_and_read_back() -> anyhow::Result<()> {
    use banlieue_api::common::{
        Initialization, MachineAddress, MachineAddressType, PowerState, ProvisioningState, ProvisioningStatus,
    };
    use banlieue_api::condition::{self, ConditionStatus};
    use banlieue_api::infrastructure::{ProxmoxMachine, ProxmoxMachineStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    let env = env_with_crds().await?;
    let ns = env.namespace("api-status").await?;
    let api: Api<ProxmoxMachine> = Api::namespaced(env.client().await?, ns.name());
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/proxmoxmachine.yaml"),
    )?;
    let mut machine: ProxmoxMachine = serde_yaml::from_str(&example)?;
    machine.metadata.namespace = Some(ns.name().to_owned());
    let mut created = api.create(&PostParams::default(), &machine).await?;

    let now = Time(k8s_openapi::jiff::Timestamp::now().round(k8s_openapi::jiff::Unit::Second)?);
    let status = ProxmoxMachineStatus {
        initialization: Initialization::provisioned(true),
        addresses: vec![MachineAddress::new(MachineAddressType::InternalIP, "10.0.20.31")],
        failure_domain: Some("pve2".into()),
        conditions: vec![condition::new_condition(
            condition::READY,
            ConditionStatus::True,
            "Running",
            "VM 1042 runs on pve2",
            created.metadata.generation,
            now,
        )],
        observed_generation: created.metadata.generation,
        vmid: Some(1042),
        node: Some("pve2".into()),
        power_state: Some(PowerState::On),
        provisioning: Some(ProvisioningStatus {
            state: ProvisioningState::Ready,
            ..Default::default()
        }),
    };
    created.status = Some(status.clone());
    let updated = api
        .replace_status(
            &machine.metadata.name.clone().unwrap_or_default(),
            &PostParams::default(),
            &created,
        )
        .await?;
    assert_eq!(updated.status, Some(status));
    Ok(())
}
