//! High Availability as Proxmox VE 9 has it: HA resources (`/cluster/ha/resources`), the rules
//! they are in (`/cluster/ha/rules`), and the HA manager's side effects the provider sees: a
//! start or stop of an HA resource is an HA request (`hastart`/`hastop` task, the resource's
//! requested state follows), a migration request moves the VM (a `qmigrate` task, online), a
//! destroy needs `purge`, which takes the VM out of HA and its rules. Messages are PVE's
//! (pve-ha-manager `API2/HA/Resources.pm`, `API2/HA/Rules.pm`).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{Action, ApiError, ApiResult, Request, State};

/// An HA resource.
#[derive(Debug, Clone)]
pub(crate) struct HaResource {
    state: String,
    comment: Option<String>,
    max_restart: Option<u64>,
    max_relocate: Option<u64>,
    failback: Option<bool>,
}

/// An HA rule.
#[derive(Debug, Clone)]
pub(crate) struct HaRule {
    kind: String,
    resources: Vec<String>,
    nodes: Option<String>,
    affinity: Option<String>,
    strict: Option<bool>,
    disable: Option<bool>,
    comment: Option<String>,
}

/// The HA configuration: resources by VMID, rules by id, and the digests of both files.
#[derive(Debug, Default)]
pub(crate) struct Ha {
    resources: BTreeMap<u32, HaResource>,
    rules: BTreeMap<String, HaRule>,
    resources_version: u64,
    rules_version: u64,
}

fn digest(file: &str, version: u64) -> String {
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(format!("{file}:{version}").as_bytes());
    hash.iter().take(20).map(|b| format!("{b:02x}")).collect()
}

/// The VMID of a resource id: `vm:100` or the `100` shortcut.
fn vmid_of(sid: &str) -> ApiResult<u32> {
    let id = sid.strip_prefix("vm:").unwrap_or(sid);
    if sid.starts_with("ct:") {
        return Err(ApiError::internal("the simulator has no containers"));
    }
    id.parse()
        .map_err(|_| ApiError::param("sid", format!("unable to parse HA resource id '{sid}'")))
}

fn sid(vmid: u32) -> String {
    format!("vm:{vmid}")
}

impl Ha {
    /// Whether `vmid` is an HA resource.
    pub(crate) fn manages(&self, vmid: u32) -> bool {
        self.resources.contains_key(&vmid)
    }

    /// The requested state of `vmid`'s resource, when it is one.
    pub(crate) fn state_of(&self, vmid: u32) -> Option<&str> {
        self.resources.get(&vmid).map(|r| r.state.as_str())
    }

    /// An HA request to start or stop `vmid` (what `qm start`/`qm stop` of an HA resource do).
    pub(crate) fn request(&mut self, vmid: u32, state: &str) {
        if let Some(r) = self.resources.get_mut(&vmid) {
            r.state = state.to_owned();
            self.resources_version += 1;
        }
    }

    /// Takes `vmid` out of HA and its rules, deleting a rule left without resources (`purge`).
    pub(crate) fn purge(&mut self, vmid: u32) {
        if self.resources.remove(&vmid).is_none() {
            return;
        }
        self.resources_version += 1;
        let gone = sid(vmid);
        let before = self.rules.len();
        let mut touched = false;
        self.rules.retain(|_, rule| {
            let len = rule.resources.len();
            rule.resources.retain(|r| *r != gone);
            touched |= rule.resources.len() != len;
            !rule.resources.is_empty()
        });
        if touched || before != self.rules.len() {
            self.rules_version += 1;
        }
    }

    fn resource_json(&self, vmid: u32, r: &HaResource) -> Value {
        let mut v = json!({
            "sid": sid(vmid),
            "type": "vm",
            "state": r.state,
            "digest": digest("resources.cfg", self.resources_version),
        });
        let m = v.as_object_mut().expect("an object");
        if let Some(c) = &r.comment {
            m.insert("comment".into(), json!(c));
        }
        if let Some(n) = r.max_restart {
            m.insert("max_restart".into(), json!(n));
        }
        if let Some(n) = r.max_relocate {
            m.insert("max_relocate".into(), json!(n));
        }
        if let Some(f) = r.failback {
            m.insert("failback".into(), json!(u8::from(f)));
        }
        v
    }

    fn rule_json(&self, id: &str, r: &HaRule) -> Value {
        let mut v = json!({
            "rule": id,
            "type": r.kind,
            "resources": r.resources.join(","),
            "digest": digest("rules.cfg", self.rules_version),
        });
        let m = v.as_object_mut().expect("an object");
        for (key, value) in [
            ("nodes", r.nodes.as_ref()),
            ("affinity", r.affinity.as_ref()),
            ("comment", r.comment.as_ref()),
        ] {
            if let Some(value) = value {
                m.insert(key.into(), json!(value));
            }
        }
        for (key, value) in [("strict", r.strict), ("disable", r.disable)] {
            if let Some(value) = value {
                m.insert(key.into(), json!(u8::from(value)));
            }
        }
        v
    }
}

/// PVE's answer to a write with a stale digest.
fn modified() -> ApiError {
    ApiError::internal("detected modified configuration - file changed by other user? Try again.\n")
}

impl State {
    pub(crate) fn ha_dispatch(&mut self, req: &Request) -> Option<ApiResult> {
        let result = match (req.method.as_str(), req.template.as_str()) {
            ("GET", "/cluster/ha/resources") => Ok(self.ha_resources_list()),
            ("GET", "/cluster/ha/resources/{sid}") => self.ha_resource_get(req),
            ("POST", "/cluster/ha/resources") => self.ha_resource_create(req),
            ("PUT", "/cluster/ha/resources/{sid}") => self.ha_resource_update(req),
            ("DELETE", "/cluster/ha/resources/{sid}") => self.ha_resource_delete(req),
            ("POST", "/cluster/ha/resources/{sid}/migrate") => self.ha_migrate(req),
            ("GET", "/cluster/ha/rules") => Ok(self.ha_rules_list(req)),
            ("GET", "/cluster/ha/rules/{rule}") => self.ha_rule_get(req),
            ("POST", "/cluster/ha/rules") => self.ha_rule_create(req),
            ("PUT", "/cluster/ha/rules/{rule}") => self.ha_rule_update(req),
            ("DELETE", "/cluster/ha/rules/{rule}") => self.ha_rule_delete(req),
            _ => return None,
        };
        Some(result)
    }

    fn ha_resources_list(&self) -> Value {
        Value::Array(
            self.ha
                .resources
                .iter()
                .map(|(vmid, r)| self.ha.resource_json(*vmid, r))
                .collect(),
        )
    }

    fn ha_resource_of(&self, req: &Request) -> ApiResult<u32> {
        let sid = req.req("sid")?;
        let vmid = vmid_of(&sid)?;
        if !self.ha.manages(vmid) {
            return Err(ApiError::internal(format!("no such resource '{sid}'\n")));
        }
        Ok(vmid)
    }

    fn ha_resource_get(&self, req: &Request) -> ApiResult {
        let vmid = self.ha_resource_of(req)?;
        Ok(self.ha.resource_json(vmid, &self.ha.resources[&vmid]))
    }

    fn ha_resource_create(&mut self, req: &Request) -> ApiResult {
        let sid_text = req.req("sid")?;
        let vmid = vmid_of(&sid_text)?;
        if !self.vms.contains_key(&vmid) {
            return Err(ApiError::internal(format!(
                "unable to find configuration file for VM {vmid} - no such machine\n"
            )));
        }
        if self.ha.manages(vmid) {
            return Err(ApiError::internal(format!(
                "resource ID '{}' already defined\n",
                sid(vmid)
            )));
        }
        let state = match req.opt("state").as_deref() {
            None | Some("enabled") => "started".to_owned(),
            Some(s) => s.to_owned(),
        };
        let resource = HaResource {
            state,
            comment: req.opt("comment"),
            max_restart: req.opt("max_restart").and_then(|v| v.parse().ok()),
            max_relocate: req.opt("max_relocate").and_then(|v| v.parse().ok()),
            failback: req.flag("failback"),
        };
        // The HA manager acts on the requested state: a started resource runs.
        self.ha_apply_state(req, vmid, &resource.state);
        self.ha.resources.insert(vmid, resource);
        self.ha.resources_version += 1;
        Ok(Value::Null)
    }

    fn ha_resource_update(&mut self, req: &Request) -> ApiResult {
        let vmid = self.ha_resource_of(req)?;
        if let Some(d) = req.opt("digest")
            && d != digest("resources.cfg", self.ha.resources_version)
        {
            return Err(modified());
        }
        let state = req
            .opt("state")
            .map(|s| if s == "enabled" { "started".to_owned() } else { s });
        let r = self.ha.resources.get_mut(&vmid).expect("checked above");
        if let Some(s) = &state {
            r.state = s.clone();
        }
        if let Some(c) = req.opt("comment") {
            r.comment = Some(c);
        }
        if let Some(n) = req.opt("max_restart").and_then(|v| v.parse().ok()) {
            r.max_restart = Some(n);
        }
        if let Some(n) = req.opt("max_relocate").and_then(|v| v.parse().ok()) {
            r.max_relocate = Some(n);
        }
        if let Some(f) = req.flag("failback") {
            r.failback = Some(f);
        }
        for key in req.opt("delete").iter().flat_map(|d| {
            crate::schema::split_list(d)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        }) {
            match key.as_str() {
                "comment" => r.comment = None,
                "max_restart" => r.max_restart = None,
                "max_relocate" => r.max_relocate = None,
                "failback" => r.failback = None,
                _ => {}
            }
        }
        self.ha.resources_version += 1;
        if let Some(s) = state {
            self.ha_apply_state(req, vmid, &s);
        }
        Ok(Value::Null)
    }

    fn ha_resource_delete(&mut self, req: &Request) -> ApiResult {
        let vmid = self.ha_resource_of(req)?;
        if req.flag("purge") == Some(false) {
            self.ha.resources.remove(&vmid);
            self.ha.resources_version += 1;
        } else {
            self.ha.purge(vmid);
        }
        Ok(Value::Null)
    }

    /// The HA manager moves the VM: a `qmigrate` task from its node, online when it runs.
    fn ha_migrate(&mut self, req: &Request) -> ApiResult {
        let vmid = self.ha_resource_of(req)?;
        let target = req.req("node")?;
        if !self.cfg.nodes.contains(&target) {
            return Err(ApiError::internal(format!("no such cluster node '{target}'\n")));
        }
        let from = self.vms[&vmid].node.clone();
        if from != target {
            self.check_unlocked(vmid)?;
            if let Some(vm) = self.vms.get_mut(&vmid) {
                vm.config.insert("lock".into(), "migrate".into());
            }
            let log = vec![format!("starting migration of VM {vmid} to node '{target}' (HA)")];
            self.new_task(
                req,
                &from,
                "qmigrate",
                &vmid.to_string(),
                Some(Action::Migrate {
                    vmid,
                    target: target.clone(),
                }),
                log,
            );
        }
        Ok(json!({"sid": sid(vmid), "requested-node": target}))
    }

    /// Starts or stops `vmid` as the HA manager would for a requested state.
    fn ha_apply_state(&mut self, req: &Request, vmid: u32, state: &str) {
        let Some(vm) = self.vms.get(&vmid) else {
            return;
        };
        let node = vm.node.clone();
        let action = match (state, vm.running) {
            ("started", false) => Action::Start { vmid },
            ("stopped", true) => Action::Stop { vmid },
            _ => return,
        };
        let kind = if matches!(action, Action::Start { .. }) {
            "qmstart"
        } else {
            "qmstop"
        };
        self.new_task(req, &node, kind, &vmid.to_string(), Some(action), vec![]);
    }

    fn ha_rules_list(&self, req: &Request) -> Value {
        let resource = req.opt("resource").map(|r| vmid_of(&r).map(sid).unwrap_or(r));
        let kind = req.opt("type");
        Value::Array(
            self.ha
                .rules
                .iter()
                .filter(|(_, r)| kind.as_ref().is_none_or(|k| *k == r.kind))
                .filter(|(_, r)| resource.as_ref().is_none_or(|s| r.resources.contains(s)))
                .map(|(id, r)| self.ha.rule_json(id, r))
                .collect(),
        )
    }

    fn ha_rule_of(&self, req: &Request) -> ApiResult<String> {
        let id = req.req("rule")?;
        if !self.ha.rules.contains_key(&id) {
            return Err(ApiError::internal(format!("no such ha rule '{id}'\n")));
        }
        Ok(id)
    }

    fn ha_rule_get(&self, req: &Request) -> ApiResult {
        let id = self.ha_rule_of(req)?;
        Ok(self.ha.rule_json(&id, &self.ha.rules[&id]))
    }

    /// The resources of a rule request, each normalised to `vm:<vmid>` and required to be an
    /// HA resource.
    fn ha_rule_resources(&self, text: &str) -> ApiResult<Vec<String>> {
        let mut out = Vec::new();
        for sid_text in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let vmid = vmid_of(sid_text)?;
            if !self.ha.manages(vmid) {
                return Err(ApiError::param(
                    "resources",
                    format!("HA resource '{}' is not configured", sid(vmid)),
                ));
            }
            if !out.contains(&sid(vmid)) {
                out.push(sid(vmid));
            }
        }
        if out.is_empty() {
            return Err(ApiError::param(
                "resources",
                "property is missing and it is not optional",
            ));
        }
        Ok(out)
    }

    fn ha_rule_create(&mut self, req: &Request) -> ApiResult {
        let id = req.req("rule")?;
        if self.ha.rules.contains_key(&id) {
            return Err(ApiError::internal(format!("ha rule '{id}' already defined\n")));
        }
        let kind = req.req("type")?;
        if kind == "node-affinity" && req.opt("nodes").is_none() {
            return Err(ApiError::param(
                "nodes",
                "property is missing and it is not optional",
            ));
        }
        let rule = HaRule {
            resources: self.ha_rule_resources(&req.req("resources")?)?,
            kind,
            nodes: req.opt("nodes"),
            affinity: req.opt("affinity"),
            strict: req.flag("strict"),
            disable: req.flag("disable"),
            comment: req.opt("comment"),
        };
        self.ha.rules.insert(id, rule);
        self.ha.rules_version += 1;
        Ok(Value::Null)
    }

    fn ha_rule_update(&mut self, req: &Request) -> ApiResult {
        let id = self.ha_rule_of(req)?;
        if let Some(d) = req.opt("digest")
            && d != digest("rules.cfg", self.ha.rules_version)
        {
            return Err(modified());
        }
        let kind = req.req("type")?;
        if kind != self.ha.rules[&id].kind {
            return Err(ApiError::param("type", "rule type cannot be changed"));
        }
        let resources = req
            .opt("resources")
            .map(|r| self.ha_rule_resources(&r))
            .transpose()?;
        let rule = self.ha.rules.get_mut(&id).expect("checked above");
        if let Some(resources) = resources {
            rule.resources = resources;
        }
        for (slot, key) in [
            (&mut rule.nodes, "nodes"),
            (&mut rule.affinity, "affinity"),
            (&mut rule.comment, "comment"),
        ] {
            if let Some(v) = req.opt(key) {
                *slot = Some(v);
            }
        }
        if let Some(v) = req.flag("strict") {
            rule.strict = Some(v);
        }
        if let Some(v) = req.flag("disable") {
            rule.disable = Some(v);
        }
        self.ha.rules_version += 1;
        Ok(Value::Null)
    }

    fn ha_rule_delete(&mut self, req: &Request) -> ApiResult {
        let id = self.ha_rule_of(req)?;
        self.ha.rules.remove(&id);
        self.ha.rules_version += 1;
        Ok(Value::Null)
    }
}
