//! Hypervisor-neutral cloud-init NoCloud seeds.
//!
//! Every banlieue provider delivers bootstrap data the same way: a NoCloud seed image (volume id
//! `cidata`) with `user-data` (the bytes of the bootstrap Secret's `value`, untouched), `meta-data`
//! (instance-id and hostname) and an optional `network-config` (version 2). This crate renders
//! those files and the ISO 9660 image that carries them, and reads seeds back (for simulators and
//! tests). What cloud-init parses is written by [`yaml11`], so YAML 1.1 (cloud-init's PyYAML)
//! reads every string as a string.

pub mod iso9660;
mod network;
pub mod yaml11;

use serde::{Deserialize, Serialize};

pub use iso9660::IsoFile;
pub use network::{Ethernet, MacMatch, NameServers, NetworkConfig, Route};

/// The volume id cloud-init's NoCloud datasource looks for.
pub const SEED_VOLUME_ID: &str = "cidata";
/// File names inside a NoCloud seed.
pub const USER_DATA: &str = "user-data";
pub const META_DATA: &str = "meta-data";
pub const NETWORK_CONFIG: &str = "network-config";

/// Errors from building or reading a seed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid ISO 9660 image: {0}")]
    InvalidIso(String),
    #[error("invalid seed: {0}")]
    InvalidSeed(String),
    #[error("cannot render {file}")]
    Render {
        file: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot parse {file} of the seed")]
    Parse {
        file: &'static str,
        #[source]
        source: serde_yaml::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The `meta-data` file: what identifies the instance to cloud-init.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct MetaData {
    /// cloud-init runs its per-instance modules once per instance id.
    pub instance_id: String,
    /// The guest's hostname.
    pub local_hostname: String,
}

/// Everything a NoCloud seed carries.
#[derive(Debug, Clone, PartialEq)]
pub struct NoCloudSeed {
    /// Raw user data (cloud-config, a script, or a MIME multipart), delivered byte for byte.
    pub user_data: Vec<u8>,
    pub meta_data: MetaData,
    /// Omitted from the image when `None` (the guest then falls back to DHCP on its first NIC).
    pub network_config: Option<NetworkConfig>,
}

impl NoCloudSeed {
    /// The seed's files, rendered.
    pub fn files(&self) -> Result<Vec<IsoFile>> {
        if self.meta_data.instance_id.trim().is_empty() {
            return Err(Error::InvalidSeed(
                "meta-data instance-id must not be empty".into(),
            ));
        }
        let meta_data = yaml11::to_string(&self.meta_data).map_err(|source| Error::Render {
            file: META_DATA,
            source,
        })?;
        let mut files = vec![
            IsoFile {
                name: USER_DATA.into(),
                data: self.user_data.clone(),
            },
            IsoFile {
                name: META_DATA.into(),
                data: meta_data.into_bytes(),
            },
        ];
        if let Some(network) = &self.network_config {
            files.push(IsoFile {
                name: NETWORK_CONFIG.into(),
                data: network.to_yaml()?.into_bytes(),
            });
        }
        Ok(files)
    }

    /// The seed as an ISO 9660 + Joliet image with volume id `cidata`. Deterministic.
    pub fn to_iso(&self) -> Result<Vec<u8>> {
        iso9660::write_image(SEED_VOLUME_ID, &self.files()?)
    }
}

/// The files found in a seed image, as raw text (what a guest would read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeedFiles {
    pub user_data: Option<Vec<u8>>,
    pub meta_data: Option<String>,
    pub network_config: Option<String>,
}

impl SeedFiles {
    /// Reads the NoCloud files from an ISO image made by this crate, `genisoimage` or `xorriso`.
    pub fn from_iso(image: &[u8]) -> Result<Self> {
        let mut seed = SeedFiles::default();
        for file in iso9660::read_root_files(image)? {
            let text = || String::from_utf8_lossy(&file.data).into_owned();
            match file.name.as_str() {
                USER_DATA => seed.user_data = Some(file.data.clone()),
                META_DATA => seed.meta_data = Some(text()),
                NETWORK_CONFIG => seed.network_config = Some(text()),
                _ => {}
            }
        }
        Ok(seed)
    }

    /// Parses `meta-data`, if present.
    pub fn parsed_meta_data(&self) -> Result<Option<MetaData>> {
        self.meta_data
            .as_deref()
            .map(|text| {
                serde_yaml::from_str(text).map_err(|source| Error::Parse {
                    file: META_DATA,
                    source,
                })
            })
            .transpose()
    }

    /// Parses `network-config`, if present.
    pub fn parsed_network_config(&self) -> Result<Option<NetworkConfig>> {
        self.network_config
            .as_deref()
            .map(|text| {
                serde_yaml::from_str(text).map_err(|source| Error::Parse {
                    file: NETWORK_CONFIG,
                    source,
                })
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn seed() -> NoCloudSeed {
        let mut ethernets = BTreeMap::new();
        ethernets.insert(
            "eth0".to_string(),
            Ethernet {
                match_mac: Some(MacMatch {
                    macaddress: "bc:24:11:00:00:01".into(),
                }),
                set_name: Some("eth0".into()),
                dhcp4: Some(false),
                addresses: vec!["10.0.0.5/24".into()],
                routes: vec![Route {
                    to: "default".into(),
                    via: "10.0.0.1".into(),
                }],
                nameservers: Some(NameServers {
                    addresses: vec!["10.0.0.1".into()],
                    search: vec![],
                }),
                ..Ethernet::default()
            },
        );
        NoCloudSeed {
            user_data: b"#cloud-config\nruncmd:\n  - [echo, hi]\n".to_vec(),
            meta_data: MetaData {
                instance_id: "uid-1234".into(),
                local_hostname: "worker-0".into(),
            },
            network_config: Some(NetworkConfig::new(ethernets)),
        }
    }

    #[test]
    fn seed_round_trips_through_the_iso() {
        let seed = seed();
        let files = SeedFiles::from_iso(&seed.to_iso().unwrap()).unwrap();
        assert_eq!(files.user_data.as_deref(), Some(seed.user_data.as_slice()));
        assert_eq!(files.parsed_meta_data().unwrap(), Some(seed.meta_data.clone()));
        assert_eq!(files.parsed_network_config().unwrap(), seed.network_config);
    }

    #[test]
    fn meta_data_uses_cloud_init_key_names() {
        let files = seed().files().unwrap();
        let meta = String::from_utf8(files[1].data.clone()).unwrap();
        assert_eq!(meta, "instance-id: uid-1234\nlocal-hostname: worker-0\n");
        let mut on = seed();
        on.meta_data.local_hostname = "on".into();
        let meta = String::from_utf8(on.files().unwrap()[1].data.clone()).unwrap();
        assert_eq!(
            meta, "instance-id: uid-1234\nlocal-hostname: \"on\"\n",
            "YAML 1.1 reads on as true"
        );
    }

    #[test]
    fn network_config_is_omitted_when_absent() {
        let mut seed = seed();
        seed.network_config = None;
        let files = SeedFiles::from_iso(&seed.to_iso().unwrap()).unwrap();
        assert_eq!(files.network_config, None);
        assert!(files.meta_data.is_some());
    }

    #[test]
    fn empty_instance_id_is_rejected() {
        let mut seed = seed();
        seed.meta_data.instance_id = " ".into();
        assert!(matches!(seed.to_iso(), Err(Error::InvalidSeed(_))));
    }
}
