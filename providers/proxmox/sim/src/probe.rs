//! A minimal raw HTTPS client for tests and benchmarks: one kept-alive HTTP/1.1 connection that
//! trusts exactly the simulator's CA, and answers with status, reason phrase and JSON body. It is
//! deliberately not a PVE client (no typing, no retries).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;

/// Every probe request must finish within this time.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Probe failures.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// TCP connect or TLS handshake failed.
    #[error("connecting to {addr}")]
    Connect {
        /// Target.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The CA PEM could not be used.
    #[error("bad CA certificate: {0}")]
    Ca(String),
    /// HTTP exchange failed (including a connection the server dropped).
    #[error("HTTP exchange failed")]
    Http(#[source] hyper::Error),
    /// Building the request failed.
    #[error("building request")]
    Request(#[source] http::Error),
    /// No answer within [`REQUEST_TIMEOUT`].
    #[error("request timed out")]
    Timeout,
}

/// An answer.
#[derive(Debug, Clone)]
pub struct ProbeResponse {
    /// HTTP status.
    pub status: u16,
    /// Reason phrase from the status line.
    pub reason: String,
    /// Body parsed as JSON (`Value::Null` if not JSON).
    pub body: Value,
}

impl ProbeResponse {
    /// `body.data`.
    pub fn data(&self) -> &Value {
        &self.body["data"]
    }
}

/// How the probe authenticates.
#[derive(Debug, Clone, Default)]
pub enum ProbeAuth {
    /// No credentials.
    #[default]
    None,
    /// `Authorization: <header>`.
    Token(String),
    /// Ticket cookie and CSRF token.
    Ticket {
        /// The ticket.
        ticket: String,
        /// The CSRF prevention token (sent on non-GET).
        csrf: String,
    },
}

/// The raw client.
pub struct Probe {
    addr: SocketAddr,
    connector: tokio_rustls::TlsConnector,
    sender: Option<SendRequest<Full<Bytes>>>,
    /// Credentials sent with every request.
    pub auth: ProbeAuth,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Probe {
    /// A probe for `addr` trusting `ca_pem`.
    pub fn new(addr: SocketAddr, ca_pem: &str, auth: ProbeAuth) -> Result<Self, ProbeError> {
        let der = pem_to_der(ca_pem).ok_or_else(|| ProbeError::Ca("no CERTIFICATE block".into()))?;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(der))
            .map_err(|e| ProbeError::Ca(e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ProbeError::Ca(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            addr,
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            sender: None,
            auth,
        })
    }

    /// A probe for a running simulator using its API token.
    pub fn for_sim(sim: &crate::SimHandle) -> Result<Self, ProbeError> {
        Self::new(sim.addr(), &sim.ca_pem(), ProbeAuth::Token(sim.token_header()))
    }

    async fn connect(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, ProbeError> {
        if self.sender.as_ref().is_some_and(|s| s.is_closed()) {
            self.sender = None;
        }
        if self.sender.is_none() {
            self.sender = Some(self.open().await?);
        }
        self.sender.as_mut().ok_or(ProbeError::Timeout)
    }

    async fn open(&self) -> Result<SendRequest<Full<Bytes>>, ProbeError> {
        let addr = self.addr;
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| ProbeError::Connect { addr, source })?;
        let _ = tcp.set_nodelay(true);
        let name = ServerName::IpAddress(addr.ip().into());
        let tls = self
            .connector
            .connect(name, tcp)
            .await
            .map_err(|source| ProbeError::Connect { addr, source })?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(ProbeError::Http)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    /// Sends a request to `/api2/json{path}` (or to `path` itself when it starts with `/_sim/`).
    /// `form` pairs go into the query for GET/DELETE and into a form body otherwise.
    pub async fn call(
        &mut self,
        method: Method,
        path: &str,
        form: &[(&str, &str)],
    ) -> Result<ProbeResponse, ProbeError> {
        let encoded = serde_urlencoded::to_string(form).unwrap_or_default();
        let (uri_query, body) = if matches!(method, Method::GET | Method::DELETE) {
            (encoded, None)
        } else {
            (
                String::new(),
                Some((
                    "application/x-www-form-urlencoded".to_owned(),
                    Bytes::from(encoded),
                )),
            )
        };
        self.send(method, path, &uri_query, body, &[]).await
    }

    /// Sends a JSON body.
    pub async fn call_json(
        &mut self,
        method: Method,
        path: &str,
        body: &Value,
    ) -> Result<ProbeResponse, ProbeError> {
        let bytes = Bytes::from(serde_json::to_vec(body).unwrap_or_default());
        self.send(
            method,
            path,
            "",
            Some(("application/json".to_owned(), bytes)),
            &[],
        )
        .await
    }

    /// Fully general request.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        query: &str,
        body: Option<(String, Bytes)>,
        headers: &[(&str, &str)],
    ) -> Result<ProbeResponse, ProbeError> {
        let full_path = if path.starts_with("/_sim/") || path.starts_with("/api2/") {
            path.to_owned()
        } else {
            format!("/api2/json{path}")
        };
        let uri = if query.is_empty() {
            full_path
        } else {
            format!("{full_path}?{query}")
        };
        let mut builder = http::Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(header::HOST, self.addr.to_string());
        match &self.auth {
            ProbeAuth::None => {}
            ProbeAuth::Token(h) => builder = builder.header(header::AUTHORIZATION, h),
            ProbeAuth::Ticket { ticket, csrf } => {
                builder = builder.header(header::COOKIE, format!("PVEAuthCookie={ticket}"));
                if method != Method::GET {
                    builder = builder.header("CSRFPreventionToken", csrf);
                }
            }
        }
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let body = match body {
            Some((ct, bytes)) => {
                builder = builder.header(header::CONTENT_TYPE, ct);
                bytes
            }
            None => Bytes::new(),
        };
        let request = builder.body(Full::new(body)).map_err(ProbeError::Request)?;
        let exchange = async {
            let sender = self.connect().await?;
            sender.ready().await.map_err(ProbeError::Http)?;
            let resp = sender.send_request(request).await.map_err(ProbeError::Http)?;
            let status = resp.status();
            let reason = resp
                .extensions()
                .get::<hyper::ext::ReasonPhrase>()
                .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
                .unwrap_or_else(|| status.canonical_reason().unwrap_or_default().to_owned());
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(ProbeError::Http)?
                .to_bytes();
            Ok(ProbeResponse {
                status: status.as_u16(),
                reason,
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            })
        };
        let result = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| ProbeError::Timeout)?;
        if result.is_err() {
            self.sender = None;
        }
        result
    }

    /// Logs in with `POST /access/ticket` and switches to ticket auth.
    pub async fn login(&mut self, username: &str, password: &str) -> Result<ProbeResponse, ProbeError> {
        let resp = self
            .call(
                Method::POST,
                "/access/ticket",
                &[("username", username), ("password", password)],
            )
            .await?;
        if let (Some(t), Some(c)) = (
            resp.data()["ticket"].as_str(),
            resp.data()["CSRFPreventionToken"].as_str(),
        ) {
            self.auth = ProbeAuth::Ticket {
                ticket: t.to_owned(),
                csrf: c.to_owned(),
            };
        }
        Ok(resp)
    }

    /// Polls a task until it stops; returns its final status object.
    pub async fn wait_task(&mut self, node: &str, upid: &str) -> Result<Value, ProbeError> {
        let path = format!("/nodes/{node}/tasks/{}/status", encode_segment(upid));
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        loop {
            let resp = self.call(Method::GET, &path, &[]).await?;
            if resp.data()["status"] == "stopped" || resp.status != 200 {
                return Ok(resp.body);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(ProbeError::Timeout);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Percent-encodes one path segment (UPIDs and volume ids contain `:` and `/`).
pub fn encode_segment(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn pem_to_der(pem: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let start = pem.find("-----BEGIN CERTIFICATE-----")? + "-----BEGIN CERTIFICATE-----".len();
    let end = pem[start..].find("-----END CERTIFICATE-----")? + start;
    let b64: String = pem[start..end].chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(b64).ok()
}
