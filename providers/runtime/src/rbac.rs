//! Kubernetes API rights as data: the [`Rule`] type every banlieue binary lists its RBAC rules
//! in (`banlieue_proxmox::rbac`, `banlieue_libvirt::rbac`, `banlieue_vsphere::rbac`,
//! `banlieue_controllers::rbac`), their conversion to `PolicyRule`s for the generated manifests
//! (`banlieue-clusterctl`), the leader-election rules they all share, and [`lint`], the
//! least-privilege checks each crate's unit test runs over its own tables.

use k8s_openapi::api::rbac::v1::PolicyRule;

/// The API group of banlieue's infrastructure kinds (`ProxmoxMachine`, `LibvirtCluster`, …).
pub const INFRASTRUCTURE_GROUP: &str = "infrastructure.banlieue.io";

/// One RBAC rule and the reason the binary needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// API groups (`""` is the core group).
    pub api_groups: &'static [&'static str],
    /// Resources, with `/status` for the status subresource.
    pub resources: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// What the binary does with it.
    pub why: &'static str,
}

impl Rule {
    /// The rule as a Kubernetes `PolicyRule`.
    pub fn policy_rule(&self) -> PolicyRule {
        let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        PolicyRule {
            api_groups: Some(strings(self.api_groups)),
            resources: Some(strings(self.resources)),
            verbs: strings(self.verbs),
            ..Default::default()
        }
    }
}

/// The only wider access to Secrets a binary may have: reading by name plus list/watch for a
/// metadata-only watch that triggers the objects referencing a Secret (the rule's `why` says so).
pub const SECRET_WATCH_VERBS: &[&str] = &["get", "list", "watch"];

/// The one write to Secrets a binary may have: a `patch` that labels a Secret for
/// `clusterctl move` (the rule's `why` names the label). RBAC cannot narrow a patch to metadata;
/// the code patches nothing else.
pub const SECRET_LABEL_VERBS: &[&str] = &["patch"];

/// The label a [`SECRET_LABEL_VERBS`] rule exists for.
const MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";

impl Rule {
    /// What is wrong with the rule, if anything (see [`lint`]).
    fn problems(&self, own_kind_prefix: Option<&str>) -> Vec<String> {
        let mut problems = Vec::new();
        if self.why.trim().is_empty() {
            problems.push("no reason given (why is empty)".to_owned());
        }
        if self.api_groups.is_empty() || self.resources.is_empty() || self.verbs.is_empty() {
            problems.push("empty api groups, resources or verbs".to_owned());
        }
        if [self.api_groups, self.resources, self.verbs]
            .iter()
            .any(|list| list.contains(&"*"))
        {
            problems.push("a wildcard".to_owned());
        }
        let labels_for_move = self.verbs == SECRET_LABEL_VERBS && self.why.contains(MOVE_LABEL);
        if self.resources.contains(&"secrets")
            && self.verbs != ["get"]
            && self.verbs != SECRET_WATCH_VERBS
            && !labels_for_move
        {
            problems.push(format!(
                "secrets may only be read by name and watched (verbs must be exactly [get] or {SECRET_WATCH_VERBS:?}), or patched for the label {MOVE_LABEL} (verbs {SECRET_LABEL_VERBS:?}, the why naming the label)"
            ));
        }
        if let Some(prefix) = own_kind_prefix
            && self.api_groups.contains(&INFRASTRUCTURE_GROUP)
        {
            let foreign: Vec<_> = self.resources.iter().filter(|r| !r.starts_with(prefix)).collect();
            if !foreign.is_empty() {
                problems.push(format!(
                    "{INFRASTRUCTURE_GROUP} resources {foreign:?} are not the binary's own `{prefix}*` kinds"
                ));
            }
        }
        problems
    }
}

/// The rules as Kubernetes `PolicyRule`s.
pub fn policy_rules(rules: &[Rule]) -> Vec<PolicyRule> {
    rules.iter().map(Rule::policy_rule).collect()
}

/// Rules of the leader-election Role, in the namespace of the Lease (what [`crate::leader`]
/// calls).
pub const LEADER_ELECTION_RULES: &[Rule] = &[Rule {
    api_groups: &["coordination.k8s.io"],
    resources: &["leases"],
    verbs: &["get", "create", "update"],
    why: "--leader-elect: acquire, renew and release the Lease",
}];

/// The least-privilege checks over a binary's rule tables: every rule says why it exists, names
/// at least one group, resource and verb, has no wildcard (group, resource or verb), and reads
/// Secrets only with `get` (by name), or `get`, `list` and `watch` ([`SECRET_WATCH_VERBS`]: the
/// Secret watch), nothing else (no `create`, `update`, `delete`, a lone `list`). With `own_kind_prefix` (a
/// provider's `"proxmox"`), rules on [`INFRASTRUCTURE_GROUP`] name only resources starting with
/// it.
///
/// Returns every violation, one line per rule and problem.
pub fn lint(tables: &[&[Rule]], own_kind_prefix: Option<&str>) -> Result<(), String> {
    let violations: Vec<String> = tables
        .iter()
        .flat_map(|table| table.iter())
        .flat_map(|rule| {
            rule.problems(own_kind_prefix)
                .into_iter()
                .map(move |problem| format!("{problem}: {rule:?}"))
        })
        .collect();
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    const GOOD: Rule = Rule {
        api_groups: &[INFRASTRUCTURE_GROUP],
        resources: &["proxmoxmachines", "proxmoxmachines/status"],
        verbs: &["get", "patch"],
        why: "reconcile",
    };

    #[test]
    fn leader_election_rules_convert_to_policy_rules_and_pass() {
        let rules = policy_rules(LEADER_ELECTION_RULES);
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].api_groups.as_deref(),
            Some(&["coordination.k8s.io".to_owned()][..])
        );
        assert_eq!(rules[0].resources.as_deref(), Some(&["leases".to_owned()][..]));
        assert_eq!(rules[0].verbs, ["get", "create", "update"]);
        assert_eq!(lint(&[LEADER_ELECTION_RULES], Some("proxmox")), Ok(()));
    }

    #[rstest]
    #[case::own_kinds(GOOD, Some("proxmox"))]
    #[case::no_prefix_check(Rule { resources: &["libvirtmachines"], ..GOOD }, None)]
    #[case::secrets_get(Rule { api_groups: &[""], resources: &["secrets"], verbs: &["get"], ..GOOD }, Some("proxmox"))]
    #[case::secrets_watched(Rule { api_groups: &[""], resources: &["secrets"], verbs: SECRET_WATCH_VERBS, ..GOOD }, Some("proxmox"))]
    #[case::secrets_labelled_for_move(Rule { api_groups: &[""], resources: &["secrets"], verbs: SECRET_LABEL_VERBS, why: "the label clusterctl.cluster.x-k8s.io/move on credentials" }, Some("proxmox"))]
    #[case::other_group(Rule { api_groups: &["cluster.x-k8s.io"], resources: &["machines"], ..GOOD }, Some("proxmox"))]
    fn accepts(#[case] rule: Rule, #[case] prefix: Option<&str>) {
        assert_eq!(lint(&[&[rule]], prefix), Ok(()));
    }

    #[rstest]
    #[case::no_reason(Rule { why: " ", ..GOOD }, "no reason")]
    #[case::no_verbs(Rule { verbs: &[], ..GOOD }, "empty")]
    #[case::no_resources(Rule { resources: &[], ..GOOD }, "empty")]
    #[case::wildcard_verb(Rule { verbs: &["*"], ..GOOD }, "wildcard")]
    #[case::wildcard_resource(Rule { api_groups: &["cluster.x-k8s.io"], resources: &["*"], ..GOOD }, "wildcard")]
    #[case::wildcard_group(Rule { api_groups: &["*"], ..GOOD }, "wildcard")]
    #[case::secrets_listed(Rule { api_groups: &[""], resources: &["secrets"], verbs: &["get", "list"], ..GOOD }, "secrets")]
    #[case::secrets_written(Rule { api_groups: &[""], resources: &["secrets"], verbs: &["get", "list", "watch", "update"], ..GOOD }, "secrets")]
    #[case::secrets_patched_for_another_reason(Rule { api_groups: &[""], resources: &["secrets"], verbs: SECRET_LABEL_VERBS, why: "rotate the token" }, "secrets")]
    #[case::foreign_kind(Rule { resources: &["proxmoxmachines", "libvirtmachines"], ..GOOD }, "[\"libvirtmachines\"]")]
    fn rejects(#[case] rule: Rule, #[case] expected: &str) {
        let error = lint(&[LEADER_ELECTION_RULES, &[GOOD, rule]], Some("proxmox")).unwrap_err();
        assert!(error.contains(expected), "{error}");
        // Only the bad rule is reported.
        assert_eq!(error.lines().count(), 1, "{error}");
    }
}
