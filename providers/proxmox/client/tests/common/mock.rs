//! A tiny scripted HTTPS server for transport tests (retries, timeouts, drops, 401 handling, TLS)
//! that must not depend on the simulator's behaviour.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A request the mock received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: http::Method,
    /// Path and query as received.
    pub uri: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// What the mock answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Status, reason phrase, JSON body.
    Json(u16, Option<&'static str>, String),
    /// Wait, then reply.
    Delay(Duration, Box<Reply>),
    /// Close the connection without answering.
    Drop,
}

impl Reply {
    pub fn data(json: serde_json::Value) -> Self {
        Self::Json(200, None, serde_json::json!({ "data": json }).to_string())
    }

    pub fn error(status: u16, reason: &'static str) -> Self {
        Self::Json(status, Some(reason), r#"{"data":null}"#.into())
    }
}

pub struct Mock {
    pub url: String,
    pub cert_pem: String,
    pub fingerprint: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Mock {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Mock {
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Requests whose path (without query) ends with `suffix`.
    pub fn count(&self, suffix: &str) -> usize {
        self.requests()
            .iter()
            .filter(|s| s.uri.split('?').next().unwrap().ends_with(suffix))
            .count()
    }
}

#[derive(Debug)]
struct Dropped;
impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dropped on purpose")
    }
}
impl std::error::Error for Dropped {}

/// Starts the mock on 127.0.0.1; `handler(request, index_of_request)` decides the reply.
pub async fn start<F>(handler: F) -> Mock
where
    F: Fn(&Seen, usize) -> Reply + Send + Sync + 'static,
{
    start_named(&["127.0.0.1", "localhost"], handler).await
}

/// [`start`] with a self-signed certificate valid for `names` only.
pub async fn start_named<F>(names: &[&str], handler: F) -> Mock
where
    F: Fn(&Seen, usize) -> Reply + Send + Sync + 'static,
{
    let _ = rustls::crypto::ring::default_provider().install_default();
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let certified = rcgen::generate_simple_self_signed(names).unwrap();
    let cert_der: CertificateDer<'static> = certified.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
    let fingerprint = banlieue_pve_client::fingerprint_of(cert_der.as_ref());
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert_der], key)
            .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let handler = Arc::new(handler);
    let seen2 = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let handler = handler.clone();
            let seen = seen2.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let handler = handler.clone();
                    let seen = seen.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        let request = Seen {
                            method: parts.method,
                            uri: parts.uri.to_string(),
                            headers: parts.headers,
                            body,
                        };
                        let index = {
                            let mut seen = seen.lock().unwrap();
                            seen.push(request.clone());
                            seen.len() - 1
                        };
                        let mut reply = handler(&request, index);
                        loop {
                            match reply {
                                Reply::Delay(d, next) => {
                                    tokio::time::sleep(d).await;
                                    reply = *next;
                                }
                                Reply::Drop => return Err(Dropped),
                                Reply::Json(status, reason, body) => {
                                    let mut resp = http::Response::builder()
                                        .status(status)
                                        .header("content-type", "application/json;charset=UTF-8")
                                        .body(Full::new(Bytes::from(body)))
                                        .unwrap();
                                    if let Some(r) = reason {
                                        resp.extensions_mut()
                                            .insert(hyper::ext::ReasonPhrase::from_static(r.as_bytes()));
                                    }
                                    return Ok::<_, Dropped>(resp);
                                }
                            }
                        }
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Mock {
        url,
        cert_pem: certified.cert.pem(),
        fingerprint,
        seen,
        task,
    }
}
