//! Which spec fields each backend honours: one declaration per field of every kind, per
//! backend, from which the provider refuses what it cannot do (a condition naming the field and
//! the provider, never a silent no-op), the docs' field table is generated
//! (`docs/field-support.md`), and a test proves that every field of every CRD has a decision.
//!
//! A field is named by its path under `spec`, in the CRD's JSON names, with `[]` after a list
//! (`networks[].ipv4.mode`). Every leaf of a kind's schema is declared; a field added later
//! without a decision fails `cargo test -p banlieue-api --test support`.

mod fields;

use serde_json::Value;

use crate::common::Backend;

pub use fields::{
    CLUSTER_PROVIDER_REF_RULE, PROVIDER_NODES_RULE, PROVIDER_RESOURCE_POOL_RULE, PROVIDER_TLS_RULE,
    PROVIDER_VSPHERE_DEFAULTS_RULE, cluster_fields, machine_fields, neutral_fields,
};

/// What a backend does with a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// The provider does what the field asks; the text says where it takes effect.
    Honoured(&'static str),
    /// Honoured when the VM is created; a later change is not applied to an existing VM (the
    /// text says what the field does).
    AtCreation(&'static str),
    /// Some values are honoured, the others are refused when the provider reconciles: its
    /// `Ready` condition turns False with reason [`UNSUPPORTED_FIELD`], naming the field and the
    /// provider, and nothing is created until the field is changed (on a VM that exists already,
    /// its `VMUpToDate` says so and the rest of the spec is still acted on).
    Refused {
        /// The values that are refused.
        values: Refused,
        /// Why, and what to use instead (shown in the condition).
        why: &'static str,
    },
    /// Refused by the API server when the object is written (a CEL rule of the CRD whose
    /// message is this text).
    RefusedAtAdmission(&'static str),
    /// Not an ask of the user: set by the provider or by Cluster API, or meaningless for this
    /// backend in a way that cannot surprise (the text says which).
    NotApplicable(&'static str),
}

/// Which values of a field a backend refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Any value: the field must stay unset (an empty list or `false` counts as unset).
    Any,
    /// These values (strings, as written in the spec).
    Values(&'static [&'static str]),
}

/// Condition reason of a spec that sets a field the provider cannot honour.
pub const UNSUPPORTED_FIELD: &str = "UnsupportedField";

/// One field's decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Path under `spec` (`networks[].ipv4.mode`).
    pub path: String,
    /// What the backend does with it.
    pub support: Support,
}

impl Field {
    /// A field at `path` with `support`.
    pub fn new(path: impl Into<String>, support: Support) -> Self {
        Self {
            path: path.into(),
            support,
        }
    }
}

/// The kinds whose fields are declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `VirtualMachine` (banlieue.io).
    VirtualMachine,
    /// `VirtualMachineClass` (banlieue.io).
    VirtualMachineClass,
    /// `VirtualMachineImage` (banlieue.io).
    VirtualMachineImage,
    /// `Provider` (banlieue.io).
    Provider,
    /// The backend's infrastructure machine (`ProxmoxMachine`, …; its template's
    /// `spec.template.spec` is the same).
    Machine,
    /// The backend's infrastructure cluster (`ProxmoxCluster`, …; its template's too).
    Cluster,
}

impl Kind {
    /// Every declared kind.
    pub const ALL: [Kind; 6] = [
        Kind::VirtualMachine,
        Kind::VirtualMachineClass,
        Kind::VirtualMachineImage,
        Kind::Provider,
        Kind::Machine,
        Kind::Cluster,
    ];

    /// The kind's name for `backend` (`ProxmoxMachine` for [`Kind::Machine`] on Proxmox).
    pub fn name(self, backend: Backend) -> &'static str {
        match (self, backend) {
            (Kind::VirtualMachine, _) => "VirtualMachine",
            (Kind::VirtualMachineClass, _) => "VirtualMachineClass",
            (Kind::VirtualMachineImage, _) => "VirtualMachineImage",
            (Kind::Provider, _) => "Provider",
            (Kind::Machine, Backend::Proxmox) => "ProxmoxMachine",
            (Kind::Machine, Backend::Libvirt) => "LibvirtMachine",
            (Kind::Machine, Backend::Vsphere) => "VSphereMachine",
            (Kind::Cluster, Backend::Proxmox) => "ProxmoxCluster",
            (Kind::Cluster, Backend::Libvirt) => "LibvirtCluster",
            (Kind::Cluster, Backend::Vsphere) => "VSphereCluster",
        }
    }
}

/// The declared fields of `kind` on `backend`.
pub fn fields(kind: Kind, backend: Backend) -> Vec<Field> {
    match kind {
        Kind::Machine => machine_fields(backend),
        Kind::Cluster => cluster_fields(backend),
        neutral => neutral_fields(neutral, backend),
    }
}

/// Every backend, in the table's column order.
pub const BACKENDS: [Backend; 3] = [Backend::Proxmox, Backend::Libvirt, Backend::Vsphere];

/// A refused field found in a spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The field with list indexes (`spec.networks[1].ipv4.mode`).
    pub field: String,
    /// The value found, as JSON.
    pub value: String,
    /// Why it is refused.
    pub why: &'static str,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} = {}: {}", self.field, self.value, self.why)
    }
}

/// The fields of `spec` (a kind's `spec` as JSON) that `fields` refuses, in declaration order
/// then list order.
pub fn refusals(fields: &[Field], spec: &Value) -> Vec<Refusal> {
    let mut found = Vec::new();
    for field in fields {
        let Support::Refused { values, why } = field.support else {
            continue;
        };
        for (at, value) in lookup(spec, &field.path) {
            let refused = match values {
                Refused::Any => is_set(value),
                Refused::Values(list) => value.as_str().is_some_and(|v| list.contains(&v)),
            };
            if refused {
                found.push(Refusal {
                    field: format!("spec.{at}"),
                    value: value.to_string(),
                    why,
                });
            }
        }
    }
    found
}

/// The refused fields of an infrastructure machine's `spec` on `backend` (the declarations'
/// refusals, built once per backend).
pub fn machine_refusals(backend: Backend, spec: &Value) -> Vec<Refusal> {
    refusals(of_backend(&REFUSED_MACHINE_FIELDS, backend), spec)
}

/// Whether `backend` refuses any machine field (else [`machine_refusals`] finds nothing in
/// any spec).
pub fn machine_refuses_any(backend: Backend) -> bool {
    !of_backend(&REFUSED_MACHINE_FIELDS, backend).is_empty()
}

/// Every backend's refused machine fields, built once.
static REFUSED_MACHINE_FIELDS: std::sync::LazyLock<Vec<(Backend, Vec<Field>)>> =
    std::sync::LazyLock::new(|| machine_fields_where(|s| matches!(s, Support::Refused { .. })));

/// Every backend's machine fields whose support `keep` accepts.
fn machine_fields_where(keep: fn(&Support) -> bool) -> Vec<(Backend, Vec<Field>)> {
    BACKENDS
        .iter()
        .map(|b| {
            (
                *b,
                machine_fields(*b)
                    .into_iter()
                    .filter(|f| keep(&f.support))
                    .collect(),
            )
        })
        .collect()
}

/// `backend`'s list of [`machine_fields_where`].
fn of_backend(lists: &[(Backend, Vec<Field>)], backend: Backend) -> &[Field] {
    lists
        .iter()
        .find(|(b, _)| *b == backend)
        .map_or(&[], |(_, fields)| fields.as_slice())
}

/// Annotation of an infrastructure machine recording, as a JSON object, the values its
/// [`Support::AtCreation`] fields had when the VM was created (written with `spec.providerID`):
/// a later change of one of them is reported instead of silently not applied.
pub const CREATED_WITH_ANNOTATION: &str = "banlieue.io/created-with";

/// Condition reason of a provisioned machine whose spec changed a field that acts only when the
/// VM is created.
pub const RECREATE_REQUIRED: &str = "RecreateRequired";

/// The values of the [`Support::AtCreation`] fields of an infrastructure machine's `spec` on
/// `backend`, keyed by their path with list indexes (`networks[0].ipv4.mode`); unset fields are
/// left out.
pub fn creation_values(backend: Backend, spec: &Value) -> std::collections::BTreeMap<String, Value> {
    static AT_CREATION: std::sync::LazyLock<Vec<(Backend, Vec<Field>)>> =
        std::sync::LazyLock::new(|| machine_fields_where(|s| matches!(s, Support::AtCreation(_))));
    let mut out = std::collections::BTreeMap::new();
    let fields = of_backend(&AT_CREATION, backend);
    for field in fields {
        for (at, value) in lookup(spec, &field.path) {
            if is_set(value) {
                out.insert(at, value.clone());
            }
        }
    }
    out
}

/// The [`creation_values`] that differ between `created` (as recorded) and `now`, one
/// `spec.<path>: <then> → <now>` each (`unset` for a missing value).
pub fn creation_changes(
    created: &std::collections::BTreeMap<String, Value>,
    now: &std::collections::BTreeMap<String, Value>,
) -> Vec<String> {
    let show = |v: Option<&Value>| v.map_or_else(|| "unset".to_owned(), Value::to_string);
    let mut paths: Vec<&String> = created.keys().chain(now.keys()).collect();
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .filter(|p| created.get(*p) != now.get(*p) && in_both(p, created, now))
        .map(|p| format!("spec.{p}: {} → {}", show(created.get(p)), show(now.get(p))))
        .collect()
}

/// Whether every list element `path` lies in (`networks[1]` of `networks[1].ipv4.mode`) has
/// recorded values on both sides: an element added or removed since (a NIC, a disk) is the
/// list's own business, honoured or not as the list field is declared, not a changed value.
fn in_both(
    path: &str,
    created: &std::collections::BTreeMap<String, Value>,
    now: &std::collections::BTreeMap<String, Value>,
) -> bool {
    let has = |map: &std::collections::BTreeMap<String, Value>, element: &str| {
        map.keys()
            .any(|k| k.starts_with(element) && k[element.len()..].starts_with('.'))
    };
    path.match_indices(']').all(|(end, _)| {
        let element = &path[..=end];
        has(created, element) && has(now, element)
    })
}

/// Puts back into `spec` the creation-only values `created` recorded (and unsets those set
/// since), so that the steps of a provisioned machine act on the VM as it was created, not on a
/// change that applies only to a new one. A value whose list element no longer exists is left
/// as it is.
pub fn restore_creation_values(
    backend: Backend,
    spec: &mut Value,
    created: &std::collections::BTreeMap<String, Value>,
) {
    let now = creation_values(backend, spec);
    for path in now
        .keys()
        .filter(|p| !created.contains_key(*p) && in_both(p, created, &now))
    {
        let segments = segments(path);
        if let Some((last, parents)) = segments.split_last()
            && let Some(Value::Object(parent)) = walk_to(spec, parents, false)
        {
            parent.remove(last.as_str());
        }
    }
    for (path, value) in created.iter().filter(|(p, _)| in_both(p, created, &now)) {
        let segments = segments(path);
        if let Some((last, parents)) = segments.split_last()
            && let Some(Value::Object(parent)) = walk_to(spec, parents, true)
        {
            parent.insert(last.clone(), value.clone());
        }
    }
}

/// `networks[0].ipv4.mode` → `networks`, `0`, `ipv4`, `mode`.
fn segments(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in path.split('.') {
        match part.split_once('[') {
            Some((name, index)) => {
                out.push(name.to_owned());
                out.push(index.trim_end_matches(']').to_owned());
            }
            None => out.push(part.to_owned()),
        }
    }
    out
}

/// The value at `segments` (list indexes as numbers); missing objects are made when `create`
/// (never missing list elements).
fn walk_to<'v>(value: &'v mut Value, segments: &[String], create: bool) -> Option<&'v mut Value> {
    let Some((first, rest)) = segments.split_first() else {
        return Some(value);
    };
    let next = match value {
        Value::Array(items) => items.get_mut(first.parse::<usize>().ok()?)?,
        Value::Object(map) => {
            if create && !map.contains_key(first) {
                map.insert(first.clone(), Value::Object(serde_json::Map::new()));
            }
            map.get_mut(first)?
        }
        _ => return None,
    };
    walk_to(next, rest, create)
}

/// One message for a provider's condition: every refused field, the provider named.
pub fn refusal_message(kind: &str, provider: &str, refusals: &[Refusal]) -> String {
    let list: Vec<String> = refusals.iter().map(Refusal::to_string).collect();
    format!(
        "the {provider} provider does not support what this {kind} asks; change or remove: {}",
        list.join("; ")
    )
}

impl Support {
    /// The table cell: the verdict, then what the field does or why it is refused.
    pub fn cell(&self) -> String {
        match self {
            Support::Honoured("") => "yes".to_owned(),
            Support::Honoured(how) => format!("yes: {how}"),
            Support::AtCreation(how) => format!("at creation: {how}"),
            Support::Refused {
                values: Refused::Any,
                why,
            } => format!("refused (condition `{UNSUPPORTED_FIELD}`): {why}"),
            Support::Refused {
                values: Refused::Values(values),
                why,
            } => format!(
                "refused for {} (condition `{UNSUPPORTED_FIELD}`): {why}",
                values.join(", ")
            ),
            Support::RefusedAtAdmission(message) => format!("refused by the API server: \"{message}\""),
            Support::NotApplicable(why) => format!("n/a: {why}"),
        }
    }
}

/// `docs/field-support.md`: per kind, one row per field, one column per backend.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Which spec fields each backend honours\n\n\
         Generated from `banlieue_api::support` (the declarations the providers refuse from); \
         regenerate with `BANLIEUE_UPDATE_DOCS=1 cargo test -p banlieue-api --test support`.\n\n\
         - **yes**: the provider does what the field asks.\n\
         - **at creation**: honoured when the VM is created; a later change is not applied to the \
         existing VM but reported: its `VMUpToDate` condition turns False with reason \
         `RecreateRequired` naming the field, the old and the new value (set it back, or replace \
         the machine: a MachineDeployment rolls out a new one).\n\
         - **refused (condition `UnsupportedField`)**: the machine's `Ready` condition turns False \
         naming the field and the provider, and nothing is created until the field is changed (on \
         a VM that exists already: its `VMUpToDate`, the rest of the spec still acted on).\n\
         - **refused by the API server**: a CEL rule of the CRD refuses the object when it is written.\n\
         - **n/a**: not an ask of the user (set by the provider or Cluster API), or another \
         backend's entry.\n\n\
         There is no \"ignored\": a field a backend accepts and does not act on cannot be \
         declared (it is refused, or honoured).\n\n\
         Machine and cluster rows hold for the kind's template too (`spec.template.spec`). A \
         VirtualMachine's fields copied onto the infrastructure machine have that machine's verdict.\n",
    );
    for kind in Kind::ALL {
        let title = match kind {
            Kind::Machine => {
                "Infrastructure machines (ProxmoxMachine, LibvirtMachine, VSphereMachine)".to_owned()
            }
            Kind::Cluster => {
                "Infrastructure clusters (ProxmoxCluster, LibvirtCluster, VSphereCluster)".to_owned()
            }
            other => other.name(Backend::Proxmox).to_owned(),
        };
        out.push_str(&format!(
            "\n## {title}\n\n| field | Proxmox | libvirt | vSphere |\n|---|---|---|---|\n"
        ));
        let per_backend: Vec<Vec<Field>> = BACKENDS.iter().map(|b| fields(kind, *b)).collect();
        let mut paths: Vec<&str> = Vec::new();
        for list in &per_backend {
            for f in list {
                if !paths.contains(&f.path.as_str()) {
                    paths.push(&f.path);
                }
            }
        }
        for path in paths {
            let cells: Vec<String> = per_backend
                .iter()
                .map(|list| {
                    list.iter()
                        .find(|f| f.path == path)
                        .map_or_else(|| "—".to_owned(), |f| f.support.cell().replace('|', "\\|"))
                })
                .collect();
            out.push_str(&format!("| `{path}` | {} |\n", cells.join(" | ")));
        }
    }
    out
}

/// Whether a value counts as set (not null, not an empty list or object, not `false`).
fn is_set(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => false,
        Value::Array(items) => !items.is_empty(),
        Value::Object(map) => !map.is_empty(),
        _ => true,
    }
}

/// The values at `path` in `value` (`a.b[].c`), each with its path written with indexes.
pub fn lookup<'v>(value: &'v Value, path: &str) -> Vec<(String, &'v Value)> {
    let mut at = vec![(String::new(), value)];
    for segment in path.split('.') {
        let (name, list) = match segment.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (segment, false),
        };
        let mut next = Vec::new();
        for (prefix, v) in at {
            let Some(child) = v.get(name) else { continue };
            let here = if prefix.is_empty() {
                name.to_owned()
            } else {
                format!("{prefix}.{name}")
            };
            if list {
                for (i, item) in child.as_array().into_iter().flatten().enumerate() {
                    next.push((format!("{here}[{i}]"), item));
                }
            } else {
                next.push((here, child));
            }
        }
        at = next;
    }
    at
}

/// The leaf paths of an OpenAPI v3 object schema (a CRD's `spec` schema), in the form
/// [`Field::path`] uses: objects recurse into their properties, lists of objects add `[]`;
/// maps, lists of scalars, free-form objects and scalars are leaves.
pub fn leaf_paths(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(schema, "", &mut out);
    out
}

fn walk(schema: &Value, path: &str, out: &mut Vec<String>) {
    let join = |name: &str| {
        if path.is_empty() {
            name.to_owned()
        } else {
            format!("{path}.{name}")
        }
    };
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            walk(sub, &join(name), out);
        }
        return;
    }
    if schema.get("type").and_then(Value::as_str) == Some("array")
        && let Some(items) = schema.get("items")
        && items.get("properties").is_some()
    {
        walk(items, &format!("{path}[]"), out);
        return;
    }
    if !path.is_empty() {
        out.push(path.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn lookup_expands_lists_with_indexes() {
        let spec = json!({"networks": [
            {"name": "a", "ipv4": {"mode": "DHCP"}},
            {"name": "b"},
            {"name": "c", "ipv4": {"mode": "Static"}},
        ]});
        let found: Vec<(String, Value)> = lookup(&spec, "networks[].ipv4.mode")
            .into_iter()
            .map(|(p, v)| (p, v.clone()))
            .collect();
        assert_eq!(
            found,
            vec![
                ("networks[0].ipv4.mode".to_owned(), json!("DHCP")),
                ("networks[2].ipv4.mode".to_owned(), json!("Static")),
            ]
        );
    }

    #[test]
    fn refusals_name_each_refused_value_and_skip_the_honoured_ones() {
        let fields = vec![
            Field::new(
                "networks[].ipv4.mode",
                Support::Refused {
                    values: Refused::Values(&["Static", "Pool"]),
                    why: "no static addressing",
                },
            ),
            Field::new(
                "tags",
                Support::Refused {
                    values: Refused::Any,
                    why: "no tags",
                },
            ),
            Field::new("cpu.cores", Support::Honoured("cores")),
        ];
        let spec = json!({
            "cpu": {"cores": 2},
            "tags": [],
            "networks": [{"ipv4": {"mode": "DHCP"}}, {"ipv4": {"mode": "Pool"}}],
        });
        let found = refusals(&fields, &spec);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].field, "spec.networks[1].ipv4.mode");
        assert_eq!(found[0].value, "\"Pool\"");
        let spec = json!({"tags": ["a"]});
        assert_eq!(refusals(&fields, &spec)[0].field, "spec.tags");
        let message = refusal_message("LibvirtMachine", "libvirt", &refusals(&fields, &spec));
        assert!(
            message.contains("libvirt provider") && message.contains("spec.tags"),
            "{message}"
        );
    }

    #[test]
    fn creation_values_keep_the_set_at_creation_fields_and_changes_name_each_difference() {
        let spec = json!({
            "cpu": {"cores": 2},
            "storagePool": "default",
            "networks": [{"name": "eth0", "network": "default", "ipv4": {"mode": "Static", "addresses": ["192.0.2.5/24"]}}],
        });
        let created = creation_values(Backend::Libvirt, &spec);
        assert_eq!(created.get("storagePool"), Some(&json!("default")));
        assert_eq!(
            created.get("networks[0].ipv4.addresses"),
            Some(&json!(["192.0.2.5/24"]))
        );
        assert!(
            !created.contains_key("cpu.cores"),
            "applied at any time: not recorded"
        );
        assert!(creation_changes(&created, &created).is_empty());
        let mut later = spec.clone();
        later["networks"][0]["ipv4"]["addresses"] = json!(["192.0.2.6/24"]);
        later["networks"][0]["mtu"] = json!(9000);
        let changes = creation_changes(&created, &creation_values(Backend::Libvirt, &later));
        assert_eq!(
            changes,
            [
                "spec.networks[0].ipv4.addresses: [\"192.0.2.5/24\"] → [\"192.0.2.6/24\"]",
                "spec.networks[0].mtu: unset → 9000",
            ]
        );
    }

    #[test]
    fn restoring_creation_values_undoes_changes_of_creation_only_fields_only() {
        let created_spec = json!({
            "cpu": {"cores": 2},
            "storagePool": "default",
            "networks": [{"name": "eth0", "network": "default"}],
        });
        let created = creation_values(Backend::Libvirt, &created_spec);
        let mut spec = json!({
            "cpu": {"cores": 4},
            "storagePool": "fast",
            "firmware": "UEFI",
            "networks": [{"name": "eth0", "network": "other", "ipv4": {"mode": "DHCP"}}],
        });
        restore_creation_values(Backend::Libvirt, &mut spec, &created);
        assert_eq!(spec["cpu"]["cores"], 4, "applied at any time: kept");
        assert_eq!(spec["storagePool"], "default");
        assert_eq!(spec.get("firmware"), None, "set since: unset again");
        assert_eq!(spec["networks"][0]["network"], "default");
        assert_eq!(spec["networks"][0]["ipv4"].get("mode"), None);
        assert!(creation_changes(&created, &creation_values(Backend::Libvirt, &spec)).is_empty());
    }

    #[test]
    fn an_element_added_or_removed_since_is_not_a_changed_value() {
        let two = json!({"networks": [{"name": "eth0", "network": "a"}, {"name": "eth1", "network": "b"}]});
        let one = json!({"networks": [{"name": "eth0", "network": "a"}]});
        let (two, one) = (
            creation_values(Backend::Libvirt, &two),
            creation_values(Backend::Libvirt, &one),
        );
        assert!(creation_changes(&two, &one).is_empty(), "removed");
        assert!(creation_changes(&one, &two).is_empty(), "added");
        let mut spec =
            json!({"networks": [{"name": "eth0", "network": "a"}, {"name": "eth1", "network": "b"}]});
        restore_creation_values(Backend::Libvirt, &mut spec, &one);
        assert_eq!(spec["networks"][1]["name"], "eth1", "a new element is left whole");
    }

    #[test]
    fn leaf_paths_recurse_into_objects_and_lists_of_objects() {
        let schema = json!({"type": "object", "properties": {
            "cpu": {"type": "object", "properties": {"cores": {"type": "integer"}}},
            "tags": {"type": "array", "items": {"type": "string"}},
            "disks": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string"}, "sizeGiB": {"type": "integer"}}}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        }});
        let mut paths = leaf_paths(&schema);
        paths.sort();
        assert_eq!(
            paths,
            ["cpu.cores", "disks[].name", "disks[].sizeGiB", "labels", "tags"]
        );
    }
}
