//! Every example under `examples/` is accepted by the real apiserver with the banlieue CRDs, and
//! the banlieue kinds read well with the machine's `kubectl`.

mod common;

use kube::api::{DynamicObject, PostParams};

use banlieue_testenv::TestEnv;

fn examples() -> Vec<(String, DynamicObject)> {
    let dir = common::repo_root().join("examples");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            for document in serde_yaml::Deserializer::from_str(&text) {
                let value = serde_json::to_value(serde_yaml::Value::deserialize(document).unwrap()).unwrap();
                if value.is_null() {
                    continue;
                }
                let object: DynamicObject = serde_json::from_value(value)
                    .unwrap_or_else(|e| panic!("{}: not a Kubernetes object: {e}", path.display()));
                out.push((path.display().to_string(), object));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

use serde::Deserialize;

#[tokio::test]
async fn every_example_is_accepted_by_the_apiserver() -> anyhow::Result<()> {
    let env = TestEnv::shared().await?;
    let crds = banlieue_api::crds::all();
    env.install_crds(&crds).await?;
    let namespace = env.namespace("examples").await?;
    let client = env.client().await?;

    let examples = examples();
    let kinds: std::collections::BTreeSet<_> = examples
        .iter()
        .filter_map(|(_, o)| o.types.as_ref().map(|t| t.kind.clone()))
        .collect();
    for crd in &crds {
        assert!(
            kinds.contains(&crd.spec.names.kind),
            "no example under examples/ for kind {}",
            crd.spec.names.kind
        );
    }
    let mut failures = Vec::new();
    for (file, mut object) in examples {
        let kind = object.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
        let Some(crd) = banlieue_api::crds::by_kind(&kind) else {
            continue; // Secrets and other built-in kinds that examples carry along
        };
        object.metadata.namespace = None;
        let api = common::dynamic_api(client.clone(), &crd, &namespace);
        if let Err(error) = api.create(&PostParams::default(), &object).await {
            failures.push(format!("{file} ({kind}): {error}"));
        }
    }
    assert!(
        failures.is_empty(),
        "examples rejected by the apiserver:\n{}",
        failures.join("\n")
    );
    Ok(())
}

#[tokio::test]
async fn kubectl_explains_and_lists_banlieue_kinds() -> anyhow::Result<()> {
    let env = TestEnv::shared().await?;
    env.install_crds(&banlieue_api::crds::all()).await?;

    let explain = env
        .kubectl()
        .args(["explain", "virtualmachines.spec.memoryMiB"])
        .output()?;
    let text = String::from_utf8_lossy(&explain.stdout);
    assert!(
        explain.status.success(),
        "kubectl explain failed: {}",
        String::from_utf8_lossy(&explain.stderr)
    );
    assert!(
        text.contains("memoryMiB"),
        "kubectl explain printed no field docs:\n{text}"
    );
    assert!(
        text.contains("MiB"),
        "kubectl explain printed no description:\n{text}"
    );

    let get = env
        .kubectl()
        .args(["get", "banlieue", "--all-namespaces"])
        .output()?;
    assert!(
        get.status.success(),
        "`kubectl get banlieue` (the CRD category) failed: {}",
        String::from_utf8_lossy(&get.stderr)
    );
    Ok(())
}
