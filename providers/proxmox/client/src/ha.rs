//! High Availability: HA resources (`/cluster/ha/resources`) and the rules they join
//! (`/cluster/ha/rules`, Proxmox VE 9). Reading needs `Sys.Audit` on `/`, writing `Sys.Console`.

use http::Method;
use serde::Deserialize;

use crate::client::{Client, Params, path_segment as seg};
use crate::de;
use crate::error::Result;

/// The HA resource id of a VM: `vm:<vmid>`.
pub fn vm_sid(vmid: u32) -> String {
    format!("vm:{vmid}")
}

/// An HA resource as `GET /cluster/ha/resources/{sid}` returns it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct HaResource {
    /// `vm:<vmid>` or `ct:<vmid>`.
    pub sid: String,
    /// Requested state: `started`, `stopped`, `disabled`, `ignored` (`enabled` reads back as
    /// `started`).
    #[serde(default, deserialize_with = "de::opt_string")]
    pub state: Option<String>,
    /// Description.
    #[serde(default, deserialize_with = "de::opt_string")]
    pub comment: Option<String>,
    /// Restarts on the same node after a failed start (PVE's default 1 when absent).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub max_restart: Option<u64>,
    /// Relocations to another node after the restarts failed (PVE's default 1 when absent).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub max_relocate: Option<u64>,
    /// Digest of the whole resources configuration.
    #[serde(default)]
    pub digest: Option<String>,
}

/// What to create or change on an HA resource; `None` leaves a setting as it is (at creation:
/// PVE's default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HaResourceSettings {
    /// Requested state (`started`, `stopped`, …).
    pub state: Option<String>,
    /// Description.
    pub comment: Option<String>,
    /// `max_restart`.
    pub max_restart: Option<u32>,
    /// `max_relocate`.
    pub max_relocate: Option<u32>,
}

impl HaResourceSettings {
    fn params(&self) -> Params {
        Params::new()
            .opt("state", self.state.as_deref())
            .opt("comment", self.comment.as_deref())
            .opt("max_restart", self.max_restart)
            .opt("max_relocate", self.max_relocate)
    }
}

/// An HA rule as `GET /cluster/ha/rules/{rule}` returns it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct HaRule {
    /// Rule id.
    pub rule: String,
    /// `node-affinity` or `resource-affinity`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The resources it applies to, comma-separated (`vm:100,vm:101`).
    #[serde(default, deserialize_with = "de::opt_string")]
    pub resources: Option<String>,
    /// Digest of the whole rules configuration.
    #[serde(default)]
    pub digest: Option<String>,
}

impl HaRule {
    /// The resource ids the rule applies to.
    pub fn resource_ids(&self) -> Vec<&str> {
        self.resources
            .as_deref()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect()
    }
}

/// What `POST /cluster/ha/resources/{sid}/migrate` answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct HaMigration {
    /// The resource to migrate.
    pub sid: String,
    /// Where to.
    #[serde(rename = "requested-node")]
    pub requested_node: String,
}

impl Client {
    /// `GET /cluster/ha/resources/{sid}`; [`crate::ErrorClass::NotFound`] when it is not an HA
    /// resource (PVE: `no such resource`).
    pub async fn ha_resource(&self, sid: &str) -> Result<HaResource> {
        self.call(
            Method::GET,
            &format!("/cluster/ha/resources/{}", seg(sid)),
            Params::new(),
        )
        .await
    }

    /// `POST /cluster/ha/resources`: makes `sid` an HA resource.
    pub async fn create_ha_resource(&self, sid: &str, settings: &HaResourceSettings) -> Result<()> {
        self.call(
            Method::POST,
            "/cluster/ha/resources",
            settings.params().set("sid", sid),
        )
        .await
    }

    /// `PUT /cluster/ha/resources/{sid}`.
    pub async fn update_ha_resource(&self, sid: &str, settings: &HaResourceSettings) -> Result<()> {
        self.call(
            Method::PUT,
            &format!("/cluster/ha/resources/{}", seg(sid)),
            settings.params(),
        )
        .await
    }

    /// `DELETE /cluster/ha/resources/{sid}` (with `purge`, PVE's default: it leaves its rules,
    /// a rule left without resources is deleted).
    pub async fn delete_ha_resource(&self, sid: &str) -> Result<()> {
        self.call(
            Method::DELETE,
            &format!("/cluster/ha/resources/{}", seg(sid)),
            Params::new(),
        )
        .await
    }

    /// `POST /cluster/ha/resources/{sid}/migrate`: asks the HA manager to move it (online).
    pub async fn migrate_ha_resource(&self, sid: &str, node: &str) -> Result<HaMigration> {
        self.call(
            Method::POST,
            &format!("/cluster/ha/resources/{}/migrate", seg(sid)),
            Params::new().set("node", node),
        )
        .await
    }

    /// `GET /cluster/ha/rules/{rule}`; [`crate::ErrorClass::NotFound`] when there is none.
    pub async fn ha_rule(&self, rule: &str) -> Result<HaRule> {
        self.call(
            Method::GET,
            &format!("/cluster/ha/rules/{}", seg(rule)),
            Params::new(),
        )
        .await
    }

    /// `PUT /cluster/ha/rules/{rule}`: the rule applies to `resources` from now on (only if
    /// the rules configuration still has `digest`).
    pub async fn set_ha_rule_resources(&self, rule: &HaRule, resources: &[String]) -> Result<()> {
        let params = Params::new()
            .set("type", &rule.kind)
            .set("resources", resources.join(","))
            .opt("digest", rule.digest.as_deref());
        self.call(
            Method::PUT,
            &format!("/cluster/ha/rules/{}", seg(&rule.rule)),
            params,
        )
        .await
    }
}
