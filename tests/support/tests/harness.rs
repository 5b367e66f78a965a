//! Proves the test control plane is a real Kubernetes API: CRDs, watches, server-side apply,
//! garbage collection, namespace deletion, RBAC and the machine's `kubectl`, all against one
//! control plane shared by this test binary (or `BANLIEUE_TEST_KUBECONFIG`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use banlieue_testenv::{TestEnv, run_with_timeout};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{CustomResource, CustomResourceExt as _, Resource as _, ResourceExt as _};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A small namespaced custom resource for the harness tests.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "testenv.banlieue.dev",
    version = "v1alpha1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus",
    shortname = "wdg"
)]
pub struct WidgetSpec {
    /// Number of sprockets the widget carries.
    pub sprockets: u32,
    /// Paint colour of the widget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub colour: Option<String>,
}

/// Observed state of a widget.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
pub struct WidgetStatus {
    /// Conditions, as kubectl wait --for=condition reads them.
    #[serde(default)]
    pub conditions: Vec<WidgetCondition>,
}

/// One status condition.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
pub struct WidgetCondition {
    /// Condition type.
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
}

const WAIT: Duration = Duration::from_secs(90);
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(60);

async fn env_with_widgets() -> Result<&'static TestEnv> {
    Ok(TestEnv::shared_with(|builder| builder.crd(Widget::crd())).await?)
}

fn widget(name: &str, sprockets: u32) -> Widget {
    Widget::new(
        name,
        WidgetSpec {
            sprockets,
            colour: None,
        },
    )
}

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..ConfigMap::default()
    }
}

fn api_status(err: &kube::Error) -> Option<&kube::core::Status> {
    match err {
        kube::Error::Api(status) => Some(status),
        _ => None,
    }
}

/// Polls `check` until it returns `Some`, or fails after `timeout` with `what`.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn kubectl_ok(env_cmd: &mut std::process::Command) -> Result<String> {
    let rendered = format!("{env_cmd:?}");
    let output = run_with_timeout(env_cmd, KUBECTL_TIMEOUT)?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    ensure!(
        output.status.success(),
        "{rendered} failed ({}):\nstdout: {stdout}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(stdout)
}

#[tokio::test]
async fn crd_installs_becomes_established_and_validates() -> Result<()> {
    let env = env_with_widgets().await?;
    let client = env.client().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get("widgets.testenv.banlieue.dev").await?;
    let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
    ensure!(
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True"),
        "not Established: {conditions:?}"
    );
    // Installing again is idempotent.
    env.install_crds(&[Widget::crd()]).await?;

    let ns = env.namespace("crd").await?;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let created = widgets.create(&PostParams::default(), &widget("w1", 3)).await?;
    assert_eq!(created.spec.sprockets, 3);
    assert!(created.uid().is_some(), "the server assigns a uid");

    // The structural schema is enforced: a string where an integer belongs is rejected.
    let dynamic: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client, &ns, &kube::api::ApiResource::erase::<Widget>(&()));
    let bad: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "testenv.banlieue.dev/v1alpha1",
        "kind": "Widget",
        "metadata": { "name": "bad" },
        "spec": { "sprockets": "many" },
    }))?;
    let err = dynamic
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("invalid widget accepted");
    let status = api_status(&err).context("expected an API error")?;
    assert_eq!(status.code, 422, "{status:?}");
    assert!(status.message.contains("spec.sprockets"), "{}", status.message);
    Ok(())
}

#[tokio::test]
async fn crds_install_from_yaml_files() -> Result<()> {
    let env = env_with_widgets().await?;
    let yaml = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.testenv.banlieue.dev
spec:
  group: testenv.banlieue.dev
  names: {kind: Gadget, plural: gadgets, singular: gadget, listKind: GadgetList}
  scope: Cluster
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer, minimum: 1}
"#;
    let file = env.workdir().join("gadgets-crd.yaml");
    std::fs::write(&file, yaml)?;
    env.install_crd_files([&file]).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client().await?);
    let crd = crds.get("gadgets.testenv.banlieue.dev").await?;
    let established = crd
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .any(|c| c.type_ == "Established" && c.status == "True");
    ensure!(established, "gadgets CRD not Established");
    Ok(())
}

fn value_of_k(cm: ConfigMap) -> String {
    let name = cm.name_any();
    cm.data
        .and_then(|mut d| d.remove("k"))
        .unwrap_or_else(|| format!("<no k in {name}>"))
}

#[tokio::test]
async fn watches_see_added_modified_deleted() -> Result<()> {
    let env = env_with_widgets().await?;
    let client = env.client().await?;
    let ns = env.namespace("watch").await?;

    // The raw watch API distinguishes ADDED, MODIFIED and DELETED.
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let version = config_maps
        .list(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut events = config_maps
        // Only our object: the root-CA publisher adds `kube-root-ca.crt` to new namespaces.
        .watch(
            &WatchParams::default().fields("metadata.name=watched").timeout(60),
            &version,
        )
        .await?
        .boxed();
    config_maps
        .create(&PostParams::default(), &config_map("watched", &[("k", "1")]))
        .await?;
    let patch = serde_json::json!({ "data": { "k": "2" } });
    config_maps
        .patch("watched", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    config_maps.delete("watched", &DeleteParams::default()).await?;
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(WAIT, events.try_next())
            .await
            .context("no watch event in time")??
            .context("watch ended early")?;
        match event {
            WatchEvent::Added(cm) => seen.push(("ADDED", value_of_k(cm))),
            WatchEvent::Modified(cm) => seen.push(("MODIFIED", value_of_k(cm))),
            WatchEvent::Deleted(cm) => seen.push(("DELETED", value_of_k(cm))),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => bail!("watch error: {e:?}"),
        }
    }
    let expected = [("ADDED", "1"), ("MODIFIED", "2"), ("DELETED", "2")];
    assert_eq!(seen, expected.map(|(t, v)| (t, v.to_owned())));

    // kube-rs's watcher (as controllers use it) sees the same on a custom resource.
    let widgets: Api<Widget> = Api::namespaced(client, &ns);
    let mut stream =
        kube::runtime::watcher(widgets.clone(), kube::runtime::watcher::Config::default()).boxed();
    let mut next_event = async || -> Result<kube::runtime::watcher::Event<Widget>> {
        let event = tokio::time::timeout(WAIT, stream.try_next())
            .await
            .context("no watcher event in time")??;
        event.context("watcher ended")
    };
    use kube::runtime::watcher::Event;
    loop {
        if matches!(next_event().await?, Event::InitDone) {
            break;
        }
    }
    widgets.create(&PostParams::default(), &widget("seen", 1)).await?;
    match next_event().await? {
        Event::Apply(w) => assert_eq!((w.name_any(), w.spec.sprockets), ("seen".to_owned(), 1)),
        other => bail!("expected Apply after create, got {other:?}"),
    }
    let patch = serde_json::json!({ "spec": { "sprockets": 7 } });
    widgets
        .patch("seen", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    match next_event().await? {
        Event::Apply(w) => assert_eq!(w.spec.sprockets, 7),
        other => bail!("expected Apply after patch, got {other:?}"),
    }
    widgets.delete("seen", &DeleteParams::default()).await?;
    match next_event().await? {
        Event::Delete(w) => assert_eq!(w.name_any(), "seen"),
        other => bail!("expected Delete, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn server_side_apply_conflict_is_409() -> Result<()> {
    let env = env_with_widgets().await?;
    let ns = env.namespace("ssa").await?;
    let api: Api<ConfigMap> = Api::namespaced(env.client().await?, &ns);
    api.patch(
        "shared",
        &PatchParams::apply("alpha"),
        &Patch::Apply(&config_map("shared", &[("owner", "alpha")])),
    )
    .await?;
    let beta = config_map("shared", &[("owner", "beta")]);
    let err = api
        .patch("shared", &PatchParams::apply("beta"), &Patch::Apply(&beta))
        .await
        .expect_err("conflicting apply without force must fail");
    let status = api_status(&err).context("expected an API error")?;
    assert_eq!(status.code, 409, "{status:?}");
    assert_eq!(status.reason, "Conflict");
    assert!(
        status.message.contains("alpha"),
        "the conflict names the owning manager: {}",
        status.message
    );
    assert_eq!(
        api.get("shared").await?.data.unwrap_or_default()["owner"],
        "alpha",
        "nothing changed"
    );

    let forced = api
        .patch(
            "shared",
            &PatchParams::apply("beta").force(),
            &Patch::Apply(&beta),
        )
        .await?;
    assert_eq!(forced.data.unwrap_or_default()["owner"], "beta");
    Ok(())
}

#[tokio::test]
async fn deleting_an_owner_garbage_collects_its_dependents() -> Result<()> {
    let env = env_with_widgets().await?;
    let client = env.client().await?;
    let ns = env.namespace("gc").await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let widgets: Api<Widget> = Api::namespaced(client, &ns);

    for (owner_name, propagation) in [
        ("owner-background", "Background"),
        ("owner-foreground", "Foreground"),
    ] {
        let owner = config_maps
            .create(&PostParams::default(), &config_map(owner_name, &[]))
            .await?;
        let reference = OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: owner_name.into(),
            uid: owner.uid().context("owner has no uid")?,
            block_owner_deletion: Some(true),
            ..OwnerReference::default()
        };
        let mut dependent = config_map(&format!("{owner_name}-dep"), &[]);
        dependent.metadata.owner_references = Some(vec![reference.clone()]);
        config_maps.create(&PostParams::default(), &dependent).await?;
        let mut custom = widget(&format!("{owner_name}-widget"), 1);
        custom.meta_mut().owner_references = Some(vec![reference]);
        widgets.create(&PostParams::default(), &custom).await?;

        let params = if propagation == "Foreground" {
            DeleteParams::foreground()
        } else {
            DeleteParams::background()
        };
        config_maps.delete(owner_name, &params).await?;
        let (config_maps, widgets) = (&config_maps, &widgets);
        eventually(
            &format!("{propagation} garbage collection of {owner_name}'s dependents"),
            WAIT,
            || async move {
                let dep = config_maps.get_opt(&format!("{owner_name}-dep")).await?;
                let custom = widgets.get_opt(&format!("{owner_name}-widget")).await?;
                let owner = config_maps.get_opt(owner_name).await?;
                Ok((dep.is_none() && custom.is_none() && owner.is_none()).then_some(()))
            },
        )
        .await?;
    }
    // An object without owner references is left alone.
    config_maps
        .create(&PostParams::default(), &config_map("orphan", &[]))
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    ensure!(
        config_maps.get_opt("orphan").await?.is_some(),
        "an unowned object was deleted"
    );
    Ok(())
}

#[tokio::test]
async fn namespace_deletion_completes() -> Result<()> {
    let env = env_with_widgets().await?;
    let client = env.client().await?;
    let ns = env.namespace("nsdel").await?;
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &config_map("content", &[("k", "v")]))
        .await?;
    Api::<Widget>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &widget("content", 2))
        .await?;

    let namespaces: Api<Namespace> = Api::all(client);
    namespaces.delete(&ns, &DeleteParams::default()).await?;
    let name = ns.name().to_owned();
    let namespaces = &namespaces;
    eventually(&format!("namespace {name} to be deleted"), WAIT, || {
        let name = name.clone();
        async move { Ok(namespaces.get_opt(&name).await?.is_none().then_some(())) }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn restricted_identities_are_subject_to_rbac() -> Result<()> {
    let env = env_with_widgets().await?;
    let ns = env.namespace("rbac").await?;
    let admin = env.client().await?;
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &config_map("visible", &[]))
        .await?;
    let role = Role {
        metadata: ObjectMeta {
            name: Some("read-config".into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: vec!["get".into(), "list".into()],
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await?;
    let bind = |name: &str, subject: Subject| RoleBinding {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "read-config".into(),
        },
        subjects: Some(vec![subject]),
    };

    // A ServiceAccount (TokenRequest token): authenticated as itself, allowed only what is bound.
    let robot = env.service_account_kubeconfig(&ns, "robot").await?;
    let robot_client = robot.client().await?;
    let review = Api::<SelfSubjectReview>::all(robot_client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let username = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default();
    assert_eq!(username, format!("system:serviceaccount:{ns}:robot"));
    let robot_maps: Api<ConfigMap> = Api::namespaced(robot_client, &ns);
    let err = robot_maps
        .list(&ListParams::default())
        .await
        .expect_err("unbound service account listed configmaps");
    assert!(api_status(&err).is_some_and(|s| s.code == 403), "{err}");
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: "robot".into(),
        namespace: Some(ns.to_string()),
        ..Subject::default()
    };
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &bind("robot", subject))
        .await?;
    let robot_maps = &robot_maps;
    let listed = eventually("the role binding to take effect", WAIT, || async move {
        Ok(robot_maps.list(&ListParams::default()).await.ok())
    })
    .await?;
    assert!(listed.items.iter().any(|cm| cm.name_any() == "visible"));
    let err = robot_maps
        .create(&PostParams::default(), &config_map("nope", &[]))
        .await
        .expect_err("create allowed");
    assert!(api_status(&err).is_some_and(|s| s.code == 403), "{err}");

    // A client-certificate user (only on a control plane this crate started: it holds the CA).
    if env.is_external() {
        assert!(matches!(
            env.user_kubeconfig("alice", &[]),
            Err(banlieue_testenv::Error::Unsupported { .. })
        ));
        return Ok(());
    }
    let alice = env.user_kubeconfig("alice", &["testers"])?;
    let alice_client = alice.client().await?;
    let review = Api::<SelfSubjectReview>::all(alice_client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let info = review.status.and_then(|s| s.user_info).context("no user info")?;
    assert_eq!(info.username.as_deref(), Some("alice"));
    assert!(info.groups.unwrap_or_default().iter().any(|g| g == "testers"));
    let alice_maps: Api<ConfigMap> = Api::namespaced(alice_client, &ns);
    let err = alice_maps
        .get("visible")
        .await
        .expect_err("unbound user read a configmap");
    assert!(api_status(&err).is_some_and(|s| s.code == 403), "{err}");
    let subject = Subject {
        kind: "Group".into(),
        name: "testers".into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Subject::default()
    };
    Api::<RoleBinding>::namespaced(admin, &ns)
        .create(&PostParams::default(), &bind("testers", subject))
        .await?;
    let alice_maps = &alice_maps;
    eventually("alice's group binding to take effect", WAIT, || async move {
        Ok(alice_maps.get("visible").await.ok())
    })
    .await?;
    let other = env.namespace("rbac-other").await?;
    let elsewhere: Api<ConfigMap> = Api::namespaced(alice.client().await?, &other);
    let err = elsewhere
        .list(&ListParams::default())
        .await
        .expect_err("role leaked to another namespace");
    assert!(api_status(&err).is_some_and(|s| s.code == 403), "{err}");
    Ok(())
}

#[tokio::test]
async fn machine_kubectl_gets_applies_waits_and_explains() -> Result<()> {
    let env = env_with_widgets().await?;
    let ns = env.namespace("kubectl").await?;

    // The dispatcher picks the bundled kubectl matching the server's minor version.
    let version: serde_json::Value =
        serde_json::from_str(&kubectl_ok(env.kubectl().args(["version", "-o", "json"]))?)?;
    let server_minor = version["serverVersion"]["minor"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let client_minor = version["clientVersion"]["minor"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    eprintln!(
        "kubectl client {} against server {}",
        version["clientVersion"]["gitVersion"], version["serverVersion"]["gitVersion"]
    );
    if !env.is_external() {
        assert_eq!(server_minor, "33", "{version}");
        assert_eq!(
            client_minor, server_minor,
            "kubectl should match the server's minor version"
        );
    }

    let out = kubectl_ok(env.kubectl().args(["get", "widgets", "-n", &ns, "-o", "name"]))?;
    assert_eq!(out.trim(), "", "a fresh namespace has no widgets");

    let manifest = env.workdir().join(format!("{ns}-widget.yaml"));
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: testenv.banlieue.dev/v1alpha1\nkind: Widget\nmetadata:\n  name: gizmo\n  namespace: {ns}\n\
             spec:\n  sprockets: 4\n"
        ),
    )?;
    let file = manifest.to_string_lossy().into_owned();
    let out = kubectl_ok(env.kubectl().args(["apply", "-f", &file]))?;
    assert!(out.contains("widget.testenv.banlieue.dev/gizmo created"), "{out}");
    let out = kubectl_ok(env.kubectl().args([
        "get",
        "wdg",
        "gizmo",
        "-n",
        &ns,
        "-o",
        "jsonpath={.spec.sprockets}",
    ]))?;
    assert_eq!(out, "4");

    // Server-side apply through kubectl: a second object, owned by field manager "tester".
    let ssa_manifest = env.workdir().join(format!("{ns}-ssa.yaml"));
    let ssa_file = ssa_manifest.to_string_lossy().into_owned();
    let write_ssa = |sprockets: u32| {
        std::fs::write(
            &ssa_manifest,
            format!(
                "apiVersion: testenv.banlieue.dev/v1alpha1\nkind: Widget\nmetadata:\n  name: sprocketeer\n  \
                 namespace: {ns}\nspec:\n  sprockets: {sprockets}\n"
            ),
        )
    };
    let widgets: Api<Widget> = Api::namespaced(env.client().await?, &ns);
    for sprockets in [5, 6] {
        write_ssa(sprockets)?;
        let apply = [
            "apply",
            "--server-side",
            "--field-manager=tester",
            "-f",
            &ssa_file,
        ];
        let out = kubectl_ok(env.kubectl().args(apply))?;
        assert!(
            out.contains("widget.testenv.banlieue.dev/sprocketeer serverside-applied"),
            "{out}"
        );
        assert_eq!(widgets.get("sprocketeer").await?.spec.sprockets, sprockets);
    }
    // A second manager changing the same field conflicts, as through the API.
    write_ssa(7)?;
    let apply = [
        "apply",
        "--server-side",
        "--field-manager=intruder",
        "-f",
        &ssa_file,
    ];
    let output = run_with_timeout(env.kubectl().args(apply), KUBECTL_TIMEOUT)?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("conflict with \"tester\""),
        "{stderr}"
    );
    assert_eq!(
        widgets.get("sprocketeer").await?.spec.sprockets,
        6,
        "the conflicting apply changed nothing"
    );

    // kubectl wait on a condition that a "controller" sets later.
    let mut wait = env.kubectl();
    wait.args([
        "wait",
        "--for=condition=Ready",
        "widget/gizmo",
        "-n",
        &ns,
        "--timeout=60s",
    ]);
    let waiter = std::thread::spawn(move || run_with_timeout(&mut wait, KUBECTL_TIMEOUT));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = serde_json::json!({ "status": { "conditions": [{ "type": "Ready", "status": "True" }] } });
    widgets
        .patch_status("gizmo", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    let output = waiter
        .join()
        .map_err(|_| anyhow::anyhow!("kubectl wait thread panicked"))??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("condition met"),
        "{stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    kubectl_ok(env.kubectl().args([
        "wait",
        "--for=condition=Established",
        "crd/widgets.testenv.banlieue.dev",
        "--timeout=30s",
    ]))?;

    // explain reads the CRD's published OpenAPI schema, doc comments included.
    let out = kubectl_ok(env.kubectl().args(["explain", "widgets.spec"]))?;
    assert!(
        out.contains("sprockets") && out.contains("Number of sprockets the widget carries"),
        "{out}"
    );
    Ok(())
}
