//! A machine's addresses as `spec.networks` asks for them, for every hypervisor: DHCP, static
//! addresses, or addresses from a CAPI IPAM pool, delivered to the guest as cloud-init
//! `network-config` v2.
//!
//! IPAM: an interface whose `ipv4`/`ipv6` has `mode: Pool` gets its address from an IPAM
//! provider. Per such interface and family the machine creates an `IPAddressClaim`
//! (`<machine>-<interface>-ipv4|ipv6`, controlled by the machine so it goes away with it)
//! pointing at `poolRef`; the IPAM provider answers with an `IPAddress` and the claim's
//! `status.addressRef`. The kit resolves the claims before the step that builds the guest's
//! seed ([`crate::machine`]) and hands the allocations to the backend, which writes them with
//! [`network_config`].

use std::collections::BTreeMap;

use banlieue_api::common::{IpAddressing, IpAddressingMode, IpPoolReference, NetworkInterface};
use banlieue_api::infrastructure::kinds::InfraMachine;
use banlieue_capi::contract::ContractRef;
use banlieue_capi::ipam::{Allocation, allocated_address_name, new_claim, parse_allocation};
use banlieue_capi::{IpAddress, IpAddressClaim};
use banlieue_cloudinit::{Ethernet, MacMatch, NameServers, NetworkConfig, Route};
use kube::api::PostParams;
use kube::{Api, ResourceExt};

/// Condition reason while the IPAM provider has not allocated every claim yet.
pub const WAITING_FOR_IP_ADDRESS: &str = "WaitingForIPAddress";
/// Condition reason: an `IPAddress` the IPAM provider wrote cannot be used.
pub const IP_ADDRESS_INVALID: &str = "IPAddressInvalid";
/// Condition reason: the claims cannot be created or read (the API refused).
pub const IP_ADDRESS_CLAIM_FAILED: &str = "IPAddressClaimFailed";

/// Addresses allocated from pools, by (interface name, IPv6?).
pub type PoolAddresses = BTreeMap<(String, bool), Allocation>;

/// One address the machine needs from a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolRequest {
    /// Interface name (`net0`, `eth0`).
    pub interface: String,
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// The pool.
    pub pool: IpPoolReference,
}

/// The addresses `networks` asks pools for, in interface order, IPv4 before IPv6.
pub fn pool_requests(networks: &[NetworkInterface]) -> Vec<PoolRequest> {
    networks
        .iter()
        .flat_map(|n| [(n, false, n.ipv4.as_ref()), (n, true, n.ipv6.as_ref())])
        .filter_map(|(n, v6, a)| {
            let pool = a?.pool_ref.clone()?;
            Some(PoolRequest {
                interface: n.name.clone(),
                v6,
                pool,
            })
        })
        .collect()
}

/// Name of the claim of `machine` for `request` (`<machine>-<interface>-ipv4`).
pub fn claim_name(machine: &str, request: &PoolRequest) -> String {
    let family = if request.v6 { "ipv6" } else { "ipv4" };
    let suffix = format!("-{}-{family}", request.interface);
    let keep = 253usize.saturating_sub(suffix.len()).min(machine.len());
    format!("{}{suffix}", &machine[..keep])
}

/// What the machine's pools answered so far.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolState {
    /// Every requested address is allocated.
    Ready(PoolAddresses),
    /// Waiting for the IPAM provider (the message names the claims).
    Waiting(String),
}

/// Why the pool addresses cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// The API refused a read or a create.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The API's error.
        source: kube::Error,
    },
    /// What the IPAM provider wrote cannot be used (a human must look).
    #[error("{0}")]
    Invalid(String),
}

impl IpamError {
    fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let context = context.into();
        move |source| Self::Kube { context, source }
    }
}

/// Creates the missing claims of `machine` and reads their allocations. `cluster_name` is the
/// CAPI Cluster (or, standalone, the infra cluster) the claims are labelled with.
pub async fn resolve<M: InfraMachine>(
    client: &kube::Client,
    machine: &M,
    cluster_name: &str,
) -> Result<PoolState, IpamError> {
    let requests = pool_requests(machine.networks());
    if requests.is_empty() {
        return Ok(PoolState::Ready(PoolAddresses::new()));
    }
    let namespace = machine.namespace().unwrap_or_default();
    let claims: Api<IpAddressClaim> = Api::namespaced(client.clone(), &namespace);
    let addresses: Api<IpAddress> = Api::namespaced(client.clone(), &namespace);
    let owner = machine
        .controller_owner_ref(&())
        .ok_or_else(|| IpamError::Invalid(format!("the {} has no uid yet", M::kind(&()))))?;
    let mut allocated = PoolAddresses::new();
    let mut waiting = Vec::new();
    for request in &requests {
        let name = claim_name(&machine.name_any(), request);
        let read = || IpamError::kube(format!("reading IPAddressClaim {name}"));
        let claim = match claims.get_opt(&name).await.map_err(read())? {
            Some(claim) => claim,
            None => {
                let pool = ContractRef::new(
                    request.pool.api_group.clone(),
                    request.pool.kind.clone(),
                    request.pool.name.clone(),
                );
                let claim = new_claim(&name, &namespace, cluster_name, pool, owner.clone());
                match claims.create(&PostParams::default(), &claim).await {
                    Ok(c) => c,
                    Err(kube::Error::Api(e)) if e.code == 409 => claims.get(&name).await.map_err(read())?,
                    Err(e) => return Err(IpamError::kube(format!("creating IPAddressClaim {name}"))(e)),
                }
            }
        };
        // A claim of an earlier object of the same name (not yet garbage-collected) is not
        // this machine's: its address goes away with it.
        let uid = machine.uid();
        let controller = claim
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true));
        if controller.is_some_and(|o| Some(&o.uid) != uid.as_ref()) {
            waiting.push(format!("{name} (still held by an earlier object of this name)"));
            continue;
        }
        let Some(address_name) = allocated_address_name(&claim) else {
            waiting.push(name);
            continue;
        };
        let Some(ip) = addresses
            .get_opt(address_name)
            .await
            .map_err(IpamError::kube(format!("reading IPAddress {address_name}")))?
        else {
            waiting.push(name);
            continue;
        };
        let allocation = parse_allocation(&ip).map_err(|e| IpamError::Invalid(e.to_string()))?;
        if allocation.address.is_ipv6() != request.v6 {
            return Err(IpamError::Invalid(format!(
                "IPAddress {address_name} for claim {name} is of the wrong family"
            )));
        }
        allocated.insert((request.interface.clone(), request.v6), allocation);
    }
    if waiting.is_empty() {
        Ok(PoolState::Ready(allocated))
    } else {
        Ok(PoolState::Waiting(format!(
            "waiting for the IPAM provider to allocate IPAddressClaim(s) {}",
            waiting.join(", ")
        )))
    }
}

/// The IPv4 default route through `gateway`.
fn default_route(gateway: String) -> Route {
    Route {
        to: "0.0.0.0/0".to_owned(),
        via: gateway,
    }
}

/// The default gateway of one family: IPv4 as a route to `0.0.0.0/0`; IPv6 as `gateway6`, since
/// cloud-init up to 22.4 (Debian bookworm's) renders a route to `::/0` as `::/64` for ifupdown
/// and networkd (the route's prefix 0 is lost), while `gateway6` renders as a default route on
/// every renderer.
fn set_gateway(eth: &mut Ethernet, v6: bool, gateway: String) {
    if v6 {
        eth.gateway6 = Some(gateway);
    } else {
        eth.routes.push(default_route(gateway));
    }
}

/// One family of one interface into `eth`.
fn family_config(
    eth: &mut Ethernet,
    addressing: &IpAddressing,
    v6: bool,
    nic: &str,
    pool: &PoolAddresses,
) -> Result<(), String> {
    match addressing.mode {
        IpAddressingMode::DHCP if v6 => eth.dhcp6 = Some(true),
        IpAddressingMode::DHCP => eth.dhcp4 = Some(true),
        IpAddressingMode::Static => {
            eth.addresses.extend(addressing.addresses.iter().cloned());
            if let Some(gw) = &addressing.gateway {
                set_gateway(eth, v6, gw.clone());
            }
        }
        IpAddressingMode::Pool => {
            let a = pool.get(&(nic.to_owned(), v6)).ok_or_else(|| {
                format!("{nic}: no address from the IPAM pool yet (IPAddressClaim not allocated)")
            })?;
            eth.addresses.push(format!("{}/{}", a.address, a.prefix));
            if let Some(gw) = a.gateway {
                set_gateway(eth, v6, gw.to_string());
            }
        }
    }
    Ok(())
}

/// The `network-config` v2 of `networks`: one ethernet per interface, keyed by its name and
/// matched by the MAC `mac` gives it (from its position in `networks` and itself) and renamed to
/// the key (`None`: the guest's interface of that name). What cloud-init makes of it is tested
/// against the real cloud-init (`providers/kit/tests/real_cloud_init.rs`). IPv4 is DHCP unless
/// said otherwise; IPv6 is written only when set. `pool` holds the addresses allocated from IPAM
/// pools ([`resolve`]). `Err`: why the configuration cannot be written yet.
pub fn network_config(
    networks: &[NetworkInterface],
    mac: impl Fn(usize, &NetworkInterface) -> Result<Option<String>, String>,
    pool: &PoolAddresses,
) -> Result<NetworkConfig, String> {
    let mut ethernets = BTreeMap::new();
    for (i, net) in networks.iter().enumerate() {
        let match_mac = mac(i, net)?.map(|m| MacMatch {
            macaddress: m.to_ascii_lowercase(),
        });
        let mut eth = Ethernet {
            // Matched by MAC, the interface is renamed to its key: cloud-init renames only for
            // `set-name`, and its ifupdown and networkd renderers configure the key's name.
            set_name: match_mac.as_ref().map(|_| net.name.clone()),
            match_mac,
            mtu: net.mtu,
            ..Ethernet::default()
        };
        let ipv4 = net.ipv4.clone().unwrap_or_default();
        family_config(&mut eth, &ipv4, false, &net.name, pool)?;
        if let Some(v6) = &net.ipv6 {
            family_config(&mut eth, v6, true, &net.name, pool)?;
        }
        if !net.dns_servers.is_empty() {
            eth.nameservers = Some(NameServers {
                addresses: net.dns_servers.clone(),
                search: Vec::new(),
            });
        }
        ethernets.insert(net.name.clone(), eth);
    }
    Ok(NetworkConfig::new(ethernets))
}

/// Whether `networks` asks for anything DHCP on the first interface would not give: a second
/// interface, a static or pool address, IPv6, an MTU or DNS servers (else the guest's default,
/// cloud-init's fallback of DHCP on one interface, is enough and no `network-config` needs to
/// be written).
pub fn needs_network_config(networks: &[NetworkInterface]) -> bool {
    networks.len() > 1
        || networks.iter().any(|n| {
            n.ipv4.as_ref().is_some_and(|a| a.mode != IpAddressingMode::DHCP)
                || n.ipv6.is_some()
                || n.mtu.is_some()
                || !n.dns_servers.is_empty()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn pool(name: &str) -> IpPoolReference {
        IpPoolReference {
            api_group: "ipam.cluster.x-k8s.io".into(),
            kind: "InClusterIPPool".into(),
            name: name.into(),
        }
    }

    fn addressing(p: Option<&str>) -> Option<IpAddressing> {
        Some(IpAddressing {
            mode: if p.is_some() {
                IpAddressingMode::Pool
            } else {
                IpAddressingMode::DHCP
            },
            pool_ref: p.map(pool),
            ..Default::default()
        })
    }

    fn two_interfaces() -> Vec<NetworkInterface> {
        vec![
            NetworkInterface {
                ipv4: addressing(None),
                ..NetworkInterface::dhcp("net0", "vmbr0")
            },
            NetworkInterface {
                ipv4: addressing(Some("v4")),
                ipv6: addressing(Some("v6")),
                ..NetworkInterface::dhcp("net1", "vmbr1")
            },
        ]
    }

    #[test]
    fn every_pool_interface_and_family_is_one_claim() {
        let requests = pool_requests(&two_interfaces());
        assert_eq!(
            requests,
            vec![
                PoolRequest {
                    interface: "net1".into(),
                    v6: false,
                    pool: pool("v4")
                },
                PoolRequest {
                    interface: "net1".into(),
                    v6: true,
                    pool: pool("v6")
                },
            ]
        );
        assert_eq!(claim_name("m1", &requests[0]), "m1-net1-ipv4");
        assert_eq!(claim_name("m1", &requests[1]), "m1-net1-ipv6");
        assert!(claim_name(&"x".repeat(260), &requests[0]).len() <= 253);
    }

    #[test]
    fn static_pool_and_dhcp_addresses_become_one_ethernet_each() {
        let mut networks = two_interfaces();
        networks[0].ipv4 = Some(IpAddressing {
            mode: IpAddressingMode::Static,
            addresses: vec!["192.0.2.10/24".into()],
            gateway: Some("192.0.2.1".into()),
            pool_ref: None,
        });
        networks[0].dns_servers = vec!["192.0.2.53".into()];
        let mut pool_addresses = PoolAddresses::new();
        pool_addresses.insert(
            ("net1".into(), false),
            Allocation {
                address: "198.51.100.7".parse().unwrap(),
                prefix: 24,
                gateway: Some("198.51.100.1".parse().unwrap()),
            },
        );
        // The IPv6 claim is not answered yet: no configuration, and the message says which.
        let err = network_config(&networks, |_, _| Ok(None), &pool_addresses).unwrap_err();
        assert!(err.contains("net1: no address from the IPAM pool yet"), "{err}");

        pool_addresses.insert(
            ("net1".into(), true),
            Allocation {
                address: "2001:db8::7".parse().unwrap(),
                prefix: 64,
                gateway: None,
            },
        );
        let config = network_config(
            &networks,
            |_, n| Ok((n.name == "net0").then(|| "52:54:00:AA:BB:CC".to_owned())),
            &pool_addresses,
        )
        .unwrap();
        let net0 = &config.ethernets["net0"];
        assert_eq!(net0.match_mac.as_ref().unwrap().macaddress, "52:54:00:aa:bb:cc");
        assert_eq!(net0.addresses, vec!["192.0.2.10/24".to_owned()]);
        assert_eq!(net0.routes, vec![default_route("192.0.2.1".into())]);
        assert_eq!(net0.dhcp4, None);
        assert_eq!(
            net0.nameservers.as_ref().unwrap().addresses,
            vec!["192.0.2.53".to_owned()]
        );
        let net1 = &config.ethernets["net1"];
        assert_eq!(net1.match_mac, None);
        assert_eq!(
            net1.addresses,
            vec!["198.51.100.7/24".to_owned(), "2001:db8::7/64".to_owned()]
        );
        assert_eq!(net1.routes, vec![default_route("198.51.100.1".into())]);
    }

    #[test]
    fn plain_dhcp_needs_no_network_config() {
        assert!(!needs_network_config(&[NetworkInterface::dhcp(
            "eth0", "default"
        )]));
        // A second interface is not brought up by cloud-init's fallback.
        assert!(needs_network_config(&[
            NetworkInterface::dhcp("eth0", "default"),
            NetworkInterface::dhcp("eth1", "default"),
        ]));
        assert!(needs_network_config(&two_interfaces()));
        let mtu = NetworkInterface {
            mtu: Some(9000),
            ..NetworkInterface::dhcp("eth0", "default")
        };
        assert!(needs_network_config(&[mtu]));
    }
}
