//! How soon to look at a hypervisor task again: soon after it started (most tasks of an idle
//! host end within a second), then less and less often, up to the provider's steady interval.
//! The age comes from `status.provisioning.taskStartedAt`, recorded with the provider's own
//! clock when the task is first written, so a restarted provider keeps the pace and the
//! hypervisor's clock does not matter.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// The first look at a task that just started.
pub const FIRST_TASK_POLL: Duration = Duration::from_millis(200);

/// When to look at a task of `age` again: half its age, at least [`FIRST_TASK_POLL`], at most
/// `steady` (so polls double from 200 ms: a task that ends after `t` is seen by about `1.5 t`).
pub fn task_poll_after(age: Duration, steady: Duration) -> Duration {
    (age / 2).clamp(FIRST_TASK_POLL, steady.max(FIRST_TASK_POLL))
}

/// [`task_poll_after`] for a task recorded as started at `started_at` (`None`: not recorded,
/// e.g. written by an older provider: `steady`).
pub fn task_poll_since(started_at: Option<Timestamp>, now: Timestamp, steady: Duration) -> Duration {
    match started_at {
        Some(at) => {
            let age = now.duration_since(at).try_into().unwrap_or(Duration::ZERO);
            task_poll_after(age, steady)
        }
        None => steady,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_start_fast_and_slow_down_to_the_steady_interval() {
        let steady = Duration::from_secs(2);
        let ms = |n| Duration::from_millis(n);
        assert_eq!(task_poll_after(Duration::ZERO, steady), ms(200));
        assert_eq!(task_poll_after(ms(300), steady), ms(200));
        assert_eq!(task_poll_after(ms(1000), steady), ms(500));
        assert_eq!(task_poll_after(Duration::from_secs(60), steady), steady);
        assert_eq!(
            task_poll_after(Duration::ZERO, ms(100)),
            ms(200),
            "never faster than the first poll"
        );
        let now = Timestamp::now();
        assert_eq!(task_poll_since(None, now, steady), steady, "unknown age: steady");
        let future = now + std::time::Duration::from_secs(5);
        assert_eq!(
            task_poll_since(Some(future), now, steady),
            ms(200),
            "a start time ahead of now counts as just started"
        );
    }

    /// Over a task of 3 s the looks add up to a few, and the end is seen well within 1.5× its
    /// length, where a fixed 2 s poll sees it at 4 s.
    #[test]
    fn a_three_second_task_is_seen_soon_after_it_ends() {
        let steady = Duration::from_secs(2);
        let (mut t, mut looks) = (Duration::ZERO, 0);
        while t < Duration::from_secs(3) {
            t += task_poll_after(t, steady);
            looks += 1;
        }
        assert!(t <= Duration::from_millis(4500), "seen at {t:?}");
        assert!(looks <= 8, "{looks} looks");
    }
}
