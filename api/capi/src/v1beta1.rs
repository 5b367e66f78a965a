//! Hand-written types for the v1beta1 leftovers that CAPI's v1beta2 objects still carry.
//!
//! CAPI v1.14 keeps writing the old condition list under `status.deprecated.v1beta1.conditions`
//! for clients that have not moved to v1beta2. Its items are not `metav1.Condition`: they carry a
//! `severity` and may omit `reason` and `message`. kopium would map them to
//! [`k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition`] (lossy), so `generate.sh`
//! points those fields at [`Condition`] instead.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

/// A CAPI v1beta1 condition (`sigs.k8s.io/cluster-api/api/core/v1beta1.Condition`), as found in
/// `status.deprecated.v1beta1.conditions`. Read it only for compatibility; v1beta2 consumers use
/// `status.conditions`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Condition {
    /// type of condition in CamelCase or in foo.example.com/CamelCase.
    #[serde(rename = "type")]
    pub type_: String,
    /// status of the condition, one of True, False, Unknown.
    pub status: String,
    /// severity provides an explicit classification of Reason code (`Error`, `Warning`, `Info`);
    /// set only when `status` is False.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<String>,
    /// lastTransitionTime is the last time the condition transitioned from one status to another.
    #[serde(rename = "lastTransitionTime")]
    pub last_transition_time: Time,
    /// reason is the reason for the condition's last transition in CamelCase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// message is a human readable message indicating details about the transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
