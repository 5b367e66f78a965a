//! What one provisioning step of a backend decided ([`Progress`]), and the one rule that turns
//! it into the kit's [`Step`]: `Ready`, the day-2 condition, the Warning, the requeue, the
//! backoff. Every backend's steps speak this type, so the rule is written once.

use std::time::Duration;

use banlieue_api::common::{PowerState, ProvisioningState, ProvisioningStatus};
use banlieue_api::condition;

use crate::cloud_init::{CloudInit, Wait};
use crate::image::{IMPORT_POLL, IMPORTING_IMAGE};
use crate::machine::{Provisioned, Report, Step, follows_at_once};

/// A hypervisor task that failed; the step's phase is the one that tries again. Said in `Ready`
/// (in the day-2 condition once provisioned) with a Warning Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedTask {
    /// The condition reason.
    pub reason: &'static str,
    /// What failed in the hypervisor's words, and what happens next.
    pub message: String,
    /// The failure passes by itself (the hypervisor was busy): tried again after the object's
    /// backoff ([`Step::backoff`]) rather than the step's requeue.
    pub busy: bool,
}

/// What a provisioning step decided: the backend's phase to persist (`P`), what the step waits
/// for or found, and the backend's own findings (`X`).
#[derive(Clone, Debug, PartialEq)]
pub struct Progress<P, X = ()> {
    /// The phase to persist.
    pub phase: P,
    /// When to look again.
    pub requeue: Duration,
    /// What the step waits for (the `Ready` message while provisioning).
    pub waiting: Option<String>,
    /// The `Ready` reason while waiting, when the phase's own does not say it.
    pub waiting_reason: Option<&'static str>,
    /// Normal Events: (reason, note), in order.
    pub events: Vec<(&'static str, String)>,
    /// A task of the previous step failed.
    pub failed: Option<FailedTask>,
    /// The day-2 condition of a provisioned VM, when this step knows it (a
    /// [`condition::RESTART_REQUIRED`] one is a Warning).
    pub up_to_date: Option<Report>,
    /// A problem besides the progress (a Warning Event when it appears).
    pub warning: bool,
    /// What the guest's cloud-init says, when this step asked.
    pub cloud_init: Option<CloudInit>,
    /// Set on the step that finishes provisioning.
    pub provisioned: Option<Provisioned>,
    /// `spec.providerID`, once this step knows it.
    pub provider_id: Option<String>,
    /// The VM's power state, when this step observed it.
    pub power: Option<PowerState>,
    /// What else the step found, for the backend's own status fields.
    pub found: X,
}

impl<P, X: Default> Progress<P, X> {
    /// Going on to `phase` at once.
    pub fn to(phase: P) -> Self {
        Self {
            phase,
            requeue: Duration::ZERO,
            waiting: None,
            waiting_reason: None,
            events: Vec::new(),
            failed: None,
            up_to_date: None,
            warning: false,
            cloud_init: None,
            provisioned: None,
            provider_id: None,
            power: None,
            found: X::default(),
        }
    }

    /// At `phase`, waiting `requeue` for what `why` says.
    pub fn wait(phase: P, requeue: Duration, why: impl Into<String>) -> Self {
        Self {
            requeue,
            waiting: Some(why.into()),
            ..Self::to(phase)
        }
    }
}

/// The `status.provisioning` of a phase at `state` with the hypervisor task `task_id` in flight:
/// the task's start time is kept only while the same task is recorded; no message.
pub fn provisioning(
    previous: Option<ProvisioningStatus>,
    state: ProvisioningState,
    task_id: Option<String>,
) -> ProvisioningStatus {
    let task_started_at = previous
        .filter(|p| task_id.is_some() && p.task_id == task_id)
        .and_then(|p| p.task_started_at);
    ProvisioningStatus {
        state,
        task_id,
        task_started_at,
        message: None,
    }
}

/// How a provisioned VM's `Ready` is decided ([`Guest::ready`]).
#[derive(Clone, Copy, Debug)]
pub struct Guest<'a> {
    /// The VM as messages name it (`VM 104`, `domain default-web`).
    pub name: &'a str,
    /// Its power state as last observed.
    pub observed: Option<PowerState>,
    /// The spec's power state.
    pub desired: Option<PowerState>,
    /// The guest's cloud-init is not waited for.
    pub skip_cloud_init: bool,
}

impl Guest<'_> {
    /// `Ready` of this provisioned VM, one rule for every hypervisor: False
    /// [`condition::POWERED_OFF`] while it is observed off (not known: counted as on; `desired`
    /// says whether the provider starts it), else False while the guest's cloud-init has not
    /// finished ([`Wait::not_ready`]: `now` is its report when this step asked), else True
    /// [`condition::PROVISIONED`].
    pub fn ready(&self, wait: &Wait, now: Option<&CloudInit>) -> Report {
        if self.observed == Some(PowerState::Off) {
            let message = condition::powered_off_message(self.name, self.desired);
            return Report::new(false, condition::POWERED_OFF, message);
        }
        match wait.not_ready(now, self.skip_cloud_init, self.name) {
            Some((reason, message)) => Report::new(false, reason, message),
            None => Report::new(true, condition::PROVISIONED, ""),
        }
    }
}

impl<P, X> Progress<P, X> {
    /// Waiting for the image import `how_far` describes ([`IMPORTING_IMAGE`], looked at again
    /// after [`IMPORT_POLL`]).
    pub fn importing(self, how_far: String) -> Self {
        Self {
            requeue: IMPORT_POLL,
            waiting: Some(how_far),
            waiting_reason: Some(IMPORTING_IMAGE),
            ..self
        }
    }

    /// With a Normal Event.
    pub fn event(mut self, reason: &'static str, message: impl Into<String>) -> Self {
        self.events.push((reason, message.into()));
        self
    }

    /// A provisioned VM's day-2 report when the step said none: up to date, or updating with what
    /// the step waits for ([`Report::up_to_date`]). For a backend whose every provisioned step
    /// compares the VM with its spec.
    pub fn up_to_date_unless_said(&mut self) {
        if self.up_to_date.is_none() {
            self.up_to_date = Some(Report::up_to_date(self.waiting.clone()));
        }
    }

    /// Whether the next step may follow at once ([`Step::next_now`]): this one did not fail,
    /// and [`follows_at_once`] (it does not wait, or it has just started a task).
    pub fn follows_at_once(&self, task_before: bool, task_after: bool) -> bool {
        self.failed.is_none() && follows_at_once(self.requeue, task_before, task_after)
    }

    /// The kit's step, by one rule for every backend. `guest`: the VM is provisioned (`Ready`
    /// is [`Guest::ready`], a failed task goes to the day-2 condition); else `Ready`
    /// says the failed task, or waits with the step's reason (`phase_reason` unless the step
    /// says one). A failed task, a change waiting for a restart or a problem the backend flags
    /// is a Warning; a busy hypervisor backs off; a wait on cloud-init polls at its pace.
    pub fn into_step(
        self,
        guest: Option<Guest<'_>>,
        phase_reason: &'static str,
        wait: &Wait,
        next_now: bool,
    ) -> Step {
        let failed = self
            .failed
            .as_ref()
            .map(|f| Report::new(false, f.reason, f.message.clone()));
        let ready = match (&guest, &failed) {
            (Some(g), _) => g.ready(wait, self.cloud_init.as_ref()),
            (None, Some(failed)) => failed.clone(),
            (None, None) => Report::new(
                false,
                self.waiting_reason.unwrap_or(phase_reason),
                self.waiting.unwrap_or_default(),
            ),
        };
        let up_to_date = match failed {
            Some(failed) if guest.is_some() => Some(failed),
            _ => self.up_to_date,
        };
        let restart_required = up_to_date
            .as_ref()
            .is_some_and(|u| u.reason == condition::RESTART_REQUIRED);
        Step {
            requeue: wait.requeue(ready.reason, self.requeue),
            provisioned: self.provisioned,
            provider_id: self.provider_id,
            ready,
            up_to_date,
            events: self.events,
            warning: self.failed.is_some() || self.warning || restart_required,
            backoff: self.failed.is_some_and(|f| f.busy),
            next_now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provisioned_vm_is_ready_only_while_it_runs_and_its_cloud_init_is_done() {
        use crate::cloud_init::{CloudInit, Wait};
        use PowerState::{Off, On};
        let wait = Wait::recorded(&[]);
        let guest = |observed, desired, skip_cloud_init| Guest {
            name: "VM 7",
            observed,
            desired,
            skip_cloud_init,
        };
        let ready =
            |observed, desired, now: Option<&CloudInit>| guest(observed, desired, false).ready(&wait, now);
        assert_eq!(
            ready(Some(On), Some(On), Some(&CloudInit::Done)),
            Report::new(true, condition::PROVISIONED, "")
        );
        assert!(
            ready(None, Some(On), None).ok,
            "a power state not observed yet counts as on"
        );
        // Still running while a shutdown is asked for: ready until it is really off.
        assert!(ready(Some(On), Some(Off), None).ok);
        let off = ready(Some(Off), Some(Off), None);
        assert_eq!((off.ok, off.reason), (false, condition::POWERED_OFF));
        assert!(
            off.message
                .starts_with("VM 7 is powered off because spec.powerState is Off"),
            "{}",
            off.message
        );
        let starting = ready(Some(Off), Some(On), Some(&CloudInit::Running));
        assert_eq!(
            starting.reason,
            condition::POWERED_OFF,
            "off wins over the guest's cloud-init"
        );
        assert!(
            starting.message.ends_with("(see condition VMUpToDate)"),
            "{}",
            starting.message
        );
        let booting = ready(Some(On), Some(On), Some(&CloudInit::Running));
        assert_eq!(
            (booting.ok, booting.reason),
            (false, crate::cloud_init::WAITING_FOR_CLOUD_INIT)
        );
        let skipped = guest(None, None, true).ready(&wait, Some(&CloudInit::Running));
        assert!(skipped.ok, "a skipped check never holds the machine back");
    }

    #[test]
    fn a_task_start_time_is_kept_only_while_the_same_task_is_recorded() {
        use ProvisioningState::{Cloning, Configuring};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let started = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
        let recorded = Some(ProvisioningStatus {
            state: Cloning,
            task_id: Some("t1".into()),
            task_started_at: Some(started.clone()),
            message: Some("cloning".into()),
        });
        let same = provisioning(recorded.clone(), Cloning, Some("t1".into()));
        assert_eq!((same.task_started_at, same.message), (Some(started), None));
        let next = provisioning(recorded.clone(), Configuring, Some("t2".into()));
        assert_eq!(
            (next.state, next.task_id.as_deref(), next.task_started_at),
            (Configuring, Some("t2"), None)
        );
        assert_eq!(provisioning(recorded, Configuring, None).task_started_at, None);
        assert_eq!(
            provisioning(None, Cloning, Some("t1".into())).task_started_at,
            None
        );
    }

    fn failed(busy: bool) -> FailedTask {
        FailedTask {
            reason: "CloningFailed",
            message: "task qmclone failed".into(),
            busy,
        }
    }

    const GUEST: Guest<'static> = Guest {
        name: "VM 100",
        observed: Some(PowerState::On),
        desired: None,
        skip_cloud_init: true,
    };

    #[test]
    fn a_waiting_step_says_its_reason_and_what_it_waits_for_in_ready() {
        let step = Progress::<(), ()>::wait((), Duration::from_secs(2), "task running").into_step(
            None,
            "Cloning",
            &Wait::default(),
            false,
        );
        assert_eq!(step.ready, Report::new(false, "Cloning", "task running"));
        assert_eq!(step.requeue, Duration::from_secs(2));
        assert!(step.up_to_date.is_none() && !step.warning && !step.backoff);

        let mut importing = Progress::<(), ()>::to(());
        importing.waiting_reason = Some("ImportingImage");
        let step = importing.into_step(None, "Cloning", &Wait::default(), true);
        assert_eq!(step.ready.reason, "ImportingImage");
        assert!(step.next_now);
    }

    #[test]
    fn a_failed_task_is_readys_while_provisioning_and_the_day_2_conditions_after() {
        let mut before = Progress::<(), ()>::to(());
        before.failed = Some(failed(false));
        let step = before.into_step(None, "Cloning", &Wait::default(), false);
        assert_eq!(step.ready.reason, "CloningFailed");
        assert!(step.warning && !step.backoff && step.up_to_date.is_none());

        let mut after = Progress::<(), ()>::to(());
        after.failed = Some(failed(true));
        after.up_to_date = Some(Report::up_to_date(None));
        let step = after.into_step(Some(GUEST), "Provisioned", &Wait::default(), false);
        assert_eq!(step.ready.reason, condition::PROVISIONED);
        assert_eq!(step.up_to_date.map(|u| u.reason), Some("CloningFailed"));
        assert!(step.warning && step.backoff);
    }

    #[test]
    fn only_a_restart_waiting_for_its_user_or_a_flagged_problem_warns_once_provisioned() {
        let mut updating = Progress::<(), ()>::to(());
        updating.up_to_date = Some(Report::up_to_date(Some("resizing".into())));
        assert!(
            !updating
                .into_step(Some(GUEST), "", &Wait::default(), false)
                .warning
        );

        let mut restart = Progress::<(), ()>::to(());
        restart.up_to_date = Some(Report::restart_required("cpu".into()));
        assert!(
            restart
                .into_step(Some(GUEST), "", &Wait::default(), false)
                .warning
        );

        let mut flagged = Progress::<(), ()>::to(());
        flagged.warning = true;
        assert!(
            flagged
                .into_step(Some(GUEST), "", &Wait::default(), false)
                .warning
        );
    }

    #[test]
    fn a_provisioned_step_that_says_no_day_2_report_is_up_to_date_or_updating() {
        let mut settled = Progress::<(), ()>::to(());
        settled.up_to_date_unless_said();
        assert_eq!(settled.up_to_date, Some(Report::up_to_date(None)));

        let mut resizing = Progress::<(), ()>::wait((), Duration::from_secs(2), "resizing disk 0");
        resizing.up_to_date_unless_said();
        assert_eq!(resizing.up_to_date.map(|u| u.reason), Some(condition::UPDATING));

        let mut said = Progress::<(), ()>::wait((), Duration::ZERO, "cpu");
        said.up_to_date = Some(Report::restart_required("cpu".into()));
        said.up_to_date_unless_said();
        assert_eq!(
            said.up_to_date.map(|u| u.reason),
            Some(condition::RESTART_REQUIRED)
        );
    }

    #[test]
    fn a_failed_step_never_lets_the_next_follow() {
        let mut step = Progress::<(), ()>::to(());
        assert!(step.follows_at_once(false, false));
        step.failed = Some(failed(true));
        assert!(!step.follows_at_once(false, true));
    }
}
