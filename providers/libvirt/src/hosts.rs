//! Which libvirt hosts a LibvirtCluster stands for, each a failure domain:
//!
//! - `spec.hosts[]`: one host per entry, named by `name` (several failure domains);
//! - `spec.uri`: one host named after the URI's host part (`localhost` for local URIs such as
//!   `qemu:///system`);
//! - `spec.providerRef`: the cluster-scoped banlieue `Provider`'s `spec.endpoint` (backend
//!   `libvirt`) and `spec.credentialsRef`.
//!
//! A host's credentials (`hosts[].credentialsRef`, else the cluster's `credentialsRef`, else
//! the Provider's) are read from their Secret and written to private files by
//! [`crate::credentials`]; the URI the connector opens carries their paths. [`resolve`] records
//! them for the Secret watch ([`crate::secrets`]) before reading them.

use std::sync::Arc;

use banlieue_api::banlieue::{Backend, Provider};
use banlieue_api::common::SecretReference;
use banlieue_api::infrastructure::LibvirtCluster;
use banlieue_provider_kit::cluster::Problem;
use banlieue_provider_kit::connection::{self, in_namespace};
use banlieue_provider_kit::usable;
use banlieue_provider_runtime::secret_watch::SecretKey;
use kube::{Resource, ResourceExt};

use crate::credentials;
use crate::error::Result;
use crate::hypervisor::Hypervisor;
use crate::provision::Host;
use banlieue_provider_kit::secrets::ReadSecrets;

/// A host: failure-domain name and URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSpec {
    /// Failure domain name.
    pub name: String,
    /// libvirt URI (after [`resolve`]: with the credential file parameters).
    pub uri: String,
    /// Secret with the connection credentials (namespace filled in).
    pub credentials: Option<SecretReference>,
    /// Whether control plane machines may be placed here.
    pub control_plane: bool,
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

/// The hosts of a LibvirtCluster given its Provider (when it has a `providerRef`), before
/// credentials are applied. Pure.
pub fn hosts_of(lvc: &LibvirtCluster, provider: Option<&Provider>) -> Result<Vec<HostSpec>, Problem> {
    let namespace = lvc.namespace().unwrap_or_default();
    let scoped = |r: Option<&SecretReference>| r.map(|r| in_namespace(r, &namespace));
    let cluster_creds = scoped(lvc.spec.credentials_ref.as_ref());
    if !lvc.spec.hosts.is_empty() {
        return Ok(lvc
            .spec
            .hosts
            .iter()
            .map(|h| HostSpec {
                name: h.name.clone(),
                uri: h.uri.clone(),
                credentials: scoped(h.credentials_ref.as_ref()).or_else(|| cluster_creds.clone()),
                control_plane: h.control_plane.unwrap_or(true),
            })
            .collect());
    }
    let (uri, credentials) = match (&lvc.spec.uri, &lvc.spec.provider_ref) {
        (Some(uri), _) => (uri.clone(), cluster_creds),
        (None, Some(r)) => {
            let p = provider.ok_or_else(|| {
                Problem::new("ProviderNotFound", format!("Provider {:?} not found", r.name))
            })?;
            // A Provider is cluster-scoped: its reference names its namespace (CEL rule).
            let creds = scoped(p.spec.credentials_ref.as_ref()).or(cluster_creds);
            (p.spec.endpoint.clone(), creds)
        }
        (None, None) => {
            return Err(Problem::new(
                "NoHost",
                "set spec.hosts, spec.uri or spec.providerRef",
            ));
        }
    };
    Ok(vec![HostSpec {
        name: host_name(&uri),
        uri,
        credentials,
        control_plane: true,
    }])
}

/// The credentials Secrets of `hosts` (each once). Pure.
pub fn credentials_secrets(hosts: &[HostSpec]) -> Vec<SecretKey> {
    let mut keys: Vec<SecretKey> = hosts
        .iter()
        .filter_map(|h| h.credentials.as_ref())
        .map(|r| SecretKey::new(r.namespace.clone().unwrap_or_default(), r.name.clone()))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// Reads the Provider (if any) and returns the hosts, or why they are unknown. Every
/// credentials Secret of the hosts is recorded in `read` before any is read.
pub async fn resolve<K: Resource<DynamicType = ()>>(
    client: &kube::Client,
    lvc: &LibvirtCluster,
    read: &ReadSecrets<K>,
) -> Result<std::result::Result<Vec<HostSpec>, Problem>> {
    let namespace = lvc.namespace().unwrap_or_default();
    let provider = match &lvc.spec.provider_ref {
        Some(r) if lvc.spec.uri.is_none() && lvc.spec.hosts.is_empty() => Some(usable!(
            connection::allowed_provider(client, &r.name, Backend::Libvirt, "LibvirtCluster", &namespace)
                .await?
        )),
        _ => None,
    };
    let mut hosts = usable!(hosts_of(lvc, provider.as_ref()));
    read.record(credentials_secrets(&hosts));
    for h in &mut hosts {
        let Some(r) = &h.credentials else { continue };
        let user = provider.is_none().then_some(namespace.as_str());
        let secret = match connection::credentials(client, Some(r), user, &h.uri).await? {
            Ok(secret) => secret,
            Err(mut problem) => {
                problem.message = format!("{} (host {})", problem.message, h.name);
                return Ok(Err(problem));
            }
        };
        let (ns, data) = (r.namespace.clone().unwrap_or_default(), secret.data);
        h.uri = usable!(credentials::materialize(
            &credentials::default_dir(),
            &ns,
            &r.name,
            &h.uri,
            &data
        ));
    }
    Ok(Ok(hosts))
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
            uri: h.uri.clone(),
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
                uri: "qemu:///system".into(),
                credentials: None,
                control_plane: true,
            }]
        );
        lvc.spec.uri = None;
        lvc.spec.provider_ref = Some(ProviderReference { name: "lab".into() });
        assert_eq!(
            hosts_of(&lvc, Some(&provider(Backend::Libvirt))).unwrap()[0].name,
            "kvm2"
        );
        assert_eq!(hosts_of(&lvc, None).unwrap_err().reason, "ProviderNotFound");
    }

    #[test]
    fn spec_hosts_are_failure_domains_with_their_own_or_the_clusters_credentials() {
        let mut lvc: LibvirtCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1",
            "kind": "LibvirtCluster",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {
                "credentialsRef": {"name": "shared"},
                "hosts": [
                    {"name": "kvm1", "uri": "qemu+ssh://root@kvm1/system"},
                    {"name": "kvm2", "uri": "qemu+tls://kvm2/system",
                     "credentialsRef": {"name": "own", "namespace": "infra"}, "controlPlane": false}
                ]
            }
        }))
        .unwrap();
        let hosts = hosts_of(&lvc, None).unwrap();
        assert_eq!(
            hosts
                .iter()
                .map(|h| (
                    h.name.as_str(),
                    h.credentials
                        .as_ref()
                        .map(|c| (c.namespace.as_deref().unwrap(), c.name.as_str())),
                    h.control_plane
                ))
                .collect::<Vec<_>>(),
            vec![
                ("kvm1", Some(("ns", "shared")), true),
                ("kvm2", Some(("infra", "own")), false)
            ]
        );
        assert_eq!(
            credentials_secrets(&hosts),
            vec![SecretKey::new("infra", "own"), SecretKey::new("ns", "shared")]
        );
        lvc.spec.credentials_ref = None;
        let hosts = hosts_of(&lvc, None).unwrap();
        assert_eq!(hosts[0].credentials, None);
        assert_eq!(credentials_secrets(&hosts), vec![SecretKey::new("infra", "own")]);
    }
}
