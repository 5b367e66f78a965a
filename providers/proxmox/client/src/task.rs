//! UPIDs and task status interpretation.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

use crate::de;
use crate::error::{Error, Result};

/// A parsed task id: `UPID:{node}:{pid:08X}:{pstart:08X}:{starttime:08X}:{type}:{id}:{user}:`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Upid {
    raw: String,
    /// The node running the task (where its status must be read).
    pub node: String,
    /// Worker process id.
    pub pid: u32,
    /// Worker process start time (clock ticks).
    pub pstart: u64,
    /// Task start time (UNIX seconds).
    pub starttime: u64,
    /// Task type, e.g. `qmclone`, `qmstart`, `imgcopy`.
    pub task_type: String,
    /// Task object id, e.g. the VMID (may be empty).
    pub id: String,
    /// The user (or token) that started the task.
    pub user: String,
}

impl Upid {
    /// The UPID exactly as PVE sent it.
    pub fn as_str(&self) -> &str {
        &self.raw
    }
}

impl fmt::Display for Upid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl FromStr for Upid {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason: &str| Error::parse("UPID", s, reason);
        let body = s
            .strip_prefix("UPID:")
            .ok_or_else(|| bad("does not start with UPID:"))?;
        let body = body
            .strip_suffix(':')
            .ok_or_else(|| bad("does not end with ':'"))?;
        let mut left = body.splitn(6, ':');
        let mut next = |what: &str| left.next().ok_or_else(|| bad(&format!("missing {what}")));
        let node = next("node")?.to_owned();
        let pid = next("pid")?;
        let pstart = next("pstart")?;
        let starttime = next("starttime")?;
        let task_type = next("type")?.to_owned();
        let rest = next("id and user")?;
        let (id, user) = rest.rsplit_once(':').ok_or_else(|| bad("missing user"))?;
        let hex = |field: &str, v: &str| {
            u64::from_str_radix(v, 16).map_err(|_| bad(&format!("{field} is not hex")))
        };
        let pid = u32::try_from(hex("pid", pid)?).map_err(|_| bad("pid out of range"))?;
        if node.is_empty() || task_type.is_empty() || user.is_empty() {
            return Err(bad("empty node, type or user"));
        }
        Ok(Self {
            raw: s.to_owned(),
            node,
            pid,
            pstart: hex("pstart", pstart)?,
            starttime: hex("starttime", starttime)?,
            task_type,
            id: id.to_owned(),
            user: user.to_owned(),
        })
    }
}

/// What a task's `exitstatus` means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskOutcome {
    /// The task has not finished.
    Running,
    /// `OK`.
    Ok,
    /// `WARNINGS: N`: finished, with N warnings in the log.
    Warnings(u32),
    /// Anything else: the error text raised inside the worker.
    Failed(String),
}

impl TaskOutcome {
    /// Interprets an `exitstatus` of a stopped task.
    pub fn from_exitstatus(exitstatus: &str) -> Self {
        let text = exitstatus.trim();
        if text == "OK" {
            return Self::Ok;
        }
        if let Some(n) = text.strip_prefix("WARNINGS:").and_then(|n| n.trim().parse().ok()) {
            return Self::Warnings(n);
        }
        Self::Failed(text.to_owned())
    }

    /// True for `OK` and `WARNINGS: N`.
    pub fn is_success(&self) -> bool {
        matches!(self, Self::Ok | Self::Warnings(_))
    }
}

/// `GET /nodes/{node}/tasks/{upid}/status`.
#[derive(Debug, Clone, Deserialize)]
pub struct TaskStatus {
    /// `running` or `stopped`.
    pub status: String,
    /// `OK`, `WARNINGS: N` or the error text; only when stopped.
    #[serde(default, deserialize_with = "de::opt_string")]
    pub exitstatus: Option<String>,
    /// Task type.
    #[serde(rename = "type", default)]
    pub task_type: String,
    /// Task object id.
    #[serde(default, deserialize_with = "de::opt_string")]
    pub id: Option<String>,
    /// User that started the task.
    #[serde(default)]
    pub user: String,
    /// Node that runs the task.
    #[serde(default)]
    pub node: String,
    /// The task's UPID.
    #[serde(default)]
    pub upid: String,
    /// Start time (UNIX seconds).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub starttime: Option<u64>,
}

impl TaskStatus {
    /// Interprets `status` and `exitstatus`.
    pub fn outcome(&self) -> TaskOutcome {
        if self.status != "stopped" {
            return TaskOutcome::Running;
        }
        match &self.exitstatus {
            Some(text) => TaskOutcome::from_exitstatus(text),
            None => TaskOutcome::Failed("task stopped without an exit status".into()),
        }
    }

    /// `Ok(None)` while running, `Ok(Some(outcome))` on success, [`Error::TaskFailed`] on failure.
    pub fn check(&self, upid: &Upid) -> Result<Option<TaskOutcome>> {
        match self.outcome() {
            TaskOutcome::Running => Ok(None),
            TaskOutcome::Failed(exitstatus) => Err(Error::TaskFailed {
                upid: upid.to_string(),
                exitstatus,
            }),
            done => Ok(Some(done)),
        }
    }
}

/// One line of `GET /nodes/{node}/tasks/{upid}/log`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct TaskLogLine {
    /// Line number (1-based).
    #[serde(deserialize_with = "de::uint")]
    pub n: u64,
    /// Line text.
    #[serde(default)]
    pub t: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[test]
    fn parses_a_upid() {
        let raw = "UPID:pve1:000A1B2C:0012D687:6790F00D:qmclone:9000:root@pam!banlieue:";
        let upid: Upid = raw.parse().unwrap();
        assert_eq!(upid.node, "pve1");
        assert_eq!(upid.pid, 0x000A_1B2C);
        assert_eq!(upid.pstart, 0x0012_D687);
        assert_eq!(upid.starttime, 0x6790_F00D);
        assert_eq!(upid.task_type, "qmclone");
        assert_eq!(upid.id, "9000");
        assert_eq!(upid.user, "root@pam!banlieue");
        assert_eq!(upid.to_string(), raw);
    }

    #[test]
    fn parses_a_upid_with_an_empty_id_or_colons_in_it() {
        let upid: Upid = "UPID:pve2:00000001:00000002:00000003:imgcopy::root@pam:"
            .parse()
            .unwrap();
        assert_eq!(upid.id, "");
        let upid: Upid = "UPID:pve2:00000001:00000002:00000003:imgdel:local:iso/x.iso:root@pam:"
            .parse()
            .unwrap();
        assert_eq!(upid.id, "local:iso/x.iso");
        assert_eq!(upid.user, "root@pam");
    }

    #[rstest]
    #[case("")]
    #[case("UPID:pve1")]
    #[case("UPID:pve1:zz:00000002:00000003:qmstart:100:root@pam:")]
    #[case("UPID:pve1:00000001:00000002:00000003:qmstart:100:root@pam")]
    #[case("NOPE:pve1:00000001:00000002:00000003:qmstart:100:root@pam:")]
    #[case("UPID::00000001:00000002:00000003:qmstart:100:root@pam:")]
    fn rejects_bad_upids(#[case] raw: &str) {
        assert!(raw.parse::<Upid>().is_err(), "{raw:?}");
    }

    #[rstest]
    #[case("OK", TaskOutcome::Ok)]
    #[case("WARNINGS: 3", TaskOutcome::Warnings(3))]
    #[case("WARNINGS:1", TaskOutcome::Warnings(1))]
    #[case("VM 9000 is a template", TaskOutcome::Failed("VM 9000 is a template".into()))]
    #[case("WARNINGS: many", TaskOutcome::Failed("WARNINGS: many".into()))]
    fn interprets_exitstatus(#[case] text: &str, #[case] want: TaskOutcome) {
        assert_eq!(TaskOutcome::from_exitstatus(text), want);
    }

    #[test]
    fn status_check_maps_failures_to_errors() {
        let upid: Upid = "UPID:pve1:00000001:00000002:00000003:qmstart:9000:root@pam:"
            .parse()
            .unwrap();
        let running: TaskStatus =
            serde_json::from_str(r#"{"status":"running","type":"qmstart","pid":"1"}"#).unwrap();
        assert_eq!(running.check(&upid).unwrap(), None);
        let ok: TaskStatus = serde_json::from_str(r#"{"status":"stopped","exitstatus":"OK"}"#).unwrap();
        assert_eq!(ok.check(&upid).unwrap(), Some(TaskOutcome::Ok));
        let failed: TaskStatus =
            serde_json::from_str(r#"{"status":"stopped","exitstatus":"VM 9000 is a template"}"#).unwrap();
        let err = failed.check(&upid).unwrap_err();
        assert!(
            matches!(&err, Error::TaskFailed { exitstatus, .. } if exitstatus == "VM 9000 is a template")
        );
    }
}
