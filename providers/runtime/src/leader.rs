//! Leader election on a `coordination.k8s.io/v1` Lease (kube-runtime has none built in), so
//! that only one replica reconciles at a time.
//!
//! Same rules as client-go's `leaderelection`: a candidate takes the Lease when it is absent,
//! released (no holder) or expired (`renewTime + leaseDurationSeconds` in the past); the holder
//! renews it every `renew_every`; writes are guarded by the Lease's `resourceVersion`, so two
//! candidates never both win (the loser sees HTTP 409). A holder that cannot renew for a whole
//! lease duration, or finds another holder, has lost leadership and must stop reconciling.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tracing::{info, warn};

use crate::{Error, Result};

/// Timeout of one Lease request.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What a candidate does with the Lease it sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No Lease yet: create it.
    Create,
    /// Free or expired: take it over (a new transition).
    Take,
    /// Ours: renew it.
    Renew,
    /// Held by someone else and valid: wait.
    Wait,
}

/// Decides (pure) what `identity` does with `lease` at `now`.
pub fn decide(lease: Option<&Lease>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return if lease.is_some() {
            Decision::Take
        } else {
            Decision::Create
        };
    };
    match spec.holder_identity.as_deref() {
        Some(h) if h == identity => Decision::Renew,
        None | Some("") => Decision::Take,
        Some(_) => {
            let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(0)));
            let expired = spec
                .renew_time
                .as_ref()
                .is_none_or(|t| t.0.checked_add(duration).is_ok_and(|end| end < now));
            if expired { Decision::Take } else { Decision::Wait }
        }
    }
}

/// The identity of this process as a candidate: `$POD_NAME`, else `$HOSTNAME`, else
/// `<prefix>-<pid>`.
pub fn default_identity(prefix: &str) -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{prefix}-{}", std::process::id()))
}

/// A candidate for one Lease.
#[derive(Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    /// Name of the Lease.
    pub name: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// This candidate's identity (e.g. the pod name).
    pub identity: String,
    /// How long the Lease stays valid without renewal (default 15 s).
    pub lease_duration: Duration,
    /// How often the holder renews and a candidate retries (default 2 s; well below
    /// `lease_duration`).
    pub renew_every: Duration,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("lease", &format_args!("{}/{}", self.namespace, self.name))
            .field("identity", &self.identity)
            .field("lease_duration", &self.lease_duration)
            .field("renew_every", &self.renew_every)
            .finish()
    }
}

impl LeaderElector {
    /// A candidate for Lease `namespace/name` as `identity`.
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(2),
        }
    }

    fn what(&self, verb: &str) -> String {
        format!("{verb} Lease {}/{}", self.namespace, self.name)
    }

    async fn call<T>(
        &self,
        verb: &str,
        fut: impl Future<Output = kube::Result<T>>,
    ) -> Result<kube::Result<T>> {
        tokio::time::timeout(CALL_TIMEOUT, fut)
            .await
            .map_err(|_| Error::Timeout(self.what(verb)))
    }

    /// One attempt to acquire or renew; `Ok(true)` when this candidate holds the Lease
    /// afterwards. A lost race (HTTP 409) is `Ok(false)`.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let existing = self
            .call("reading", self.api.get_opt(&self.name))
            .await?
            .map_err(|e| Error::kube(self.what("reading"), e))?;
        let now = Timestamp::now();
        let decision = decide(existing.as_ref(), &self.identity, now);
        let seconds = i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let result = match decision {
            Decision::Wait => return Ok(false),
            Decision::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: Some(MicroTime(now)),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.call("creating", self.api.create(&PostParams::default(), &lease))
                    .await?
                    .map(|_| ())
            }
            Decision::Take | Decision::Renew => {
                // `existing` is Some for both; its resourceVersion guards the replace.
                let mut lease = existing.unwrap_or_default();
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if decision == Decision::Take {
                    spec.holder_identity = Some(self.identity.clone());
                    spec.acquire_time = Some(MicroTime(now));
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
                }
                spec.lease_duration_seconds = Some(seconds);
                spec.renew_time = Some(MicroTime(now));
                self.call(
                    "updating",
                    self.api.replace(&self.name, &PostParams::default(), &lease),
                )
                .await?
                .map(|_| ())
            }
        };
        match result {
            Ok(()) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(Error::kube(self.what("writing"), e)),
        }
    }

    /// Waits until this candidate holds the Lease (retrying every `renew_every`).
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    info!(lease = self.name, identity = self.identity, "became leader");
                    return;
                }
                Ok(false) => {}
                Err(e) => warn!(error = %e, "leader election attempt failed"),
            }
            tokio::time::sleep(self.renew_every).await;
        }
    }

    /// Renews the held Lease until leadership is lost (another holder, or no successful
    /// renewal for a whole lease duration); then returns.
    pub async fn hold(&self) {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.renew_every).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => {
                    warn!(lease = self.name, "leadership lost to another holder");
                    return;
                }
                Err(e) => warn!(error = %e, "renewing the Lease failed"),
            }
            if last_renewal.elapsed() > self.lease_duration {
                warn!(
                    lease = self.name,
                    "no renewal for a whole lease duration: stepping down"
                );
                return;
            }
        }
    }

    /// Gives the Lease up if this candidate holds it (on a clean shutdown), so a standby takes
    /// over at once instead of after the lease duration. Someone else's Lease is left alone.
    pub async fn release(&self) -> Result<()> {
        let Some(mut lease) = self
            .call("releasing", self.api.get_opt(&self.name))
            .await?
            .map_err(|e| Error::kube(self.what("releasing"), e))?
        else {
            return Ok(());
        };
        let Some(spec) = lease
            .spec
            .as_mut()
            .filter(|s| s.holder_identity.as_deref() == Some(self.identity.as_str()))
        else {
            return Ok(());
        };
        spec.holder_identity = None;
        spec.renew_time = None;
        self.call(
            "releasing",
            self.api.replace(&self.name, &PostParams::default(), &lease),
        )
        .await?
        .map_err(|e| Error::kube(self.what("releasing"), e))?;
        info!(lease = self.name, "released the Lease");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    fn lease(holder: Option<&str>, renewed_at: i64, duration: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(duration),
                renew_time: Some(MicroTime(Timestamp::from_second(renewed_at).expect("valid"))),
                ..LeaseSpec::default()
            }),
        }
    }

    #[rstest]
    #[case::absent(None, 100, Decision::Create)]
    #[case::mine(Some(lease(Some("me"), 99, 15)), 100, Decision::Renew)]
    #[case::mine_even_if_expired(Some(lease(Some("me"), 0, 15)), 100, Decision::Renew)]
    #[case::other_valid(Some(lease(Some("other"), 90, 15)), 100, Decision::Wait)]
    #[case::other_expired(Some(lease(Some("other"), 80, 15)), 100, Decision::Take)]
    #[case::released(Some(lease(Some(""), 99, 15)), 100, Decision::Take)]
    #[case::no_holder(Some(lease(None, 99, 15)), 100, Decision::Take)]
    #[case::no_spec(Some(Lease::default()), 100, Decision::Take)]
    fn decisions(#[case] lease: Option<Lease>, #[case] now: i64, #[case] expected: Decision) {
        let now = Timestamp::from_second(now).expect("valid");
        assert_eq!(decide(lease.as_ref(), "me", now), expected);
    }
}
