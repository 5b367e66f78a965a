//! Which libvirt hosts a LibvirtCluster stands for: one per failure domain, named after the
//! URI's host part (`localhost` for local URIs such as `qemu:///system`).
//!
//! The URI comes from `spec.uri`, or, with `spec.providerRef`, from the cluster-scoped banlieue
//! `Provider` (`spec.endpoint`, backend `libvirt`).

use std::sync::Arc;

use banlieue_api::banlieue::{Backend, Provider};
use banlieue_api::infrastructure::LibvirtCluster;
use kube::Api;

use crate::error::{Error, Result};
use crate::hypervisor::Hypervisor;
use crate::provision::Host;

/// A host: failure-domain name and URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSpec {
    /// Failure domain name.
    pub name: String,
    /// libvirt URI.
    pub uri: String,
}

/// The host part of a libvirt URI (`qemu+ssh://root@kvm1:22/system` → `kvm1`), `localhost`
/// when it has none.
pub fn host_name(uri: &str) -> String {
    let rest = uri.split_once("://").map_or(uri, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if host.starts_with('[') {
        host.split_inclusive(']').next().unwrap_or(host)
    } else {
        host.split(':').next().unwrap_or(host)
    };
    if host.is_empty() {
        "localhost".into()
    } else {
        host.to_owned()
    }
}

/// Why a LibvirtCluster's hosts cannot be known (a `Ready=False` reason and message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostsError {
    /// Condition reason.
    pub reason: &'static str,
    /// Message.
    pub message: String,
}

/// The hosts of a LibvirtCluster given its Provider (when it has a `providerRef`). Pure.
pub fn hosts_of(lvc: &LibvirtCluster, provider: Option<&Provider>) -> Result<Vec<HostSpec>, HostsError> {
    let uri = match (&lvc.spec.uri, &lvc.spec.provider_ref) {
        (Some(uri), _) => uri.clone(),
        (None, Some(r)) => {
            let p = provider.ok_or_else(|| HostsError {
                reason: "ProviderNotFound",
                message: format!("Provider {:?} not found", r.name),
            })?;
            if p.spec.backend != Backend::Libvirt {
                return Err(HostsError {
                    reason: "ProviderBackendMismatch",
                    message: format!(
                        "Provider {:?} has backend {}, a LibvirtCluster needs libvirt",
                        r.name,
                        p.spec.backend.as_str()
                    ),
                });
            }
            p.spec.endpoint.clone()
        }
        (None, None) => {
            return Err(HostsError {
                reason: "NoHost",
                message: "set spec.uri or spec.providerRef".into(),
            });
        }
    };
    Ok(vec![HostSpec {
        name: host_name(&uri),
        uri,
    }])
}

/// Reads the Provider (if any) and returns the hosts, or why they are unknown.
pub async fn resolve(
    client: &kube::Client,
    lvc: &LibvirtCluster,
) -> Result<std::result::Result<Vec<HostSpec>, HostsError>> {
    let provider = match &lvc.spec.provider_ref {
        Some(r) if lvc.spec.uri.is_none() => Api::<Provider>::all(client.clone())
            .get_opt(&r.name)
            .await
            .map_err(|e| Error::kube("reading the Provider", e))?,
        _ => None,
    };
    Ok(hosts_of(lvc, provider.as_ref()))
}

/// Opens hypervisor handles.
pub trait Connector: Send + Sync + 'static {
    /// The handle type.
    type Hv: Hypervisor;
    /// The (shared, cached) handle for a URI.
    fn connect(&self, uri: &str) -> Arc<Self::Hv>;
}

#[cfg(feature = "libvirt")]
impl Connector for crate::connection::VirtConnector {
    type Hv = crate::connection::VirtHypervisor;

    fn connect(&self, uri: &str) -> Arc<Self::Hv> {
        self.get(uri)
    }
}

/// Handles for every host.
pub fn connect_all<C: Connector>(connector: &C, hosts: &[HostSpec]) -> Vec<Host<C::Hv>> {
    hosts
        .iter()
        .map(|h| Host {
            name: h.name.clone(),
            hv: connector.connect(&h.uri),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::banlieue::ProviderSpec;
    use banlieue_api::common::ProviderReference;
    use rstest::rstest;

    #[rstest]
    #[case("qemu:///system", "localhost")]
    #[case("test:///default", "localhost")]
    #[case("qemu+ssh://root@kvm1.example.com/system", "kvm1.example.com")]
    #[case("qemu+ssh://root@kvm1:2222/system?keyfile=/k", "kvm1")]
    #[case("qemu+tls://[2001:db8::1]/system", "[2001:db8::1]")]
    fn host_names(#[case] uri: &str, #[case] want: &str) {
        assert_eq!(host_name(uri), want);
    }

    fn provider(backend: Backend) -> Provider {
        Provider::new(
            "lab",
            ProviderSpec {
                backend,
                endpoint: "qemu+ssh://root@kvm2/system".into(),
                ..Default::default()
            },
        )
    }

    #[test]
    fn hosts_come_from_the_uri_or_the_provider() {
        let mut lvc = LibvirtCluster::new("c", Default::default());
        lvc.spec.uri = Some("qemu:///system".into());
        assert_eq!(
            hosts_of(&lvc, None).unwrap(),
            vec![HostSpec {
                name: "localhost".into(),
                uri: "qemu:///system".into()
            }]
        );
        lvc.spec.uri = None;
        lvc.spec.provider_ref = Some(ProviderReference { name: "lab".into() });
        assert_eq!(
            hosts_of(&lvc, Some(&provider(Backend::Libvirt))).unwrap()[0].name,
            "kvm2"
        );
        assert_eq!(
            hosts_of(&lvc, Some(&provider(Backend::Proxmox)))
                .unwrap_err()
                .reason,
            "ProviderBackendMismatch"
        );
        assert_eq!(hosts_of(&lvc, None).unwrap_err().reason, "ProviderNotFound");
    }
}
