//! Whether cloud-init has finished in a guest, from the report it leaves when its last stage
//! ends (`/run/cloud-init/result.json`, which the guest's agent reads for the backend), and the
//! `Ready` a provisioned machine shows until then.
//!
//! A machine is provisioned (providerID, addresses, `initialization.provisioned`) as soon as its
//! guest reports an address, so Cluster API goes on; its `Ready` stays False
//! ([`WAITING_FOR_CLOUD_INIT`]) until cloud-init reports, and turns False with
//! [`CLOUD_INIT_FAILED`] when that report lists errors (a bootstrap that failed: `kubeadm`,
//! a `runcmd`). `readinessChecks.skipCloudInit` (or `skipGuestAgent`) skips the wait.

use std::time::{Duration, SystemTime};

use banlieue_api::common::ReadinessChecks;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::Deserialize;

/// Where cloud-init writes its report at the end of its last stage (a link to
/// `/var/lib/cloud/data/result.json`, removed at the start of every boot).
pub const RESULT_FILE: &str = "/run/cloud-init/result.json";

/// `Ready` reason of a provisioned machine whose guest's cloud-init has not reported yet.
pub const WAITING_FOR_CLOUD_INIT: &str = "WaitingForCloudInit";
/// `Ready` reason of a provisioned machine whose guest's cloud-init reported errors.
pub const CLOUD_INIT_FAILED: &str = "CloudInitFailed";

/// The longest error text kept in a condition message.
const MAX_ERRORS_LEN: usize = 600;

/// What the guest's cloud-init says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloudInit {
    /// No report yet: cloud-init still runs (or has not started).
    Running,
    /// It finished without errors.
    Done,
    /// It finished with errors (their text), or left a report that cannot be read.
    Failed(String),
}

#[derive(Deserialize)]
struct ResultFile {
    v1: ResultV1,
}

#[derive(Deserialize)]
struct ResultV1 {
    #[serde(default)]
    errors: Vec<serde_json::Value>,
}

impl CloudInit {
    /// Reads the report (`None`: the file does not exist yet).
    pub fn from_result(content: Option<&str>) -> Self {
        let Some(content) = content else {
            return Self::Running;
        };
        match serde_json::from_str::<ResultFile>(content) {
            Ok(result) if result.v1.errors.is_empty() => Self::Done,
            Ok(result) => {
                // An error as its text (a string's without the quotes).
                let text = |e: &serde_json::Value| e.as_str().map_or_else(|| e.to_string(), str::to_owned);
                let errors: Vec<String> = result.v1.errors.iter().map(text).collect();
                Self::Failed(shorten(&errors.join("; ")))
            }
            Err(e) => Self::Failed(format!("{RESULT_FILE} cannot be read: {e}")),
        }
    }

    /// The `Ready` condition of a provisioned, running machine whose guest is in this state:
    /// `None` when cloud-init is done (the machine is Ready as far as cloud-init goes).
    pub fn not_ready(&self, vm: &str) -> Option<(&'static str, String)> {
        match self {
            Self::Done => None,
            Self::Running => Some((
                WAITING_FOR_CLOUD_INIT,
                format!(
                    "{vm} runs and has its addresses; waiting for cloud-init in the guest to finish ({RESULT_FILE}); set spec.readinessChecks.skipCloudInit for a guest without cloud-init"
                ),
            )),
            Self::Failed(errors) => Some((
                CLOUD_INIT_FAILED,
                format!(
                    "cloud-init in {vm} finished with errors: {errors}; look at /var/log/cloud-init-output.log in the guest"
                ),
            )),
        }
    }
}

/// The reason constant when a machine whose `Ready` reason is `reason` still waits on its
/// guest's cloud-init (waiting, or reported failed: a report that may still change, after a
/// reboot); `None` otherwise.
pub fn pending(reason: &str) -> Option<&'static str> {
    [WAITING_FOR_CLOUD_INIT, CLOUD_INIT_FAILED]
        .into_iter()
        .find(|pending| *pending == reason)
}

/// Whether the spec's readiness checks skip the wait for cloud-init (`skipCloudInit`, or
/// `skipGuestAgent`: no agent to read the report through).
pub fn skipped(checks: Option<&ReadinessChecks>) -> bool {
    checks.is_some_and(|c| c.skip_cloud_init == Some(true)) || ReadinessChecks::skip_guest_agent(checks)
}

/// How long to wait before asking again, `waited` after the wait began: every 2 s at first,
/// then a tenth of the time waited, at most every 30 s.
pub fn poll_interval(waited: Duration) -> Duration {
    (waited / 10).clamp(Duration::from_secs(2), Duration::from_secs(30))
}

/// A machine's wait for its guest's cloud-init as its `Ready` condition records it, and what
/// that wait makes of a reconcile: the `Ready` of a provisioned, running machine and how soon
/// to ask again. One rule for every backend.
#[derive(Clone, Debug, Default)]
pub struct Wait {
    /// The `Ready` condition, when it waits on cloud-init (its reason is one of [`pending`]).
    recorded: Option<(&'static str, Condition)>,
    /// `Ready` said the VM was powered off: once it runs again, its guest boots again, and its
    /// cloud-init is asked again (a machine created off has never been asked).
    powered_off: bool,
}

impl Wait {
    /// The wait recorded in a machine's conditions (none: `Ready` does not wait on cloud-init).
    pub fn recorded(conditions: &[Condition]) -> Self {
        let ready = banlieue_api::condition::find(conditions, banlieue_api::condition::READY);
        let recorded = ready.and_then(|c| Some((pending(&c.reason)?, c.clone())));
        let powered_off = ready.is_some_and(|c| c.reason == banlieue_api::condition::POWERED_OFF);
        Self {
            recorded,
            powered_off,
        }
    }

    /// Whether the guest's cloud-init is to be asked (again): `Ready` waits on it, or the VM was
    /// off (a provisioned machine's step asks the guest once it runs).
    pub fn is_pending(&self) -> bool {
        self.recorded.is_some() || self.powered_off
    }

    /// Why a provisioned, running machine whose guest is `vm` is not Ready as far as cloud-init
    /// goes (`None`: it is). `now` is what the guest said this time; `None` when it was not asked
    /// (a change in flight), and then a recorded wait goes on as it was. A skipped check
    /// ([`skipped`]) never holds the machine back, even one set while the wait went on.
    pub fn not_ready(&self, now: Option<&CloudInit>, skip: bool, vm: &str) -> Option<(&'static str, String)> {
        if skip {
            return None;
        }
        match (now, &self.recorded) {
            (Some(state), _) => state.not_ready(vm),
            (None, Some((reason, condition))) => Some((reason, condition.message.clone())),
            // Running again after a power-off, not asked yet (a change in flight).
            (None, None) if self.powered_off => CloudInit::Running.not_ready(vm),
            (None, None) => None,
        }
    }

    /// When to reconcile again, given the `Ready` reason this reconcile writes and the step's own
    /// `requeue`: while `Ready` waits on cloud-init, soon ([`poll_interval`] since the wait
    /// began); a failed report is asked again as well (a reboot or the user's fix may bring a
    /// new one), at the same pace.
    pub fn requeue(&self, ready_reason: &str, requeue: Duration) -> Duration {
        if pending(ready_reason).is_none() {
            return requeue;
        }
        let waited = self
            .recorded
            .as_ref()
            .and_then(|(_, c)| SystemTime::from(c.last_transition_time.0).elapsed().ok())
            .unwrap_or_default();
        requeue.min(poll_interval(waited))
    }
}

fn shorten(text: &str) -> String {
    if text.len() <= MAX_ERRORS_LEN {
        return text.to_owned();
    }
    let mut end = MAX_ERRORS_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_says_running_done_or_failed_with_its_errors() {
        assert_eq!(CloudInit::from_result(None), CloudInit::Running);
        let done = r#"{"v1": {"datasource": "DataSourceNoCloud [seed=/dev/sr0]", "errors": []}}"#;
        assert_eq!(CloudInit::from_result(Some(done)), CloudInit::Done);
        let failed = r#"{"v1": {"datasource": "DataSourceNoCloud", "errors": ["('scripts_user', RuntimeError('Runparts: 1 failures (part-001) in 1 attempted commands'))"]}}"#;
        let CloudInit::Failed(errors) = CloudInit::from_result(Some(failed)) else {
            panic!("errors listed");
        };
        assert!(errors.contains("scripts_user"), "{errors}");
        assert!(matches!(
            CloudInit::from_result(Some("{not json")),
            CloudInit::Failed(e) if e.contains(RESULT_FILE)
        ));
    }

    #[test]
    fn long_errors_are_cut_on_a_character_boundary() {
        let many = format!(r#"{{"v1": {{"errors": ["{}"]}}}}"#, "é".repeat(2000));
        let CloudInit::Failed(errors) = CloudInit::from_result(Some(&many)) else {
            panic!("errors listed");
        };
        assert!(
            errors.len() <= MAX_ERRORS_LEN + '…'.len_utf8(),
            "{}",
            errors.len()
        );
        assert!(errors.ends_with('…'));
    }

    #[test]
    fn the_ready_condition_names_the_wait_or_the_errors() {
        assert_eq!(CloudInit::Done.not_ready("VM 100"), None);
        let (reason, message) = CloudInit::Running.not_ready("VM 100").expect("waiting");
        assert_eq!(reason, WAITING_FOR_CLOUD_INIT);
        assert!(message.contains("skipCloudInit"), "{message}");
        assert_eq!(pending(reason), Some(reason));
        let (reason, message) = CloudInit::Failed("boom".into())
            .not_ready("VM 100")
            .expect("failed");
        assert_eq!(reason, CLOUD_INIT_FAILED);
        assert!(
            message.contains("boom") && message.contains("VM 100"),
            "{message}"
        );
        assert_eq!(pending(reason), Some(reason));
        assert_eq!(pending("Running"), None);
    }

    #[test]
    fn either_skip_skips_the_wait() {
        let checks = |agent: Option<bool>, cloud_init: Option<bool>| ReadinessChecks {
            skip_guest_agent: agent,
            skip_cloud_init: cloud_init,
        };
        assert!(!skipped(None));
        assert!(!skipped(Some(&checks(None, Some(false)))));
        assert!(skipped(Some(&checks(None, Some(true)))));
        assert!(skipped(Some(&checks(Some(true), None))));
    }

    fn ready(reason: &str, message: &str, since: Duration) -> Condition {
        Condition {
            type_: banlieue_api::condition::READY.to_owned(),
            status: "False".to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::try_from(SystemTime::now() - since).unwrap(),
            ),
            observed_generation: None,
        }
    }

    #[test]
    fn a_recorded_wait_goes_on_until_the_guest_is_asked_and_a_skip_ends_it() {
        let none = Wait::recorded(&[ready("Provisioned", "", Duration::ZERO)]);
        assert!(!none.is_pending());
        assert_eq!(none.not_ready(None, false, "VM 1"), None);
        assert_eq!(
            none.not_ready(Some(&CloudInit::Running), false, "VM 1")
                .map(|r| r.0),
            Some(WAITING_FOR_CLOUD_INIT)
        );

        let waiting = Wait::recorded(&[ready(WAITING_FOR_CLOUD_INIT, "as recorded", Duration::ZERO)]);
        assert!(waiting.is_pending());
        // Not asked this time: the wait goes on as it was, message included.
        assert_eq!(
            waiting.not_ready(None, false, "VM 1"),
            Some((WAITING_FOR_CLOUD_INIT, "as recorded".to_owned()))
        );
        assert_eq!(waiting.not_ready(Some(&CloudInit::Done), false, "VM 1"), None);
        // skipCloudInit set while it waits: Ready at once, whatever was recorded.
        assert_eq!(waiting.not_ready(None, true, "VM 1"), None);
        assert_eq!(waiting.not_ready(Some(&CloudInit::Running), true, "VM 1"), None);
    }

    #[test]
    fn a_vm_that_was_off_is_asked_again_once_it_runs() {
        let off = Wait::recorded(&[ready(banlieue_api::condition::POWERED_OFF, "off", Duration::ZERO)]);
        assert!(off.is_pending(), "its guest boots again");
        assert_eq!(
            off.not_ready(None, false, "VM 1").map(|r| r.0),
            Some(WAITING_FOR_CLOUD_INIT),
            "not asked yet: waiting, never Ready on the strength of an old boot"
        );
        assert_eq!(off.not_ready(Some(&CloudInit::Done), false, "VM 1"), None);
        assert_eq!(off.not_ready(None, true, "VM 1"), None, "skipped");
        // Written while it is still off: the step's own requeue.
        let long = Duration::from_secs(300);
        assert_eq!(off.requeue(banlieue_api::condition::POWERED_OFF, long), long);
    }

    #[test]
    fn the_wait_asks_often_at_first_then_less() {
        let long = Duration::from_secs(300);
        let fresh = Wait::recorded(&[ready(WAITING_FOR_CLOUD_INIT, "", Duration::ZERO)]);
        assert_eq!(
            fresh.requeue(WAITING_FOR_CLOUD_INIT, long),
            Duration::from_secs(2)
        );
        let old = Wait::recorded(&[ready(WAITING_FOR_CLOUD_INIT, "", Duration::from_secs(200))]);
        let later = old.requeue(WAITING_FOR_CLOUD_INIT, long);
        assert!(
            (Duration::from_secs(20)..Duration::from_secs(21)).contains(&later),
            "{later:?}"
        );
        // A failed report is asked again at the same pace.
        assert!(old.requeue(CLOUD_INIT_FAILED, long) < Duration::from_secs(21));
        // Not waiting (done): the step's own requeue.
        assert_eq!(old.requeue("Provisioned", long), long);
        assert_eq!(Wait::default().requeue("Provisioned", long), long);
        // Never later than the step wants.
        assert_eq!(
            fresh.requeue(WAITING_FOR_CLOUD_INIT, Duration::from_secs(1)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn polls_start_fast_and_slow_down() {
        assert_eq!(poll_interval(Duration::ZERO), Duration::from_secs(2));
        assert_eq!(poll_interval(Duration::from_secs(100)), Duration::from_secs(10));
        assert_eq!(poll_interval(Duration::from_secs(3600)), Duration::from_secs(30));
    }
}
