//! The provider components (what `clusterctl init --infrastructure banlieue-proxmox` installs)
//! and the banlieue core install (VirtualMachine API + controller, applied with `kubectl`).
//!
//! Every object of the Proxmox components carries `cluster.x-k8s.io/provider:
//! infrastructure-banlieue-proxmox` (clusterctl would add it on install; having it in the file
//! keeps `kubectl apply` installs identical). Variables use clusterctl's `${VAR}` and
//! `${VAR:=default}` syntax; the core manifest has none (plain `kubectl apply`).

use banlieue_api::crds;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

use crate::{CORE_NAMESPACE, PROVIDER_LABEL_KEY, PROXMOX_NAMESPACE, PROXMOX_PROVIDER_LABEL, VERSION};

/// Deployment name of the Proxmox provider.
pub const PROXMOX_DEPLOYMENT: &str = "banlieue-proxmox-controller-manager";
/// ServiceAccount of the Proxmox provider.
pub const PROXMOX_SERVICE_ACCOUNT: &str = "banlieue-proxmox-manager";
/// ClusterRole of the Proxmox provider (rules: `banlieue_proxmox::rbac::CLUSTER_RULES`).
pub const PROXMOX_CLUSTER_ROLE: &str = "banlieue-proxmox-manager-role";
/// Role of the Proxmox provider's leader election.
pub const PROXMOX_LEADER_ROLE: &str = "banlieue-proxmox-leader-election-role";
/// ClusterRole aggregated into CAPI's manager role.
pub const PROXMOX_AGGREGATED_ROLE: &str = "banlieue-proxmox-capi-aggregated-role";
/// Default credentials Secret (referenced by the cluster templates).
pub const PROXMOX_CREDENTIALS_SECRET: &str = "banlieue-proxmox-credentials";
/// Label selecting CAPI's aggregated manager ClusterRole.
pub const AGGREGATE_TO_MANAGER: &str = "cluster.x-k8s.io/aggregate-to-manager";

/// Deployment name of the banlieue controller.
pub const CORE_DEPLOYMENT: &str = "banlieue-controller";
/// ServiceAccount of the banlieue controller.
pub const CORE_SERVICE_ACCOUNT: &str = "banlieue-controller";
/// ClusterRole of the banlieue controller (rules: `banlieue_controllers::rbac::CLUSTER_RULES`).
pub const CORE_CLUSTER_ROLE: &str = "banlieue-controller-role";
/// Role of the banlieue controller's leader election.
pub const CORE_LEADER_ROLE: &str = "banlieue-controller-leader-election-role";

/// Default image of the Proxmox provider (override with `BANLIEUE_PROXMOX_IMAGE`).
pub fn proxmox_image() -> String {
    format!("ghcr.io/banlieue/banlieue-proxmox:{VERSION}")
}

/// Image of the banlieue controller.
pub fn core_image() -> String {
    format!("ghcr.io/banlieue/banlieue:{VERSION}")
}

/// The flags the provider Deployment passes to `banlieue-proxmox` (each must be one of its
/// `--help` flags; a test checks that against the binary).
pub fn proxmox_args() -> Vec<String> {
    [
        "--leader-elect",
        "--metrics-bind-address=0.0.0.0:8080",
        "--health-probe-bind-address=0.0.0.0:8081",
        "--concurrency=${BANLIEUE_PROXMOX_CONCURRENCY:=10}",
        "--seed-storage=${PROXMOX_SEED_STORAGE:=local}",
        "--log-format=json",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The flags the core Deployment passes to `banlieue` (subcommand first).
pub fn core_args() -> Vec<String> {
    ["controller", "--leader-elect", "--metrics-addr=0.0.0.0:8080"]
        .map(str::to_owned)
        .to_vec()
}

fn is_proxmox_crd(crd: &CustomResourceDefinition) -> bool {
    crd.spec.group == banlieue_api::INFRASTRUCTURE_GROUP && crd.spec.names.kind.starts_with("Proxmox")
}

fn is_core_crd(crd: &CustomResourceDefinition) -> bool {
    crd.spec.group == "banlieue.io"
}

fn crd_value(crd: CustomResourceDefinition, labels: &Value) -> Value {
    let mut value = serde_json::to_value(crd).unwrap_or(Value::Null);
    merge_labels(&mut value, labels);
    value
}

fn merge_labels(doc: &mut Value, labels: &Value) {
    let Some(extra) = labels.as_object() else { return };
    let meta = &mut doc["metadata"];
    if !meta["labels"].is_object() {
        meta["labels"] = json!({});
    }
    if let Some(map) = meta["labels"].as_object_mut() {
        for (k, v) in extra {
            map.insert(k.clone(), v.clone());
        }
    }
}

fn rules(rules: Vec<k8s_openapi::api::rbac::v1::PolicyRule>) -> Value {
    serde_json::to_value(rules).unwrap_or(Value::Null)
}

/// A hardened controller Deployment: non-root, read-only root file system, no capabilities,
/// RuntimeDefault seccomp, probes on `/healthz` and `/readyz`, resource requests and limits.
struct DeploymentSpec<'a> {
    name: &'a str,
    namespace: &'a str,
    labels: Value,
    service_account: &'a str,
    image: String,
    args: Vec<String>,
    probe_port: u16,
    metrics_port: u16,
    env: Value,
}

fn deployment(d: DeploymentSpec<'_>) -> Value {
    let mut selector = d.labels.clone();
    selector["control-plane"] = json!("controller-manager");
    let mut ports = vec![json!({"name": "metrics", "containerPort": d.metrics_port, "protocol": "TCP"})];
    if d.probe_port != d.metrics_port {
        ports.push(json!({"name": "health", "containerPort": d.probe_port, "protocol": "TCP"}));
    }
    let probe = |path: &str, initial: u32| {
        json!({
            "httpGet": {"path": path, "port": d.probe_port},
            "initialDelaySeconds": initial,
            "periodSeconds": 10,
        })
    };
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": d.name, "namespace": d.namespace, "labels": selector},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {
                    "serviceAccountName": d.service_account,
                    "terminationGracePeriodSeconds": 30,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [{
                        "name": "manager",
                        "image": d.image,
                        "imagePullPolicy": "IfNotPresent",
                        "args": d.args,
                        "env": d.env,
                        "ports": ports,
                        "livenessProbe": probe("/healthz", 15),
                        "readinessProbe": probe("/readyz", 5),
                        "resources": {
                            "requests": {"cpu": "10m", "memory": "64Mi"},
                            "limits": {"cpu": "500m", "memory": "256Mi"},
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "runAsNonRoot": true,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }],
                },
            },
        },
    })
}

fn pod_env() -> Value {
    json!([
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ])
}

/// Namespace, ServiceAccount, ClusterRole + binding, leader-election Role + binding.
fn rbac_objects(
    namespace: &str,
    labels: &Value,
    service_account: &str,
    cluster_role: &str,
    cluster_rules: Value,
    leader_role: &str,
    leader_rules: Value,
) -> Vec<Value> {
    let subject = json!([{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]);
    vec![
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": service_account, "namespace": namespace, "labels": labels},
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": cluster_role, "labels": labels},
            "rules": cluster_rules,
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": cluster_role.replace("-role", "-rolebinding"), "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": subject,
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": leader_role, "namespace": namespace, "labels": labels},
            "rules": leader_rules,
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": leader_role.replace("-role", "-rolebinding"), "namespace": namespace, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": leader_role},
            "subjects": subject,
        }),
    ]
}

/// `infrastructure-components.yaml` of `infrastructure-banlieue-proxmox`, as documents.
pub fn proxmox_components() -> Vec<Value> {
    use banlieue_proxmox::rbac;
    let labels = json!({ PROVIDER_LABEL_KEY: PROXMOX_PROVIDER_LABEL });
    let mut docs = vec![json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": PROXMOX_NAMESPACE, "labels": labels},
    })];
    docs.extend(
        crds::all()
            .into_iter()
            .filter(is_proxmox_crd)
            .map(|crd| crd_value(crd, &labels)),
    );
    docs.extend(rbac_objects(
        PROXMOX_NAMESPACE,
        &labels,
        PROXMOX_SERVICE_ACCOUNT,
        PROXMOX_CLUSTER_ROLE,
        rules(rbac::policy_rules(rbac::CLUSTER_RULES)),
        PROXMOX_LEADER_ROLE,
        rules(rbac::policy_rules(rbac::LEADER_ELECTION_RULES)),
    ));
    let mut aggregated_labels = labels.clone();
    aggregated_labels[AGGREGATE_TO_MANAGER] = json!("true");
    docs.push(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": PROXMOX_AGGREGATED_ROLE, "labels": aggregated_labels},
        "rules": rules(rbac::policy_rules(rbac::CAPI_AGGREGATED_RULES)),
    }));
    docs.push(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": PROXMOX_CREDENTIALS_SECRET, "namespace": PROXMOX_NAMESPACE, "labels": labels},
        "type": "Opaque",
        "stringData": {
            banlieue_proxmox::credentials::TOKEN_ID_KEY: "${PROXMOX_TOKEN}",
            banlieue_proxmox::credentials::TOKEN_SECRET_KEY: "${PROXMOX_SECRET}",
        },
    }));
    let mut env = pod_env();
    if let Some(list) = env.as_array_mut() {
        list.push(json!({"name": "RUST_LOG", "value": "${BANLIEUE_PROXMOX_LOG_LEVEL:=info}"}));
    }
    docs.push(deployment(DeploymentSpec {
        name: PROXMOX_DEPLOYMENT,
        namespace: PROXMOX_NAMESPACE,
        labels: labels.clone(),
        service_account: PROXMOX_SERVICE_ACCOUNT,
        image: format!("${{BANLIEUE_PROXMOX_IMAGE:={}}}", proxmox_image()),
        args: proxmox_args(),
        probe_port: 8081,
        metrics_port: 8080,
        env,
    }));
    docs
}

/// The banlieue core install (`kubectl apply --server-side -f banlieue-core.yaml`): the
/// `banlieue.io` CRDs (VirtualMachine, Provider, VirtualMachineClass, VirtualMachineImage) and
/// the banlieue controller in `banlieue-system`.
pub fn core_components() -> Vec<Value> {
    use banlieue_controllers::rbac;
    let labels = json!({
        "app.kubernetes.io/name": "banlieue-controller",
        "app.kubernetes.io/part-of": "banlieue",
    });
    let mut docs = vec![json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": CORE_NAMESPACE, "labels": labels},
    })];
    docs.extend(
        crds::all()
            .into_iter()
            .filter(is_core_crd)
            .map(|crd| crd_value(crd, &labels)),
    );
    docs.extend(rbac_objects(
        CORE_NAMESPACE,
        &labels,
        CORE_SERVICE_ACCOUNT,
        CORE_CLUSTER_ROLE,
        rules(rbac::policy_rules(rbac::CLUSTER_RULES)),
        CORE_LEADER_ROLE,
        rules(rbac::policy_rules(rbac::LEADER_ELECTION_RULES)),
    ));
    let mut env = pod_env();
    if let Some(list) = env.as_array_mut() {
        list.push(json!({"name": "RUST_LOG", "value": "info"}));
    }
    docs.push(deployment(DeploymentSpec {
        name: CORE_DEPLOYMENT,
        namespace: CORE_NAMESPACE,
        labels,
        service_account: CORE_SERVICE_ACCOUNT,
        image: core_image(),
        args: core_args(),
        probe_port: 8080,
        metrics_port: 8080,
        env,
    }));
    docs
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::rbac::v1::ClusterRole;

    use super::*;

    fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    }

    #[test]
    fn every_proxmox_object_carries_the_provider_label() {
        let docs = proxmox_components();
        for doc in &docs {
            assert_eq!(
                doc["metadata"]["labels"][PROVIDER_LABEL_KEY],
                PROXMOX_PROVIDER_LABEL,
                "{}",
                crate::yaml::describe(doc)
            );
        }
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        assert_eq!(
            kinds.iter().filter(|k| **k == "Namespace").count(),
            1,
            "clusterctl wants one Namespace"
        );
        assert_eq!(
            kinds.iter().filter(|k| **k == "CustomResourceDefinition").count(),
            4
        );
    }

    #[test]
    fn the_deployment_is_hardened_and_probed() {
        let docs = proxmox_components();
        let d: Deployment =
            serde_json::from_value(find(&docs, "Deployment", PROXMOX_DEPLOYMENT).clone()).unwrap();
        let pod = d.spec.template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some(PROXMOX_SERVICE_ACCOUNT));
        assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
        let c = &pod.containers[0];
        let sc = c.security_context.clone().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        assert!(c.liveness_probe.is_some() && c.readiness_probe.is_some());
        assert!(
            c.resources
                .as_ref()
                .unwrap()
                .limits
                .as_ref()
                .unwrap()
                .contains_key("memory")
        );
        assert!(
            c.image
                .as_deref()
                .unwrap()
                .starts_with("${BANLIEUE_PROXMOX_IMAGE:=ghcr.io/")
        );
    }

    #[test]
    fn roles_come_from_the_rbac_modules() {
        let docs = proxmox_components();
        let role: ClusterRole =
            serde_json::from_value(find(&docs, "ClusterRole", PROXMOX_CLUSTER_ROLE).clone()).unwrap();
        assert_eq!(
            role.rules.unwrap(),
            banlieue_proxmox::rbac::policy_rules(banlieue_proxmox::rbac::CLUSTER_RULES)
        );
        let aggregated = find(&docs, "ClusterRole", PROXMOX_AGGREGATED_ROLE);
        assert_eq!(aggregated["metadata"]["labels"][AGGREGATE_TO_MANAGER], "true");
        let core = core_components();
        let role: ClusterRole =
            serde_json::from_value(find(&core, "ClusterRole", CORE_CLUSTER_ROLE).clone()).unwrap();
        assert_eq!(
            role.rules.unwrap(),
            banlieue_controllers::rbac::policy_rules(banlieue_controllers::rbac::CLUSTER_RULES)
        );
    }

    #[test]
    fn the_core_manifest_has_no_clusterctl_variables() {
        let text = serde_json::to_string(&core_components()).unwrap();
        assert!(
            !text.contains("${"),
            "plain kubectl apply cannot substitute variables"
        );
        let kinds: Vec<String> = core_components()
            .iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
            .map(|d| d["spec"]["names"]["kind"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            kinds,
            [
                "VirtualMachine",
                "Provider",
                "VirtualMachineClass",
                "VirtualMachineImage"
            ]
        );
    }
}
