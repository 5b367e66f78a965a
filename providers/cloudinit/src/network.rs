//! cloud-init `network-config` version 2 (the netplan-like format).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Error, NETWORK_CONFIG, Result};

/// `network-config` v2: ethernets keyed by the name the guest gives them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkConfig {
    /// Always 2.
    pub version: u8,
    pub ethernets: BTreeMap<String, Ethernet>,
}

impl NetworkConfig {
    pub fn new(ethernets: BTreeMap<String, Ethernet>) -> Self {
        NetworkConfig {
            version: 2,
            ethernets,
        }
    }

    pub fn to_yaml(&self) -> Result<String> {
        crate::yaml11::to_string(self).map_err(|source| Error::Render {
            file: NETWORK_CONFIG,
            source,
        })
    }
}

/// One ethernet device: matched by MAC, configured by DHCP or static addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Ethernet {
    #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
    pub match_mac: Option<MacMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp4: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp6: Option<bool>,
    /// Static addresses in CIDR notation (`10.0.0.5/24`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// The IPv6 default gateway (see the kit's `network` for why not a route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway6: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nameservers: Option<NameServers>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MacMatch {
    /// Lower-case, colon-separated MAC address.
    pub macaddress: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Destination in CIDR notation, or `default`.
    pub to: String,
    pub via: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameServers {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_netplan_v2_keys() {
        let mut ethernets = BTreeMap::new();
        ethernets.insert(
            "eth0".to_string(),
            Ethernet {
                match_mac: Some(MacMatch {
                    macaddress: "bc:24:11:00:00:01".into(),
                }),
                set_name: Some("eth0".into()),
                dhcp4: Some(true),
                ..Ethernet::default()
            },
        );
        let yaml = NetworkConfig::new(ethernets).to_yaml().unwrap();
        assert_eq!(
            yaml,
            "ethernets:\n  eth0:\n    dhcp4: true\n    match:\n      macaddress: \"bc:24:11:00:00:01\"\n    set-name: eth0\nversion: 2\n"
        );
    }
}
