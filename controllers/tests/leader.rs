//! Lease leader election against a real apiserver: one holder at a time, takeover after expiry.

use std::time::Duration;

use banlieue_controllers::leader::{LeaseConfig, try_acquire_or_renew};
use banlieue_testenv::TestEnv;

#[tokio::test]
async fn one_leader_at_a_time_and_takeover_after_expiry() -> anyhow::Result<()> {
    let env = TestEnv::shared_with(|b| b.crds(banlieue_api::crds::all())).await?;
    let ns = env.namespace("leader").await?;
    let client = env.client().await?;
    let config = |id: &str| LeaseConfig {
        lease_duration: Duration::from_secs(2),
        renew_every: Duration::from_millis(500),
        ..LeaseConfig::new("banlieue-controller", ns.to_string(), id)
    };
    let (a, b) = (config("a"), config("b"));
    assert!(try_acquire_or_renew(&client, &a).await?, "a takes the free Lease");
    assert!(
        !try_acquire_or_renew(&client, &b).await?,
        "b waits while a holds it"
    );
    assert!(try_acquire_or_renew(&client, &a).await?, "a renews");
    assert!(
        !try_acquire_or_renew(&client, &b).await?,
        "b still waits after a renewed"
    );
    // a stops renewing: after the lease duration b takes over, and a has lost it.
    tokio::time::sleep(Duration::from_millis(3100)).await;
    assert!(
        try_acquire_or_renew(&client, &b).await?,
        "b takes the expired Lease"
    );
    assert!(!try_acquire_or_renew(&client, &a).await?, "a no longer holds it");
    // A clean shutdown releases the Lease: a takes it at once, without waiting for expiry.
    banlieue_controllers::leader::release(&client, &a).await?; // not the holder: no-op
    assert!(
        !try_acquire_or_renew(&client, &a).await?,
        "releasing someone else's Lease does nothing"
    );
    banlieue_controllers::leader::release(&client, &b).await?;
    assert!(
        try_acquire_or_renew(&client, &a).await?,
        "a takes the released Lease immediately"
    );
    Ok(())
}
