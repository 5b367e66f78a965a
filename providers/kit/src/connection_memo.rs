//! The connections a controller read in the last moments, reused by its next reads of the same
//! settings: the steps of one reconcile, and the reconciles of the many machines that share a
//! Provider, read the Provider and its Secrets once per [`MEMO_TTL`] instead of once each (at
//! 1,000 machines this was most of the API server's reads).
//!
//! The memo belongs to one running machine controller ([`remembering`], set around each of its
//! reconciles), so two controllers (two providers in one test process, two API servers) never
//! share one; the infra cluster controllers, which report a changed Provider or Secret, keep
//! none. Only connections read in full are remembered: one that could not be read
//! (a missing Secret, a refused namespace) is read again at the next attempt, so a fix is seen
//! at once; a changed Provider or Secret is seen within [`MEMO_TTL`].

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use banlieue_provider_runtime::secret_watch::SecretKey;

/// How long a connection read stays reusable.
pub const MEMO_TTL: Duration = Duration::from_secs(2);

tokio::task_local! {
    static MEMO: Memo;
}

/// A controller's recent connections, by the settings they were read from. Cheap to clone
/// (shared).
#[derive(Clone, Default)]
pub struct Memo(Arc<Mutex<HashMap<String, Remembered>>>);

/// A connection (`crate::connection::Connection`, kept as `Any`: this module knows only that it
/// is cloned in and out) and what it was read from.
struct Remembered {
    read_at: Instant,
    secrets: Vec<SecretKey>,
    connection: Arc<dyn Any + Send + Sync>,
}

/// Runs `reconcile` with `memo` as its controller's memo.
pub async fn remembering<F: Future>(memo: Memo, reconcile: F) -> F::Output {
    MEMO.scope(memo, reconcile).await
}

/// The connection read from `settings` within [`MEMO_TTL`], with the Secrets it was read from,
/// if the running controller has one.
pub fn recall<C: Clone + 'static>(settings: &str) -> Option<(Vec<SecretKey>, C)> {
    MEMO.try_with(|memo| memo.recall(settings, Instant::now()))
        .ok()
        .flatten()
}

/// Remembers `connection`, read now from `settings` and `secrets`, for the running controller
/// (nothing outside one).
pub fn remember<C: Clone + Send + Sync + 'static>(settings: String, secrets: Vec<SecretKey>, connection: &C) {
    let _ = MEMO.try_with(|memo| memo.remember(settings, secrets, connection.clone(), Instant::now()));
}

impl Memo {
    fn recall<C: Clone + 'static>(&self, settings: &str, now: Instant) -> Option<(Vec<SecretKey>, C)> {
        let memo = crate::lock(&self.0);
        let remembered = memo
            .get(settings)
            .filter(|r| now.saturating_duration_since(r.read_at) < MEMO_TTL)?;
        let connection = remembered.connection.downcast_ref::<C>()?.clone();
        Some((remembered.secrets.clone(), connection))
    }

    fn remember<C: Send + Sync + 'static>(
        &self,
        settings: String,
        secrets: Vec<SecretKey>,
        connection: C,
        now: Instant,
    ) {
        let mut memo = crate::lock(&self.0);
        memo.retain(|_, r| now.saturating_duration_since(r.read_at) < MEMO_TTL);
        memo.insert(
            settings,
            Remembered {
                read_at: now,
                secrets,
                connection: Arc::new(connection),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stands for a connection.
    #[derive(Clone, Debug, PartialEq)]
    struct Endpoint(&'static str);

    #[test]
    fn a_connection_is_reused_only_for_the_same_settings_and_not_after_the_ttl() {
        let memo = Memo::default();
        let now = Instant::now();
        let secrets = vec![SecretKey::new("platform", "pve-token")];
        memo.remember("a".into(), secrets.clone(), Endpoint("https://a:8006"), now);
        assert_eq!(
            memo.recall::<Endpoint>("a", now + Duration::from_millis(1500)),
            Some((secrets, Endpoint("https://a:8006")))
        );
        assert_eq!(memo.recall::<Endpoint>("b", now), None, "other settings");
        assert_eq!(memo.recall::<Endpoint>("a", now + MEMO_TTL), None, "too old");
        assert_eq!(memo.recall::<String>("a", now), None, "another type");
    }

    #[tokio::test]
    async fn only_a_running_controller_remembers_and_each_its_own() {
        remember("a".into(), Vec::new(), &Endpoint("https://a:8006"));
        assert_eq!(
            recall::<Endpoint>("a"),
            None,
            "outside a controller nothing is kept"
        );
        let (first, second) = (Memo::default(), Memo::default());
        remembering(first.clone(), async {
            remember("a".into(), Vec::new(), &Endpoint("https://a:8006"));
            assert!(recall::<Endpoint>("a").is_some());
        })
        .await;
        remembering(second, async {
            assert_eq!(recall::<Endpoint>("a"), None, "another controller's memo")
        })
        .await;
        remembering(first, async {
            assert!(recall::<Endpoint>("a").is_some(), "the same controller's memo")
        })
        .await;
    }
}
