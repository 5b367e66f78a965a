//! The CRD validation table of `banlieue-api` (`api/tests/validation/*.yaml`) against the real
//! kube-apiserver: every valid object is accepted, every invalid one is rejected with the message
//! the table names. The same table runs in-process in `banlieue-api`; this is the ground truth.

mod common;

use kube::api::{DynamicObject, PostParams};
use serde_json::Value;

use banlieue_testenv::TestEnv;

#[tokio::test]
async fn the_apiserver_accepts_and_rejects_exactly_as_the_table_says() -> anyhow::Result<()> {
    let env = TestEnv::shared().await?;
    env.install_crds(&banlieue_api::crds::all()).await?;
    let namespace = env.namespace("crd-validation").await?;
    let client = env.client().await?;
    let cases = banlieue_api::validation::load()?;
    assert!(
        cases.len() > 50,
        "the validation table has only {} cases",
        cases.len()
    );

    let mut failures = Vec::new();
    for (index, case) in cases.iter().enumerate() {
        let crd = banlieue_api::crds::by_kind(&case.kind)
            .unwrap_or_else(|| panic!("no CRD for kind {} ({})", case.kind, case.file.display()));
        let api = common::dynamic_api(client.clone(), &crd, &namespace);
        // Unique names: cluster-scoped kinds share one namespace-less space.
        let name = format!("case-{index}-{}", namespace.name());
        let with_name = |object: &Value| -> anyhow::Result<DynamicObject> {
            let mut object = object.clone();
            object["metadata"]["name"] = Value::String(name.clone());
            if let Some(metadata) = object["metadata"].as_object_mut() {
                metadata.remove("namespace");
            }
            Ok(serde_json::from_value(object)?)
        };
        let outcome = match &case.old_object {
            None => {
                api.create(&PostParams::default(), &with_name(&case.object)?)
                    .await
            }
            Some(old) => match api.create(&PostParams::default(), &with_name(old)?).await {
                Err(error) => {
                    failures.push(format!(
                        "{} / {}: the old object was rejected: {error}",
                        case.kind, case.name
                    ));
                    continue;
                }
                Ok(created) => {
                    let mut new = with_name(&case.object)?;
                    new.metadata.resource_version = created.metadata.resource_version;
                    api.replace(&name, &PostParams::default(), &new).await
                }
            },
        };
        match (case.valid, outcome) {
            (true, Ok(_)) => {}
            (true, Err(error)) => failures.push(format!(
                "{} / {}: must be accepted, was rejected: {error}",
                case.kind, case.name
            )),
            (false, Ok(_)) => failures.push(format!(
                "{} / {}: must be rejected, was accepted",
                case.kind, case.name
            )),
            (false, Err(kube::Error::Api(status))) => {
                let expected = case.message.as_deref().unwrap_or_default();
                if status.code != 422 || !status.message.contains(expected) {
                    failures.push(format!(
                        "{} / {}: expected 422 containing {expected:?}, got {}: {}",
                        case.kind, case.name, status.code, status.message
                    ));
                }
            }
            (false, Err(error)) => failures.push(format!(
                "{} / {}: expected a 422, got a client error: {error}",
                case.kind, case.name
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases disagree with the apiserver:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    Ok(())
}
