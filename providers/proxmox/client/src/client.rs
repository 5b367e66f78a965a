//! The HTTP machinery: configuration, authentication, timeouts, retries, error decoding.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, COOKIE};
use http::{HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use rand::Rng;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::limit::Limiter;
use crate::secret::Secret;
use crate::tls::{HttpsConnector, TlsVerification, client_config};

/// How long an idle connection is kept for reuse: under pveproxy's own idle limit (5 s,
/// `AnyEvent.pm`'s keep-alive timeout, REAL-PVE.md R9), so a request is never sent on a
/// connection the server is closing (a POST lost that way would not be retried).
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// How long Proxmox VE honours a ticket (`PVE::AccessControl`'s 2 h).
pub const TICKET_LIFETIME: Duration = Duration::from_secs(2 * 3600);

/// Requests in flight at once per client, by default: pveproxy serves API calls with 3 worker
/// processes (`max_workers`), so more only queue inside it, where they count against their
/// timeout.
pub const MAX_IN_FLIGHT: usize = 6;

/// The API prefix below the server URL.
pub const API_PREFIX: &str = "/api2/json";

/// How the client authenticates.
#[derive(Debug, Clone)]
pub enum Auth {
    /// API token (preferred): `Authorization: PVEAPIToken=USER@REALM!TOKENID=SECRET`.
    Token {
        /// `USER@REALM!TOKENID`, e.g. `root@pam!banlieue`.
        token_id: String,
        /// The token secret (a UUID).
        secret: Secret,
    },
    /// Username and password: a ticket from `POST /access/ticket`, sent as the `PVEAuthCookie`
    /// cookie with the `CSRFPreventionToken` header on non-GET requests; the client logs in again
    /// once when PVE answers 401 (expired ticket).
    Password {
        /// `USER@REALM`, e.g. `root@pam`.
        username: String,
        /// The password.
        password: Secret,
    },
}

/// Retries with exponential backoff and jitter, for transient errors of idempotent requests.
///
/// What is retried: GET requests (and the login) that fail with a transient error (5xx other than
/// 501, timeout, reset or dropped connection), and any request whose connection could not be
/// established (nothing was sent). POST/PUT/DELETE are not retried after they were sent: PVE may
/// have acted on them (a clone or a start already running), and repeating them would fail with
/// "already exists" or start a second task; callers re-read the state instead. 4xx are never
/// retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (0 disables retries).
    pub max_retries: u32,
    /// Backoff before the first retry; doubles each retry.
    pub initial_backoff: Duration,
    /// Upper bound of a single backoff.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 3,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// No retries.
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }

    /// The backoff before retry number `retry` (0-based): `initial * 2^retry`, capped, with
    /// "equal jitter" (uniform in the upper half).
    pub fn backoff(&self, retry: u32, rng: &mut impl Rng) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(1u32.checked_shl(retry.min(20)).unwrap_or(u32::MAX));
        let cap = exp.min(self.max_backoff);
        let half = cap / 2;
        let jitter = rng.random_range(0..=half.as_micros().min(u128::from(u64::MAX)) as u64);
        half + Duration::from_micros(jitter)
    }
}

/// One request as the client sends it, given to the request hook (for tests: schema checks,
/// counting attempts). Secret parameters (`password`) are replaced by `***`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: Method,
    /// Path below `/api2/json`, with its segments percent-encoded as on the wire.
    pub path: String,
    /// Query (GET/DELETE) or body (POST/PUT) parameters.
    pub params: Vec<(String, String)>,
    /// 0 for the first attempt, then 1, 2, … for retries.
    pub attempt: u32,
}

/// A callback that sees every request attempt.
pub type RequestHook = Arc<dyn Fn(&RequestRecord) + Send + Sync>;

/// Builds a [`Client`].
#[derive(Clone)]
pub struct ClientBuilder {
    url: String,
    auth: Option<Auth>,
    tls: TlsVerification,
    server_name: Option<String>,
    timeout: Duration,
    upload_timeout: Duration,
    connect_timeout: Duration,
    retry: RetryPolicy,
    hook: Option<RequestHook>,
    ticket_lifetime: Duration,
    max_in_flight: usize,
    limit_per_endpoint: bool,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("url", &self.url)
            .field("auth", &self.auth)
            .field("tls", &self.tls)
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// Starts a builder for the server at `url` (`https://host:8006`; a trailing `/api2/json` is
    /// accepted).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            auth: None,
            tls: TlsVerification::default(),
            server_name: None,
            timeout: Duration::from_secs(30),
            upload_timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            hook: None,
            ticket_lifetime: TICKET_LIFETIME,
            max_in_flight: MAX_IN_FLIGHT,
            limit_per_endpoint: false,
        }
    }

    /// Authenticates with an API token (`USER@REALM!TOKENID` and its secret).
    pub fn token(mut self, token_id: impl Into<String>, secret: impl Into<Secret>) -> Self {
        self.auth = Some(Auth::Token {
            token_id: token_id.into(),
            secret: secret.into(),
        });
        self
    }

    /// Authenticates with username and password (ticket + CSRF token).
    pub fn password(mut self, username: impl Into<String>, password: impl Into<Secret>) -> Self {
        self.auth = Some(Auth::Password {
            username: username.into(),
            password: password.into(),
        });
        self
    }

    /// Sets the authentication.
    pub fn auth(mut self, auth: Auth) -> Self {
        self.auth = Some(auth);
        self
    }

    /// Sets how the server certificate is verified (default: web PKI roots).
    pub fn tls(mut self, tls: TlsVerification) -> Self {
        self.tls = tls;
        self
    }

    /// Verifies the certificate against `name` instead of the URL's host (`tls.serverName`).
    pub fn server_name(mut self, name: Option<String>) -> Self {
        self.server_name = name;
        self
    }

    /// Timeout for one request attempt, from sending to the end of the body (default 30 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Timeout for uploads (default 10 min).
    pub fn upload_timeout(mut self, timeout: Duration) -> Self {
        self.upload_timeout = timeout;
        self
    }

    /// Timeout for TCP connect plus TLS handshake (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the retry policy (default: 3 retries, 200 ms doubling up to 5 s).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// How long PVE honours a ticket (default 2 h, PVE's own): the client logs in again after
    /// three quarters of it, before PVE refuses the ticket.
    pub fn ticket_lifetime(mut self, lifetime: Duration) -> Self {
        self.ticket_lifetime = lifetime;
        self
    }

    /// At most this many requests in flight at once (default [`MAX_IN_FLIGHT`]); more wait.
    /// Fewer while the server answers that it is overloaded (see [`crate::limit`]).
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// Shares the bound on requests in flight with every other client of the same endpoint
    /// (host and port, as the client normalises them) that asks for it, in this process
    /// ([`Limiter::shared`]), instead of a bound of this client's own.
    pub fn limit_per_endpoint(mut self) -> Self {
        self.limit_per_endpoint = true;
        self
    }

    /// Calls `hook` for every request attempt (never with secrets).
    pub fn on_request(mut self, hook: impl Fn(&RequestRecord) + Send + Sync + 'static) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// Builds the client. Fails on a bad URL, a missing authentication or a bad TLS setting.
    pub fn build(self) -> Result<Client> {
        let url = url::Url::parse(self.url.trim_end_matches('/'))
            .map_err(|e| Error::Config(format!("URL {:?}: {e}", self.url)))?;
        if url.scheme() != "https" {
            return Err(Error::Config(format!(
                "URL {:?}: only https is supported",
                self.url
            )));
        }
        let host = url
            .host_str()
            .ok_or_else(|| Error::Config(format!("URL {:?} has no host", self.url)))?;
        let port = url.port().unwrap_or(8006);
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let base = format!("https://{host}:{port}");
        let auth = match self
            .auth
            .ok_or_else(|| Error::Config("no authentication configured".into()))?
        {
            Auth::Token { token_id, secret } => {
                if !token_id.contains('@') || !token_id.contains('!') {
                    return Err(Error::Config(format!(
                        "token id {token_id:?} is not USER@REALM!TOKENID"
                    )));
                }
                AuthState::Token(sensitive(&format!("PVEAPIToken={token_id}={}", secret.expose()))?)
            }
            Auth::Password { username, password } => AuthState::Ticket {
                username,
                password,
                session: tokio::sync::Mutex::new(None),
            },
        };
        let tls = tokio_rustls::TlsConnector::from(Arc::new(client_config(&self.tls)?));
        if let Some(name) = &self.server_name {
            crate::tls::check_server_name(name)?;
        }
        let connector = HttpsConnector {
            tls,
            connect_timeout: self.connect_timeout,
            server_name: self.server_name,
        };
        let http = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(16)
            .build(connector);
        let limiter = if self.limit_per_endpoint {
            Limiter::shared(&base, self.max_in_flight)
        } else {
            Arc::new(Limiter::new(self.max_in_flight))
        };
        Ok(Client {
            inner: Arc::new(Inner {
                base,
                http,
                auth,
                timeout: self.timeout,
                upload_timeout: self.upload_timeout,
                retry: self.retry,
                hook: self.hook,
                renew_after: self.ticket_lifetime.mul_f64(0.75),
                limiter,
            }),
        })
    }
}

fn sensitive(value: &str) -> Result<HeaderValue> {
    let mut v = HeaderValue::from_str(value)
        .map_err(|_| Error::Config("credential contains characters not allowed in an HTTP header".into()))?;
    v.set_sensitive(true);
    Ok(v)
}

/// A Proxmox VE API client. Cheap to clone (shares connections and the session).
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auth = match &self.inner.auth {
            AuthState::Token(_) => "token",
            AuthState::Ticket { .. } => "ticket",
        };
        f.debug_struct("Client")
            .field("url", &self.inner.base)
            .field("auth", &auth)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    base: String,
    http: HyperClient<HttpsConnector, Full<Bytes>>,
    auth: AuthState,
    timeout: Duration,
    upload_timeout: Duration,
    retry: RetryPolicy,
    hook: Option<RequestHook>,
    /// A ticket older than this is renewed before it is used.
    renew_after: Duration,
    /// Bounds the requests in flight (pveproxy has 3 workers by default), fewer while the
    /// server says it is overloaded.
    limiter: Arc<Limiter>,
}

enum AuthState {
    Token(HeaderValue),
    Ticket {
        username: String,
        password: Secret,
        session: tokio::sync::Mutex<Option<Arc<Session>>>,
    },
}

struct Session {
    cookie: HeaderValue,
    csrf: HeaderValue,
    issued: std::time::Instant,
}

#[derive(serde::Deserialize)]
struct TicketData {
    ticket: String,
    #[serde(rename = "CSRFPreventionToken")]
    csrf: String,
}

/// Characters escaped in a path segment: controls, space, and the URL delimiters (`/`, `?`, `#`, `%`).
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'?')
    .add(b'<')
    .add(b'>')
    .add(b'`');

/// Percent-encodes one path segment (e.g. a volume id `local:iso/seed.iso`).
pub fn path_segment(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// Request parameters, in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Params(pub(crate) Vec<(String, String)>);

impl Params {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn set(mut self, key: &str, value: impl ToString) -> Self {
        self.0.push((key.to_owned(), value.to_string()));
        self
    }

    pub(crate) fn opt(self, key: &str, value: Option<impl ToString>) -> Self {
        match value {
            Some(v) => self.set(key, v),
            None => self,
        }
    }

    pub(crate) fn flag(self, key: &str, value: Option<bool>) -> Self {
        self.opt(key, value.map(u8::from))
    }
}

/// A request body.
pub(crate) enum Payload {
    Params(Params),
    Upload {
        params: Params,
        file_name: String,
        data: Bytes,
    },
}

impl Client {
    /// Starts a [`ClientBuilder`].
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder::new(url)
    }

    /// The server base URL (`https://host:port`).
    pub fn base_url(&self) -> &str {
        &self.inner.base
    }

    /// Sends a request and decodes `data`, with authentication, timeout and retries.
    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        params: Params,
    ) -> Result<T> {
        self.send(method, path, Payload::Params(params)).await
    }

    pub(crate) async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        payload: Payload,
    ) -> Result<T> {
        let inner = &self.inner;
        let idempotent = method == Method::GET;
        let mut attempt = 0u32;
        let mut relogged = false;
        loop {
            let session = self.session().await?;
            let result = self
                .attempt(&method, path, &payload, session.as_deref(), attempt)
                .await;
            match result {
                Ok(value) => return Ok(value),
                Err(Error::Api { status: 401, .. }) if session.is_some() && !relogged => {
                    tracing::debug!(%method, path, "ticket rejected, logging in again");
                    relogged = true;
                    self.invalidate(session.as_ref()).await;
                }
                Err(err) => {
                    let retryable =
                        err.is_transient() && (idempotent || matches!(err, Error::Connect { .. }));
                    if !retryable || attempt >= inner.retry.max_retries {
                        return Err(err);
                    }
                    let delay = inner.retry.backoff(attempt, &mut rand::rng());
                    tracing::debug!(%method, path, attempt, ?delay, error = %err, "transient error, retrying");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
            }
        }
    }

    /// The current ticket session (logging in if needed); `None` for token auth.
    async fn session(&self) -> Result<Option<Arc<Session>>> {
        let AuthState::Ticket {
            username,
            password,
            session,
        } = &self.inner.auth
        else {
            return Ok(None);
        };
        let mut guard = session.lock().await;
        if let Some(s) = guard.as_ref()
            && s.issued.elapsed() < self.inner.renew_after
        {
            return Ok(Some(s.clone()));
        }
        let params = Params::new()
            .set("username", username)
            .set("password", password.expose());
        let mut attempt = 0;
        let ticket: TicketData = loop {
            match self
                .attempt(
                    &Method::POST,
                    "/access/ticket",
                    &Payload::Params(params.clone()),
                    None,
                    attempt,
                )
                .await
            {
                Ok(t) => break t,
                Err(err) if err.is_transient() && attempt < self.inner.retry.max_retries => {
                    let delay = self.inner.retry.backoff(attempt, &mut rand::rng());
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(err) => return Err(err),
            }
        };
        let fresh = Arc::new(Session {
            cookie: sensitive(&format!("PVEAuthCookie={}", ticket.ticket))?,
            csrf: sensitive(&ticket.csrf)?,
            issued: std::time::Instant::now(),
        });
        *guard = Some(fresh.clone());
        Ok(Some(fresh))
    }

    /// Drops the session if it is still the one that was rejected.
    async fn invalidate(&self, rejected: Option<&Arc<Session>>) {
        if let (AuthState::Ticket { session, .. }, Some(rejected)) = (&self.inner.auth, rejected) {
            let mut guard = session.lock().await;
            if guard.as_ref().is_some_and(|s| Arc::ptr_eq(s, rejected)) {
                *guard = None;
            }
        }
    }

    fn record(&self, method: &Method, path: &str, payload: &Payload, attempt: u32) {
        let Some(hook) = &self.inner.hook else { return };
        let params = match payload {
            Payload::Params(p) | Payload::Upload { params: p, .. } => &p.0,
        };
        let mut params: Vec<(String, String)> = params
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    if k == "password" {
                        "***".to_owned()
                    } else {
                        v.clone()
                    },
                )
            })
            .collect();
        if let Payload::Upload { file_name, .. } = payload {
            params.push(("filename".into(), file_name.clone()));
        }
        hook(&RequestRecord {
            method: method.clone(),
            path: path.to_owned(),
            params,
            attempt,
        });
    }

    async fn attempt<T: DeserializeOwned>(
        &self,
        method: &Method,
        path: &str,
        payload: &Payload,
        session: Option<&Session>,
        attempt: u32,
    ) -> Result<T> {
        let inner = &self.inner;
        // Waiting for a slot does not count against the request's timeout.
        let slot = inner.limiter.acquire().await;
        self.record(method, path, payload, attempt);
        let mut uri = format!("{}{API_PREFIX}{path}", inner.base);
        let mut builder = http::Request::builder()
            .method(method.clone())
            .header(ACCEPT, "application/json");
        let (body, timeout) = match payload {
            Payload::Params(params) if *method == Method::GET || *method == Method::DELETE => {
                if !params.0.is_empty() {
                    uri.push('?');
                    uri.push_str(&encode_form(&params.0));
                }
                (Bytes::new(), inner.timeout)
            }
            Payload::Params(params) => {
                builder = builder.header(CONTENT_TYPE, "application/x-www-form-urlencoded");
                (Bytes::from(encode_form(&params.0)), inner.timeout)
            }
            Payload::Upload {
                params,
                file_name,
                data,
            } => {
                let boundary = format!("banlieue-{:016x}", rand::rng().random::<u64>());
                builder = builder.header(CONTENT_TYPE, format!("multipart/form-data; boundary={boundary}"));
                (
                    multipart(&boundary, &params.0, file_name, data),
                    inner.upload_timeout,
                )
            }
        };
        match (&inner.auth, session) {
            (AuthState::Token(header), _) => builder = builder.header(AUTHORIZATION, header.clone()),
            (AuthState::Ticket { .. }, Some(s)) => {
                builder = builder.header(COOKIE, s.cookie.clone());
                if *method != Method::GET {
                    builder = builder.header("CSRFPreventionToken", s.csrf.clone());
                }
            }
            (AuthState::Ticket { .. }, None) => {}
        }
        let request = builder
            .uri(&uri)
            .body(Full::new(body))
            .map_err(|e| Error::Config(format!("cannot build request for {path}: {e}")))?;
        let exchange = async {
            let response = inner.http.request(request).await.map_err(|e| {
                if is_tls_failure(&e) {
                    Error::Tls {
                        method: method.clone(),
                        path: path.to_owned(),
                        source: Box::new(e),
                    }
                } else if e.is_connect() {
                    Error::Connect {
                        method: method.clone(),
                        path: path.to_owned(),
                        source: Box::new(e),
                    }
                } else {
                    Error::Transport {
                        method: method.clone(),
                        path: path.to_owned(),
                        source: Box::new(e),
                    }
                }
            })?;
            let (parts, body) = response.into_parts();
            let bytes = body.collect().await.map_err(|e| Error::Transport {
                method: method.clone(),
                path: path.to_owned(),
                source: Box::new(e),
            })?;
            Ok::<_, Error>((parts, bytes.to_bytes()))
        };
        let Ok(exchanged) = tokio::time::timeout(timeout, exchange).await else {
            // pveproxy queues what its workers cannot take: no answer in time is an overload too.
            slot.overloaded(None);
            return Err(Error::Timeout {
                method: method.clone(),
                path: path.to_owned(),
                timeout,
            });
        };
        let (parts, bytes) = exchanged?;
        tracing::trace!(%method, path, status = parts.status.as_u16(), attempt, "PVE response");
        if matches!(parts.status.as_u16(), 429 | 503) {
            let retry_after = crate::limit::retry_after(&parts.headers);
            tracing::debug!(%method, path, status = parts.status.as_u16(), ?retry_after, "the server is overloaded: fewer requests at once");
            slot.overloaded(retry_after);
        } else {
            slot.answered();
        }
        decode(method, path, &parts, &bytes)
    }
}

fn is_tls_failure(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if e.is::<crate::tls::TlsHandshakeError>() {
            return true;
        }
        cur = e.source();
    }
    false
}

fn encode_form(params: &[(String, String)]) -> String {
    let mut ser = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in params {
        ser.append_pair(k, v);
    }
    ser.finish()
}

/// `multipart/form-data`: the plain fields first (PVE needs `content` before the file), then the
/// file part named `filename`.
fn multipart(boundary: &str, fields: &[(String, String)], file_name: &str, data: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(data.len() + 512);
    for (k, v) in fields {
        out.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n").as_bytes(),
        );
    }
    let quoted = file_name.replace(['"', '\r', '\n'], "_");
    out.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"filename\"; filename=\"{quoted}\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    out.extend_from_slice(data);
    out.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    Bytes::from(out)
}

/// Turns a response into `data` or an [`Error::Api`].
pub(crate) fn decode<T: DeserializeOwned>(
    method: &Method,
    path: &str,
    parts: &http::response::Parts,
    body: &[u8],
) -> Result<T> {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    if parts.status == StatusCode::OK {
        let mut json = match json {
            Some(v) => v,
            None => {
                let source = serde_json::from_slice::<Value>(body).expect_err("parse failed above");
                return Err(Error::Decode {
                    method: method.clone(),
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let data = json
            .as_object_mut()
            .and_then(|m| m.remove("data"))
            .unwrap_or(Value::Null);
        return serde_json::from_value(data).map_err(|source| Error::Decode {
            method: method.clone(),
            path: path.to_owned(),
            source,
        });
    }
    let body_message = json
        .as_ref()
        .and_then(|v| v.get("message"))
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_owned);
    let reason = parts
        .extensions
        .get::<hyper::ext::ReasonPhrase>()
        .map(|r| String::from_utf8_lossy(r.as_bytes()).trim().to_owned())
        .or_else(|| parts.status.canonical_reason().map(str::to_owned))
        .unwrap_or_default();
    let errors = json
        .as_ref()
        .and_then(|v| v.get("errors"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let text = v
                        .as_str()
                        .map(|s| s.trim().to_owned())
                        .unwrap_or_else(|| v.to_string());
                    (k.clone(), text)
                })
                .collect()
        })
        .unwrap_or_default();
    Err(Error::Api {
        method: method.clone(),
        path: path.to_owned(),
        status: parts.status.as_u16(),
        message: body_message.unwrap_or(reason),
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn parts(status: u16, reason: Option<&'static str>) -> http::response::Parts {
        let mut resp = http::Response::builder().status(status).body(()).unwrap();
        if let Some(r) = reason {
            resp.extensions_mut()
                .insert(hyper::ext::ReasonPhrase::from_static(r.as_bytes()));
        }
        resp.into_parts().0
    }

    #[test]
    fn decodes_data() {
        let v: Vec<u32> = decode(&Method::GET, "/x", &parts(200, None), br#"{"data":[1,2]}"#).unwrap();
        assert_eq!(v, vec![1, 2]);
        let unit: () = decode(&Method::PUT, "/x", &parts(200, None), br#"{"data":null}"#).unwrap();
        assert_eq!(unit, ());
        let missing: Option<String> = decode(&Method::PUT, "/x", &parts(200, None), b"{}").unwrap();
        assert_eq!(missing, None);
    }

    #[test]
    fn bad_success_bodies_are_decode_errors() {
        let err = decode::<u32>(&Method::GET, "/x", &parts(200, None), b"<html>").unwrap_err();
        assert!(matches!(err, Error::Decode { .. }), "{err}");
        let err = decode::<u32>(&Method::GET, "/x", &parts(200, None), br#"{"data":"abc"}"#).unwrap_err();
        assert!(matches!(err, Error::Decode { .. }), "{err}");
    }

    #[test]
    fn error_message_prefers_body_then_reason_phrase() {
        let body = br#"{"data":null,"message":"VM 100 is running - destroy failed\n"}"#;
        let err = decode::<()>(
            &Method::DELETE,
            "/x",
            &parts(500, Some("VM 100 is running - destroy failed")),
            body,
        )
        .unwrap_err();
        assert_eq!(err.message(), Some("VM 100 is running - destroy failed"));
        let err = decode::<()>(
            &Method::GET,
            "/x",
            &parts(401, Some("No ticket")),
            br#"{"data":null}"#,
        )
        .unwrap_err();
        assert_eq!((err.status(), err.message()), (Some(401), Some("No ticket")));
        let err = decode::<()>(&Method::GET, "/x", &parts(503, None), b"").unwrap_err();
        assert_eq!(err.message(), Some("Service Unavailable"));
    }

    #[test]
    fn keeps_the_errors_map() {
        let body = br#"{"data":null,"errors":{"vmid":"VM 100 already exists\n","x":5}}"#;
        let err = decode::<()>(
            &Method::POST,
            "/x",
            &parts(400, Some("Parameter verification failed.")),
            body,
        )
        .unwrap_err();
        let errors = err.param_errors().unwrap();
        assert_eq!(errors["vmid"], "VM 100 already exists");
        assert_eq!(errors["x"], "5");
        assert_eq!(err.message(), Some("Parameter verification failed."));
    }

    #[test]
    fn backoff_grows_is_bounded_and_jittered() {
        let policy = RetryPolicy {
            max_retries: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for retry in 0..12 {
            let cap = (Duration::from_millis(100) * 2u32.pow(retry.min(10))).min(Duration::from_secs(1));
            let samples: Vec<_> = (0..50).map(|_| policy.backoff(retry, &mut rng)).collect();
            assert!(
                samples.iter().all(|d| *d >= cap / 2 && *d <= cap),
                "retry {retry}: {samples:?}"
            );
            assert!(
                samples.iter().any(|d| *d != samples[0]),
                "no jitter at retry {retry}"
            );
        }
    }

    #[test]
    fn multipart_puts_content_before_the_file() {
        let params = vec![("content".to_owned(), "iso".to_owned())];
        let body = multipart("B", &params, "seed.iso", b"DATA");
        let text = String::from_utf8_lossy(&body);
        let content = text.find("name=\"content\"").unwrap();
        let file = text.find("name=\"filename\"; filename=\"seed.iso\"").unwrap();
        assert!(content < file);
        assert!(text.ends_with("\r\nDATA\r\n--B--\r\n"));
    }

    #[test]
    fn path_segments_escape_slashes_only_where_needed() {
        assert_eq!(path_segment("local:iso/seed 1.iso"), "local:iso%2Fseed%201.iso");
        assert_eq!(
            path_segment("UPID:pve1:0000:0000:0000:qmstart:100:root@pam!t:"),
            "UPID:pve1:0000:0000:0000:qmstart:100:root@pam!t:"
        );
    }

    fn assert_send<T: Send>(_: &T) {}

    #[test]
    fn client_futures_are_send() {
        let c = Client::builder("https://h")
            .password("root@pam", "pw")
            .build()
            .unwrap();
        assert_send(&c.version());
        assert_send(&c.clone_vm("pve1", 9000, &crate::CloneRequest::default()));
        assert_send(&c.upload("pve1", "local", crate::UploadContent::Iso, "a.iso", Vec::new()));
        let upid: crate::Upid = "UPID:pve1:00000001:00000002:00000003:qmstart:100:root@pam:"
            .parse()
            .unwrap();
        assert_send(&c.wait_task(&upid, Duration::ZERO, Duration::ZERO));
    }

    #[test]
    fn clients_that_limit_per_endpoint_share_one_bound_per_host_and_port() {
        let build = |url: &str, shared: bool| {
            let builder = Client::builder(url).token("a@pam!t", "s");
            let builder = if shared {
                builder.limit_per_endpoint()
            } else {
                builder
            };
            builder.build().unwrap()
        };
        let a = build("https://pve-limit.example.com", true);
        let b = build("https://PVE-LIMIT.example.com:8006/", true);
        let other_port = build("https://pve-limit.example.com:8007", true);
        let own = build("https://pve-limit.example.com:8006", false);
        assert!(
            Arc::ptr_eq(&a.inner.limiter, &b.inner.limiter),
            "8006 is the default port"
        );
        assert!(!Arc::ptr_eq(&a.inner.limiter, &other_port.inner.limiter));
        assert!(!Arc::ptr_eq(&a.inner.limiter, &own.inner.limiter));
    }

    #[test]
    fn builder_validates() {
        assert!(matches!(
            Client::builder("https://h").build(),
            Err(Error::Config(_))
        ));
        assert!(matches!(
            Client::builder("http://h").token("a@pam!t", "s").build(),
            Err(Error::Config(_))
        ));
        assert!(matches!(
            Client::builder("https://h").token("nobang", "s").build(),
            Err(Error::Config(_))
        ));
        let c = Client::builder("https://pve.example:8006/api2/json/")
            .token("a@pam!t", "s3cr3t")
            .build()
            .unwrap();
        assert_eq!(c.base_url(), "https://pve.example:8006");
        let debug = format!("{c:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        let b = Client::builder("https://h").password("root@pam", "hunter2");
        assert!(!format!("{b:?}").contains("hunter2"));
    }
}
