//! Privileges as Proxmox VE checks them, for a simulator that refuses what a real cluster would.
//!
//! An [`Acl`] is built from the `pveum` commands an administrator runs (`pveum role add NAME
//! --privs "…"`, `pveum acl modify PATH --users/--tokens … --roles …`), so a test can apply the
//! very commands the docs print. A grant on a path holds there and below it (PVE's default
//! `propagate 1`; `--propagate 0` keeps it to the path), and a VM in a pool gets what is granted
//! on `/pool/<pool>`. Privileges of every entry that applies are added up (PVE lets the most
//! specific entry win; the docs never grant less below more, so both read the same).
//!
//! [`check`] evaluates the `permissions.check` expressions of the API schema (`perm` with
//! `any` and `require_param`, `and`, `or`); a refusal reads as PVE's `403 Permission check failed
//! (<path>, <privilege>)`. Checks the schema only describes in words (clone's storage and bridge
//! access, per-option config privileges, listings that leave out what the token may not see) are
//! made by the handlers with [`Acl::allows`].

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// The HTML comment before the `pveum` block of the Proxmox provider's README that documents
/// the least privileges (read by its tests).
pub const LEAST_PRIVILEGE_MARKER: &str = "<!-- pve-least-privilege";

/// Privileges granted per path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acl {
    roles: BTreeMap<String, BTreeSet<String>>,
    entries: Vec<Entry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    path: String,
    roles: Vec<String>,
    propagate: bool,
}

/// A refused permission check: the path and the privilege(s) missing there (`A|B`: any would do).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denied {
    /// The ACL path checked.
    pub path: String,
    /// What was missing.
    pub privileges: String,
}

impl Denied {
    /// PVE's message: `Permission check failed (/vms/100, VM.Audit)`.
    pub fn message(&self) -> String {
        format!("Permission check failed ({}, {})", self.path, self.privileges)
    }
}

fn normalize(path: &str) -> String {
    let trimmed = path.trim().trim_end_matches('/');
    if trimmed.is_empty() {
        "/".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// The value of `--flag` in `words`, if present.
fn option<'a>(words: &'a [String], flag: &str) -> Option<&'a str> {
    words
        .iter()
        .position(|w| w == flag)
        .and_then(|i| words.get(i + 1))
        .map(String::as_str)
}

/// Splits a shell line into words, honouring single and double quotes.
fn shell_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err(format!("unterminated quote in {line:?}"));
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

impl Acl {
    /// Defines role `name` with `privileges`.
    pub fn role(mut self, name: &str, privileges: &[&str]) -> Self {
        self.roles.insert(
            name.to_owned(),
            privileges.iter().map(|p| (*p).to_owned()).collect(),
        );
        self
    }

    /// Grants `roles` on `path` (and below it).
    pub fn grant(mut self, path: &str, roles: &[&str]) -> Self {
        self.entries.push(Entry {
            path: normalize(path),
            roles: roles.iter().map(|r| (*r).to_owned()).collect(),
            propagate: true,
        });
        self
    }

    /// The ACL the `pveum role add` and `pveum acl modify` lines of `script` set up, for the
    /// user `user` and its token `token_id` (`user!name`); other lines (comments, `pveum user
    /// token add`, other commands) are skipped. Entries for other users or tokens are left out.
    pub fn from_pveum(script: &str, token_id: &str) -> Result<Self, String> {
        let user = token_id.split_once('!').map_or(token_id, |(u, _)| u);
        let mut acl = Self::default();
        for line in script.lines() {
            let line = line.split_once(" #").map_or(line, |(code, _)| code).trim();
            if !line.starts_with("pveum ") {
                continue;
            }
            let words = shell_words(line)?;
            match words.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
                ["pveum", "role", "add", name, ..] => {
                    let privs = option(&words, "--privs")
                        .or_else(|| option(&words, "-privs"))
                        .ok_or_else(|| format!("{line:?}: no --privs"))?;
                    let privileges = privs
                        .split([',', ' ', ';'])
                        .filter(|p| !p.is_empty())
                        .map(str::to_owned)
                        .collect();
                    acl.roles.insert((*name).to_owned(), privileges);
                }
                ["pveum", "acl", "modify", path, ..] => {
                    let roles = option(&words, "--roles").ok_or_else(|| format!("{line:?}: no --roles"))?;
                    let principals: Vec<&str> = ["--users", "--tokens"]
                        .into_iter()
                        .filter_map(|f| option(&words, f))
                        .flat_map(|list| list.split(','))
                        .collect();
                    if !principals.iter().any(|p| *p == user || *p == token_id) {
                        continue;
                    }
                    for role in roles.split(',') {
                        if !acl.roles.contains_key(role) {
                            return Err(format!(
                                "{line:?}: role {role} is not defined by a `pveum role add` line"
                            ));
                        }
                    }
                    acl.entries.push(Entry {
                        path: normalize(path),
                        roles: roles.split(',').map(str::to_owned).collect(),
                        propagate: option(&words, "--propagate") != Some("0"),
                    });
                }
                _ => {}
            }
        }
        Ok(acl)
    }

    /// [`Acl::from_pveum`] of the first fenced `sh` block after the line holding `marker` in a
    /// Markdown document (docs that tests hold to what they print).
    pub fn from_markdown(markdown: &str, marker: &str, token_id: &str) -> Result<Self, String> {
        let block = markdown
            .split_once(marker)
            .and_then(|(_, rest)| rest.split_once("```sh\n"))
            .and_then(|(_, rest)| rest.split_once("```"))
            .map(|(block, _)| block)
            .ok_or_else(|| format!("no ```sh block after {marker:?}"))?;
        Self::from_pveum(block, token_id)
    }

    /// Every `(role, privilege)` the ACL defines, in order.
    pub fn role_privileges(&self) -> Vec<(String, String)> {
        self.roles
            .iter()
            .flat_map(|(role, privs)| privs.iter().map(move |p| (role.clone(), p.clone())))
            .collect()
    }

    /// The same ACL with `privilege` taken out of `role`.
    pub fn without(&self, role: &str, privilege: &str) -> Self {
        let mut acl = self.clone();
        if let Some(privs) = acl.roles.get_mut(role) {
            privs.remove(privilege);
        }
        acl
    }

    /// Every privilege granted on `path`, by entries on it or (propagating) above it, and for a
    /// `/vms/<vmid>` path in `pool`, on `/pool/<pool>` too.
    pub fn privileges(&self, path: &str, pool: Option<&str>) -> BTreeSet<String> {
        let path = normalize(path);
        let pool_path = pool.map(|p| format!("/pool/{p}"));
        let applies = |e: &Entry, target: &str| {
            e.path == target
                || (e.propagate && (e.path == "/" || target.starts_with(&format!("{}/", e.path))))
        };
        self.entries
            .iter()
            .filter(|e| applies(e, &path) || pool_path.as_deref().is_some_and(|p| applies(e, p)))
            .flat_map(|e| e.roles.iter())
            .filter_map(|r| self.roles.get(r))
            .flatten()
            .cloned()
            .collect()
    }

    /// Whether `privilege` is granted on `path` (see [`Acl::privileges`]).
    pub fn allows(&self, path: &str, privilege: &str, pool: Option<&str>) -> bool {
        self.privileges(path, pool).contains(privilege)
    }

    /// Ok when every one of `privileges` (`any`: one of them) is granted on `path`.
    pub fn require(
        &self,
        path: &str,
        privileges: &[&str],
        any: bool,
        pool: Option<&str>,
    ) -> Result<(), Denied> {
        let granted = self.privileges(path, pool);
        if any {
            if privileges.iter().any(|p| granted.contains(*p)) {
                return Ok(());
            }
            return Err(Denied {
                path: normalize(path),
                privileges: privileges.join("|"),
            });
        }
        match privileges.iter().find(|p| !granted.contains(**p)) {
            None => Ok(()),
            Some(missing) => Err(Denied {
                path: normalize(path),
                privileges: (*missing).to_owned(),
            }),
        }
    }
}

/// Substitutes `{param}` in a schema path with the request's parameter; `None` when one is
/// missing.
fn substitute(template: &str, params: &BTreeMap<String, Value>) -> Option<String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}')? + start;
        let name = &rest[start + 1..end];
        let value = match params.get(name)? {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        out.push_str(&value);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// Evaluates a method's `permissions` object of the schema for a request with `params`.
/// `pool_of` gives the pool of the VM a `/vms/<vmid>` path names. `{"user": "all"}` passes
/// (the handler checks what the description says); a method without permissions is root's.
pub fn check(
    acl: &Acl,
    permissions: Option<&Value>,
    params: &BTreeMap<String, Value>,
    pool_of: &dyn Fn(&str) -> Option<String>,
) -> Result<(), Denied> {
    let Some(permissions) = permissions.filter(|p| !p.is_null()) else {
        return Err(Denied {
            path: "/".into(),
            privileges: "root@pam only".into(),
        });
    };
    match permissions.get("check") {
        Some(expr) => eval(acl, expr, params, pool_of),
        None if permissions.get("user").and_then(Value::as_str) == Some("all") => Ok(()),
        None => Err(Denied {
            path: "/".into(),
            privileges: "root@pam only".into(),
        }),
    }
}

fn eval(
    acl: &Acl,
    expr: &Value,
    params: &BTreeMap<String, Value>,
    pool_of: &dyn Fn(&str) -> Option<String>,
) -> Result<(), Denied> {
    let unsupported = || Denied {
        path: "/".into(),
        privileges: format!("unsupported check {expr}"),
    };
    let items = expr.as_array().ok_or_else(unsupported)?;
    match items.first().and_then(Value::as_str) {
        Some("and") => items[1..].iter().try_for_each(|e| eval(acl, e, params, pool_of)),
        Some("or") => {
            let mut first = None;
            for e in &items[1..] {
                match eval(acl, e, params, pool_of) {
                    Ok(()) => return Ok(()),
                    Err(d) => {
                        first.get_or_insert(d);
                    }
                }
            }
            Err(first.unwrap_or_else(unsupported))
        }
        Some("perm") => {
            let template = items.get(1).and_then(Value::as_str).ok_or_else(unsupported)?;
            let privileges: Vec<&str> = items
                .get(2)
                .and_then(Value::as_array)
                .ok_or_else(unsupported)?
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let options: Vec<&Value> = items.iter().skip(3).collect();
            let flag = |name: &str| {
                options
                    .iter()
                    .position(|o| o.as_str() == Some(name))
                    .and_then(|i| options.get(i + 1))
                    .copied()
            };
            if let Some(required) = flag("require_param").and_then(Value::as_str)
                && !params.contains_key(required)
            {
                return Err(Denied {
                    path: template.to_owned(),
                    privileges: format!("{} (needs parameter {required})", privileges.join("|")),
                });
            }
            let any = flag("any").is_some_and(|v| v.as_i64() == Some(1) || v.as_bool() == Some(true));
            let path = substitute(template, params).ok_or_else(unsupported)?;
            let pool = path.strip_prefix("/vms/").and_then(pool_of);
            acl.require(&path, &privileges, any, pool.as_deref())
        }
        _ => Err(unsupported()),
    }
}

/// The privilege PVE requires on `/vms/<vmid>` to set or delete config option `key`
/// (`check_vm_modify_config_perm`), with `cdrom` telling a CD-ROM drive from a disk.
pub fn config_privilege(key: &str, cdrom: bool) -> &'static str {
    let numbered = |prefix: &str| {
        key.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    if ["ide", "sata", "scsi", "virtio", "efidisk", "tpmstate", "unused"]
        .into_iter()
        .any(numbered)
    {
        return if cdrom {
            "VM.Config.CDROM"
        } else {
            "VM.Config.Disk"
        };
    }
    if numbered("net") {
        return "VM.Config.Network";
    }
    if numbered("ipconfig") {
        return "VM.Config.Cloudinit";
    }
    if numbered("numa") {
        return "VM.Config.CPU";
    }
    if numbered("hostpci") || numbered("usb") {
        return "VM.Config.HWType";
    }
    match key {
        "cores" | "sockets" | "vcpus" | "cpu" | "cpulimit" | "cpuunits" | "affinity" | "numa" => {
            "VM.Config.CPU"
        }
        "memory" | "balloon" | "shares" => "VM.Config.Memory",
        "cicustom" | "cipassword" | "citype" | "ciuser" | "ciupgrade" | "nameserver" | "searchdomain"
        | "sshkeys" => "VM.Config.Cloudinit",
        "acpi" | "hotplug" | "kvm" | "machine" | "scsihw" | "smbios1" | "tablet" | "vga" | "watchdog"
        | "audio0" | "bios" | "vmgenid" | "rng0" | "keyboard" | "localtime" | "ostype" | "freeze" => {
            "VM.Config.HWType"
        }
        _ => "VM.Config.Options",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SCRIPT: &str = r#"
# the provider's role
pveum role add Provider --privs "VM.Audit VM.PowerMgmt,VM.Clone"
pveum role add Seeds --privs "Datastore.AllocateTemplate"
pveum user token add capi@pve banlieue --privsep 0
pveum acl modify /vms --users capi@pve --roles Provider
pveum acl modify /storage/local --tokens 'capi@pve!banlieue' --roles Seeds --propagate 0
pveum acl modify / --users someone@pve --roles Provider
"#;

    fn acl() -> Acl {
        Acl::from_pveum(SCRIPT, "capi@pve!banlieue").unwrap()
    }

    #[test]
    fn the_pveum_lines_grant_on_a_path_and_below_for_the_user_and_its_token() {
        let acl = acl();
        assert!(acl.allows("/vms/100", "VM.Clone", None));
        assert!(acl.allows("/vms", "VM.Audit", None));
        assert!(!acl.allows("/vms/100", "VM.Allocate", None));
        assert!(acl.allows("/storage/local", "Datastore.AllocateTemplate", None));
        assert!(
            !acl.allows("/storage/local/x", "Datastore.AllocateTemplate", None),
            "propagate 0"
        );
        assert!(
            !acl.allows("/nodes/pve1", "VM.Audit", None),
            "someone else's grant"
        );
        let pooled = Acl::default()
            .role("R", &["VM.Allocate"])
            .grant("/pool/k8s", &["R"]);
        assert!(pooled.allows("/vms/105", "VM.Allocate", Some("k8s")));
        assert!(!pooled.allows("/vms/105", "VM.Allocate", None));
        assert!(Acl::from_pveum("pveum acl modify / --users capi@pve --roles Nope", "capi@pve!t").is_err());
    }

    #[test]
    fn schema_checks_are_evaluated_as_pve_does() {
        let acl = acl();
        let params = |pairs: &[(&str, &str)]| -> BTreeMap<String, Value> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect()
        };
        let no_pool = |_: &str| None;
        let clone = json!({"check": ["and", ["perm", "/vms/{vmid}", ["VM.Clone"]],
            ["or", ["perm", "/vms/{newid}", ["VM.Allocate"]], ["perm", "/pool/{pool}", ["VM.Allocate"], "require_param", "pool"]]]});
        let denied = check(
            &acl,
            Some(&clone),
            &params(&[("vmid", "9000"), ("newid", "101")]),
            &no_pool,
        )
        .unwrap_err();
        assert_eq!(
            denied.message(),
            "Permission check failed (/vms/101, VM.Allocate)"
        );
        let any = json!({"check": ["perm", "/vms/{vmid}", ["VM.Config.Disk", "VM.PowerMgmt"], "any", 1]});
        assert!(check(&acl, Some(&any), &params(&[("vmid", "7")]), &no_pool).is_ok());
        let all = json!({"check": ["perm", "/vms/{vmid}", ["VM.Allocate"]]});
        assert!(check(&acl, Some(&all), &params(&[("vmid", "7")]), &no_pool).is_err());
        assert!(check(&acl, Some(&json!({"user": "all"})), &params(&[]), &no_pool).is_ok());
        assert!(
            check(&acl, None, &params(&[]), &no_pool).is_err(),
            "no permissions: root only"
        );
    }

    #[test]
    fn config_options_need_the_privilege_of_their_kind() {
        assert_eq!(config_privilege("cores", false), "VM.Config.CPU");
        assert_eq!(config_privilege("memory", false), "VM.Config.Memory");
        assert_eq!(config_privilege("net0", false), "VM.Config.Network");
        assert_eq!(config_privilege("ipconfig1", false), "VM.Config.Cloudinit");
        assert_eq!(config_privilege("ide2", true), "VM.Config.CDROM");
        assert_eq!(config_privilege("scsi0", false), "VM.Config.Disk");
        assert_eq!(config_privilege("tags", false), "VM.Config.Options");
        assert_eq!(config_privilege("smbios1", false), "VM.Config.HWType");
    }
}
