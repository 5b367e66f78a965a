//! End-to-end tests of the simulator over real HTTPS with a raw client.

use std::time::{Duration, Instant};

use banlieue_pve_sim::probe::{Probe, ProbeAuth, ProbeError, ProbeResponse, encode_segment};
use banlieue_pve_sim::schema::{UNDECLARED, check_returns};
use banlieue_pve_sim::{FaultRule, SimConfig, SimHandle};
use bytes::Bytes;
use http::Method;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

type Form<'a> = &'a [(&'a str, &'a str)];
type RawBody = (&'static str, &'static [u8]);
type FormVec = Vec<(&'static str, &'static str)>;

async fn sim_with(edit: impl FnOnce(&mut SimConfig)) -> (SimHandle, Probe) {
    let mut cfg = SimConfig::fast();
    edit(&mut cfg);
    let sim = banlieue_pve_sim::start(cfg).await.expect("simulator starts");
    let probe = Probe::for_sim(&sim).expect("probe");
    (sim, probe)
}

/// Every test ends here: the server-side `returns` check must have found nothing.
async fn finish(sim: SimHandle) {
    assert_eq!(sim.returns_violations(), Vec::<String>::new());
    sim.shutdown().await;
}

async fn sim() -> (SimHandle, Probe) {
    sim_with(|_| {}).await
}

async fn get(p: &mut Probe, path: &str) -> ProbeResponse {
    p.call(Method::GET, path, &[]).await.expect("request")
}

async fn post(p: &mut Probe, path: &str, form: &[(&str, &str)]) -> ProbeResponse {
    p.call(Method::POST, path, form).await.expect("request")
}

/// A synchronous `PUT` that must succeed.
async fn put(p: &mut Probe, path: &str, form: &[(&str, &str)]) -> ProbeResponse {
    let r = p.call(Method::PUT, path, form).await.expect("request");
    assert_eq!(r.status, 200, "{r:?}");
    r
}

fn upid(r: &ProbeResponse) -> String {
    assert_eq!(r.status, 200, "{r:?}");
    r.data().as_str().expect("UPID string").to_owned()
}

async fn wait(p: &mut Probe, upid: &str) -> Value {
    let node = upid.split(':').nth(1).expect("node in UPID").to_owned();
    p.wait_task(&node, upid).await.expect("task status")["data"].clone()
}

async fn post_wait(p: &mut Probe, path: &str) -> Value {
    let id = upid(&post(p, path, &[]).await);
    wait(p, &id).await
}

async fn clone_template(p: &mut Probe, newid: &str, name: &str) -> String {
    let r = post(
        p,
        "/nodes/pve1/qemu/9000/clone",
        &[("newid", newid), ("name", name)],
    )
    .await;
    let id = upid(&r);
    let status = wait(p, &id).await;
    assert_eq!(status["exitstatus"], "OK", "{status}");
    id
}

fn assert_error(r: &ProbeResponse, status: u16, message: &str) {
    assert_eq!(
        (r.status, r.reason.as_str()),
        (status, message.lines().next().unwrap_or_default()),
        "{r:?}"
    );
    assert_eq!(r.body["message"], format!("{message}\n"), "{r:?}");
    assert_eq!(r.body["data"], Value::Null);
}

// ---------- schema checks over HTTP ----------

#[tokio::test]
async fn schema_violations_get_exact_pve_answers() {
    let (sim, mut p) = sim().await;

    let r = get(&mut p, "/nodes/pve1/nosuch").await;
    assert_error(&r, 501, "Method 'GET /nodes/pve1/nosuch' not implemented");
    // Declared in the schema but not simulated: the same answer, with the concrete path.
    let r = get(&mut p, "/nodes/pve1/lxc").await;
    assert_error(&r, 501, "Method 'GET /nodes/pve1/lxc' not implemented");
    let r = p.call(Method::PUT, "/version", &[]).await.unwrap();
    assert_error(&r, 501, "Method 'PUT /version' not implemented");

    let cases: &[(Form, &str, &str)] = &[
        (&[("newid", "101"), ("colour", "red")], "colour", UNDECLARED),
        (
            &[("newid", "abc")],
            "newid",
            "type check ('integer') failed - got 'abc'",
        ),
        (
            &[("newid", "101"), ("full", "true")],
            "full",
            "type check ('boolean') failed - got 'true'",
        ),
        (
            &[("newid", "101"), ("format", "vdi")],
            "format",
            "value 'vdi' does not have a value in the enumeration 'raw, qcow2, vmdk'",
        ),
        (
            &[("newid", "101"), ("name", "not_a dns name")],
            "name",
            "value does not look like a valid DNS name",
        ),
        (
            &[("newid", "42")],
            "newid",
            "value must have a minimum value of 100",
        ),
        (
            &[("name", "x")],
            "newid",
            "property is missing and it is not optional",
        ),
    ];
    for (form, key, msg) in cases {
        let r = post(&mut p, "/nodes/pve1/qemu/9000/clone", form).await;
        assert_error(&r, 400, "Parameter verification failed.");
        assert_eq!(r.body["errors"], json!({ *key: *msg }), "form {form:?}");
    }
    // Path parameters are validated too.
    let r = get(&mut p, "/nodes/pve1/qemu/abc/config").await;
    assert_eq!(
        r.body["errors"],
        json!({"vmid": "type check ('integer') failed - got 'abc'"})
    );
    // JSON booleans are fine, the string "true" is not.
    let r = p
        .call_json(
            Method::POST,
            "/nodes/pve1/qemu/9000/clone",
            &json!({"newid": 150, "full": true}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    // Nothing reached the state for rejected requests: only the JSON clone exists.
    let ids: Vec<u32> = sim.vms().iter().map(|v| v.vmid).collect();
    assert_eq!(ids, [150, 9000]);
    finish(sim).await;
}

#[tokio::test]
async fn transport_rules() {
    let (sim, mut p) = sim().await;
    // DELETE with a body → 501.
    let body = Some((
        "application/x-www-form-urlencoded".to_owned(),
        Bytes::from_static(b"purge=1"),
    ));
    let r = p
        .send(Method::DELETE, "/nodes/pve1/qemu/9000", "", body, &[])
        .await
        .unwrap();
    assert_eq!(r.status, 501, "{r:?}");
    // Body above 512 KiB → 501.
    let big = format!("description={}", "x".repeat(600 * 1024));
    let body = Some(("application/x-www-form-urlencoded".to_owned(), Bytes::from(big)));
    let r = p
        .send(Method::PUT, "/nodes/pve1/qemu/9000/config", "", body, &[])
        .await
        .unwrap();
    assert_eq!(r.status, 501, "{r:?}");
    // GET parameters come from the query string.
    let r = p
        .call(Method::GET, "/cluster/resources", &[("type", "node")])
        .await
        .unwrap();
    assert_eq!(r.data().as_array().map(Vec::len), Some(3));
    finish(sim).await;
}

// ---------- authentication ----------

#[tokio::test]
async fn authentication_failures_are_401_with_reason_and_delay() {
    let (sim, _) = sim_with(|c| c.auth_failure_delay = Duration::from_millis(300)).await;
    let mut anon = Probe::new(sim.addr(), &sim.ca_pem(), ProbeAuth::None).unwrap();
    let started = Instant::now();
    let r = get(&mut anon, "/version").await;
    assert_eq!((r.status, r.reason.as_str()), (401, "No ticket"));
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "401 must be delayed"
    );
    assert_eq!(
        r.body.get("message"),
        None,
        "the reason is only in the status line"
    );

    let mut bad = Probe::new(
        sim.addr(),
        &sim.ca_pem(),
        ProbeAuth::Token(format!("PVEAPIToken={}=wrong", sim.token_id())),
    )
    .unwrap();
    let r = get(&mut bad, "/version").await;
    assert_eq!((r.status, r.reason.as_str()), (401, "authentication failure"));

    let r = anon.login(&sim.username(), "wrong").await.unwrap();
    assert_eq!((r.status, r.reason.as_str()), (401, "authentication failure"));
    finish(sim).await;
}

#[tokio::test]
async fn ticket_auth_requires_csrf_on_writes_and_expires() {
    let (sim, _) = sim().await;
    let mut p = Probe::new(sim.addr(), &sim.ca_pem(), ProbeAuth::None).unwrap();
    let r = p.login(&sim.username(), &sim.password()).await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.data()["username"], "root@pam");
    assert!(r.data()["ticket"].as_str().unwrap().starts_with("PVE:root@pam:"));
    assert_eq!(get(&mut p, "/version").await.status, 200);

    let ProbeAuth::Ticket { ticket, csrf } = p.auth.clone() else {
        panic!("logged in")
    };
    p.auth = ProbeAuth::Ticket {
        ticket: ticket.clone(),
        csrf: "wrong".into(),
    };
    let r = post(&mut p, "/pools", &[("poolid", "x")]).await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (401, "Permission denied - invalid csrf token")
    );
    // GET needs no CSRF token.
    assert_eq!(get(&mut p, "/pools").await.status, 200);
    p.auth = ProbeAuth::Ticket {
        ticket: ticket.clone(),
        csrf,
    };
    assert_eq!(post(&mut p, "/pools", &[("poolid", "x")]).await.status, 200);
    // UPIDs carry the ticket user.
    let id = upid(&post(&mut p, "/nodes/pve1/qemu/9000/clone", &[("newid", "120")]).await);
    assert!(id.ends_with(":qmclone:9000:root@pam:"), "{id}");

    sim.faults().expire_all_tickets();
    let r = get(&mut p, "/version").await;
    assert_eq!((r.status, r.reason.as_str()), (401, "authentication failure"));
    // API tokens are unaffected.
    assert_eq!(
        get(&mut Probe::for_sim(&sim).unwrap(), "/version").await.status,
        200
    );
    finish(sim).await;
}

#[tokio::test]
async fn tickets_last_the_configured_lifetime() {
    let (sim, _) = sim_with(|c| c.ticket_lifetime = Duration::from_millis(200)).await;
    let mut p = Probe::new(sim.addr(), &sim.ca_pem(), ProbeAuth::None).unwrap();
    p.login(&sim.username(), &sim.password()).await.unwrap();
    assert_eq!(get(&mut p, "/version").await.status, 200);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(get(&mut p, "/version").await.status, 401);
    finish(sim).await;
}

// ---------- Perl typing and declared returns ----------

#[tokio::test]
async fn perl_typed_responses() {
    let (sim, mut p) = sim().await;
    assert_eq!(get(&mut p, "/cluster/nextid").await.data(), &json!("100"));
    let r = p
        .call(Method::GET, "/cluster/nextid", &[("vmid", "9000")])
        .await
        .unwrap();
    assert_error(&r, 400, "Parameter verification failed.");
    assert_eq!(r.body["errors"], json!({"vmid": "VM 9000 already exists"}));

    clone_template(&mut p, "101", "web1").await;
    let cfg = get(&mut p, "/nodes/pve1/qemu/101/config").await;
    assert_eq!(cfg.data()["memory"], json!("2048"), "memory is a string");
    assert_eq!(cfg.data()["cores"], json!(2), "cores is a number");
    let list = get(&mut p, "/nodes/pve1/qemu").await;
    let vm = |id: u64| {
        list.data()
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["vmid"] == id)
            .cloned()
            .unwrap()
    };
    assert_eq!(vm(9000)["template"], json!(1));
    assert_eq!(vm(101).get("template"), None, "template only on templates");
    let res = p
        .call(Method::GET, "/cluster/resources", &[("type", "vm")])
        .await
        .unwrap();
    let templates: Vec<&Value> = res
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| &v["template"])
        .collect();
    assert_eq!(templates, [&json!(0), &json!(1)], "always 0/1 in resources");
    finish(sim).await;
}

#[tokio::test]
async fn responses_match_declared_returns() {
    let (sim, mut p) = sim().await;
    clone_template(&mut p, "101", "web1").await;
    post(
        &mut p,
        "/nodes/pve1/qemu/101/config",
        &[("ipconfig0", "ip=10.0.0.5/24,gw=10.0.0.1")],
    )
    .await;
    let start = upid(&post(&mut p, "/nodes/pve1/qemu/101/status/start", &[]).await);
    wait(&mut p, &start).await;
    let iso = seed_iso_with_writer("#cloud-config\n", "instance-id: i-101\n", None);
    let up = upload(&mut p, "pve1", "local", "seed-101.iso", iso).await;
    let schema = sim.schema();
    let mut calls: Vec<(Method, String, FormVec)> = vec![
        (Method::GET, "/version".into(), vec![]),
        (Method::GET, "/nodes".into(), vec![]),
        (Method::GET, "/nodes/pve1/status".into(), vec![]),
        (Method::GET, "/cluster/resources".into(), vec![]),
        (Method::GET, "/cluster/nextid".into(), vec![]),
        (Method::GET, "/nodes/pve1/qemu".into(), vec![]),
        (Method::GET, "/nodes/pve1/qemu/101/status/current".into(), vec![]),
        (Method::GET, "/nodes/pve1/qemu/9000/status/current".into(), vec![]),
        (Method::GET, "/nodes/pve1/qemu/101/config".into(), vec![]),
        (
            Method::PUT,
            "/nodes/pve1/qemu/101/config".into(),
            vec![("tags", "a;b")],
        ),
        (
            Method::POST,
            "/nodes/pve1/qemu/101/config".into(),
            vec![("cores", "4")],
        ),
        (
            Method::PUT,
            "/nodes/pve1/qemu/101/resize".into(),
            vec![("disk", "scsi0"), ("size", "+2G")],
        ),
        (
            Method::GET,
            "/nodes/pve1/qemu/101/agent/network-get-interfaces".into(),
            vec![],
        ),
        (
            Method::GET,
            format!("/nodes/pve1/tasks/{}/status", encode_segment(&start)),
            vec![],
        ),
        (
            Method::GET,
            format!("/nodes/pve1/tasks/{}/log", encode_segment(&start)),
            vec![],
        ),
        (Method::GET, "/nodes/pve1/storage".into(), vec![]),
        (Method::GET, "/nodes/pve1/storage/local/content".into(), vec![]),
        (
            Method::GET,
            "/nodes/pve1/storage/local-lvm/content".into(),
            vec![],
        ),
        (Method::GET, "/pools".into(), vec![]),
        (Method::GET, "/pools".into(), vec![("poolid", "banlieue")]),
        (Method::GET, "/pools/banlieue".into(), vec![]),
        (Method::POST, "/pools".into(), vec![("poolid", "extra")]),
        (
            Method::PUT,
            "/pools".into(),
            vec![("poolid", "extra"), ("vms", "101")],
        ),
        (Method::POST, "/nodes/pve1/qemu/101/status/reboot".into(), vec![]),
        (
            Method::POST,
            "/nodes/pve1/qemu/101/status/shutdown".into(),
            vec![],
        ),
        (Method::POST, "/nodes/pve1/qemu/101/status/stop".into(), vec![]),
        (
            Method::POST,
            "/nodes/pve1/qemu/9000/clone".into(),
            vec![("newid", "102")],
        ),
        (
            Method::DELETE,
            format!(
                "/nodes/pve1/storage/local/content/{}",
                encode_segment("local:iso/seed-101.iso")
            ),
            vec![],
        ),
        (Method::DELETE, "/nodes/pve1/qemu/102".into(), vec![]),
    ];
    calls.push((
        Method::GET,
        format!("/nodes/pve1/tasks/{}/status", encode_segment(&up)),
        vec![],
    ));
    for (method, path, form) in calls {
        let r = p.call(method.clone(), &path, &form).await.unwrap();
        assert_eq!(r.status, 200, "{method} {path}: {r:?}");
        let endpoint = schema.find(method.as_str(), &path).expect("declared endpoint");
        let problems = check_returns(endpoint.returns(), r.data());
        assert!(problems.is_empty(), "{method} {path}: {problems:?}\n{}", r.data());
    }
    assert_eq!(
        sim.returns_violations(),
        Vec::<String>::new(),
        "the server-side check agrees"
    );
    finish(sim).await;
}

// ---------- clone, tasks, lifecycle ----------

#[tokio::test]
async fn clone_shows_only_the_lock_until_done_then_new_identity() {
    let (sim, mut p) = sim_with(|c| {
        c.task_durations
            .insert("qmclone".into(), Duration::from_millis(400));
    })
    .await;
    let id = upid(
        &post(
            &mut p,
            "/nodes/pve1/qemu/9000/clone",
            &[("newid", "101"), ("name", "web1"), ("pool", "banlieue")],
        )
        .await,
    );
    assert!(id.starts_with("UPID:pve1:"), "{id}");
    let parts: Vec<&str> = id.split(':').collect();
    assert_eq!(parts.len(), 9, "{id}");
    assert!(
        parts[2..5]
            .iter()
            .all(|h| h.len() == 8 && h.chars().all(|c| c.is_ascii_hexdigit())),
        "{id}"
    );
    assert_eq!(&parts[5..], ["qmclone", "9000", "root@pam!banlieue", ""]);

    let during = get(&mut p, "/nodes/pve1/qemu/101/config").await;
    let keys: Vec<&String> = during.data().as_object().unwrap().keys().collect();
    assert_eq!(keys, ["digest", "lock"]);
    assert_eq!(during.data()["lock"], "clone");
    let status = get(&mut p, "/nodes/pve1/qemu/101/status/current").await;
    assert_eq!(status.data()["lock"], "clone");
    assert_error(
        &post(&mut p, "/nodes/pve1/qemu/101/status/start", &[]).await,
        500,
        "VM 101 is locked (clone)",
    );
    assert_eq!(
        get(
            &mut p,
            &format!("/nodes/pve1/tasks/{}/status", encode_segment(&id))
        )
        .await
        .data()["status"],
        "running"
    );

    tokio::time::sleep(Duration::from_millis(450)).await;
    let done = wait(&mut p, &id).await;
    assert_eq!(
        (done["status"].as_str(), done["exitstatus"].as_str()),
        (Some("stopped"), Some("OK"))
    );
    let cfg = get(&mut p, "/nodes/pve1/qemu/101/config").await.data().clone();
    let template = sim.vm(9000).unwrap().config;
    assert_eq!(cfg["name"], "web1");
    assert_eq!(cfg.get("lock"), None);
    assert_eq!(cfg.get("template"), None);
    let net0 = cfg["net0"].as_str().unwrap();
    assert!(
        net0.starts_with("virtio=BC:24:11:") && net0.ends_with(",bridge=vmbr0"),
        "{net0}"
    );
    assert_ne!(net0, template["net0"]);
    let uuid = cfg["smbios1"].as_str().unwrap();
    assert!(uuid.starts_with("uuid=") && uuid != template["smbios1"], "{uuid}");
    assert_eq!(
        cfg["scsi0"], "local-lvm:base-9000-disk-0/vm-101-disk-0,size=8G",
        "linked clone"
    );
    assert_eq!(sim.vm(101).unwrap().pool.as_deref(), Some("banlieue"));
    let log = get(&mut p, &format!("/nodes/pve1/tasks/{}/log", encode_segment(&id))).await;
    assert_eq!(log.data().as_array().unwrap().last().unwrap()["t"], "TASK OK");

    // A second clone gets a different MAC again.
    clone_template(&mut p, "102", "web2").await;
    assert_ne!(sim.vm(102).unwrap().config["net0"], net0);
    // Cloning onto an existing id fails.
    let r = post(&mut p, "/nodes/pve1/qemu/9000/clone", &[("newid", "101")]).await;
    assert_error(&r, 500, "VM 101 already exists on node 'pve1'");
    finish(sim).await;
}

#[tokio::test]
async fn resources_lag_for_new_vms() {
    let (sim, mut p) = sim_with(|c| c.resources_lag = Duration::from_millis(300)).await;
    clone_template(&mut p, "101", "web1").await;
    let find = |r: &ProbeResponse| {
        r.data()
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["vmid"] == 101)
            .cloned()
            .unwrap()
    };
    let early = find(
        &p.call(Method::GET, "/cluster/resources", &[("type", "vm")])
            .await
            .unwrap(),
    );
    assert_eq!(
        (early["status"].as_str(), early.get("name")),
        (Some("unknown"), None)
    );
    tokio::time::sleep(Duration::from_millis(350)).await;
    let later = find(
        &p.call(Method::GET, "/cluster/resources", &[("type", "vm")])
            .await
            .unwrap(),
    );
    assert_eq!(
        (later["status"].as_str(), later["name"].as_str()),
        (Some("stopped"), Some("web1"))
    );
    // After a pvestatd restart, every guest lags, templates included: no template flag either.
    sim.restart_pvestatd();
    let resources = p
        .call(Method::GET, "/cluster/resources", &[("type", "vm")])
        .await
        .unwrap();
    let template = resources
        .data()
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["vmid"] == 9000)
        .cloned()
        .unwrap();
    assert_eq!(
        (
            template["status"].as_str(),
            template.get("name"),
            template.get("template")
        ),
        (Some("unknown"), None, None)
    );
    finish(sim).await;
}

#[tokio::test]
async fn task_failures() {
    let (sim, mut p) = sim().await;
    // Starting a template fails inside the task.
    let id = upid(&post(&mut p, "/nodes/pve1/qemu/9000/status/start", &[]).await);
    let st = wait(&mut p, &id).await;
    assert_eq!(st["exitstatus"], "you can't start a vm if it's a template");
    let log = get(&mut p, &format!("/nodes/pve1/tasks/{}/log", encode_segment(&id))).await;
    assert_eq!(
        log.data().as_array().unwrap().last().unwrap()["t"],
        "TASK ERROR: you can't start a vm if it's a template"
    );
    assert!(!sim.vm(9000).unwrap().running);

    // DELETE of a running VM fails synchronously.
    clone_template(&mut p, "101", "web1").await;
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/start").await;
    assert_error(
        &p.call(Method::DELETE, "/nodes/pve1/qemu/101", &[]).await.unwrap(),
        500,
        "VM 101 is running - destroy failed",
    );
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/stop").await;
    let del = upid(&p.call(Method::DELETE, "/nodes/pve1/qemu/101", &[]).await.unwrap());
    assert_eq!(wait(&mut p, &del).await["exitstatus"], "OK");
    assert_error(
        &get(&mut p, "/nodes/pve1/qemu/101/config").await,
        500,
        "Configuration file 'nodes/pve1/qemu-server/101.conf' does not exist",
    );

    // Injected task failure: the clone task fails with the given text and leaves no VM.
    sim.faults()
        .add(FaultRule::task_failure("clone failed: out of space").path_regex("/clone$"))
        .unwrap();
    let id = upid(&post(&mut p, "/nodes/pve1/qemu/9000/clone", &[("newid", "103")]).await);
    assert_eq!(
        wait(&mut p, &id).await["exitstatus"],
        "clone failed: out of space"
    );
    assert!(sim.vm(103).is_none());

    // Unknown UPIDs and nodes.
    let r = get(
        &mut p,
        "/nodes/pve1/tasks/UPID:pve1:00000001:00000001:00000001:qmstart:1:root@pam:/status",
    )
    .await;
    assert_eq!(r.status, 400, "{r:?}");
    let r = get(&mut p, "/nodes/pve9/qemu").await;
    assert_eq!(r.status, 500);
    assert!(r.reason.starts_with("hostname lookup 'pve9' failed"), "{r:?}");
    finish(sim).await;
}

/// `local-lvm`'s used bytes and `pve1`'s CPU load.
async fn used(p: &mut Probe) -> (u64, f64) {
    let storage = get(p, "/nodes/pve1/storage/local-lvm/status")
        .await
        .data()
        .clone();
    let node = get(p, "/nodes/pve1/status").await.data().clone();
    (storage["used"].as_u64().unwrap(), node["cpu"].as_f64().unwrap())
}

/// Cluster status, and nodes and storages that account for what their VMs use: a running VM
/// raises its node's CPU and memory, its disks fill their storage (as `/cluster/resources`,
/// `/nodes/{node}/storage` and the storage's own status report it).
#[tokio::test]
async fn cluster_status_and_resources_account_for_the_vms() {
    let (sim, mut p) = sim().await;
    let status = get(&mut p, "/cluster/status").await;
    let items = status.data().as_array().unwrap().clone();
    assert_eq!(items[0]["type"], "cluster");
    assert_eq!(items[0]["quorate"], 1);
    assert_eq!(
        items.iter().filter(|i| i["type"] == "node").count(),
        sim.config().nodes.len()
    );

    let (disk_before, cpu_before) = used(&mut p).await;
    clone_template(&mut p, "101", "web1").await;
    let (disk_cloned, _) = used(&mut p).await;
    assert!(
        disk_cloned > disk_before,
        "{disk_before} → {disk_cloned}: the clone's disk counts"
    );
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/start").await;
    let (_, cpu_running) = used(&mut p).await;
    assert!(
        cpu_running > cpu_before,
        "{cpu_before} → {cpu_running}: a running VM uses CPU"
    );
    finish(sim).await;
}

/// Pending changes (REAL-PVE.md R5): on a running VM, what cannot be hot-plugged (CPU topology,
/// a NIC when `hotplug` lacks `network`, removing an IDE drive) is only recorded; `GET …/config`
/// shows it applied, `current=1` shows what runs, `GET …/pending` lists both; the next start
/// applies it.
#[tokio::test]
async fn changes_that_cannot_be_hot_plugged_stay_pending_until_the_next_start() {
    let (sim, mut p) = sim().await;
    clone_template(&mut p, "101", "web1").await;
    put(&mut p, "/nodes/pve1/qemu/101/config", &[("hotplug", "disk,usb")]).await;
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/start").await;
    put(
        &mut p,
        "/nodes/pve1/qemu/101/config",
        &[("cores", "4"), ("net0", "e1000,bridge=vmbr0"), ("tags", "k8s")],
    )
    .await;
    let vm = sim.vm(101).unwrap();
    assert_eq!(
        vm.config.get("tags").map(String::as_str),
        Some("k8s"),
        "tags apply at once"
    );
    assert_ne!(vm.config.get("cores").map(String::as_str), Some("4"));
    assert_eq!(
        vm.pending.keys().map(String::as_str).collect::<Vec<_>>(),
        ["cores", "net0"]
    );
    assert_eq!(
        get(&mut p, "/nodes/pve1/qemu/101/config").await.data()["cores"],
        4
    );
    let current = p
        .call(Method::GET, "/nodes/pve1/qemu/101/config", &[("current", "1")])
        .await
        .unwrap();
    assert_ne!(current.data()["cores"], 4, "{current:?}");
    let pending = get(&mut p, "/nodes/pve1/qemu/101/pending").await;
    let lines = pending.data().as_array().unwrap().clone();
    let cores = lines.iter().find(|l| l["key"] == "cores").unwrap();
    assert_eq!(cores["pending"], "4");
    let tags = lines.iter().find(|l| l["key"] == "tags").unwrap();
    assert!(tags.get("pending").is_none(), "{tags}");

    post_wait(&mut p, "/nodes/pve1/qemu/101/status/stop").await;
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/start").await;
    let vm = sim.vm(101).unwrap();
    assert!(vm.pending.is_empty(), "{:?}", vm.pending);
    assert_eq!(vm.config.get("cores").map(String::as_str), Some("4"));
    assert!(vm.config["net0"].starts_with("e1000="), "{}", vm.config["net0"]);
    finish(sim).await;
}

/// `qm migrate` as a user, node maintenance or HA does it: the VM keeps its VMID and config on
/// the target node, is locked while the task runs, and is gone from the source node.
#[tokio::test]
async fn migration_moves_the_vm_to_the_target_node() {
    let (sim, mut p) = sim_with(|c| c.nodes = vec!["pve1".into(), "pve2".into()]).await;
    clone_template(&mut p, "101", "web1").await;
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/start").await;
    assert_error(
        &post(&mut p, "/nodes/pve1/qemu/101/migrate", &[("target", "pve2")]).await,
        500,
        "can't migrate running VM without --online",
    );
    assert_error(
        &post(
            &mut p,
            "/nodes/pve1/qemu/101/migrate",
            &[("target", "pve1"), ("online", "1")],
        )
        .await,
        500,
        "target is local node.",
    );
    let before = sim.vm(101).unwrap().config;
    let id = upid(
        &post(
            &mut p,
            "/nodes/pve1/qemu/101/migrate",
            &[("target", "pve2"), ("online", "1")],
        )
        .await,
    );
    assert!(id.contains(":qmigrate:101:"), "{id}");
    assert_eq!(wait(&mut p, &id).await["exitstatus"], "OK");
    let moved = sim.vm(101).unwrap();
    assert_eq!(
        (moved.node.as_str(), moved.running, moved.lock),
        ("pve2", true, None)
    );
    assert_eq!(moved.config, before, "same config");
    assert_error(
        &get(&mut p, "/nodes/pve1/qemu/101/status/current").await,
        500,
        "Configuration file 'nodes/pve1/qemu-server/101.conf' does not exist",
    );
    assert_eq!(
        get(&mut p, "/nodes/pve2/qemu/101/status/current").await.status,
        200
    );

    // A failed migration leaves the VM where it was, unlocked.
    sim.faults()
        .add(banlieue_pve_sim::FaultRule::task_failure("migration aborted").path_regex("/migrate$"))
        .unwrap();
    let id = upid(
        &post(
            &mut p,
            "/nodes/pve2/qemu/101/migrate",
            &[("target", "pve1"), ("online", "1")],
        )
        .await,
    );
    assert_eq!(wait(&mut p, &id).await["exitstatus"], "migration aborted");
    let stayed = sim.vm(101).unwrap();
    assert_eq!((stayed.node.as_str(), stayed.lock), ("pve2", None));
    sim.faults().clear();
    finish(sim).await;
}

#[tokio::test]
async fn config_update_semantics() {
    let (sim, mut p) = sim().await;
    clone_template(&mut p, "101", "web1").await;
    let r = p
        .call(
            Method::PUT,
            "/nodes/pve1/qemu/101/config",
            &[
                ("tags", "Web, db;web  alpha"),
                ("net1", "virtio,bridge=vmbr1,tag=20"),
                ("scsi1", "local-lvm:4"),
                ("sshkeys", "ssh-ed25519%20AAAAC3Nz%2B%2F%3D%20me%0A"),
                ("delete", "vmgenid"),
            ],
        )
        .await
        .unwrap();
    assert_eq!((r.status, r.data()), (200, &Value::Null), "{r:?}");
    let cfg = sim.vm(101).unwrap().config;
    assert_eq!(cfg["tags"], "alpha;db;web");
    assert!(
        cfg["net1"].starts_with("virtio=BC:24:11:") && cfg["net1"].ends_with(",bridge=vmbr1,tag=20"),
        "{}",
        cfg["net1"]
    );
    assert_eq!(cfg["scsi1"], "local-lvm:vm-101-disk-1,size=4G");
    assert_eq!(cfg.get("vmgenid"), None);
    let digest = get(&mut p, "/nodes/pve1/qemu/101/config").await.data()["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = p
        .call(
            Method::PUT,
            "/nodes/pve1/qemu/101/config",
            &[("cores", "3"), ("digest", "0000")],
        )
        .await
        .unwrap();
    assert_error(
        &r,
        500,
        "detected modified configuration - file changed by other user? Try again.",
    );
    let r = p
        .call(
            Method::PUT,
            "/nodes/pve1/qemu/101/config",
            &[("cores", "3"), ("digest", &digest)],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);

    let id = upid(
        &p.call(
            Method::PUT,
            "/nodes/pve1/qemu/101/resize",
            &[("disk", "scsi0"), ("size", "+2G")],
        )
        .await
        .unwrap(),
    );
    wait(&mut p, &id).await;
    assert_eq!(
        sim.vm(101).unwrap().config["scsi0"],
        "local-lvm:base-9000-disk-0/vm-101-disk-0,size=10G"
    );
    let id = upid(
        &p.call(
            Method::PUT,
            "/nodes/pve1/qemu/101/resize",
            &[("disk", "scsi0"), ("size", "32G")],
        )
        .await
        .unwrap(),
    );
    wait(&mut p, &id).await;
    assert!(sim.vm(101).unwrap().config["scsi0"].ends_with(",size=32G"));
    let r = p
        .call(
            Method::PUT,
            "/nodes/pve1/qemu/101/resize",
            &[("disk", "scsi0"), ("size", "1G")],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 500);
    assert!(r.reason.starts_with("shrinking disks is not supported"), "{r:?}");

    // POST config is a task (qmconfig) and applies when it finishes.
    let id = upid(&post(&mut p, "/nodes/pve1/qemu/101/config", &[("memory", "4096")]).await);
    assert!(id.contains(":qmconfig:101:"), "{id}");
    wait(&mut p, &id).await;
    assert_eq!(
        get(&mut p, "/nodes/pve1/qemu/101/config").await.data()["memory"],
        "4096"
    );
    finish(sim).await;
}

// ---------- guest agent ----------

/// The guest agent's OS info and file reads: cloud-init's copy of the user data the guest
/// booted with is readable as on a real guest; other files do not exist.
#[tokio::test]
async fn guest_agent_tells_the_os_and_reads_cloud_init_s_user_data() {
    let (sim, mut p) = sim().await;
    clone_template(&mut p, "101", "web1").await;
    let os = "/nodes/pve1/qemu/101/agent/get-osinfo";
    assert_error(&get(&mut p, os).await, 500, "VM 101 is not running");
    let iso = seed_iso_with_writer("#cloud-config\nhostname: web1\n", "instance-id: web1\n", None);
    upload(&mut p, "pve1", "local", "seed-101.iso", iso).await;
    put(
        &mut p,
        "/nodes/pve1/qemu/101/config",
        &[("ide2", "local:iso/seed-101.iso,media=cdrom")],
    )
    .await;
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/start").await;
    assert_eq!(get(&mut p, os).await.data()["result"]["id"], "ubuntu");
    let read = p
        .call(
            Method::GET,
            "/nodes/pve1/qemu/101/agent/file-read",
            &[("file", "/var/lib/cloud/instance/user-data.txt")],
        )
        .await
        .unwrap();
    assert_eq!(read.data()["content"], "#cloud-config\nhostname: web1\n");
    let missing = p
        .call(
            Method::GET,
            "/nodes/pve1/qemu/101/agent/file-read",
            &[("file", "/etc/shadow")],
        )
        .await
        .unwrap();
    assert_error(
        &missing,
        500,
        "Agent error: Failed to open file '/etc/shadow': No such file or directory",
    );
    finish(sim).await;
}

#[tokio::test]
async fn guest_agent_reports_an_address_after_the_delay() {
    let (sim, mut p) = sim_with(|c| c.agent_delay = Duration::from_millis(300)).await;
    clone_template(&mut p, "101", "pooled").await;
    clone_template(&mut p, "102", "static").await;
    p.call(
        Method::PUT,
        "/nodes/pve1/qemu/102/config",
        &[("ipconfig0", "ip=192.168.7.5/24,gw=192.168.7.1")],
    )
    .await
    .unwrap();
    let agent = "/nodes/pve1/qemu/101/agent/network-get-interfaces";
    assert_error(&get(&mut p, agent).await, 500, "VM 101 is not running");
    for vm in ["101", "102"] {
        post_wait(&mut p, &format!("/nodes/pve1/qemu/{vm}/status/start")).await;
    }
    assert_error(&get(&mut p, agent).await, 500, "QEMU guest agent is not running");
    tokio::time::sleep(Duration::from_millis(350)).await;
    let addr = |r: &ProbeResponse| -> (String, String, u64) {
        let eth0 = r.data()["result"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == "eth0")
            .cloned()
            .unwrap();
        let ip = &eth0["ip-addresses"][0];
        (
            eth0["hardware-address"].as_str().unwrap().to_owned(),
            ip["ip-address"].as_str().unwrap().to_owned(),
            ip["prefix"].as_u64().unwrap(),
        )
    };
    let (mac, ip, prefix) = addr(&get(&mut p, agent).await);
    assert_eq!((ip.as_str(), prefix), ("10.99.0.10", 16), "first pool address");
    assert!(
        sim.vm(101).unwrap().config["net0"].to_lowercase().contains(&mac),
        "{mac}"
    );
    let (_, ip, prefix) = addr(&get(&mut p, "/nodes/pve1/qemu/102/agent/network-get-interfaces").await);
    assert_eq!((ip.as_str(), prefix), ("192.168.7.5", 24), "static ipconfig0");
    finish(sim).await;
}

#[tokio::test]
async fn a_real_guest_agent_answers_once_the_guest_reported_and_says_what_it_has() {
    use banlieue_pve_sim::GuestInterface;
    let (sim, mut p) = sim_with(|c| c.external_guests = true).await;
    clone_template(&mut p, "101", "real").await;
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/start").await;
    let agent = "/nodes/pve1/qemu/101/agent/network-get-interfaces";
    // No address is invented for a real guest, and its agent is silent until the guest reports.
    assert_eq!(sim.vm(101).unwrap().ip, None);
    assert_error(&get(&mut p, agent).await, 500, "QEMU guest agent is not running");
    let nic = GuestInterface {
        name: "net0".into(),
        mac: "BC:24:11:00:00:01".into(),
        addresses: vec![
            ("10.203.4.120".parse().unwrap(), 24),
            ("10.203.4.2".parse().unwrap(), 32),
        ],
    };
    sim.report_guest_interfaces(101, vec![nic]).unwrap();
    let answer = get(&mut p, agent).await;
    let interfaces = answer.data()["result"].as_array().unwrap().clone();
    let names: Vec<&str> = interfaces.iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["lo", "net0"]);
    assert_eq!(interfaces[1]["hardware-address"], "bc:24:11:00:00:01");
    let ips: Vec<(&str, u64)> = interfaces[1]["ip-addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["ip-address"].as_str().unwrap(), a["prefix"].as_u64().unwrap()))
        .collect();
    assert_eq!(ips, [("10.203.4.120", 24), ("10.203.4.2", 32)]);
    // Powered off, the guest's report is gone with it; a stopped VM takes no report.
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/stop").await;
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/start").await;
    assert_error(&get(&mut p, agent).await, 500, "QEMU guest agent is not running");
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/stop").await;
    assert!(sim.report_guest_interfaces(101, Vec::new()).is_err());
    finish(sim).await;
}

/// cloud-init's report through `agent/file-read`: a simulated guest's has finished once its
/// agent answers; a real guest's is there only once the harness reported it, and is gone when
/// the VM stops (cloud-init writes it anew on every boot).
#[tokio::test]
async fn cloud_init_reports_through_the_agent_as_the_guest_wrote_it() {
    use banlieue_pve_sim::GuestInterface;
    async fn result(p: &mut Probe) -> ProbeResponse {
        let file = [("file", "/run/cloud-init/result.json")];
        p.call(Method::GET, "/nodes/pve1/qemu/101/agent/file-read", &file)
            .await
            .expect("request")
    }
    let (sim, mut p) = sim_with(|_| {}).await;
    clone_template(&mut p, "101", "simulated").await;
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/start").await;
    let answer = result(&mut p).await;
    let report: serde_json::Value = serde_json::from_str(answer.data()["content"].as_str().unwrap()).unwrap();
    assert_eq!(report["v1"]["errors"], serde_json::json!([]), "{report}");
    finish(sim).await;

    let (sim, mut p) = sim_with(|c| c.external_guests = true).await;
    clone_template(&mut p, "101", "real").await;
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/start").await;
    let nic = GuestInterface {
        name: "net0".into(),
        mac: "BC:24:11:00:00:01".into(),
        addresses: vec![("10.203.4.120".parse().unwrap(), 24)],
    };
    sim.report_guest_interfaces(101, vec![nic]).unwrap();
    assert_error(
        &result(&mut p).await,
        500,
        "Agent error: Failed to open file '/run/cloud-init/result.json': No such file or directory",
    );
    let written = r#"{"v1": {"errors": ["kubeadm failed"]}}"#;
    sim.report_guest_file(101, "/run/cloud-init/result.json", written.to_owned())
        .unwrap();
    assert_eq!(result(&mut p).await.data()["content"], written);
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/stop").await;
    assert!(
        sim.report_guest_file(101, "/run/cloud-init/result.json", written.to_owned())
            .is_err()
    );
    finish(sim).await;
}

// ---------- seed ISO ----------

fn seed_iso_with_writer(user: &str, meta: &str, network: Option<&str>) -> Vec<u8> {
    use banlieue_cloudinit::IsoFile;
    let mut files = vec![
        IsoFile {
            name: "user-data".into(),
            data: user.as_bytes().to_vec(),
        },
        IsoFile {
            name: "meta-data".into(),
            data: meta.as_bytes().to_vec(),
        },
    ];
    if let Some(n) = network {
        files.push(IsoFile {
            name: "network-config".into(),
            data: n.as_bytes().to_vec(),
        });
    }
    banlieue_cloudinit::iso9660::write_image("cidata", &files).expect("ISO writer")
}

fn seed_iso_with_genisoimage(user: &str, meta: &str, network: &str) -> Option<Vec<u8>> {
    genisoimage(user, meta, network, &["-joliet", "-rock"])
}

fn genisoimage(user: &str, meta: &str, network: &str, flags: &[&str]) -> Option<Vec<u8>> {
    let dir = tempfile::tempdir().ok()?;
    for (name, text) in [
        ("user-data", user),
        ("meta-data", meta),
        ("network-config", network),
    ] {
        std::fs::write(dir.path().join(name), text).ok()?;
    }
    let out = dir.path().join("seed.iso");
    let status = std::process::Command::new("genisoimage")
        .args(["-quiet", "-output"])
        .arg(&out)
        .args(["-volid", "cidata"])
        .args(flags)
        .args(["user-data", "meta-data", "network-config"])
        .current_dir(dir.path())
        .status()
        .ok()?;
    status.success().then(|| std::fs::read(&out).ok()).flatten()
}

fn multipart(parts: &[(&str, Option<&str>, &[u8])]) -> (String, Bytes) {
    let boundary = "----banlieue-test-boundary";
    let mut body = Vec::new();
    for (name, filename, data) in parts {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        match filename {
            Some(f) => body.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes(),
            ),
            None => body.extend_from_slice(format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes()),
        }
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (
        format!("multipart/form-data; boundary={boundary}"),
        Bytes::from(body),
    )
}

async fn upload(p: &mut Probe, node: &str, storage: &str, filename: &str, iso: Vec<u8>) -> String {
    let body = multipart(&[("content", None, b"iso"), ("filename", Some(filename), &iso)]);
    let r = p
        .send(
            Method::POST,
            &format!("/nodes/{node}/storage/{storage}/upload"),
            "",
            Some(body),
            &[],
        )
        .await
        .unwrap();
    let id = upid(&r);
    assert!(id.contains(":imgcopy:"), "{id}");
    assert_eq!(wait(p, &id).await["exitstatus"], "OK");
    id
}

async fn seed_round_trip(iso: Vec<u8>, user: &str, meta: &str, network: Option<&str>) {
    let (sim, mut p) = sim().await;
    clone_template(&mut p, "101", "web1").await;
    upload(&mut p, "pve1", "local", "seed-101.iso", iso.clone()).await;
    let content = p
        .call(
            Method::GET,
            "/nodes/pve1/storage/local/content",
            &[("content", "iso")],
        )
        .await
        .unwrap();
    assert_eq!(
        content.data()[0]["volid"],
        "local:iso/seed-101.iso",
        "{content:?}"
    );
    p.call(
        Method::PUT,
        "/nodes/pve1/qemu/101/config",
        &[("ide0", "local:iso/seed-101.iso,media=cdrom")],
    )
    .await
    .unwrap();
    post_wait(&mut p, "/nodes/pve1/qemu/101/status/start").await;
    // The seed is captured at boot, so it stays readable after the ISO is removed.
    let del = p
        .call(
            Method::DELETE,
            &format!(
                "/nodes/pve1/storage/local/content/{}",
                encode_segment("local:iso/seed-101.iso")
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(wait(&mut p, &upid(&del)).await["exitstatus"], "OK");
    let seed = sim.seed(101).expect("seed decoded");
    assert_eq!(seed.volid, "local:iso/seed-101.iso");
    assert_eq!(seed.volume_label, "cidata");
    assert_eq!(seed.user_data.as_deref(), Some(user));
    assert_eq!(seed.meta_data.as_deref(), Some(meta));
    assert_eq!(seed.network_config.as_deref(), network);
    assert!(
        seed.image == iso,
        "the drive a guest reads is the ISO as uploaded, byte for byte"
    );
    assert!(
        p.call(
            Method::GET,
            "/nodes/pve1/storage/local/content",
            &[("content", "iso")]
        )
        .await
        .unwrap()
        .data()
        .as_array()
        .unwrap()
        .is_empty()
    );
    finish(sim).await;
}

#[tokio::test]
async fn seed_iso_round_trip_rust_writer() {
    let user = "#cloud-config\nhostname: web1\n";
    let meta = "instance-id: i-101\nlocal-hostname: web1\n";
    let net = "version: 2\nethernets:\n  eth0:\n    dhcp4: true\n";
    seed_round_trip(seed_iso_with_writer(user, meta, Some(net)), user, meta, Some(net)).await;
}

#[tokio::test]
async fn seed_iso_round_trip_genisoimage() {
    let user = "#cloud-config\nusers:\n  - name: capi\n";
    let meta = "instance-id: i-102\nlocal-hostname: web2\n";
    let net = "version: 2\nethernets:\n  eth0:\n    addresses: [10.0.0.5/24]\n";
    let iso = seed_iso_with_genisoimage(user, meta, net)
        .expect("genisoimage failed or is missing: apt-get install -y genisoimage (as .ci/run does)");
    seed_round_trip(iso, user, meta, Some(net)).await;
}

#[tokio::test]
async fn upload_rules() {
    let (sim, mut p) = sim().await;
    let iso = seed_iso_with_writer("a", "b", None);
    // File part before the content field: PVE never sees `content`.
    let body = multipart(&[("filename", Some("seed.iso"), &iso), ("content", None, b"iso")]);
    let r = p
        .send(
            Method::POST,
            "/nodes/pve1/storage/local/upload",
            "",
            Some(body),
            &[],
        )
        .await
        .unwrap();
    assert_error(&r, 400, "Parameter verification failed.");
    // snippets is not an uploadable content type (schema enum).
    let body = multipart(&[
        ("content", None, b"snippets"),
        ("filename", Some("user-data.yaml"), b"x"),
    ]);
    let r = p
        .send(
            Method::POST,
            "/nodes/pve1/storage/local/upload",
            "",
            Some(body),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        r.body["errors"]["content"],
        "value 'snippets' does not have a value in the enumeration 'iso, vztmpl, import'"
    );
    // local-lvm does not hold ISOs.
    let body = multipart(&[("content", None, b"iso"), ("filename", Some("seed.iso"), &iso)]);
    let r = p
        .send(
            Method::POST,
            "/nodes/pve1/storage/local-lvm/upload",
            "",
            Some(body),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 500, "{r:?}");
    finish(sim).await;
}

// ---------- faults ----------

async fn fault_pattern(seed: u64) -> Vec<u16> {
    let (sim, mut p) = sim_with(|c| c.seed = seed).await;
    sim.faults()
        .add(
            FaultRule::status(503, "service busy")
                .path_prefix("/nodes")
                .probability(0.4),
        )
        .unwrap();
    let mut out = Vec::new();
    for _ in 0..60 {
        out.push(get(&mut p, "/nodes/pve1/status").await.status);
    }
    finish(sim).await;
    out
}

#[tokio::test]
async fn fault_injection_is_deterministic_per_seed() {
    let a = fault_pattern(11).await;
    assert_eq!(a, fault_pattern(11).await);
    assert_ne!(a, fault_pattern(12).await);
    assert!(a.contains(&503) && a.contains(&200), "{a:?}");
}

#[tokio::test]
async fn fault_effects() {
    let (sim, mut p) = sim().await;
    let faults = sim.faults();
    faults
        .add(
            FaultRule::status(500, "storage offline\ndetails")
                .method("GET")
                .path_prefix("/nodes/pve1/storage")
                .nth(2),
        )
        .unwrap();
    let codes: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(get(&mut p, "/nodes/pve1/storage").await.status);
        }
        v
    };
    assert_eq!(codes, [200, 500, 200]);
    faults.clear();

    faults
        .add(
            FaultRule::status(503, "too many requests")
                .path_prefix("/version")
                .first(1),
        )
        .unwrap();
    assert_error(&get(&mut p, "/version").await, 503, "too many requests");
    assert_eq!(get(&mut p, "/version").await.status, 200);

    faults
        .add(FaultRule::latency(Duration::from_millis(200)).path_prefix("/cluster/nextid"))
        .unwrap();
    let t = Instant::now();
    assert_eq!(get(&mut p, "/cluster/nextid").await.status, 200);
    assert!(t.elapsed() >= Duration::from_millis(200));

    faults
        .add(FaultRule::drop_connection().path_prefix("/pools").first(1))
        .unwrap();
    let dropped = p.call(Method::GET, "/pools", &[]).await;
    assert!(matches!(dropped, Err(ProbeError::Http(_))), "{dropped:?}");
    assert_eq!(
        get(&mut p, "/pools").await.status,
        200,
        "the next call reconnects"
    );

    // The admin endpoint installs and clears rules for the CLI.
    let rule = json!({"method": "GET", "path": {"prefix": "/nodes/pve2"}, "trigger": "always",
        "effect": {"status": {"code": 500, "message": "node pve2 is offline"}}});
    let r = p.call_json(Method::POST, "/_sim/faults", &rule).await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_error(
        &get(&mut p, "/nodes/pve2/status").await,
        500,
        "node pve2 is offline",
    );
    assert_eq!(
        p.call(Method::DELETE, "/_sim/faults", &[]).await.unwrap().status,
        200
    );
    assert_eq!(get(&mut p, "/nodes/pve2/status").await.status, 200);
    assert!(faults.rules().is_empty());
    let r = p.call(Method::POST, "/_sim/tickets/expire", &[]).await.unwrap();
    assert_eq!(r.status, 200);
    let mut anon = Probe::new(sim.addr(), &sim.ca_pem(), ProbeAuth::None).unwrap();
    assert_eq!(
        anon.call(Method::GET, "/_sim/vms", &[]).await.unwrap().status,
        401,
        "admin needs the token"
    );
    finish(sim).await;
}

#[tokio::test]
async fn certificate_fingerprint_matches_served_certificate() {
    let (sim, _) = sim().await;
    let fp = sim.fingerprint_sha256();
    assert_eq!(fp.len(), 32 * 3 - 1);
    assert!(
        fp.chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_lowercase() || c == ':'),
        "{fp}"
    );
    // Fetch the served certificate with a verifier that records it.
    let served = served_leaf(sim.addr()).await;
    assert_eq!(banlieue_pve_sim::fingerprint(&served), fp);
    // /nodes reports it too, as PVE does.
    let mut p = Probe::for_sim(&sim).unwrap();
    let nodes = get(&mut p, "/nodes").await;
    assert!(
        nodes
            .data()
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["ssl_fingerprint"] == fp.as_str()),
        "{nodes:?}"
    );
    finish(sim).await;
}

async fn served_leaf(addr: std::net::SocketAddr) -> Vec<u8> {
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use std::sync::{Arc, Mutex};
    #[derive(Debug)]
    struct Record(Mutex<Vec<u8>>, Arc<rustls::crypto::CryptoProvider>);
    impl ServerCertVerifier for Record {
        fn verify_server_cert(
            &self,
            end: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            *self.0.lock().unwrap() = end.to_vec();
            Ok(ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(m, c, d, &self.1.signature_verification_algorithms)
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(m, c, d, &self.1.signature_verification_algorithms)
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.1.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let record = Arc::new(Record(Mutex::new(Vec::new()), provider.clone()));
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(record.clone())
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::IpAddress(addr.ip().into());
    let _tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .unwrap();
    record.0.lock().unwrap().clone()
}

#[test]
fn iso_reader_handles_rock_ridge_only_images() {
    let user = "#cloud-config\n";
    let iso = genisoimage(user, "instance-id: rr\n", "version: 2\n", &["-rock"])
        .expect("genisoimage failed or is missing: apt-get install -y genisoimage (as .ci/run does)");
    let image = banlieue_pve_sim::iso::read_image(&iso).expect("readable");
    assert_eq!(image.volume_id, "cidata");
    let names: Vec<&String> = image.files.keys().collect();
    assert_eq!(names, ["meta-data", "network-config", "user-data"]);
    assert_eq!(image.files["user-data"], user.as_bytes());
}

#[tokio::test]
async fn malformed_requests_do_not_break_the_server() {
    let (sim, mut p) = sim().await;
    let junk: Vec<(Method, &str, &str, Option<RawBody>)> = vec![
        (Method::GET, "/nodes/%ff%fe/status", "", None),
        (Method::GET, "/cluster/resources", "type=%zz&&=", None),
        (
            Method::POST,
            "/nodes/pve1/qemu/9000/clone",
            "",
            Some(("application/json", b"{not json")),
        ),
        (
            Method::POST,
            "/nodes/pve1/qemu/9000/clone",
            "",
            Some(("application/json", b"[1,2]")),
        ),
        (
            Method::POST,
            "/nodes/pve1/storage/local/upload",
            "",
            Some(("multipart/form-data", b"--x\r\n")),
        ),
        (
            Method::POST,
            "/nodes/pve1/storage/local/upload",
            "",
            Some(("multipart/form-data; boundary=x", b"--x\r\ngarbage")),
        ),
        (
            Method::PUT,
            "/nodes/pve1/qemu/9000/config",
            "",
            Some(("application/x-www-form-urlencoded", b"net0=%ff&tags=\xff")),
        ),
        (
            Method::PUT,
            "/nodes/pve1/qemu/9000/resize",
            "",
            Some(("application/x-www-form-urlencoded", b"disk=scsi0&size=-1G")),
        ),
        (Method::GET, "/nodes/pve1/tasks/UPID:x/log", "start=-1", None),
        (
            Method::GET,
            "/nodes/pve1/storage/local/content/%3A%3A%3A",
            "",
            None,
        ),
    ];
    for (method, path, query, body) in junk {
        let body = body.map(|(ct, b)| (ct.to_owned(), Bytes::copy_from_slice(b)));
        let r = p
            .send(method.clone(), path, query, body, &[])
            .await
            .expect("an answer, not a dropped connection");
        assert!((400..=501).contains(&r.status), "{method} {path}: {r:?}");
        assert!(
            r.body["message"].as_str().is_some_and(|m| m.ends_with('\n')),
            "{method} {path}: {r:?}"
        );
    }
    assert_eq!(get(&mut p, "/version").await.status, 200);
    assert!(
        sim.vms().iter().all(|v| v.vmid == 9000),
        "no junk request changed state"
    );
    finish(sim).await;
}
