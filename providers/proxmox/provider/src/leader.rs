//! Leader election through a `coordination.k8s.io/v1` Lease (kube-runtime has none built in).
//!
//! Same rules as client-go's `leaderelection`: a candidate takes the Lease when it is absent,
//! released (no holder) or expired (`renewTime + leaseDurationSeconds` in the past); the holder
//! renews it periodically; writes are guarded by `resourceVersion`, so two candidates never
//! both win. A leader that cannot renew for a whole lease duration must stop (the caller exits).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};

use crate::error::{Error, Result};

/// Timeout of one Lease request.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A Lease-based leader elector.
#[derive(Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    /// How long a lease is valid without renewal.
    pub lease_duration: Duration,
    /// How often the holder renews, and candidates retry.
    pub retry_period: Duration,
}

fn timeout_error(what: &str) -> Error {
    Error::kube(
        format!("{what}: no answer within {CALL_TIMEOUT:?}"),
        kube::Error::Service(format!("{what} timed out").into()),
    )
}

impl LeaderElector {
    /// An elector for Lease `namespace/name` as `identity`.
    pub fn new(client: kube::Client, namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            retry_period: Duration::from_secs(2),
        }
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One attempt to acquire or renew; `Ok(true)` when this candidate holds the Lease after it.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let now = Timestamp::now();
        let current = tokio::time::timeout(CALL_TIMEOUT, self.api.get_opt(&self.name))
            .await
            .map_err(|_| timeout_error("reading the Lease"))?
            .map_err(|e| Error::kube("reading the Lease", e))?;
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(now, None, 0)),
            };
            return match tokio::time::timeout(CALL_TIMEOUT, self.api.create(&PostParams::default(), &lease))
                .await
            {
                Err(_) => Err(timeout_error("creating the Lease")),
                Ok(Ok(_)) => Ok(true),
                Ok(Err(kube::Error::Api(s))) if s.code == 409 => Ok(false),
                Ok(Err(e)) => Err(Error::kube("creating the Lease", e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let ours = holder.as_deref() == Some(self.identity.as_str());
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(renewed), Some(secs)) => renewed.0 + SignedDuration::from_secs(i64::from(secs)) < now,
            _ => true,
        };
        if !ours && holder.is_some() && !expired {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
        let acquired = if ours { spec.acquire_time.clone() } else { None };
        lease.spec = Some(self.spec(now, acquired, transitions));
        let name = lease.name_any();
        match tokio::time::timeout(
            CALL_TIMEOUT,
            self.api.replace(&name, &PostParams::default(), &lease),
        )
        .await
        {
            Err(_) => Err(timeout_error("updating the Lease")),
            Ok(Ok(_)) => Ok(true),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => Ok(false),
            Ok(Err(e)) => Err(Error::kube("updating the Lease", e)),
        }
    }

    /// Waits until this candidate holds the Lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election attempt failed"),
            }
            tokio::time::sleep(self.retry_period).await;
        }
    }

    /// Renews the Lease until leadership is lost (another holder, or no successful renewal for
    /// a whole lease duration); then returns.
    pub async fn hold(&self) {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.retry_period).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot renew the leader Lease");
                    if last_renewal.elapsed() >= self.lease_duration {
                        return;
                    }
                }
            }
        }
    }

    /// Gives the Lease up (on graceful shutdown) so that another candidate takes over at once.
    pub async fn release(&self) -> Result<()> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| Error::kube("reading the Lease", e))?
        else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map_err(|e| Error::kube("releasing the Lease", e))?;
        Ok(())
    }
}
