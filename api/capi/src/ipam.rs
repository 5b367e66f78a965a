//! CAPI IPAM contract helpers: an infrastructure provider creates an `IPAddressClaim` per
//! address it needs (owned by its InfraMachine, pointing at an IP pool), an IPAM provider answers
//! with an `IPAddress` and sets the claim's `status.addressRef`.

use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::contract::{CLUSTER_NAME_LABEL, ContractRef};
use crate::error::{Error, Result};
use crate::generated::ip_address::IpAddress;
use crate::generated::ip_address_claim::{IpAddressClaim, IpAddressClaimSpec};

/// A new `IPAddressClaim` named `name` in `namespace` for `cluster_name`, asking `pool` for an
/// address, owned (as controller) by `owner` — normally the InfraMachine, so the claim and its
/// address go away with it.
pub fn new_claim(
    name: &str,
    namespace: &str,
    cluster_name: &str,
    pool: ContractRef,
    owner: OwnerReference,
) -> IpAddressClaim {
    IpAddressClaim {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some([(CLUSTER_NAME_LABEL.to_owned(), cluster_name.to_owned())].into()),
            owner_references: Some(vec![OwnerReference {
                controller: Some(true),
                block_owner_deletion: Some(true),
                ..owner
            }]),
            ..ObjectMeta::default()
        },
        spec: IpAddressClaimSpec {
            cluster_name: Some(cluster_name.to_owned()),
            pool_ref: pool.into(),
        },
        status: None,
    }
}

/// The name of the `IPAddress` allocated for the claim, once the IPAM provider has set it.
pub fn allocated_address_name(claim: &IpAddressClaim) -> Option<&str> {
    claim
        .status
        .as_ref()?
        .address_ref
        .as_ref()
        .map(|r| r.name.as_str())
        .filter(|n| !n.is_empty())
}

/// An `IPAddress` in typed form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The address.
    pub address: IpAddr,
    /// Prefix length of the network (0–32 for IPv4, 0–128 for IPv6).
    pub prefix: u8,
    /// The network's gateway, same family as `address`.
    pub gateway: Option<IpAddr>,
}

/// Parses and checks an `IPAddress`: the address and gateway must be IP literals of one family
/// and the prefix must fit that family. IPAM providers are third-party code; don't trust them.
pub fn parse_allocation(ip: &IpAddress) -> Result<Allocation> {
    let name = ip.metadata.name.clone().unwrap_or_default();
    let invalid = |field: &'static str, value: String, reason: &'static str| Error::InvalidIpAddress {
        name: name.clone(),
        field,
        value,
        reason,
    };
    let address: IpAddr = ip
        .spec
        .address
        .parse()
        .map_err(|_| invalid("spec.address", ip.spec.address.clone(), "not an IP address"))?;
    let max = if address.is_ipv4() { 32 } else { 128 };
    let prefix = u8::try_from(ip.spec.prefix)
        .ok()
        .filter(|p| *p <= max)
        .ok_or_else(|| {
            invalid(
                "spec.prefix",
                ip.spec.prefix.to_string(),
                "out of range for the address family",
            )
        })?;
    let gateway = match ip.spec.gateway.as_deref().filter(|g| !g.is_empty()) {
        None => None,
        Some(g) => {
            let gw: IpAddr = g
                .parse()
                .map_err(|_| invalid("spec.gateway", g.to_owned(), "not an IP address"))?;
            if gw.is_ipv4() != address.is_ipv4() {
                return Err(invalid(
                    "spec.gateway",
                    g.to_owned(),
                    "not of the address's family",
                ));
            }
            Some(gw)
        }
    };
    Ok(Allocation {
        address,
        prefix,
        gateway,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generated::ip_address::IpAddressSpec;
    use crate::generated::ip_address_claim::{IpAddressClaimStatus, IpAddressClaimStatusAddressRef};

    fn ip(address: &str, prefix: i32, gateway: Option<&str>) -> IpAddress {
        IpAddress::new(
            "a1",
            IpAddressSpec {
                address: address.into(),
                prefix,
                gateway: gateway.map(str::to_owned),
                ..IpAddressSpec::default()
            },
        )
    }

    #[test]
    fn new_claim_is_labelled_owned_and_points_at_the_pool() {
        let owner = OwnerReference {
            api_version: "infrastructure.banlieue.io/v1alpha1".into(),
            kind: "ProxmoxMachine".into(),
            name: "m1".into(),
            uid: "u1".into(),
            ..OwnerReference::default()
        };
        let pool = ContractRef::new("ipam.cluster.x-k8s.io", "InClusterIPPool", "nodes");
        let claim = new_claim("m1-net0-inet", "ns", "prod", pool, owner);
        let json = serde_json::to_value(&claim).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
                "kind": "IPAddressClaim",
                "metadata": {
                    "name": "m1-net0-inet",
                    "namespace": "ns",
                    "labels": {"cluster.x-k8s.io/cluster-name": "prod"},
                    "ownerReferences": [{
                        "apiVersion": "infrastructure.banlieue.io/v1alpha1",
                        "kind": "ProxmoxMachine",
                        "name": "m1",
                        "uid": "u1",
                        "controller": true,
                        "blockOwnerDeletion": true,
                    }],
                },
                "spec": {
                    "clusterName": "prod",
                    "poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "nodes"},
                },
            })
        );
    }

    #[test]
    fn allocated_address_name_waits_for_the_ipam_provider() {
        let mut claim = IpAddressClaim::new("c", IpAddressClaimSpec::default());
        assert_eq!(allocated_address_name(&claim), None);
        claim.status = Some(IpAddressClaimStatus::default());
        assert_eq!(allocated_address_name(&claim), None);
        claim.status.as_mut().unwrap().address_ref =
            Some(IpAddressClaimStatusAddressRef { name: String::new() });
        assert_eq!(
            allocated_address_name(&claim),
            None,
            "an empty name is no allocation"
        );
        claim.status.as_mut().unwrap().address_ref =
            Some(IpAddressClaimStatusAddressRef { name: "a1".into() });
        assert_eq!(allocated_address_name(&claim), Some("a1"));
    }

    #[test]
    fn parses_valid_allocations() {
        let v4 = parse_allocation(&ip("192.0.2.31", 24, Some("192.0.2.1"))).unwrap();
        assert_eq!(v4.address, "192.0.2.31".parse::<IpAddr>().unwrap());
        assert_eq!((v4.prefix, v4.gateway), (24, Some("192.0.2.1".parse().unwrap())));
        let v6 = parse_allocation(&ip("2001:db8::31", 128, None)).unwrap();
        assert_eq!((v6.prefix, v6.gateway), (128, None));
        let empty_gateway = parse_allocation(&ip("192.0.2.31", 32, Some(""))).unwrap();
        assert_eq!(empty_gateway.gateway, None);
    }

    #[test]
    fn rejects_invalid_allocations_naming_the_field() {
        let cases = [
            (ip("192.0.2.300", 24, None), "spec.address"),
            (ip("", 24, None), "spec.address"),
            (ip("192.0.2.31", 33, None), "spec.prefix"),
            (ip("192.0.2.31", -1, None), "spec.prefix"),
            (ip("2001:db8::1", 129, None), "spec.prefix"),
            (ip("192.0.2.31", 24, Some("gw")), "spec.gateway"),
            (ip("192.0.2.31", 24, Some("2001:db8::1")), "spec.gateway"),
        ];
        for (input, want) in cases {
            match parse_allocation(&input) {
                Err(err @ Error::InvalidIpAddress { field, .. }) => {
                    assert_eq!(field, want, "{input:?}");
                    assert_eq!(err.metric_label(), "invalid_ip_address");
                    assert!(err.to_string().contains("\"a1\""), "{err}");
                }
                other => panic!("{input:?}: expected InvalidIpAddress, got {other:?}"),
            }
        }
    }
}
