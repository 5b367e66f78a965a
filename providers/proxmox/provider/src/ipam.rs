//! CAPI IPAM: a network interface whose `ipv4`/`ipv6` has `mode: Pool` gets its address from an
//! IPAM provider. Per such interface and family the machine creates an `IPAddressClaim`
//! (`<machine>-<interface>-ipv4|ipv6`, owned by the ProxmoxMachine so it goes away with it)
//! pointing at `poolRef`; the IPAM provider answers with an `IPAddress` and the claim's
//! `status.addressRef`. The address, prefix and gateway are written into the seed's
//! `network-config` as a static configuration (Proxmox VE's own `ipconfigN` is not used: the
//! provider delivers its own NoCloud seed).

use std::collections::BTreeMap;

use banlieue_api::common::IpPoolReference;
use banlieue_api::infrastructure::{ProxmoxMachine, ProxmoxMachineSpec};
use banlieue_capi::contract::ContractRef;
use banlieue_capi::ipam::{Allocation, allocated_address_name, new_claim, parse_allocation};
use banlieue_capi::{IpAddress, IpAddressClaim};
use kube::api::PostParams;
use kube::{Api, Resource, ResourceExt};

use crate::error::{Error, Result};

/// Addresses allocated from pools, by (interface name, IPv6?).
pub type PoolAddresses = BTreeMap<(String, bool), Allocation>;

/// One address the machine needs from a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolRequest {
    /// Interface name (`net0`).
    pub interface: String,
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// The pool.
    pub pool: IpPoolReference,
}

/// The addresses `spec` asks pools for, in interface order, IPv4 before IPv6.
pub fn pool_requests(spec: &ProxmoxMachineSpec) -> Vec<PoolRequest> {
    spec.networks
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
    /// Waiting for the IPAM provider (message names the claims).
    Waiting(String),
}

/// Creates the missing claims of `pm` and reads their allocations. `cluster_name` is the CAPI
/// Cluster (or, standalone, the ProxmoxCluster) the claims are labelled with.
pub async fn resolve(client: &kube::Client, pm: &ProxmoxMachine, cluster_name: &str) -> Result<PoolState> {
    let requests = pool_requests(&pm.spec);
    if requests.is_empty() {
        return Ok(PoolState::Ready(PoolAddresses::new()));
    }
    let namespace = pm.namespace().unwrap_or_default();
    let claims: Api<IpAddressClaim> = Api::namespaced(client.clone(), &namespace);
    let addresses: Api<IpAddress> = Api::namespaced(client.clone(), &namespace);
    let owner = pm
        .controller_owner_ref(&())
        .ok_or_else(|| Error::Bootstrap("the ProxmoxMachine has no uid yet".into()))?;
    let mut allocated = PoolAddresses::new();
    let mut waiting = Vec::new();
    for request in &requests {
        let name = claim_name(&pm.name_any(), request);
        let claim = match claims
            .get_opt(&name)
            .await
            .map_err(|e| Error::kube(format!("reading IPAddressClaim {name}"), e))?
        {
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
                    Err(kube::Error::Api(e)) if e.code == 409 => claims
                        .get(&name)
                        .await
                        .map_err(|e| Error::kube(format!("reading IPAddressClaim {name}"), e))?,
                    Err(e) => return Err(Error::kube(format!("creating IPAddressClaim {name}"), e)),
                }
            }
        };
        let Some(address_name) = allocated_address_name(&claim) else {
            waiting.push(name);
            continue;
        };
        let Some(ip) = addresses
            .get_opt(address_name)
            .await
            .map_err(|e| Error::kube(format!("reading IPAddress {address_name}"), e))?
        else {
            waiting.push(name);
            continue;
        };
        let allocation = parse_allocation(&ip).map_err(|e| Error::Bootstrap(e.to_string()))?;
        if allocation.address.is_ipv6() != request.v6 {
            return Err(Error::Bootstrap(format!(
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

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::common::{Cpu, IpAddressing, IpAddressingMode, NetworkInterface};
    use banlieue_api::infrastructure::ProxmoxTemplateSource;
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

    #[test]
    fn every_pool_interface_and_family_is_one_claim() {
        let spec = ProxmoxMachineSpec {
            provider_id: None,
            provider_ref: None,
            source: ProxmoxTemplateSource::default(),
            target_node: None,
            allowed_nodes: vec![],
            storage: None,
            clone_mode: None,
            pool: None,
            cpu: Cpu::cores(1),
            memory_mib: 512,
            disks: vec![],
            networks: vec![
                NetworkInterface {
                    ipv4: addressing(None),
                    ..NetworkInterface::dhcp("net0", "vmbr0")
                },
                NetworkInterface {
                    ipv4: addressing(Some("v4")),
                    ipv6: addressing(Some("v6")),
                    ..NetworkInterface::dhcp("net1", "vmbr1")
                },
            ],
            tags: vec![],
            vmid_range: None,
            readiness_checks: None,
            power_state: None,
        };
        let requests = pool_requests(&spec);
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
}
