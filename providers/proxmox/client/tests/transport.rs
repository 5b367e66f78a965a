//! Transport behaviour against a scripted HTTPS server: TLS modes, authentication headers, ticket
//! re-login, timeouts, dropped connections, retry policy, error decoding, multipart upload.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use banlieue_pve_client::{
    Client, ClientBuilder, Error, ErrorClass, RequestRecord, RetryPolicy, TlsFailureKind, TlsVerification,
    UploadContent,
};
use common::mock::{self, Mock, Reply};
use serde_json::json;

const UPID: &str = "UPID:pve1:00001234:00005678:6790F00D:qmstart:100:root@pam!t:";

fn fast_retry(max_retries: u32) -> RetryPolicy {
    RetryPolicy {
        max_retries,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
    }
}

fn builder(mock: &Mock) -> ClientBuilder {
    Client::builder(&mock.url)
        .token("root@pam!t", "0b5e-secret")
        .tls(TlsVerification::Fingerprint(mock.fingerprint.clone()))
        .retry(fast_retry(3))
        .timeout(Duration::from_secs(5))
}

fn version() -> Reply {
    Reply::data(json!({"version":"9.1.2","release":"9.1","repoid":"abc"}))
}

#[tokio::test]
async fn pinned_fingerprint_accepts_the_right_certificate() {
    let mock = mock::start(|_, _| version()).await;
    let v = builder(&mock).build().unwrap().version().await.unwrap();
    assert_eq!(v.release, "9.1");
}

#[tokio::test]
async fn wrong_fingerprint_is_rejected_without_retries() {
    let mock = mock::start(|_, _| version()).await;
    let wrong = "00:".repeat(31) + "00";
    let client = builder(&mock)
        .tls(TlsVerification::Fingerprint(wrong))
        .build()
        .unwrap();
    let err = client.version().await.unwrap_err();
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert_eq!(err.class(), ErrorClass::Auth);
    assert_eq!(mock.requests().len(), 0);
    // The message names both fingerprints, the presented and the pinned one.
    let tls = err.tls_failure().expect("a TLS failure");
    assert_eq!(tls.kind, TlsFailureKind::FingerprintMismatch);
    let message = err.to_string();
    assert!(message.contains(&mock.fingerprint), "{message}");
    assert!(message.contains(&"00:".repeat(31)), "{message}");
    assert!(message.contains("fingerprint mismatch"), "{message}");
    assert!(!message.contains("client error"), "{message}");
}

#[tokio::test]
async fn an_unknown_ca_and_a_host_name_mismatch_say_so() {
    let mock = mock::start(|_, _| version()).await;
    let err = builder(&mock)
        .tls(TlsVerification::WebPki)
        .build()
        .unwrap()
        .version()
        .await
        .unwrap_err();
    assert_eq!(
        err.tls_failure().map(|t| t.kind),
        Some(TlsFailureKind::UnknownCa),
        "{err}"
    );
    let message = err.to_string();
    assert!(message.contains("unknown CA"), "{message}");
    assert!(
        message.contains(&mock.fingerprint),
        "presented certificate: {message}"
    );

    let other = mock::start_named(&["pve.example.invalid"], |_, _| version()).await;
    let err = builder(&other)
        .tls(TlsVerification::CaBundle(other.cert_pem.clone()))
        .build()
        .unwrap()
        .version()
        .await
        .unwrap_err();
    assert_eq!(
        err.tls_failure().map(|t| t.kind),
        Some(TlsFailureKind::HostnameMismatch),
        "{err}"
    );
    let message = err.to_string();
    assert!(message.contains("host name mismatch"), "{message}");
    assert!(message.contains("pve.example.invalid"), "{message}");
    assert!(message.contains("127.0.0.1"), "{message}");
    assert!(!message.contains("0b5e-secret"), "{message}");
}

#[tokio::test]
async fn a_server_name_verifies_a_certificate_issued_for_another_name_than_the_address() {
    let named = mock::start_named(&["pve.example.invalid"], |_, _| version()).await;
    let client = builder(&named)
        .tls(TlsVerification::CaBundle(named.cert_pem.clone()))
        .server_name(Some("pve.example.invalid".into()))
        .build()
        .unwrap();
    assert_eq!(client.version().await.unwrap().version, "9.1.2");
    let err = builder(&named)
        .tls(TlsVerification::CaBundle(named.cert_pem.clone()))
        .server_name(Some("other.example.invalid".into()))
        .build()
        .unwrap()
        .version()
        .await
        .unwrap_err();
    assert_eq!(
        err.tls_failure().map(|t| t.kind),
        Some(TlsFailureKind::HostnameMismatch),
        "the name is still checked: {err}"
    );
    let err = builder(&named)
        .server_name(Some("not a name".into()))
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains("not a name")),
        "{err}"
    );
}

#[tokio::test]
async fn ca_bundle_accepts_and_default_webpki_rejects_a_self_signed_server() {
    let mock = mock::start(|_, _| version()).await;
    let client = builder(&mock)
        .tls(TlsVerification::CaBundle(mock.cert_pem.clone()))
        .build()
        .unwrap();
    assert_eq!(client.version().await.unwrap().version, "9.1.2");

    let client = builder(&mock).tls(TlsVerification::WebPki).build().unwrap();
    let err = client.version().await.unwrap_err();
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");

    let client = builder(&mock)
        .tls(TlsVerification::InsecureSkipVerify)
        .build()
        .unwrap();
    assert_eq!(client.version().await.unwrap().version, "9.1.2");
}

#[tokio::test]
async fn sends_the_api_token_header_and_no_csrf() {
    let mock = mock::start(|_, _| Reply::data(json!(UPID))).await;
    let client = builder(&mock).build().unwrap();
    client.start_vm("pve1", 100).await.unwrap();
    let seen = &mock.requests()[0];
    assert_eq!(
        seen.headers["authorization"],
        "PVEAPIToken=root@pam!t=0b5e-secret"
    );
    assert!(seen.headers.get("csrfpreventiontoken").is_none());
    assert_eq!(seen.uri, "/api2/json/nodes/pve1/qemu/100/status/start");
}

/// A login endpoint handing out `ticket-N`; `accept(ticket)` decides which tickets are valid.
fn ticket_server(accept: fn(&str) -> bool) -> impl Fn(&mock::Seen, usize) -> Reply + Send + Sync {
    let logins = AtomicUsize::new(0);
    move |req, _| {
        if req.uri.ends_with("/access/ticket") {
            let body = String::from_utf8_lossy(&req.body).to_string();
            if !body.contains("password=pw") {
                return Reply::error(401, "authentication failure");
            }
            let n = logins.fetch_add(1, Ordering::SeqCst) + 1;
            return Reply::data(
                json!({"ticket": format!("ticket-{n}"), "CSRFPreventionToken": format!("csrf-{n}"),
                "username": "root@pam"}),
            );
        }
        let cookie = req
            .headers
            .get("cookie")
            .and_then(|c| c.to_str().ok())
            .unwrap_or("");
        let ticket = cookie.strip_prefix("PVEAuthCookie=").unwrap_or("");
        if !accept(ticket) {
            return Reply::error(401, "invalid PVE ticket");
        }
        if req.method != http::Method::GET {
            let csrf = req
                .headers
                .get("csrfpreventiontoken")
                .and_then(|c| c.to_str().ok())
                .unwrap_or("");
            if csrf != ticket.replace("ticket", "csrf") {
                return Reply::error(401, "Permission denied - invalid csrf token");
            }
            return Reply::data(json!(UPID));
        }
        version()
    }
}

#[tokio::test]
async fn ticket_auth_logs_in_sends_cookie_and_csrf_on_non_get() {
    let mock = mock::start(ticket_server(|t| t == "ticket-1")).await;
    let client = builder(&mock).password("root@pam", "pw").build().unwrap();
    client.version().await.unwrap();
    client.start_vm("pve1", 100).await.unwrap();
    let seen = mock.requests();
    assert_eq!(mock.count("/access/ticket"), 1, "one login for two calls");
    let get = &seen[1];
    assert_eq!(get.headers["cookie"], "PVEAuthCookie=ticket-1");
    assert!(get.headers.get("csrfpreventiontoken").is_none());
    assert_eq!(seen[2].headers["csrfpreventiontoken"], "csrf-1");
}

#[tokio::test]
async fn expired_ticket_triggers_exactly_one_relogin() {
    let mock = mock::start(ticket_server(|t| t == "ticket-2")).await;
    let client = builder(&mock).password("root@pam", "pw").build().unwrap();
    client.version().await.unwrap();
    assert_eq!(mock.count("/access/ticket"), 2);
    assert_eq!(mock.count("/version"), 2);

    let mock = mock::start(ticket_server(|_| false)).await;
    let client = builder(&mock).password("root@pam", "pw").build().unwrap();
    let err = client.version().await.unwrap_err();
    assert_eq!((err.status(), err.class()), (Some(401), ErrorClass::Auth));
    assert_eq!(mock.count("/access/ticket"), 2, "re-login only once");
    assert_eq!(mock.count("/version"), 2);
}

#[tokio::test]
async fn wrong_password_is_an_auth_error_without_retries() {
    let mock = mock::start(ticket_server(|_| true)).await;
    let client = builder(&mock).password("root@pam", "nope").build().unwrap();
    let err = client.version().await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Auth);
    assert_eq!(err.message(), Some("authentication failure"));
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn transient_get_failures_are_retried_with_backoff() {
    let mock = mock::start(|_, i| {
        if i < 2 {
            Reply::error(503, "Service Unavailable")
        } else {
            version()
        }
    })
    .await;
    let started = std::time::Instant::now();
    builder(&mock).build().unwrap().version().await.unwrap();
    assert_eq!(mock.requests().len(), 3);
    assert!(started.elapsed() >= Duration::from_millis(5), "backoff happened");
}

#[tokio::test]
async fn retries_are_bounded() {
    let mock = mock::start(|_, _| Reply::error(500, "got timeout")).await;
    let err = builder(&mock)
        .retry(fast_retry(2))
        .build()
        .unwrap()
        .version()
        .await
        .unwrap_err();
    assert_eq!((err.status(), err.class()), (Some(500), ErrorClass::Transient));
    assert_eq!(mock.requests().len(), 3);
}

#[tokio::test]
async fn no_retry_on_4xx_or_on_non_transient_5xx() {
    let mock = mock::start(|_, _| {
        Reply::Json(
            400,
            Some("Parameter verification failed."),
            r#"{"data":null,"errors":{"vmid":"VM 100 already exists"}}"#.into(),
        )
    })
    .await;
    let client = builder(&mock).build().unwrap();
    assert!(!client.is_vmid_free(100).await.unwrap());
    assert_eq!(mock.requests().len(), 1);

    let mock = mock::start(|_, _| Reply::error(403, "Permission check failed (/vms/100, VM.Audit)")).await;
    let err = builder(&mock)
        .build()
        .unwrap()
        .vm_status("pve1", 100)
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Auth);
    assert_eq!(mock.requests().len(), 1);

    let mock = mock::start(|_, _| {
        Reply::error(
            500,
            "Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist",
        )
    })
    .await;
    let err = builder(&mock)
        .build()
        .unwrap()
        .vm_config("pve1", 100)
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::NotFound);
    assert_eq!(
        mock.requests().len(),
        1,
        "a 500 that says 'does not exist' is not transient"
    );
}

#[tokio::test]
async fn posts_are_not_retried_after_being_sent() {
    let mock = mock::start(|_, _| Reply::error(503, "Service Unavailable")).await;
    let err = builder(&mock)
        .build()
        .unwrap()
        .start_vm("pve1", 100)
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Transient);
    assert_eq!(mock.requests().len(), 1);

    let mock = mock::start(|_, _| Reply::Drop).await;
    let err = builder(&mock)
        .build()
        .unwrap()
        .start_vm("pve1", 100)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Transport { .. }), "{err:?}");
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn dropped_connections_are_transient_and_gets_recover() {
    let mock = mock::start(|_, i| if i == 0 { Reply::Drop } else { version() }).await;
    builder(&mock).build().unwrap().version().await.unwrap();
    assert_eq!(mock.requests().len(), 2);
}

#[tokio::test]
async fn every_call_has_a_timeout() {
    let slow = || Reply::Delay(Duration::from_secs(3), Box::new(version()));
    let mock = mock::start(move |_, _| slow()).await;
    let client = builder(&mock)
        .timeout(Duration::from_millis(150))
        .retry(fast_retry(1))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let err = client.version().await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert!(err.is_transient());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "gave up in time: {:?}",
        started.elapsed()
    );
    assert_eq!(mock.requests().len(), 2, "one retry");
}

#[tokio::test]
async fn connection_refused_is_a_transient_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://127.0.0.1:{}", listener.local_addr().unwrap().port());
    drop(listener);
    let attempts = Arc::new(AtomicUsize::new(0));
    let counter = attempts.clone();
    let client = Client::builder(&url)
        .token("root@pam!t", "s")
        .retry(fast_retry(2))
        .on_request(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    let err = client.start_vm("pve1", 100).await.unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert_eq!(err.class(), ErrorClass::Transient);
    let message = err.to_string();
    let addr = url.trim_start_matches("https://");
    assert!(
        message.contains(&format!("cannot connect to {addr}: connection refused")),
        "{message}"
    );
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        3,
        "nothing was sent, so even a POST is retried"
    );
}

#[tokio::test]
async fn keeps_pve_messages_from_body_or_status_line() {
    let mock = mock::start(|req, _| {
        if req.method == http::Method::DELETE {
            Reply::Json(
                500,
                Some("VM 100 is running - destroy failed"),
                r#"{"data":null,"message":"VM 100 is running - destroy failed\n"}"#.into(),
            )
        } else {
            Reply::error(500, "QEMU guest agent is not running")
        }
    })
    .await;
    let client = builder(&mock).retry(RetryPolicy::none()).build().unwrap();
    let err = client
        .delete_vm("pve1", 100, Default::default())
        .await
        .unwrap_err();
    assert_eq!(err.message(), Some("VM 100 is running - destroy failed"));
    let err = client.agent_network_interfaces("pve1", 100).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::AgentNotRunning);
    assert_eq!(
        mock.count("/agent/network-get-interfaces"),
        1,
        "agent not running is not retried"
    );
}

#[tokio::test]
async fn upload_is_multipart_with_content_first() {
    let mock = mock::start(|_, _| Reply::data(json!(UPID))).await;
    let client = builder(&mock).build().unwrap();
    let iso = vec![0xABu8; 4096];
    client
        .upload("pve1", "local", UploadContent::Iso, "seed-web-1.iso", iso)
        .await
        .unwrap();
    let seen = &mock.requests()[0];
    assert_eq!(seen.uri, "/api2/json/nodes/pve1/storage/local/upload");
    let ctype = seen.headers["content-type"].to_str().unwrap();
    assert!(ctype.starts_with("multipart/form-data; boundary="), "{ctype}");
    let body = String::from_utf8_lossy(&seen.body);
    let content = body
        .find("name=\"content\"\r\n\r\niso\r\n")
        .expect("content field");
    let file = body
        .find("name=\"filename\"; filename=\"seed-web-1.iso\"")
        .expect("file part");
    assert!(content < file);
    assert_eq!(seen.body.iter().filter(|b| **b == 0xAB).count(), 4096);

    let err = client
        .upload("pve1", "local", UploadContent::Iso, "seed.img", vec![1])
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Invalid);
    assert_eq!(mock.requests().len(), 1, "rejected before sending");
}

#[tokio::test]
async fn volume_ids_and_upids_are_path_encoded() {
    let mock = mock::start(|_, _| Reply::data(serde_json::Value::Null)).await;
    let client = builder(&mock).build().unwrap();
    assert_eq!(
        client
            .delete_volume("pve1", "local", "local:iso/seed-web-1.iso")
            .await
            .unwrap(),
        None
    );
    let seen = &mock.requests()[0];
    assert!(
        seen.body.is_empty() && seen.headers.get("content-length").is_none(),
        "DELETE carries no body"
    );
    assert!(seen.headers.get("transfer-encoding").is_none());
    assert_eq!(
        mock.requests()[0].uri,
        "/api2/json/nodes/pve1/storage/local/content/local:iso%2Fseed-web-1.iso"
    );
}

#[tokio::test]
async fn request_hook_sees_every_attempt_and_no_secret() {
    let mock = mock::start(ticket_server(|t| t == "ticket-1")).await;
    let records: Arc<Mutex<Vec<RequestRecord>>> = Arc::default();
    let sink = records.clone();
    let client = builder(&mock)
        .password("root@pam", "pw")
        .on_request(move |r| sink.lock().unwrap().push(r.clone()))
        .build()
        .unwrap();
    client
        .cluster_resources(Some(banlieue_pve_client::ResourceType::Vm))
        .await
        .unwrap_err();
    let records = records.lock().unwrap().clone();
    assert_eq!(records[0].path, "/access/ticket");
    assert!(records[0].params.contains(&("password".into(), "***".into())));
    assert_eq!(records[1].path, "/cluster/resources");
    assert_eq!(records[1].params, vec![("type".to_string(), "vm".to_string())]);
    assert!(!format!("{records:?}").contains("pw\""));
}
