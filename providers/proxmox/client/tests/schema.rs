//! Schema tests: every request the client sends (recorded by its request hook while the contract
//! scenarios run against the simulator) names a path and method that exist in the official PVE 9.1
//! schema and passes only declared parameters with values of the declared type/format; and the
//! scenarios exercise every endpoint the client offers.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use banlieue_pve_client::RequestRecord;
use banlieue_pve_sim::schema::ApiSchema;
use common::{scenarios, target};
use serde_json::Value;

/// Every endpoint the client can call, as `(method, schema template)`.
const CLIENT_ENDPOINTS: &[(&str, &str)] = &[
    ("GET", "/version"),
    ("POST", "/access/ticket"),
    ("GET", "/nodes"),
    ("GET", "/nodes/{node}/status"),
    ("GET", "/cluster/resources"),
    ("GET", "/cluster/nextid"),
    ("GET", "/nodes/{node}/qemu"),
    ("GET", "/nodes/{node}/qemu/{vmid}/status/current"),
    ("GET", "/nodes/{node}/qemu/{vmid}/config"),
    ("POST", "/nodes/{node}/qemu/{vmid}/config"),
    ("PUT", "/nodes/{node}/qemu/{vmid}/config"),
    ("POST", "/nodes/{node}/qemu/{vmid}/clone"),
    ("PUT", "/nodes/{node}/qemu/{vmid}/resize"),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/start"),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/stop"),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/shutdown"),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/reboot"),
    ("DELETE", "/nodes/{node}/qemu/{vmid}"),
    ("GET", "/nodes/{node}/tasks/{upid}/status"),
    ("GET", "/nodes/{node}/tasks/{upid}/log"),
    ("GET", "/nodes/{node}/storage"),
    ("GET", "/nodes/{node}/storage/{storage}/content"),
    ("POST", "/nodes/{node}/storage/{storage}/upload"),
    ("DELETE", "/nodes/{node}/storage/{storage}/content/{volume}"),
    ("GET", "/pools"),
    ("GET", "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces"),
];

/// Checks one recorded request; returns the schema template it hit.
fn check(schema: &ApiSchema, record: &RequestRecord) -> Result<String, String> {
    let method = record.method.as_str();
    let endpoint = schema
        .find(method, &record.path)
        .map_err(|e| format!("{method} {}: {e}", record.path))?;
    let mut params: BTreeMap<String, Value> = endpoint
        .path_params
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    for (k, v) in &record.params {
        if params.insert(k.clone(), Value::String(v.clone())).is_some() {
            return Err(format!("{method} {}: parameter {k} sent twice", record.path));
        }
    }
    schema
        .validate(endpoint.info, &params)
        .map_err(|errors| format!("{method} {} {:?}: {errors:?}", record.path, record.params))?;
    Ok(endpoint.template.to_owned())
}

#[tokio::test]
async fn every_request_the_client_sends_is_declared_in_the_schema() {
    let schema =
        ApiSchema::load_default().expect("PVE API schema (providers/proxmox/sim/schema) is readable");
    let t = target::sim_target().await;
    scenarios::all(&t).await;

    let sim = t.sim.as_ref().unwrap();
    let (builder, ticket_records) =
        target::recording(target::sim_builder(sim).password(sim.username(), sim.password()));
    builder
        .build()
        .unwrap()
        .update_vm_config(&t.node, t.template, &Default::default())
        .await
        .unwrap();

    let mut records = t.records();
    records.extend(ticket_records.lock().unwrap().iter().cloned());
    assert!(
        records.len() > 50,
        "the scenarios made requests: {}",
        records.len()
    );

    let mut failures = Vec::new();
    let mut hit = BTreeSet::new();
    for record in &records {
        match check(&schema, record) {
            Ok(template) => {
                hit.insert((record.method.to_string(), template));
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "requests not matching the schema:\n{}",
        failures.join("\n")
    );

    let missing: Vec<_> = CLIENT_ENDPOINTS
        .iter()
        .filter(|(m, p)| !hit.contains(&(m.to_string(), p.to_string())))
        .collect();
    assert!(
        missing.is_empty(),
        "client endpoints not exercised by the scenarios: {missing:?}"
    );
    let unexpected: Vec<_> = hit
        .iter()
        .filter(|(m, p)| !CLIENT_ENDPOINTS.contains(&(m.as_str(), p.as_str())))
        .collect();
    assert!(
        unexpected.is_empty(),
        "endpoints missing from CLIENT_ENDPOINTS: {unexpected:?}"
    );
}

#[test]
fn the_checker_rejects_what_pve_would_reject() {
    let schema =
        ApiSchema::load_default().expect("PVE API schema (providers/proxmox/sim/schema) is readable");
    let record = |method: http::Method, path: &str, params: &[(&str, &str)]| RequestRecord {
        method,
        path: path.into(),
        params: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        attempt: 0,
    };
    assert!(
        check(
            &schema,
            &record(http::Method::GET, "/nodes/pve1/qemu/100/nope", &[])
        )
        .is_err()
    );
    assert!(check(&schema, &record(http::Method::PATCH, "/version", &[])).is_err());
    assert!(
        check(
            &schema,
            &record(http::Method::GET, "/cluster/resources", &[("type", "vms")])
        )
        .is_err()
    );
    assert!(
        check(
            &schema,
            &record(http::Method::GET, "/cluster/nextid", &[("bogus", "1")])
        )
        .is_err()
    );
    assert!(
        check(
            &schema,
            &record(http::Method::POST, "/nodes/pve1/qemu/100/clone", &[])
        )
        .is_err()
    );
    assert!(
        check(
            &schema,
            &record(
                http::Method::POST,
                "/nodes/pve1/qemu/100/clone",
                &[("newid", "101"), ("full", "true")]
            )
        )
        .is_err()
    );
    assert_eq!(
        check(
            &schema,
            &record(
                http::Method::POST,
                "/nodes/pve1/qemu/100/clone",
                &[("newid", "101"), ("full", "1")]
            )
        ),
        Ok("/nodes/{node}/qemu/{vmid}/clone".to_owned())
    );
}
