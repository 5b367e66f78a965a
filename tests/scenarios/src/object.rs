//! Reading the CAPI contract fields of any infra object (`spec.providerID`,
//! `status.initialization.provisioned`, `status.addresses`, `status.failureDomain`,
//! `status.conditions`) from its JSON. Pure.

use serde_json::Value;

/// A `metav1.Condition`'s interesting part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cond {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Reason.
    pub reason: String,
    /// Message.
    pub message: String,
}

/// `status.initialization.provisioned == true`.
pub fn provisioned(obj: &Value) -> bool {
    obj.pointer("/status/initialization/provisioned") == Some(&Value::Bool(true))
}

/// `spec.providerID`.
pub fn provider_id(obj: &Value) -> Option<&str> {
    obj.pointer("/spec/providerID").and_then(Value::as_str)
}

/// `status.failureDomain`.
pub fn failure_domain(obj: &Value) -> Option<&str> {
    obj.pointer("/status/failureDomain").and_then(Value::as_str)
}

/// `status.addresses[].address`.
pub fn addresses(obj: &Value) -> Vec<&str> {
    obj.pointer("/status/addresses")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|x| x["address"].as_str()).collect())
        .unwrap_or_default()
}

/// The condition of `type_` in `status.conditions`.
pub fn condition(obj: &Value, type_: &str) -> Option<Cond> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| Cond {
            status: c["status"].as_str().unwrap_or_default().to_owned(),
            reason: c["reason"].as_str().unwrap_or_default().to_owned(),
            message: c["message"].as_str().unwrap_or_default().to_owned(),
        })
}

/// Every condition in `status.conditions`.
pub fn conditions(obj: &Value) -> Vec<(String, Cond)> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|c| {
                    Some((
                        c["type"].as_str()?.to_owned(),
                        condition(obj, c["type"].as_str()?)?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `Ready` is `True`.
pub fn ready(obj: &Value) -> bool {
    condition(obj, "Ready").is_some_and(|c| c.status == "True")
}

/// `Paused` is `status`.
pub fn paused_is(obj: &Value, status: &str) -> bool {
    condition(obj, "Paused").is_some_and(|c| c.status == status)
}

/// Provisioned as CAPI's Machine controller requires it: `provisioned`, a providerID and at
/// least one address.
pub fn fully_provisioned(obj: &Value) -> bool {
    provisioned(obj) && provider_id(obj).is_some() && !addresses(obj).is_empty()
}

/// `status.observedGeneration` and every condition's `observedGeneration` (where set) equal
/// `metadata.generation`: the status describes the current spec.
pub fn observed_current(obj: &Value) -> bool {
    let generation = obj.pointer("/metadata/generation");
    generation.is_some()
        && obj.pointer("/status/observedGeneration") == generation
        && obj
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_none_or(|cs| {
                cs.iter()
                    .all(|c| c.get("observedGeneration").is_none_or(|g| Some(g) == generation))
            })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_contract_fields() {
        let obj = json!({
            "spec": {"providerID": "proxmox://x"},
            "status": {
                "initialization": {"provisioned": true},
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                "failureDomain": "pve2",
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "Provisioned", "message": ""},
                    {"type": "Paused", "status": "False", "reason": "NotPaused", "message": "m"},
                ],
            },
        });
        assert!(provisioned(&obj));
        assert!(fully_provisioned(&obj));
        assert_eq!(provider_id(&obj), Some("proxmox://x"));
        assert_eq!(failure_domain(&obj), Some("pve2"));
        assert_eq!(addresses(&obj), ["10.0.0.1"]);
        assert!(ready(&obj));
        assert!(paused_is(&obj, "False"));
        assert_eq!(
            condition(&obj, "Paused").map(|c| c.reason),
            Some("NotPaused".into())
        );
        assert_eq!(conditions(&obj).len(), 2);
    }

    #[test]
    fn observed_generation_of_status_and_conditions() {
        let current = json!({"metadata": {"generation": 2}, "status": {"observedGeneration": 2,
            "conditions": [{"type": "Ready", "observedGeneration": 2}, {"type": "Paused"}]}});
        assert!(observed_current(&current));
        let lagging = json!({"metadata": {"generation": 2}, "status": {"observedGeneration": 2,
            "conditions": [{"type": "Paused", "observedGeneration": 1}]}});
        assert!(!observed_current(&lagging));
        assert!(!observed_current(
            &json!({"metadata": {"generation": 2}, "status": {"observedGeneration": 1}})
        ));
    }

    #[test]
    fn absent_fields_are_not_provisioned() {
        let obj = json!({"spec": {}, "status": {"initialization": {"provisioned": false}}});
        assert!(!provisioned(&obj));
        assert!(!fully_provisioned(
            &json!({"spec": {"providerID": "a"}, "status": {
            "initialization": {"provisioned": true}}})
        ));
        assert_eq!(condition(&obj, "Ready"), None);
        assert!(!paused_is(&obj, "True"));
        assert!(conditions(&obj).is_empty());
    }
}
