//! The validation table (`tests/validation/*.yaml`) against a real kube-apiserver: install every
//! CRD from `config/crd/`, create each case's object (after its `old_object` for update cases)
//! and assert the apiserver's accept/reject and that its message contains the case's `message`.
//!
//! Needs the control plane binaries built by `tests/controlplane/build.sh` (or
//! `BANLIEUE_TEST_KUBECONFIG` pointing at a cluster).

use std::path::Path;

use banlieue_api::{crds, validation};
use banlieue_testenv::TestEnv;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
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
    install_policies(env, ns.name()).await?;

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
    let mut applied = std::collections::BTreeSet::new();
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
        applied.insert(kind);
    }
    // Every kind has at least one example (some have more: an image from a URL).
    assert_eq!(
        applied.len(),
        crds::all().len(),
        "kinds with an example: {applied:?}"
    );
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

/// Installs the admission policies of `banlieue_api::policies` (as the provider components do)
/// and waits until the apiserver enforces them (it loads policies asynchronously): a plain
/// update of a probe template in `ns` is refused.
async fn install_policies(env: &TestEnv, ns: &str) -> anyhow::Result<()> {
    env.install_admission_policies(&banlieue_api::policies::all())
        .await?;
    let client = &env.client().await?;
    let templates = proxmox_templates(client, ns);
    match templates
        .create(&PostParams::default(), &probe_template("policy-probe", 1024)?)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let change = serde_json::json!({"spec": {"template": {"spec": {"memoryMiB": 2048}}}});
        match templates
            .patch(
                "policy-probe",
                &PatchParams::default().dry_run(),
                &Patch::Merge(&change),
            )
            .await
        {
            Err(kube::Error::Api(status)) if status.message.contains("is immutable") => return Ok(()),
            _ if std::time::Instant::now() > deadline => {
                anyhow::bail!("the template immutability policy is not enforced 60 s after its creation")
            }
            _ => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
        }
    }
}

fn proxmox_templates(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("infrastructure.banlieue.io", "v1alpha1", "ProxmoxMachineTemplate");
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, "proxmoxmachinetemplates"),
    )
}

fn probe_template(name: &str, memory: u64) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachineTemplate",
        "metadata": {"name": name},
        "spec": {"template": {"spec": {
            "source": {"vmid": 9000}, "cpu": {"cores": 2}, "memoryMiB": memory,
            "networks": [{"name": "net0", "network": "vmbr0"}],
        }}},
    }))?)
}

/// A machine template's spec stays immutable, except to the dry-run requests CAPI's topology
/// controller marks with its annotation (ClusterClass compares templates that way, then makes a
/// new one): such a request is answered with the changed object, and nothing is stored.
#[tokio::test]
async fn template_specs_are_immutable_but_topology_dry_runs_pass() -> anyhow::Result<()> {
    let env = env_with_crds().await?;
    let ns = env.namespace("api-policies").await?;
    let client = env.client().await?;
    install_policies(env, ns.name()).await?;
    let templates = proxmox_templates(&client, ns.name());
    templates
        .create(&PostParams::default(), &probe_template("workers", 4096)?)
        .await?;
    let change = |annotated: bool| {
        let annotations = if annotated {
            serde_json::json!({banlieue_api::policies::TOPOLOGY_DRY_RUN_ANNOTATION: ""})
        } else {
            serde_json::json!({})
        };
        serde_json::json!({
            "metadata": {"annotations": annotations},
            "spec": {"template": {"spec": {"memoryMiB": 8192}}},
        })
    };
    let refused = |r: Result<DynamicObject, kube::Error>| match r {
        Err(kube::Error::Api(status)) => status.message.contains("spec.template.spec is immutable"),
        _ => false,
    };
    let plain = templates
        .patch("workers", &PatchParams::default(), &Patch::Merge(change(false)))
        .await;
    assert!(
        refused(plain),
        "a plain update of spec.template.spec was not refused"
    );
    let annotated = templates
        .patch("workers", &PatchParams::default(), &Patch::Merge(change(true)))
        .await;
    assert!(refused(annotated), "the annotation alone let an update through");
    let dry_run = templates
        .patch(
            "workers",
            &PatchParams::default().dry_run(),
            &Patch::Merge(change(false)),
        )
        .await;
    assert!(
        refused(dry_run),
        "a dry-run without the annotation was not refused"
    );
    let topology = templates
        .patch(
            "workers",
            &PatchParams::default().dry_run(),
            &Patch::Merge(change(true)),
        )
        .await?;
    assert_eq!(topology.data["spec"]["template"]["spec"]["memoryMiB"], 8192);
    let stored = templates.get("workers").await?;
    assert_eq!(
        stored.data["spec"]["template"]["spec"]["memoryMiB"], 4096,
        "a dry-run changed the template"
    );
    // What CAPI writes on templates (labels, owner references) is no change of the spec.
    let labelled = templates
        .patch(
            "workers",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata": {"labels": {"cluster.x-k8s.io/cluster-name": "c1"}}}),
            ),
        )
        .await?;
    assert_eq!(
        labelled.metadata.labels.unwrap_or_default()["cluster.x-k8s.io/cluster-name"],
        "c1"
    );
    Ok(())
}
