//! HTTPS front end: TLS, authentication, body parsing, schema checks, fault injection, dispatch.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http::{Method, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

use crate::config::SimConfig;
use crate::faults::{FaultEffect, FaultInjector, FaultRule};
use crate::schema::ApiSchema;
use crate::state::{ApiError, Request, State, value_text};

/// The response type of the service.
pub(crate) type Resp = Response<Full<Bytes>>;

/// Returned by the service to make hyper drop the connection (fault injection).
#[derive(Debug, thiserror::Error)]
#[error("connection dropped by fault injection")]
pub(crate) struct DropConnection;

#[derive(Debug, Clone)]
struct Ticket {
    user: String,
    csrf: String,
    issued: Instant,
    epoch: u64,
}

/// Everything the request handlers share.
pub(crate) struct Shared {
    pub cfg: Arc<SimConfig>,
    pub schema: Arc<ApiSchema>,
    pub state: Mutex<State>,
    pub faults: FaultInjector,
    pub token_id: String,
    pub token_secret: String,
    pub password: String,
    tickets: Mutex<HashMap<String, Ticket>>,
    rng: Mutex<ChaCha8Rng>,
    /// Responses that did not match the declared `returns` (when `check_returns` is on).
    pub violations: Mutex<Vec<String>>,
    /// Requests that reached a handler, by `METHOD /schema/path/{template}`.
    pub calls: Mutex<std::collections::BTreeMap<String, u64>>,
    /// API requests being served now, and the most at once so far.
    pub in_flight: (std::sync::atomic::AtomicUsize, std::sync::atomic::AtomicUsize),
}

/// Counts one API request in flight while it lives.
struct InFlight<'a>(&'a Shared);

impl<'a> InFlight<'a> {
    fn enter(shared: &'a Shared) -> Self {
        use std::sync::atomic::Ordering::SeqCst;
        let now = shared.in_flight.0.fetch_add(1, SeqCst) + 1;
        shared.in_flight.1.fetch_max(now, SeqCst);
        Self(shared)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0
            .in_flight
            .0
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn new(cfg: Arc<SimConfig>, schema: Arc<ApiSchema>, fingerprint: String) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0xa11c_e5ed);
        let token_secret = cfg.token_secret.clone().unwrap_or_else(|| {
            uuid::Builder::from_random_bytes(rng.random())
                .into_uuid()
                .to_string()
        });
        let password = cfg.password.clone().unwrap_or_else(|| {
            let b: [u8; 12] = rng.random();
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
        });
        Self {
            token_id: format!("{}!{}", cfg.username, cfg.token_name),
            token_secret,
            password,
            state: Mutex::new(State::new(cfg.clone(), schema.clone(), fingerprint)),
            faults: FaultInjector::new(cfg.seed),
            tickets: Mutex::new(HashMap::new()),
            rng: Mutex::new(rng),
            violations: Mutex::new(Vec::new()),
            calls: Mutex::new(std::collections::BTreeMap::new()),
            in_flight: Default::default(),
            schema,
            cfg,
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        let mut s = lock(&self.state);
        s.advance(Instant::now());
        s
    }

    fn issue_ticket(&self, user: &str) -> (String, String) {
        let (sig, csrf_sig): ([u8; 32], [u8; 16]) = {
            let mut rng = lock(&self.rng);
            (rng.random(), rng.random())
        };
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let b64 = base64::engine::general_purpose::STANDARD_NO_PAD;
        let ticket = format!("PVE:{user}:{time:08X}::{}", b64.encode(sig));
        let csrf = format!("{time:08X}:{}", b64.encode(csrf_sig));
        let entry = Ticket {
            user: user.to_owned(),
            csrf: csrf.clone(),
            issued: Instant::now(),
            epoch: self.faults.ticket_epoch(),
        };
        lock(&self.tickets).insert(ticket.clone(), entry);
        (ticket, csrf)
    }

    fn valid_ticket(&self, ticket: &str) -> Option<Ticket> {
        let epoch = self.faults.ticket_epoch();
        let tickets = lock(&self.tickets);
        tickets
            .get(ticket)
            .filter(|t| t.epoch == epoch && t.issued.elapsed() < self.cfg.ticket_lifetime)
            .cloned()
    }

    /// Authenticates a request: `Ok(user)` or `Err(401 reason)`.
    fn authenticate(&self, headers: &http::HeaderMap, method: &Method) -> Result<String, &'static str> {
        if let Some(auth) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
            let token = auth
                .trim()
                .strip_prefix("PVEAPIToken")
                .map(|t| t.trim_start_matches(['=', ' ']));
            let Some(token) = token else {
                return Err("authentication failure");
            };
            let (id, secret) = token.rsplit_once('=').ok_or("authentication failure")?;
            return if id == self.token_id && constant_eq(secret.as_bytes(), self.token_secret.as_bytes()) {
                Ok(id.to_owned())
            } else {
                Err("authentication failure")
            };
        }
        let cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|c| c.trim().strip_prefix("PVEAuthCookie="))
            .map(|c| {
                percent_encoding::percent_decode_str(c)
                    .decode_utf8_lossy()
                    .into_owned()
            });
        let Some(ticket) = cookie.filter(|c| !c.is_empty()) else {
            return Err("No ticket");
        };
        let entry = self.valid_ticket(&ticket).ok_or("authentication failure")?;
        if method != Method::GET {
            let csrf = headers.get("CSRFPreventionToken").and_then(|v| v.to_str().ok());
            if csrf != Some(entry.csrf.as_str()) {
                return Err("Permission denied - invalid csrf token");
            }
        }
        Ok(entry.user)
    }
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Builds a PVE JSON response; errors get the message as reason phrase and in the body.
pub(crate) fn respond(result: Result<Value, ApiError>) -> Resp {
    match result {
        Ok(data) => json_response(StatusCode::OK, None, &json!({ "data": data })),
        Err(e) => {
            let mut body = json!({"data": null, "message": format!("{}\n", e.message)});
            if let Some(errors) = e.errors {
                body["errors"] = json!(errors);
            }
            let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            json_response(status, Some(first_line(&e.message)), &body)
        }
    }
}

fn first_line(msg: &str) -> &str {
    msg.lines().next().unwrap_or_default()
}

fn json_response(status: StatusCode, reason: Option<&str>, body: &Value) -> Resp {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(bytes)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json;charset=UTF-8"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, http::HeaderValue::from_static("max-age=0"));
    if let Some(reason) = reason {
        // Reason phrases may not contain control characters; PVE messages are plain text.
        let clean: String = reason.chars().filter(|c| !c.is_control()).collect();
        if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(clean) {
            resp.extensions_mut().insert(phrase);
        }
    }
    resp
}

fn unauthorized(reason: &str) -> Resp {
    json_response(StatusCode::UNAUTHORIZED, Some(reason), &json!({"data": null}))
}

/// The hyper service: one request in, one response out (or a dropped connection).
pub(crate) async fn serve(shared: Arc<Shared>, req: http::Request<Incoming>) -> Result<Resp, DropConnection> {
    let path = req.uri().path().to_owned();
    if let Some(rest) = path.strip_prefix("/_sim/") {
        return Ok(admin(&shared, req, rest.to_owned()).await);
    }
    let _counted = InFlight::enter(&shared);
    let method = req.method().clone();
    let Some(rel) = path.strip_prefix("/api2/json") else {
        return Ok(respond(Err(ApiError::new(
            501,
            format!("Method '{method} {path}' not implemented"),
        ))));
    };
    let rel = if rel.is_empty() {
        "/".to_owned()
    } else {
        rel.trim_end_matches('/').to_owned()
    };
    let rel = if rel.is_empty() { "/".to_owned() } else { rel };
    let is_login = rel == "/access/ticket";
    let user = if is_login {
        String::new()
    } else {
        match shared.authenticate(req.headers(), &method) {
            Ok(user) => user,
            Err(reason) => {
                tokio::time::sleep(shared.cfg.auth_failure_delay).await;
                return Ok(unauthorized(reason));
            }
        }
    };
    let mut task_failure = None;
    for effect in shared.faults.evaluate(method.as_str(), &rel) {
        match effect {
            FaultEffect::Latency { millis } => tokio::time::sleep(Duration::from_millis(millis)).await,
            FaultEffect::DropConnection => return Err(DropConnection),
            FaultEffect::Status { code, message } => return Ok(respond(Err(ApiError::new(code, message)))),
            FaultEffect::TaskFailure { exitstatus } => task_failure = Some(exitstatus),
        }
    }
    let result = api(&shared, req, &method, &rel, user, task_failure).await;
    let resp = match result {
        Ok(Handled::Data(v)) => respond(Ok(v)),
        Ok(Handled::Unauthorized(reason)) => {
            tokio::time::sleep(shared.cfg.auth_failure_delay).await;
            unauthorized(reason)
        }
        Err(e) => respond(Err(e)),
    };
    tracing::debug!(method = %method, path = %rel, status = resp.status().as_u16(), "request");
    Ok(resp)
}

enum Handled {
    Data(Value),
    Unauthorized(&'static str),
}

async fn api(
    shared: &Arc<Shared>,
    req: http::Request<Incoming>,
    method: &Method,
    rel: &str,
    user: String,
    task_failure: Option<String>,
) -> Result<Handled, ApiError> {
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let multipart = content_type.starts_with("multipart/form-data");
    let query = req.uri().query().unwrap_or_default().to_owned();
    let limit = if multipart {
        shared.cfg.upload_limit
    } else {
        shared.cfg.body_limit
    };
    let body = match Limited::new(req.into_body(), limit).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(ApiError::new(501, "request too large"));
        }
        Err(_) => return Err(ApiError::new(400, "error reading request body")),
    };
    let mut params: BTreeMap<String, Value> = BTreeMap::new();
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(&query).map_err(|_| ApiError::new(400, "unable to parse query string"))?;
    for (k, v) in pairs {
        params.insert(k, Value::String(v));
    }
    let mut upload = None;
    if matches!(*method, Method::GET | Method::DELETE) {
        if !body.is_empty() {
            return Err(ApiError::new(
                501,
                format!("Unexpected content for method '{method}'"),
            ));
        }
    } else if !body.is_empty() {
        if content_type.starts_with("application/json") {
            match serde_json::from_slice::<Value>(&body) {
                Ok(Value::Object(map)) => params.extend(map),
                _ => return Err(ApiError::new(400, "malformed JSON request body")),
            }
        } else if multipart {
            upload = Some(parse_multipart(&content_type, body, &mut params).await?);
        } else {
            let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(&body)
                .map_err(|_| ApiError::new(400, "unable to parse form body"))?;
            for (k, v) in pairs {
                params.insert(k, Value::String(v));
            }
        }
    }
    let endpoint = shared
        .schema
        .find(method.as_str(), rel)
        .map_err(|e| ApiError::new(501, e.to_string()))?;
    for (k, v) in &endpoint.path_params {
        params.insert(k.clone(), Value::String(v.clone()));
    }
    shared
        .schema
        .validate(endpoint.info, &params)
        .map_err(ApiError::params)?;
    if endpoint.template == "/access/ticket" {
        return login(shared, method, &params);
    }
    *lock(&shared.calls)
        .entry(format!("{method} {}", endpoint.template))
        .or_default() += 1;
    let request = Request {
        template: endpoint.template.to_owned(),
        path: rel.to_owned(),
        method: method.as_str().to_owned(),
        params,
        user,
        task_failure,
        upload,
    };
    let (data, fetches) = {
        let mut state = shared.state();
        state.authorize(endpoint.info.get("permissions"), &request)?;
        let data = state.handle(&request)?;
        (data, state.take_fetches())
    };
    for fetch in fetches {
        tokio::spawn(fetch_download(shared.clone(), fetch));
    }
    if shared.cfg.check_returns {
        let problems = crate::schema::check_returns(endpoint.returns(), &data);
        if !problems.is_empty() {
            tracing::warn!(method = %method, path = %rel, ?problems, "response does not match declared returns");
            let mut list = lock(&shared.violations);
            if list.len() < MAX_VIOLATIONS {
                list.extend(problems.into_iter().map(|p| format!("{method} {rel}: {p}")));
            }
        }
    }
    Ok(Handled::Data(data))
}

/// Longest a `download-url` fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(600);

/// Fetches what a `download-url` task downloads (plain HTTP: the simulator reaches only the
/// test's own servers) and ends the task with it.
async fn fetch_download(shared: Arc<Shared>, fetch: crate::state::Fetch) {
    let fetched = async {
        let uri: http::Uri = fetch
            .url
            .parse()
            .map_err(|e| format!("invalid URL '{}': {e}", fetch.url))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!(
                "the simulator downloads only http:// URLs, not '{}'",
                fetch.url
            ));
        }
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http::<http_body_util::Empty<bytes::Bytes>>();
        let response = client
            .get(uri)
            .await
            .map_err(|e| format!("unable to download '{}': {e}", fetch.url))?;
        if !response.status().is_success() {
            return Err(format!(
                "download failed: {} {}",
                response.status().as_u16(),
                response.status().canonical_reason().unwrap_or_default()
            ));
        }
        Limited::new(response.into_body(), shared.cfg.upload_limit)
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .map_err(|e| format!("download of '{}' failed: {e}", fetch.url))
    };
    let outcome = tokio::time::timeout(FETCH_TIMEOUT, fetched)
        .await
        .unwrap_or_else(|_| Err(format!("download of '{}' timed out", fetch.url)));
    shared.state().fetched(&fetch, outcome);
}

/// At most this many `returns` violations are kept for inspection.
const MAX_VIOLATIONS: usize = 1000;

fn login(shared: &Shared, method: &Method, params: &BTreeMap<String, Value>) -> Result<Handled, ApiError> {
    if *method == Method::GET {
        return Ok(Handled::Data(Value::Null));
    }
    let mut username = params.get("username").map(value_text).unwrap_or_default();
    if let Some(realm) = params.get("realm").map(value_text)
        && !username.contains('@')
    {
        username = format!("{username}@{realm}");
    }
    let password = params.get("password").map(value_text).unwrap_or_default();
    let ok = username == shared.cfg.username
        && (constant_eq(password.as_bytes(), shared.password.as_bytes())
            || shared.valid_ticket(&password).is_some_and(|t| t.user == username));
    if !ok {
        return Ok(Handled::Unauthorized("authentication failure"));
    }
    let (ticket, csrf) = shared.issue_ticket(&username);
    Ok(Handled::Data(json!({
        "username": username, "ticket": ticket, "CSRFPreventionToken": csrf, "clustername": "banlieue-sim",
        "cap": {"vms": {"VM.Allocate": 1, "VM.Clone": 1, "VM.Config.Disk": 1, "VM.PowerMgmt": 1, "VM.Audit": 1},
                "storage": {"Datastore.AllocateTemplate": 1, "Datastore.Audit": 1}}
    })))
}

/// Parses `content=iso` then the file part `filename`; returns the file bytes.
async fn parse_multipart(
    content_type: &str,
    body: Bytes,
    params: &mut BTreeMap<String, Value>,
) -> Result<Vec<u8>, ApiError> {
    let boundary =
        multer::parse_boundary(content_type).map_err(|_| ApiError::new(400, "multipart boundary missing"))?;
    let stream = futures::stream::once(async move { Ok::<Bytes, Infallible>(body) });
    let mut mp = multer::Multipart::new(stream, boundary);
    let mut file = None;
    loop {
        let field = match mp.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return Err(ApiError::new(400, format!("malformed multipart body: {e}"))),
        };
        let name = field.name().unwrap_or_default().to_owned();
        if let Some(file_name) = field.file_name().map(str::to_owned) {
            if name != "filename" {
                return Err(ApiError::param(&name, crate::schema::UNDECLARED));
            }
            if !params.contains_key("content") {
                // PVE reads parameters up to the file part; anything after it is not seen.
                return Err(ApiError::param("content", crate::schema::MISSING));
            }
            let data = field
                .bytes()
                .await
                .map_err(|e| ApiError::new(400, format!("malformed multipart body: {e}")))?;
            params.insert("filename".into(), Value::String(file_name));
            file = Some(data.to_vec());
            break;
        }
        let text = field
            .text()
            .await
            .map_err(|e| ApiError::new(400, format!("malformed multipart body: {e}")))?;
        params.insert(name, Value::String(text));
    }
    file.ok_or_else(|| ApiError::param("filename", crate::schema::MISSING))
}

/// `/_sim/...`: fault rules, ticket expiry and state inspection for the CLI. Requires the API token.
async fn admin(shared: &Shared, req: http::Request<Incoming>, rest: String) -> Resp {
    let method = req.method().clone();
    let token_ok =
        matches!(shared.authenticate(req.headers(), &Method::GET), Ok(ref u) if *u == shared.token_id);
    if !token_ok {
        tokio::time::sleep(shared.cfg.auth_failure_delay).await;
        return unauthorized("authentication failure");
    }
    let body = match Limited::new(req.into_body(), 64 * 1024).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return respond(Err(ApiError::new(400, "body too large"))),
    };
    let result = match (method.as_str(), rest.trim_end_matches('/')) {
        ("GET", "faults") => Ok(json!(shared.faults.rules())),
        ("POST", "faults") => match serde_json::from_slice::<FaultRule>(&body) {
            Ok(rule) => shared
                .faults
                .add(rule)
                .map(|i| json!({"index": i}))
                .map_err(|e| ApiError::new(400, e.to_string())),
            Err(e) => Err(ApiError::new(400, format!("invalid fault rule: {e}"))),
        },
        ("DELETE", "faults") => {
            shared.faults.clear();
            Ok(Value::Null)
        }
        ("POST", "tickets/expire") => {
            shared.faults.expire_all_tickets();
            Ok(Value::Null)
        }
        ("GET", "vms") => Ok(json!(shared.state().vm_infos())),
        ("GET", "tasks") => Ok(json!(shared.state().task_infos())),
        ("GET", seed) if seed.starts_with("seed/") => {
            match seed
                .trim_start_matches("seed/")
                .parse::<u32>()
                .ok()
                .and_then(|id| shared.state().seed(id))
            {
                Some(s) => Ok(json!(s)),
                None => Err(ApiError::new(404, "no seed ISO attached")),
            }
        }
        _ => Err(ApiError::new(
            404,
            format!("no admin endpoint '{method} /_sim/{rest}'"),
        )),
    };
    respond(result)
}
