//! The CAPI-style provider scenario suite, written once against Cluster API objects and run by
//! every infrastructure provider's tests (Proxmox VE on `pve-sim`, libvirt on
//! `test:///default`, vSphere on vcsim).
//!
//! A provider's test binary implements [`ProviderUnderTest`] (how to start its hypervisor
//! double and controllers, what its infra cluster and machine specs look like, how to read the
//! hypervisor's VM inventory) and expands [`scenario_tests!`], which generates one
//! `#[tokio::test]` per scenario in [`scenarios`]. The scenarios drive the provider the way
//! CAPI's controllers would: a `Cluster` owning the infra cluster, `Machine`s with a bootstrap
//! `dataSecretName` owning the infra machines, all created on a real kube-apiserver with CAPI's
//! CRDs installed (so every object is validated by CAPI's schema), and assert on what a user
//! observes: the infra objects' contract fields and conditions, and the VMs on the hypervisor.
//!
//! See `tests/scenarios/README.md`.

pub mod fixture;
pub mod leaks;
pub mod object;
pub mod provider;
pub mod scenarios;

pub use fixture::{Scenario, TIMEOUT, USER_DATA, env};
pub use provider::{Access, Controllers, MachineHint, ProviderUnderTest, Template, Vm};

/// Generates one `#[tokio::test]` per named scenario of [`scenarios`] for a provider, in a
/// module `shared_scenarios` (so the test names read `shared_scenarios::provision`).
///
/// ```text
/// banlieue_scenarios::scenario_tests!(Proxmox: provision, scale, delete, pause, bad_template);
/// ```
///
/// `Proxmox` is resolved in the calling module.
///
/// A second provider set-up of the same test binary names its own module:
/// `scenario_tests!(mod spread_scenarios; Spread: provision, delete)`.
#[macro_export]
macro_rules! scenario_tests {
    (mod $module:ident; $provider:ty: $($scenario:ident),+ $(,)?) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() -> ::anyhow::Result<()> {
                    $crate::scenarios::$scenario::<$provider>().await
                }
            )+
        }
    };
    ($provider:ty: $($scenario:ident),+ $(,)?) => {
        $crate::scenario_tests!(mod shared_scenarios; $provider: $($scenario),+);
    };
}
