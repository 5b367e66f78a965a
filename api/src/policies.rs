//! Admission policies the CRDs cannot express: `ValidatingAdmissionPolicy` objects (Kubernetes
//! 1.30+) shipped beside the CRDs.
//!
//! A machine template's `spec.template.spec` is immutable (CAPI clones it into each machine; a
//! change would apply to some machines only). CAPI's topology controller (ClusterClass) must
//! nevertheless be able to send the changed template as a server-side-apply **dry-run**, marked
//! with the annotation [`TOPOLOGY_DRY_RUN_ANNOTATION`], to learn whether it differs; it then
//! creates a new template instead of changing this one (CAPI's contract: "tolerance of SSA
//! dry-run requests"). A CRD's CEL rule sees neither the request's dry-run flag nor the
//! annotations, so the rule lives in a policy, which sees both.

use serde_json::{Value, json};

/// The annotation CAPI's topology controller puts on the objects of its dry-run requests.
pub const TOPOLOGY_DRY_RUN_ANNOTATION: &str = "topology.cluster.x-k8s.io/dry-run";

/// A kind whose `spec.template.spec` may not change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImmutableTemplate {
    /// The kind, e.g. `ProxmoxMachineTemplate`.
    pub kind: &'static str,
    /// Its resource (plural), e.g. `proxmoxmachinetemplates`.
    pub plural: &'static str,
}

/// The machine templates of every provider.
pub const IMMUTABLE_TEMPLATES: [ImmutableTemplate; 3] = [
    ImmutableTemplate {
        kind: "ProxmoxMachineTemplate",
        plural: "proxmoxmachinetemplates",
    },
    ImmutableTemplate {
        kind: "LibvirtMachineTemplate",
        plural: "libvirtmachinetemplates",
    },
    ImmutableTemplate {
        kind: "VSphereMachineTemplate",
        plural: "vspheremachinetemplates",
    },
];

impl ImmutableTemplate {
    /// The refusal's message.
    pub fn message(&self) -> String {
        format!(
            "spec.template.spec is immutable: create a new {} and point the MachineDeployment or \
             control plane at it",
            self.kind
        )
    }

    /// The rule a plain (not dry-run) update must hold, as a CEL expression over the object and
    /// its old version (`self`/`oldSelf` in a CRD's rule).
    pub const RULE: &str = "self.template.spec == oldSelf.template.spec";

    /// [`Self::RULE`] over the admission request's objects (`object`/`oldObject`) instead of
    /// the spec (`self`/`oldSelf`).
    fn rule_on_objects() -> String {
        Self::RULE
            .replace("oldSelf.", "oldObject.spec.")
            .replace("self.", "object.spec.")
    }

    /// The policy's name (also its binding's).
    pub fn policy_name(&self) -> String {
        format!("banlieue-immutable-{}", self.plural)
    }

    /// The `ValidatingAdmissionPolicy` and its binding (deny) for this kind.
    pub fn policy(&self) -> [Value; 2] {
        let name = self.policy_name();
        let expression = format!(
            "{} || (has(request.dryRun) && request.dryRun == true && \
             has(object.metadata.annotations) && '{TOPOLOGY_DRY_RUN_ANNOTATION}' in \
             object.metadata.annotations)",
            Self::rule_on_objects()
        );
        [
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": name},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": [{
                        "apiGroups": [crate::INFRASTRUCTURE_GROUP],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        "resources": [self.plural],
                    }]},
                    "validations": [{
                        "expression": expression,
                        "message": self.message(),
                        "reason": "Invalid",
                    }],
                },
            }),
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": name},
                "spec": {"policyName": name, "validationActions": ["Deny"]},
            }),
        ]
    }
}

/// The policies (with their bindings) of every immutable template kind.
pub fn all() -> Vec<Value> {
    IMMUTABLE_TEMPLATES
        .iter()
        .flat_map(ImmutableTemplate::policy)
        .collect()
}

/// The immutable template kind `kind`, if it is one.
pub fn immutable_template(kind: &str) -> Option<ImmutableTemplate> {
    IMMUTABLE_TEMPLATES.into_iter().find(|t| t.kind == kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_machine_template_kind_has_a_policy_and_a_binding() {
        let machine_templates: Vec<String> = crate::crds::all()
            .into_iter()
            .map(|crd| crd.spec.names.kind)
            .filter(|kind| kind.ends_with("MachineTemplate"))
            .collect();
        assert_eq!(machine_templates.len(), IMMUTABLE_TEMPLATES.len());
        for kind in &machine_templates {
            let template = immutable_template(kind).unwrap_or_else(|| panic!("{kind} has no policy"));
            let crd = crate::crds::by_kind(kind).unwrap();
            assert_eq!(crd.spec.names.plural, template.plural);
            let [policy, binding] = template.policy();
            assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
            assert_eq!(
                policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"][0],
                template.plural
            );
            let expression = policy["spec"]["validations"][0]["expression"].as_str().unwrap();
            assert!(
                expression.starts_with("object.spec.template.spec == oldObject.spec.template.spec || "),
                "the policy enforces RULE on plain updates: {expression}"
            );
        }
    }
}
