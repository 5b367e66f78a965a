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

use k8s_openapi::api::rbac::v1::PolicyRule;

use crate::{CORE_NAMESPACE, Infra, PROVIDER_LABEL_KEY, VERSION};

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
/// Label selecting the kubeadm control-plane manager's aggregated ClusterRole
/// (`capi-kubeadm-control-plane-aggregated-manager-role`). Its own rules cover only the
/// `infrastructure.cluster.x-k8s.io` group, so a provider in another group must hand it the
/// machine kinds it clones and watches through this label.
pub const KCP_AGGREGATE_TO_MANAGER: &str = "kubeadm.controlplane.cluster.x-k8s.io/aggregate-to-manager";

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

fn is_infra_crd(crd: &CustomResourceDefinition, infra: Infra) -> bool {
    crd.spec.group == banlieue_api::INFRASTRUCTURE_GROUP
        && crd.spec.names.kind.starts_with(infra.kind_prefix())
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

fn rules(rules: Vec<PolicyRule>) -> Value {
    serde_json::to_value(rules).unwrap_or(Value::Null)
}

/// A hardened controller Deployment: non-root, read-only root file system, no capabilities,
/// RuntimeDefault seccomp, probes on `/healthz` and `/readyz`, resource requests and limits. It
/// tolerates the control plane taints, as CAPI's managers do, so that a cluster whose only
/// nodes are its control plane can run it (a self-hosted management cluster often is).
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
    /// `(volume, volumeMount)` pairs; none: no `volumes` key at all.
    volumes: Vec<(Value, Value)>,
    /// The pod's `securityContext.supplementalGroups`, if any.
    supplemental_groups: Option<Value>,
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
    let mut value = json!({
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
                    "tolerations": [
                        {"key": "node-role.kubernetes.io/master", "effect": "NoSchedule"},
                        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
                    ],
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
    });
    let pod = &mut value["spec"]["template"]["spec"];
    if let Some(groups) = d.supplemental_groups {
        pod["securityContext"]["supplementalGroups"] = groups;
    }
    if !d.volumes.is_empty() {
        let (volumes, mounts): (Vec<Value>, Vec<Value>) = d.volumes.into_iter().unzip();
        pod["volumes"] = json!(volumes);
        pod["containers"][0]["volumeMounts"] = json!(mounts);
    }
    value
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
    infra_components(Infra::Proxmox)
}

/// The provider's RBAC rules: (ClusterRole, leader-election Role, aggregated into CAPI's manager).
fn infra_rules(infra: Infra) -> [Vec<PolicyRule>; 3] {
    match infra {
        Infra::Proxmox => {
            use banlieue_proxmox::rbac::*;
            [CLUSTER_RULES, LEADER_ELECTION_RULES, CAPI_AGGREGATED_RULES].map(policy_rules)
        }
        Infra::Libvirt => {
            use banlieue_libvirt::rbac::*;
            [CLUSTER_RULES, LEADER_ELECTION_RULES, CAPI_AGGREGATED_RULES].map(policy_rules)
        }
        Infra::Vsphere => {
            use banlieue_vsphere::rbac::*;
            [CLUSTER_RULES, LEADER_ELECTION_RULES, CAPI_AGGREGATED_RULES].map(policy_rules)
        }
    }
}

/// The ClusterRole of `infra`'s manager (`banlieue-libvirt-manager-role`).
pub fn cluster_role(infra: Infra) -> String {
    format!("{}-manager-role", infra.name())
}

/// The ServiceAccount of `infra`'s manager (`banlieue-libvirt-manager`).
pub fn service_account(infra: Infra) -> String {
    format!("{}-manager", infra.name())
}

/// The Deployment of `infra` (`banlieue-libvirt-controller-manager`).
pub fn deployment_name(infra: Infra) -> String {
    format!("{}-controller-manager", infra.name())
}

/// The ClusterRole aggregated into CAPI's manager role (`banlieue-libvirt-capi-aggregated-role`).
pub fn aggregated_role(infra: Infra) -> String {
    format!("{}-capi-aggregated-role", infra.name())
}

/// The ClusterRole aggregated into the kubeadm control-plane manager's
/// (`banlieue-proxmox-kcp-aggregated-role`).
pub fn kcp_aggregated_role(infra: Infra) -> String {
    format!("{}-kcp-aggregated-role", infra.name())
}

/// What the kubeadm control-plane manager needs of `infra`'s kinds: the machine templates it
/// clones (and owns) and the machines it creates, watches, patches and deletes; the rules of
/// CAPI's aggregated role narrowed to those kinds.
fn kcp_rules(capi_aggregated: &[PolicyRule]) -> Vec<PolicyRule> {
    capi_aggregated
        .iter()
        .filter_map(|rule| {
            let resources: Vec<String> = rule
                .resources
                .iter()
                .flatten()
                .filter(|r| r.ends_with("machines") || r.ends_with("machinetemplates"))
                .cloned()
                .collect();
            (!resources.is_empty()).then(|| PolicyRule {
                resources: Some(resources),
                ..rule.clone()
            })
        })
        .collect()
}

/// The default credentials Secret of `infra` (`banlieue-vsphere-credentials`), if the components
/// carry one (libvirt's credentials are per host files: see the README).
pub fn credentials_secret(infra: Infra) -> Option<String> {
    (infra != Infra::Libvirt).then(|| format!("{}-credentials", infra.name()))
}

/// Default image of `infra` (override with `BANLIEUE_<INFRA>_IMAGE`).
pub fn image(infra: Infra) -> String {
    format!("ghcr.io/banlieue/{}:{VERSION}", infra.name())
}

/// The flags the Deployment of `infra` passes to its binary (each must be one of its `--help`
/// flags; a test checks that against the binary).
pub fn args(infra: Infra) -> Vec<String> {
    if infra == Infra::Proxmox {
        return proxmox_args();
    }
    let mut out: Vec<String> = [
        "--leader-elect",
        "--metrics-bind-address=0.0.0.0:8080",
        "--health-probe-bind-address=0.0.0.0:8081",
    ]
    .map(str::to_owned)
    .to_vec();
    out.push(format!(
        "--concurrency=${{{}_CONCURRENCY:=10}}",
        infra.var_prefix()
    ));
    if infra == Infra::Libvirt {
        out.push("--domain-type=${LIBVIRT_DOMAIN_TYPE:=kvm}".to_owned());
    }
    out.push("--log-format=json".to_owned());
    out
}

/// The libvirt socket folder of the node, mounted for local URIs (`qemu:///system`).
pub const LIBVIRT_SOCKET_DIR: &str = "/var/run/libvirt";

/// Where a provider that downloads images (`spec.source.image`) keeps them while it imports
/// them: an emptyDir of its own (`<PREFIX>_IMAGE_CACHE_SIZE`, default 20Gi).
pub const IMAGE_DIR: &str = "/var/cache/banlieue/images";

/// The environment variable the providers read [`IMAGE_DIR`] from
/// (`banlieue_provider_kit::image::IMAGE_DIR_ENV`).
pub const IMAGE_DIR_ENV: &str = "BANLIEUE_IMAGE_DIR";

/// Whether `infra`'s provider downloads images itself (Proxmox VE's storage does its own).
fn downloads_images(infra: Infra) -> bool {
    matches!(infra, Infra::Libvirt | Infra::Vsphere)
}

/// `(volume, mount)` pairs and pod security additions of `infra`'s Deployment.
fn pod_extras(infra: Infra) -> (Vec<(Value, Value)>, Option<Value>) {
    let (mut volumes, groups) = base_pod_extras(infra);
    if downloads_images(infra) {
        volumes.push((
            json!({"name": "images", "emptyDir": {
                "sizeLimit": format!("${{{}_IMAGE_CACHE_SIZE:=20Gi}}", infra.var_prefix()),
            }}),
            json!({"name": "images", "mountPath": IMAGE_DIR}),
        ));
    }
    (volumes, groups)
}

fn base_pod_extras(infra: Infra) -> (Vec<(Value, Value)>, Option<Value>) {
    match infra {
        Infra::Libvirt => (
            vec![
                (
                    json!({"name": "libvirt-run", "hostPath": {
                        "path": format!("${{LIBVIRT_SOCKET_DIR:={LIBVIRT_SOCKET_DIR}}}"),
                        "type": "DirectoryOrCreate",
                    }}),
                    json!({"name": "libvirt-run", "mountPath": LIBVIRT_SOCKET_DIR}),
                ),
                (
                    json!({"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}),
                    json!({"name": "tmp", "mountPath": "/tmp"}),
                ),
            ],
            Some(json!(["${LIBVIRT_SOCKET_GID:=65532}"])),
        ),
        _ => (Vec::new(), None),
    }
}

/// `infrastructure-components.yaml` of `infra`, as documents.
pub fn infra_components(infra: Infra) -> Vec<Value> {
    let namespace = infra.namespace();
    let labels = json!({ PROVIDER_LABEL_KEY: infra.label() });
    let mut docs = vec![json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": namespace, "labels": labels},
    })];
    docs.extend(
        crds::all()
            .into_iter()
            .filter(|crd| is_infra_crd(crd, infra))
            .map(|crd| crd_value(crd, &labels)),
    );
    let [cluster_rules, leader_rules, aggregated_rules] = infra_rules(infra);
    let name = infra.name();
    docs.extend(rbac_objects(
        &namespace,
        &labels,
        &service_account(infra),
        &cluster_role(infra),
        rules(cluster_rules),
        &format!("{name}-leader-election-role"),
        rules(leader_rules),
    ));
    let mut aggregated_labels = labels.clone();
    aggregated_labels[AGGREGATE_TO_MANAGER] = json!("true");
    let kcp = kcp_rules(&aggregated_rules);
    docs.push(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": aggregated_role(infra), "labels": aggregated_labels},
        "rules": rules(aggregated_rules),
    }));
    let mut kcp_labels = labels.clone();
    kcp_labels[KCP_AGGREGATE_TO_MANAGER] = json!("true");
    docs.push(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": kcp_aggregated_role(infra), "labels": kcp_labels},
        "rules": rules(kcp),
    }));
    // The machine template's immutability, which CAPI's topology dry-runs may pass
    // (`banlieue_api::policies`).
    docs.extend(
        banlieue_api::policies::IMMUTABLE_TEMPLATES
            .iter()
            .filter(|t| t.kind == format!("{}MachineTemplate", infra.kind_prefix()))
            .flat_map(banlieue_api::policies::ImmutableTemplate::policy)
            .map(|mut doc| {
                merge_labels(&mut doc, &labels);
                doc
            }),
    );
    let string_data = match infra {
        Infra::Proxmox => Some((
            json!({
                banlieue_proxmox::credentials::TOKEN_ID_KEY: "${PROXMOX_TOKEN}",
                banlieue_proxmox::credentials::TOKEN_SECRET_KEY: "${PROXMOX_SECRET}",
            }),
            "${PROXMOX_URL}",
        )),
        Infra::Vsphere => Some((
            json!({
                VSPHERE_USERNAME_KEY: "${VSPHERE_USERNAME}",
                VSPHERE_PASSWORD_KEY: "${VSPHERE_PASSWORD}",
            }),
            "${VSPHERE_SERVER}",
        )),
        Infra::Libvirt => None,
    };
    if let (Some(secret), Some((string_data, endpoint))) = (credentials_secret(infra), string_data) {
        // Clusters of every namespace may name it (as before the grant existed); an operator
        // narrows it with <PREFIX>_CREDENTIALS_ALLOWED_NAMESPACES at `clusterctl init`. The
        // default is quoted: a plain `*` is a YAML alias. Since other namespaces choose the endpoint,
        // the Secret goes only to the endpoint clusterctl init is given (the one the cluster
        // templates write); the operator lists more by annotating it.
        let allowed = format!(
            "${{{}_CREDENTIALS_ALLOWED_NAMESPACES:=\"*\"}}",
            infra.var_prefix()
        );
        docs.push(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {
                "name": secret, "namespace": namespace, "labels": labels,
                "annotations": {
                    banlieue_api::ALLOWED_NAMESPACES_ANNOTATION: allowed,
                    banlieue_api::ALLOWED_ENDPOINTS_ANNOTATION: endpoint,
                },
            },
            "type": "Opaque",
            "stringData": string_data,
        }));
    }
    let prefix = infra.var_prefix();
    let mut env = pod_env();
    if let Some(list) = env.as_array_mut() {
        list.push(json!({"name": "RUST_LOG", "value": format!("${{{prefix}_LOG_LEVEL:=info}}")}));
        if infra == Infra::Libvirt {
            // ssh (qemu+ssh URIs) wants a writable home; the root file system is read-only.
            list.push(json!({"name": "HOME", "value": "/tmp"}));
        }
        if downloads_images(infra) {
            list.push(json!({"name": IMAGE_DIR_ENV, "value": IMAGE_DIR}));
        }
    }
    let (volumes, supplemental_groups) = pod_extras(infra);
    docs.push(deployment(DeploymentSpec {
        name: &deployment_name(infra),
        namespace: &namespace,
        labels: labels.clone(),
        service_account: &service_account(infra),
        image: format!("${{{prefix}_IMAGE:={}}}", image(infra)),
        args: args(infra),
        probe_port: 8081,
        metrics_port: 8080,
        env,
        volumes,
        supplemental_groups,
    }));
    docs
}

/// Keys of the vSphere credentials Secret (`banlieue-vsphere`'s `credentialsRef`).
pub const VSPHERE_USERNAME_KEY: &str = "username";
/// See [`VSPHERE_USERNAME_KEY`].
pub const VSPHERE_PASSWORD_KEY: &str = "password";

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
        volumes: Vec::new(),
        supplemental_groups: None,
    }));
    docs
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::rbac::v1::ClusterRole;

    use super::*;
    use crate::PROXMOX_PROVIDER_LABEL;

    /// The default cluster template of `infra` and the field of its infra cluster that names the
    /// hypervisor endpoint.
    fn template_of(infra: Infra) -> std::path::PathBuf {
        let templates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates");
        match infra {
            Infra::Proxmox => templates.join("cluster-template.yaml"),
            Infra::Vsphere => templates.join("vsphere/cluster-template.yaml"),
            Infra::Libvirt => templates.join("libvirt/cluster-template.yaml"),
        }
    }

    fn endpoint_field(infra: Infra) -> &'static str {
        match infra {
            Infra::Proxmox => "endpoint",
            Infra::Vsphere => "server",
            Infra::Libvirt => "uri",
        }
    }

    /// The Deployment as a typed object, the clusterctl variable of libvirt's supplemental group
    /// (a string until clusterctl substitutes it) replaced by its default.
    /// The Pod may run on a control plane node, as CAPI's managers may.
    fn assert_tolerates_the_control_plane(pod: &k8s_openapi::api::core::v1::PodSpec) {
        let tolerated: Vec<(String, String)> = pod
            .tolerations
            .iter()
            .flatten()
            .map(|t| {
                (
                    t.key.clone().unwrap_or_default(),
                    t.effect.clone().unwrap_or_default(),
                )
            })
            .collect();
        for key in [
            "node-role.kubernetes.io/control-plane",
            "node-role.kubernetes.io/master",
        ] {
            assert!(
                tolerated.contains(&(key.to_owned(), "NoSchedule".to_owned())),
                "{key}:NoSchedule not tolerated: {tolerated:?}"
            );
        }
    }

    fn typed_deployment(doc: &Value) -> Deployment {
        let mut doc = doc.clone();
        let groups = &mut doc["spec"]["template"]["spec"]["securityContext"]["supplementalGroups"];
        if !groups.is_null() {
            assert_eq!(*groups, json!(["${LIBVIRT_SOCKET_GID:=65532}"]));
            *groups = json!([65532]);
        }
        serde_json::from_value(doc).unwrap()
    }

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
    fn every_provider_has_its_own_crds_rbac_and_labels() {
        for infra in Infra::ALL {
            let docs = infra_components(infra);
            for doc in &docs {
                assert_eq!(
                    doc["metadata"]["labels"][PROVIDER_LABEL_KEY],
                    infra.label(),
                    "{}",
                    crate::yaml::describe(doc)
                );
            }
            let crds: Vec<&str> = docs
                .iter()
                .filter(|d| d["kind"] == "CustomResourceDefinition")
                .map(|d| d["spec"]["names"]["kind"].as_str().unwrap())
                .collect();
            let prefix = infra.kind_prefix();
            assert_eq!(
                crds,
                ["Cluster", "Machine", "ClusterTemplate", "MachineTemplate"].map(|k| format!("{prefix}{k}")),
                "{infra:?}"
            );
            let namespaces: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Namespace").collect();
            assert_eq!(namespaces.len(), 1);
            assert_eq!(namespaces[0]["metadata"]["name"], infra.namespace());
            let role: ClusterRole =
                serde_json::from_value(find(&docs, "ClusterRole", &cluster_role(infra)).clone()).unwrap();
            assert_eq!(role.rules.unwrap(), infra_rules(infra)[0]);
            let aggregated = find(&docs, "ClusterRole", &aggregated_role(infra));
            assert_eq!(aggregated["metadata"]["labels"][AGGREGATE_TO_MANAGER], "true");
            let kcp = find(&docs, "ClusterRole", &kcp_aggregated_role(infra));
            assert_eq!(kcp["metadata"]["labels"][KCP_AGGREGATE_TO_MANAGER], "true");
            let kcp_resources: Vec<&str> = kcp["rules"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r["resources"].as_array().unwrap())
                .filter_map(Value::as_str)
                .collect();
            let prefix = infra.kind_prefix().to_lowercase();
            assert_eq!(
                kcp_resources,
                [format!("{prefix}machines"), format!("{prefix}machinetemplates")],
                "the control-plane manager gets the machine kinds, nothing else"
            );
            let d = typed_deployment(find(&docs, "Deployment", &deployment_name(infra)));
            let pod = d.spec.template.spec.unwrap();
            assert_eq!(pod.service_account_name, Some(service_account(infra)));
            let c = &pod.containers[0];
            assert_eq!(
                c.security_context.clone().unwrap().read_only_root_filesystem,
                Some(true)
            );
            assert!(c.liveness_probe.is_some() && c.readiness_probe.is_some());
            assert_eq!(c.args.clone().unwrap(), args(infra));
            assert_tolerates_the_control_plane(&pod);
            let secrets: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Secret").collect();
            assert_eq!(secrets.len(), usize::from(credentials_secret(infra).is_some()));
            for secret in secrets {
                let endpoint = secret["metadata"]["annotations"][banlieue_api::ALLOWED_ENDPOINTS_ANNOTATION]
                    .as_str()
                    .unwrap();
                let templates = std::fs::read_to_string(template_of(infra)).unwrap();
                assert!(
                    templates.contains(&format!("{}: {endpoint}", endpoint_field(infra))),
                    "{infra:?}: the Secret goes to the endpoint the cluster template writes"
                );
            }
        }
    }

    #[test]
    fn every_provider_ships_its_machine_template_policy() {
        for infra in Infra::ALL {
            let docs = infra_components(infra);
            let kind = format!("{}MachineTemplate", infra.kind_prefix());
            let template = banlieue_api::policies::immutable_template(&kind).unwrap();
            let policy = find(&docs, "ValidatingAdmissionPolicy", &template.policy_name());
            assert_eq!(
                policy["metadata"]["labels"][PROVIDER_LABEL_KEY],
                infra.label(),
                "{kind}"
            );
            find(&docs, "ValidatingAdmissionPolicyBinding", &template.policy_name());
        }
    }

    #[test]
    fn libvirt_mounts_the_socket_folder_and_a_writable_tmp() {
        let docs = infra_components(Infra::Libvirt);
        let d = typed_deployment(find(&docs, "Deployment", &deployment_name(Infra::Libvirt)));
        let pod = d.spec.template.spec.unwrap();
        let mounts = pod.containers[0].volume_mounts.clone().unwrap();
        let paths: Vec<&str> = mounts.iter().map(|m| m.mount_path.as_str()).collect();
        assert_eq!(paths, [LIBVIRT_SOCKET_DIR, "/tmp", IMAGE_DIR]);
        let volumes = pod.volumes.unwrap();
        assert_eq!(
            volumes[0].host_path.as_ref().unwrap().path,
            "${LIBVIRT_SOCKET_DIR:=/var/run/libvirt}"
        );
        let vsphere = infra_components(Infra::Vsphere);
        let secret = find(&vsphere, "Secret", &credentials_secret(Infra::Vsphere).unwrap());
        assert_eq!(secret["stringData"]["username"], "${VSPHERE_USERNAME}");
        assert_eq!(secret["stringData"]["password"], "${VSPHERE_PASSWORD}");
    }

    #[test]
    fn the_providers_that_download_images_get_a_folder_of_their_own_for_them() {
        for infra in Infra::ALL {
            let docs = infra_components(infra);
            let d = typed_deployment(find(&docs, "Deployment", &deployment_name(infra)));
            let pod = d.spec.template.spec.unwrap();
            let container = &pod.containers[0];
            let env = container.env.clone().unwrap_or_default();
            let dir = env
                .iter()
                .find(|e| e.name == IMAGE_DIR_ENV)
                .and_then(|e| e.value.clone());
            let mounted = container
                .volume_mounts
                .clone()
                .unwrap_or_default()
                .iter()
                .any(|m| m.mount_path == IMAGE_DIR);
            if infra == Infra::Proxmox {
                assert!(dir.is_none() && !mounted, "Proxmox VE's storage downloads itself");
            } else {
                assert_eq!(dir.as_deref(), Some(IMAGE_DIR), "{infra:?}");
                assert!(
                    mounted,
                    "{infra:?}: an emptyDir at {IMAGE_DIR} (the root file system is read-only)"
                );
                let volume = pod
                    .volumes
                    .clone()
                    .unwrap()
                    .into_iter()
                    .find(|v| v.name == "images")
                    .unwrap();
                assert!(
                    volume.empty_dir.unwrap().size_limit.is_some(),
                    "{infra:?}: a size the administrator can set"
                );
            }
        }
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
    fn the_core_controller_may_run_on_a_control_plane_node() {
        let d = typed_deployment(find(&core_components(), "Deployment", CORE_DEPLOYMENT));
        assert_tolerates_the_control_plane(&d.spec.template.spec.unwrap());
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
