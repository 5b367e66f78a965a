//! Leader election on a `coordination.k8s.io/v1` Lease, so that only one replica of the
//! controller reconciles at a time.
//!
//! A candidate takes the Lease when it is free or expired (`renewTime + leaseDurationSeconds`
//! in the past), renews it every `renew_every`, and stops leading when a renewal fails for
//! longer than the lease duration or another holder took it. Writes are guarded by the Lease's
//! resourceVersion, so two candidates never both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tracing::{info, warn};

use crate::{Error, Result};

/// Settings of one election.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Name of the Lease.
    pub name: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// This candidate's identity (e.g. the pod name).
    pub identity: String,
    /// How long a Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// How often the holder renews (well below `lease_duration`).
    pub renew_every: Duration,
}

impl LeaseConfig {
    /// Defaults: 15 s lease, renewed every 5 s.
    pub fn new(name: impl Into<String>, namespace: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
        }
    }
}

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

/// One attempt to acquire or renew; `Ok(true)` when this candidate holds the Lease afterwards.
/// A lost race (HTTP 409) is `Ok(false)`.
pub async fn try_acquire_or_renew(client: &Client, cfg: &LeaseConfig) -> Result<bool> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let existing = api
        .get_opt(&cfg.name)
        .await
        .map_err(|e| Error::kube(format!("reading Lease {}/{}", cfg.namespace, cfg.name), e))?;
    let now = Timestamp::now();
    let decision = decide(existing.as_ref(), &cfg.identity, now);
    let seconds = i32::try_from(cfg.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let result = match decision {
        Decision::Wait => return Ok(false),
        Decision::Create => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(cfg.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await.map(|_| ())
        }
        Decision::Take | Decision::Renew => {
            // `existing` is Some for both; its resourceVersion guards the replace.
            let mut lease = existing.unwrap_or_default();
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if decision == Decision::Take {
                spec.holder_identity = Some(cfg.identity.clone());
                spec.acquire_time = Some(MicroTime(now));
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            }
            spec.lease_duration_seconds = Some(seconds);
            spec.renew_time = Some(MicroTime(now));
            api.replace(&cfg.name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        }
    };
    match result {
        Ok(()) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(Error::kube(
            format!("writing Lease {}/{}", cfg.namespace, cfg.name),
            e,
        )),
    }
}

/// Gives the Lease up if this candidate holds it (on a clean shutdown), so a standby takes over
/// at once instead of after the lease duration. Best effort: a failure only delays the standby.
pub async fn release(client: &Client, cfg: &LeaseConfig) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let context = || format!("releasing Lease {}/{}", cfg.namespace, cfg.name);
    let Some(mut lease) = api
        .get_opt(&cfg.name)
        .await
        .map_err(|e| Error::kube(context(), e))?
    else {
        return Ok(());
    };
    let Some(spec) = lease
        .spec
        .as_mut()
        .filter(|s| s.holder_identity.as_deref() == Some(cfg.identity.as_str()))
    else {
        return Ok(());
    };
    spec.holder_identity = None;
    spec.renew_time = None;
    api.replace(&cfg.name, &PostParams::default(), &lease)
        .await
        .map_err(|e| Error::kube(context(), e))?;
    info!(lease = cfg.name, "released the Lease");
    Ok(())
}

/// Waits until this candidate holds the Lease (retrying every `renew_every`).
pub async fn acquire(client: &Client, cfg: &LeaseConfig) {
    loop {
        match try_acquire_or_renew(client, cfg).await {
            Ok(true) => {
                info!(lease = cfg.name, identity = cfg.identity, "became leader");
                return;
            }
            Ok(false) => {}
            Err(e) => warn!(error = %e, "leader election attempt failed"),
        }
        tokio::time::sleep(cfg.renew_every).await;
    }
}

/// Renews the held Lease until leadership is lost (another holder, or no successful renewal
/// for a whole lease duration); then returns.
pub async fn hold(client: &Client, cfg: &LeaseConfig) {
    let mut last_renewal = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(cfg.renew_every).await;
        let attempt = tokio::time::timeout(cfg.renew_every, try_acquire_or_renew(client, cfg)).await;
        match attempt {
            Ok(Ok(true)) => last_renewal = tokio::time::Instant::now(),
            Ok(Ok(false)) => {
                warn!(lease = cfg.name, "leadership lost to another holder");
                return;
            }
            Ok(Err(e)) => warn!(error = %e, "renewing the Lease failed"),
            Err(_) => warn!("renewing the Lease timed out"),
        }
        if last_renewal.elapsed() > cfg.lease_duration {
            warn!(
                lease = cfg.name,
                "no renewal for a whole lease duration: stepping down"
            );
            return;
        }
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
    fn decisions(#[case] lease: Option<Lease>, #[case] now: i64, #[case] expected: Decision) {
        let now = Timestamp::from_second(now).expect("valid");
        assert_eq!(decide(lease.as_ref(), "me", now), expected);
    }
}
