//! The SOAP transport: one POST per call to `<server>/sdk`, the session cookie, re-login.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, COOKIE, SET_COOKIE};
use http::{HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{Mutex, OnceCell};
use tracing::debug;

use crate::error::{Error, Result};
use crate::objects::{MoRef, ServiceContent};
use crate::secret::Secret;
use crate::tls::{HttpsConnector, TlsHandshakeError, TlsVerification, client_config};
use crate::xml::{self, Element};

/// The `SOAPAction` vim25 version sent with every call.
pub const VIM_VERSION: &str = "urn:vim25/8.0.1.0";
const SESSION_COOKIE: &str = "vmware_soap_session";

/// Builds a [`Client`].
#[derive(Clone)]
pub struct ClientBuilder {
    server: String,
    username: String,
    password: Secret,
    tls: TlsVerification,
    server_name: Option<String>,
    timeout: Duration,
    connect_timeout: Duration,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("server", &self.server)
            .field("username", &self.username)
            .field("tls", &self.tls)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// A builder for `server`: a host name, `host:port`, or an `https://` URL (the `/sdk` path
    /// is added when missing).
    pub fn new(server: impl Into<String>, username: impl Into<String>, password: impl Into<Secret>) -> Self {
        Self {
            server: server.into(),
            username: username.into(),
            password: password.into(),
            tls: TlsVerification::default(),
            server_name: None,
            timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
        }
    }

    /// How vCenter's certificate is verified (default: web PKI).
    pub fn tls(mut self, tls: TlsVerification) -> Self {
        self.tls = tls;
        self
    }

    /// Verifies the certificate against `name` instead of the server's host (`tls.serverName`).
    pub fn server_name(mut self, name: Option<String>) -> Self {
        self.server_name = name;
        self
    }

    /// Timeout of one call, from sending to the end of the answer (default 60 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Timeout of TCP connect plus TLS handshake (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Builds the client. No request is sent until the first call.
    pub fn build(self) -> Result<Client> {
        let endpoint = sdk_url(&self.server)?;
        let tls = client_config(&self.tls)?;
        if let Some(name) = &self.server_name {
            crate::tls::check_server_name(name)?;
        }
        let connector = HttpsConnector {
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            connect_timeout: self.connect_timeout,
            server_name: self.server_name,
        };
        let upload_http = HyperClient::builder(TokioExecutor::new()).build(connector.clone());
        let http = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                upload_http,
                connect_timeout: self.connect_timeout,
                endpoint,
                username: self.username,
                password: self.password,
                timeout: self.timeout,
                session: Mutex::new(None),
                rest_session: Mutex::new(None),
                content: OnceCell::new(),
            }),
        })
    }
}

/// `https://host[:port]/sdk` from what a user writes in `spec.server`.
pub fn sdk_url(server: &str) -> Result<http::Uri> {
    let server = server.trim().trim_end_matches('/');
    if server.is_empty() || server.ends_with(':') {
        return Err(Error::Config(format!("server {server:?} has no host")));
    }
    let with_scheme = if server.contains("://") {
        server.to_owned()
    } else {
        format!("https://{server}")
    };
    if !with_scheme.starts_with("https://") {
        return Err(Error::Config(format!(
            "server {server:?}: only https:// is supported"
        )));
    }
    let full = if with_scheme.ends_with("/sdk") {
        with_scheme
    } else {
        format!("{with_scheme}/sdk")
    };
    let uri: http::Uri = full
        .parse()
        .map_err(|e| Error::Config(format!("server {server:?}: {e}")))?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(Error::Config(format!("server {server:?} has no host")));
    }
    Ok(uri)
}

/// A vSphere SOAP client. Cheap to clone; clones share the session.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// The body of an upload: a file streamed in pieces.
pub(crate) type UploadBody = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

struct Inner {
    http: HyperClient<HttpsConnector, Full<Bytes>>,
    /// The same connection settings for uploads (disks of an imported OVF).
    upload_http: HyperClient<HttpsConnector, UploadBody>,
    /// TCP connect plus TLS handshake timeout (for the upload clients of other hosts too).
    connect_timeout: Duration,
    endpoint: http::Uri,
    username: String,
    password: Secret,
    timeout: Duration,
    /// The session cookie (`vmware_soap_session="…"`), `None` before login.
    session: Mutex<Option<Secret>>,
    /// The vAPI REST session id, `None` before its login.
    rest_session: Mutex<Option<Secret>>,
    content: OnceCell<ServiceContent>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.inner.endpoint)
            .field("username", &self.inner.username)
            .finish_non_exhaustive()
    }
}

/// A header value kept out of debug output (a cookie, a session id, credentials).
fn sensitive(value: &str, what: &str, name: &str) -> Result<HeaderValue> {
    let mut value = HeaderValue::from_str(value).map_err(|e| Error::Decode {
        method: what.into(),
        message: format!("{name}: {e}"),
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// Wraps a method body in a SOAP envelope.
pub fn envelope(method: &str, body: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
<soapenv:Envelope xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" \
xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\" xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\">\
<soapenv:Body><{method} xmlns=\"urn:vim25\">{body}</{method}></soapenv:Body></soapenv:Envelope>"
    )
}

/// Extracts the fault type and message of a SOAP fault body.
pub fn fault_of(body: &Element) -> Option<(String, String)> {
    let fault = body.child("Fault")?;
    let message = fault
        .child_text("faultstring")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let detail = fault.child("detail").and_then(|d| d.children.first());
    let kind = detail
        .map(|d| {
            d.xsi_type()
                .map(str::to_owned)
                .unwrap_or_else(|| d.local_name().trim_end_matches("Fault").to_owned())
        })
        .unwrap_or_else(|| "SoapFault".to_owned());
    // A refused privilege (NoPermission and its subtypes) names the privilege and the object:
    // what the account's owner must grant.
    let missing = detail.and_then(|d| {
        let privilege = d.child_text("privilegeId")?.trim();
        let object = d.child("object");
        let on = object
            .map(|o| format!(" on {} {}", o.attr("type").unwrap_or("object"), o.text.trim()))
            .unwrap_or_default();
        (!privilege.is_empty()).then(|| format!("the account lacks the privilege {privilege}{on}"))
    });
    let message = match (missing, message.is_empty()) {
        (Some(missing), true) => missing,
        (Some(missing), false) => format!("{message} ({missing})"),
        (None, _) => message,
    };
    Some((kind, message))
}

impl Client {
    /// The server's ServiceContent (fetched once, without a session).
    pub async fn service_content(&self) -> Result<&ServiceContent> {
        self.inner
            .content
            .get_or_try_init(|| async {
                let body = "<_this type=\"ServiceInstance\">ServiceInstance</_this>";
                let resp = self.post("RetrieveServiceContent", body, None).await?;
                let rv = resp.child("returnval").ok_or_else(|| Error::Decode {
                    method: "RetrieveServiceContent".into(),
                    message: "no returnval".into(),
                })?;
                ServiceContent::from_xml(rv).map_err(|message| Error::Decode {
                    method: "RetrieveServiceContent".into(),
                    message,
                })
            })
            .await
    }

    /// Logs in now (normally done lazily by the first call), replacing any session.
    pub async fn login(&self) -> Result<()> {
        let mut guard = self.inner.session.lock().await;
        *guard = None;
        self.login_locked(&mut guard).await
    }

    async fn login_locked(&self, guard: &mut Option<Secret>) -> Result<()> {
        let sm = self.service_content().await?.session_manager.clone();
        let body = format!(
            "{}<userName>{}</userName><password>{}</password>",
            sm.to_xml("_this"),
            xml::escape(&self.inner.username),
            xml::escape(self.inner.password.expose())
        );
        let (_, cookie) = self.post_raw("Login", &body, None).await?;
        let cookie = cookie.ok_or_else(|| Error::Decode {
            method: "Login".into(),
            message: format!("no {SESSION_COOKIE} cookie in the answer"),
        })?;
        debug!(user = %self.inner.username, "logged in to vCenter");
        *guard = Some(cookie);
        Ok(())
    }

    /// Logs in unless a session exists (checks credentials and TLS without another call).
    pub async fn login_if_needed(&self) -> Result<()> {
        let mut guard = self.inner.session.lock().await;
        if guard.is_none() {
            self.login_locked(&mut guard).await?;
        }
        Ok(())
    }

    /// Ends the session (best effort).
    pub async fn logout(&self) -> Result<()> {
        let sm = self.service_content().await?.session_manager.clone();
        let cookie = self.inner.session.lock().await.take();
        if let Some(cookie) = cookie {
            self.post("Logout", &sm.to_xml("_this"), Some(&cookie)).await?;
        }
        Ok(())
    }

    /// Calls a vim25 method with an authenticated session; logs in first if needed and once
    /// more when the server says the session is gone (`NotAuthenticated`). Returns the
    /// `<methodResponse>` element.
    pub async fn call(&self, method: &str, body: &str) -> Result<Element> {
        let cookie = {
            let mut guard = self.inner.session.lock().await;
            if guard.is_none() {
                self.login_locked(&mut guard).await?;
            }
            guard.clone()
        };
        match self.post(method, body, cookie.as_ref()).await {
            Err(e) if e.fault() == Some("NotAuthenticated") => {
                debug!(method, "session expired; logging in again");
                let cookie = {
                    let mut guard = self.inner.session.lock().await;
                    // Another call may have logged in meanwhile.
                    if *guard == cookie {
                        self.login_locked(&mut guard).await?;
                    }
                    guard.clone()
                };
                self.post(method, body, cookie.as_ref()).await
            }
            other => other,
        }
    }

    async fn post(&self, method: &str, body: &str, cookie: Option<&Secret>) -> Result<Element> {
        self.post_raw(method, body, cookie).await.map(|(el, _)| el)
    }

    /// One POST; returns the response element and a new session cookie if the server set one.
    async fn post_raw(
        &self,
        method: &str,
        body: &str,
        cookie: Option<&Secret>,
    ) -> Result<(Element, Option<Secret>)> {
        let payload = envelope(method, body);
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(self.inner.endpoint.clone())
            .header(CONTENT_TYPE, "text/xml; charset=utf-8")
            .header("SOAPAction", VIM_VERSION);
        if let Some(cookie) = cookie {
            req = req.header(COOKIE, sensitive(cookie.expose(), method, "session cookie")?);
        }
        let req = req
            .body(Full::new(Bytes::from(payload)))
            .map_err(|e| Error::Config(e.to_string()))?;
        let (status, headers, bytes) = self.exchange(req, method).await?;
        let new_cookie = headers
            .get_all(SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .filter_map(|v| v.split(';').next())
            .find(|pair| pair.trim_start().starts_with(SESSION_COOKIE))
            .map(|pair| Secret::new(pair.trim()));
        let text = String::from_utf8_lossy(&bytes);
        let doc = xml::parse(&text);
        let body = doc.as_ref().ok().and_then(|root| root.child("Body")).cloned();
        if let Some((fault, message)) = body.as_ref().and_then(fault_of) {
            return Err(Error::Fault {
                method: method.into(),
                fault,
                message,
            });
        }
        if !status.is_success() {
            return Err(Error::Http {
                method: method.into(),
                status: status.as_u16(),
                body: text.chars().take(300).collect(),
            });
        }
        let body = body.ok_or_else(|| Error::Decode {
            method: method.into(),
            message: match doc {
                Err(e) => e.to_string(),
                Ok(_) => "no SOAP Body".into(),
            },
        })?;
        let resp = body.children.into_iter().next().ok_or_else(|| Error::Decode {
            method: method.into(),
            message: "empty SOAP Body".into(),
        })?;
        Ok((resp, new_cookie))
    }

    /// Calls the vAPI REST service (`https://<server>/rest<path>`, e.g. tagging) with its own
    /// session (`vmware-api-session-id`, logged in with basic authentication and again once when
    /// the server answers 401). Returns the answer's `value`, `None` when it has none.
    pub async fn rest(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Option<serde_json::Value>> {
        let what = format!("{method} /rest{path}");
        for attempt in 0..2 {
            let session = {
                let mut guard = self.inner.rest_session.lock().await;
                if guard.is_none() {
                    *guard = Some(self.rest_login().await?);
                }
                guard.clone()
            };
            let (status, answer) = self
                .rest_exchange(method.clone(), path, body, session.as_ref(), &what)
                .await?;
            if status == http::StatusCode::UNAUTHORIZED && attempt == 0 {
                *self.inner.rest_session.lock().await = None;
                continue;
            }
            if !status.is_success() {
                return Err(Error::Http {
                    method: what,
                    status: status.as_u16(),
                    body: answer.chars().take(300).collect(),
                });
            }
            if answer.trim().is_empty() {
                return Ok(None);
            }
            let value: serde_json::Value = serde_json::from_str(&answer).map_err(|e| Error::Decode {
                method: what.clone(),
                message: e.to_string(),
            })?;
            return Ok(value.get("value").cloned());
        }
        Err(Error::Http {
            method: what,
            status: 401,
            body: "the vAPI session was refused twice".into(),
        })
    }

    async fn rest_login(&self) -> Result<Secret> {
        let what = "POST /rest/com/vmware/cis/session";
        let (status, answer) = self
            .rest_exchange(Method::POST, "/com/vmware/cis/session", None, None, what)
            .await?;
        if !status.is_success() {
            return Err(Error::Http {
                method: what.into(),
                status: status.as_u16(),
                body: answer.chars().take(300).collect(),
            });
        }
        let id = serde_json::from_str::<serde_json::Value>(&answer)
            .ok()
            .and_then(|v| v.get("value").and_then(|v| v.as_str()).map(str::to_owned))
            .ok_or_else(|| Error::Decode {
                method: what.into(),
                message: "no session id in the answer".into(),
            })?;
        Ok(Secret::new(id))
    }

    /// One REST request: with `session` its header, else (the login) basic authentication.
    async fn rest_exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        session: Option<&Secret>,
        what: &str,
    ) -> Result<(http::StatusCode, String)> {
        let authority = self
            .inner
            .endpoint
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let uri: http::Uri = format!("https://{authority}/rest{path}")
            .parse()
            .map_err(|e| Error::Config(format!("{what}: {e}")))?;
        let credential = match session {
            Some(id) => ("vmware-api-session-id", id.expose().to_owned()),
            None => {
                use base64::Engine as _;
                let credentials = base64::engine::general_purpose::STANDARD.encode(format!(
                    "{}:{}",
                    self.inner.username,
                    self.inner.password.expose()
                ));
                ("authorization", format!("Basic {credentials}"))
            }
        };
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header(credential.0, sensitive(&credential.1, what, credential.0)?)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(
                body.map(|b| b.to_string()).unwrap_or_default(),
            )))
            .map_err(|e| Error::Config(e.to_string()))?;
        let (status, _, bytes) = self.exchange(req, what).await?;
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// Sends `req` and reads the whole answer, bounded by the client's timeout; `what` names
    /// the call in errors.
    async fn exchange(
        &self,
        req: Request<Full<Bytes>>,
        what: &str,
    ) -> Result<(http::StatusCode, http::HeaderMap, Bytes)> {
        let timeout = self.inner.timeout;
        let exchange = async {
            let resp = self
                .inner
                .http
                .request(req)
                .await
                .map_err(|e| classify(what, e))?;
            let (parts, body) = resp.into_parts();
            let bytes = body
                .collect()
                .await
                .map_err(|e| Error::Transport {
                    method: what.into(),
                    source: Box::new(e),
                })?
                .to_bytes();
            Ok::<_, Error>((parts.status, parts.headers, bytes))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| Error::Timeout {
                method: what.into(),
                timeout,
            })?
    }

    /// The `/sdk` URL this client calls.
    pub fn endpoint(&self) -> String {
        self.inner.endpoint.to_string()
    }

    /// The session cookie, logging in first when there is none.
    pub(crate) async fn session_cookie(&self) -> Result<Option<Secret>> {
        let mut guard = self.inner.session.lock().await;
        if guard.is_none() {
            self.login_locked(&mut guard).await?;
        }
        Ok(guard.clone())
    }

    /// An upload client for another host than vCenter whose certificate has the SHA-1
    /// `thumbprint`.
    fn host_upload_client(&self, thumbprint: &str) -> Result<HyperClient<HttpsConnector, UploadBody>> {
        let pin = banlieue_provider_runtime::tls::parse_sha1(thumbprint)
            .map_err(|e| Error::Config(format!("the lease's sslThumbprint: {e}")))?;
        let tls = banlieue_provider_runtime::tls::client_config(
            &banlieue_provider_runtime::tls::Trust::PinnedSha1(pin),
        )
        .map_err(|e| Error::Config(e.to_string()))?;
        let connector = HttpsConnector {
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            connect_timeout: self.inner.connect_timeout,
            server_name: None,
        };
        Ok(HyperClient::builder(TokioExecutor::new()).build(connector))
    }

    /// `url` with a `*` host (what a lease hands out) replaced by this client's server.
    pub(crate) fn on_server(&self, url: &str) -> String {
        match self.inner.endpoint.authority() {
            Some(authority) => url.replacen("://*", &format!("://{authority}"), 1),
            None => url.to_owned(),
        }
    }

    /// Sends `body` to `target` with `method`; `what` names the upload in errors. Bounded by
    /// `timeout`. To vCenter itself: its connection settings and the session cookie. To another
    /// host (an ESXi host of a lease): no cookie, and its certificate pinned by the thumbprint
    /// vCenter gave (else vCenter's trust settings, which a host's certificate may not meet).
    pub(crate) async fn upload(
        &self,
        method: Method,
        target: UploadTarget<'_>,
        length: u64,
        body: UploadBody,
        timeout: Duration,
        what: &str,
    ) -> Result<()> {
        let url = target.url;
        let uri: http::Uri = self
            .on_server(url)
            .parse()
            .map_err(|e| Error::Config(format!("upload URL {url:?}: {e}")))?;
        let to_vcenter = uri.authority() == self.inner.endpoint.authority();
        let (client, cookie) = match (to_vcenter, target.host_thumbprint) {
            (true, _) => (self.inner.upload_http.clone(), self.session_cookie().await?),
            (false, Some(thumbprint)) => (self.host_upload_client(thumbprint)?, None),
            (false, None) => (self.inner.upload_http.clone(), None),
        };
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(CONTENT_TYPE, "application/x-vnd.vmware-streamVmdk")
            .header(http::header::CONTENT_LENGTH, length);
        if let Some(cookie) = cookie {
            req = req.header(COOKIE, sensitive(cookie.expose(), what, "session cookie")?);
        }
        let req = req.body(body).map_err(|e| Error::Config(e.to_string()))?;
        let exchange = async {
            let resp = client.request(req).await.map_err(|e| classify(what, e))?;
            let status = resp.status();
            let text = resp
                .into_body()
                .collect()
                .await
                .map(|b| {
                    String::from_utf8_lossy(&b.to_bytes())
                        .chars()
                        .take(300)
                        .collect::<String>()
                })
                .unwrap_or_default();
            if status.is_success() {
                Ok(())
            } else {
                Err(Error::Http {
                    method: what.into(),
                    status: status.as_u16(),
                    body: text,
                })
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| Error::Timeout {
                method: what.into(),
                timeout,
            })?
    }

    /// The managed object reference of the property collector etc. are in
    /// [`Client::service_content`]; this is a shortcut for the root folder.
    pub async fn root_folder(&self) -> Result<MoRef> {
        Ok(self.service_content().await?.root_folder.clone())
    }
}

fn classify(method: &str, e: hyper_util::client::legacy::Error) -> Error {
    let method = method.to_owned();
    if e.is_connect() {
        let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(s) = src {
            if s.downcast_ref::<TlsHandshakeError>().is_some() {
                return Error::Tls {
                    method,
                    source: Box::new(e),
                };
            }
            src = s.source();
        }
        return Error::Connect {
            method,
            source: Box::new(e),
        };
    }
    Error::Transport {
        method,
        source: Box::new(e),
    }
}

/// Where an upload goes: its URL (host `*`: vCenter's) and, for another host, the SHA-1
/// thumbprint vCenter gave for that host's certificate.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UploadTarget<'a> {
    pub(crate) url: &'a str,
    pub(crate) host_thumbprint: Option<&'a str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_urls() {
        assert_eq!(
            sdk_url("vc.example").unwrap().to_string(),
            "https://vc.example/sdk"
        );
        assert_eq!(
            sdk_url("https://127.0.0.1:8989/sdk").unwrap().to_string(),
            "https://127.0.0.1:8989/sdk"
        );
        assert_eq!(sdk_url("vc:443/").unwrap().to_string(), "https://vc:443/sdk");
        assert!(sdk_url("http://vc.example").is_err());
        assert!(sdk_url("https://").is_err());
        assert!(sdk_url(" ").is_err());
    }

    #[test]
    fn reads_a_fault() {
        let doc = r#"<soapenv:Envelope xmlns:soapenv="s" xmlns:xsi="x"><soapenv:Body><soapenv:Fault>
<faultcode>ServerFaultCode</faultcode><faultstring>The session is not authenticated.</faultstring>
<detail><NotAuthenticatedFault xmlns="urn:vim25" xsi:type="NotAuthenticated"><object type="Folder">group-d1</object>
</NotAuthenticatedFault></detail></soapenv:Fault></soapenv:Body></soapenv:Envelope>"#;
        let body = xml::parse(doc).unwrap().child("Body").cloned().unwrap();
        assert_eq!(
            fault_of(&body),
            Some((
                "NotAuthenticated".into(),
                "The session is not authenticated.".into()
            ))
        );
    }

    #[test]
    fn a_refused_privilege_is_named_with_its_object() {
        let doc = r#"<?xml version="1.0"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><soapenv:Body><soapenv:Fault>
<faultcode>ServerFaultCode</faultcode><faultstring>Permission to perform this operation was denied.</faultstring>
<detail><NoPermissionFault xmlns="urn:vim25" xsi:type="NoPermission"><object type="VirtualMachine">vm-42</object><privilegeId>VirtualMachine.Provisioning.DeployTemplate</privilegeId>
</NoPermissionFault></detail></soapenv:Fault></soapenv:Body></soapenv:Envelope>"#;
        let body = xml::parse(doc).unwrap().child("Body").cloned().unwrap();
        assert_eq!(
            fault_of(&body),
            Some((
                "NoPermission".into(),
                "Permission to perform this operation was denied. (the account lacks the privilege \
                 VirtualMachine.Provisioning.DeployTemplate on VirtualMachine vm-42)"
                    .into()
            ))
        );
    }

    #[test]
    fn envelope_is_well_formed() {
        let e = envelope("Login", "<userName>a&amp;b</userName>");
        let root = xml::parse(&e).unwrap();
        assert_eq!(root.path(&["Body", "Login", "userName"]).unwrap().text, "a&b");
    }
}
