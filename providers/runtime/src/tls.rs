//! The verifying HTTPS connector of the hypervisor clients (feature `tls`): how a server
//! certificate is trusted ([`Trust`]: web PKI roots by default, a CA bundle, a pinned SHA-256 of
//! the leaf certificate, or an explicit insecure opt-in), the rustls configuration for it, and a
//! connector for hyper-util's client (TCP connect + handshake under one timeout).
//!
//! Each client keeps its own public verification enum (Proxmox calls a pin a "fingerprint",
//! vSphere a "thumbprint") and maps it to [`Trust`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A boxed error, as hyper-util's connector interface wants it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// How a server certificate is trusted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Trust {
    /// Chain and host name against the Mozilla root store (webpki-roots).
    #[default]
    WebPki,
    /// Chain and host name against the certificates of this PEM bundle only.
    CaBundle(String),
    /// Exactly the leaf certificate with this SHA-256 digest; chain and host name are not
    /// checked, the handshake signatures made with its key are.
    Pinned([u8; 32]),
    /// Exactly the leaf certificate with this SHA-1 digest, as vSphere names an ESXi host's
    /// certificate (`sslThumbprint` of a lease's upload URL, read from vCenter over a verified
    /// connection); otherwise as [`Trust::Pinned`].
    PinnedSha1([u8; 20]),
    /// Any certificate. Only for an explicit opt-in (a lab); never the default.
    Insecure,
}

/// A TLS configuration that cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A pin is not hex-encoded bytes of its digest's length.
    #[error(
        "certificate digest {text:?}: expected 32 (SHA-256) or 20 (SHA-1) hex-encoded bytes, `:` optional"
    )]
    Pin {
        /// The text given.
        text: String,
    },
    /// The CA bundle is not PEM or holds no usable certificate.
    #[error("CA bundle: {0}")]
    CaBundle(String),
    /// `tls.serverName` is neither a DNS name nor an IP address.
    #[error("server name {0:?} is neither a DNS name nor an IP address")]
    ServerName(String),
    /// rustls refused the protocol versions (a build problem).
    #[error("TLS protocol versions: {0}")]
    Protocol(#[source] rustls::Error),
}

/// Parses a SHA-256 digest: 32 bytes as hex, with or without `:` separators or whitespace,
/// any case (as PVE and vCenter show certificate fingerprints/thumbprints).
pub fn parse_sha256(text: &str) -> Result<[u8; 32], ConfigError> {
    parse_digest(text)
}

/// Parses a SHA-1 digest: 20 bytes as hex, with or without `:` separators (vSphere's
/// `sslThumbprint`).
pub fn parse_sha1(text: &str) -> Result<[u8; 20], ConfigError> {
    parse_digest(text)
}

/// `N` bytes as hex, with or without `:` separators or whitespace, any case.
fn parse_digest<const N: usize>(text: &str) -> Result<[u8; N], ConfigError> {
    let hex: Vec<u8> = text
        .bytes()
        .filter(|c| *c != b':' && !c.is_ascii_whitespace())
        .collect();
    let bad = || ConfigError::Pin {
        text: text.to_owned(),
    };
    if hex.len() != 2 * N {
        return Err(bad());
    }
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(hex.chunks(2)) {
        let pair = std::str::from_utf8(pair).map_err(|_| bad())?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// The SHA-1 digest of a DER certificate as `AB:CD:…` (vSphere's `sslThumbprint` notation).
pub fn sha1_of(der: &[u8]) -> String {
    hex_colon(ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, der).as_ref())
}

/// The SHA-256 digest of a DER certificate as `AB:CD:…` (PVE's and vCenter's notation).
pub fn sha256_of(der: &[u8]) -> String {
    hex_colon(&Sha256::digest(der))
}

/// Bytes as upper-case hex pairs joined by `:`.
fn hex_colon(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The rustls client configuration for `trust` (ring provider, safe default protocols).
pub fn client_config(trust: &Trust) -> Result<rustls::ClientConfig, ConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(ConfigError::Protocol)?;
    let pinned = |pin| -> Arc<dyn ServerCertVerifier> {
        Arc::new(PinnedVerifier {
            pin,
            algs: provider.signature_verification_algorithms,
        })
    };
    let explained = |roots: rustls::RootCertStore, trusted: &'static str| {
        let inner =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| ConfigError::CaBundle(e.to_string()))?;
        Ok::<_, ConfigError>(Arc::new(ExplainingVerifier { inner, trusted }))
    };
    let verifier: Arc<dyn ServerCertVerifier> = match trust {
        Trust::WebPki => explained(
            rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            },
            "the web PKI roots (webpki-roots)",
        )?,
        Trust::CaBundle(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_pemfile::certs(&mut std::io::BufReader::new(pem.as_bytes())) {
                let cert = cert.map_err(|e| ConfigError::CaBundle(e.to_string()))?;
                roots
                    .add(cert)
                    .map_err(|e| ConfigError::CaBundle(format!("certificate: {e}")))?;
            }
            if roots.is_empty() {
                return Err(ConfigError::CaBundle("contains no PEM certificate".into()));
            }
            explained(roots, "the configured CA bundle")?
        }
        Trust::Pinned(pin) => pinned(Some(LeafDigest::Sha256(*pin))),
        Trust::PinnedSha1(pin) => pinned(Some(LeafDigest::Sha1(*pin))),
        Trust::Insecure => pinned(None),
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// Why the server certificate was rejected, as a stable kind (for tests and classification).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsFailureKind {
    /// The chain does not lead to a trusted root (CA bundle or web PKI).
    UnknownCa,
    /// The leaf is not the pinned one.
    FingerprintMismatch,
    /// The certificate is not valid for the host name connected to.
    HostnameMismatch,
    /// The certificate is expired or not valid yet.
    Expired,
    /// Anything else (revoked, bad signature, protocol mismatch, an alert from the server).
    Other,
}

/// A rejected server certificate with a complete, human message (host, presented and expected
/// fingerprints, names); carried through rustls as a `CertificateError::Other`.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CertificateRejected {
    /// Why.
    pub kind: TlsFailureKind,
    /// What a user needs to fix it.
    pub message: String,
}

fn rejected(kind: TlsFailureKind, message: String) -> rustls::Error {
    rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(Arc::new(
        CertificateRejected { kind, message },
    ))))
}

/// The web PKI verifier (chain and host name against `trusted`), whose rejections say which
/// host presented which certificate and why it was refused.
#[derive(Debug)]
struct ExplainingVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    trusted: &'static str,
}

impl ServerCertVerifier for ExplainingVerifier {
    fn verify_server_cert(
        &self,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(leaf, intermediates, name, ocsp, now)
            .map_err(|e| {
                let rustls::Error::InvalidCertificate(cert) = &e else {
                    return e;
                };
                let host = name.to_str();
                let presented = sha256_of(leaf.as_ref());
                use rustls::CertificateError as C;
                let (kind, message) = match cert {
                    C::UnknownIssuer => (
                        TlsFailureKind::UnknownCa,
                        format!(
                            "unknown CA: the certificate presented by {host} (SHA-256 {presented}) is not \
                             signed by a CA of {}",
                            self.trusted
                        ),
                    ),
                    C::NotValidForName | C::NotValidForNameContext { .. } => (
                        TlsFailureKind::HostnameMismatch,
                        format!("host name mismatch: {cert} (connected to {host}, certificate SHA-256 {presented})"),
                    ),
                    C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. } => (
                        TlsFailureKind::Expired,
                        format!("the certificate presented by {host} (SHA-256 {presented}) is not valid now: {cert}"),
                    ),
                    other => (
                        TlsFailureKind::Other,
                        format!(
                            "the certificate presented by {host} (SHA-256 {presented}) was rejected: {other}"
                        ),
                    ),
                };
                rejected(kind, message)
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The digest a leaf certificate is pinned by.
#[derive(Clone, Copy, Debug)]
enum LeafDigest {
    Sha256([u8; 32]),
    Sha1([u8; 20]),
}

impl LeafDigest {
    /// Whether `der` is the pinned certificate; else its digest and the pinned one, named.
    fn check(&self, der: &[u8]) -> Result<(), (String, String, &'static str)> {
        let (presented, pinned, name) = match self {
            Self::Sha256(pin) if Sha256::digest(der).as_slice() == pin => return Ok(()),
            Self::Sha1(pin)
                if ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, der).as_ref() == pin =>
            {
                return Ok(());
            }
            Self::Sha256(pin) => (sha256_of(der), hex_colon(pin), "SHA-256"),
            Self::Sha1(pin) => (sha1_of(der), hex_colon(pin), "SHA-1"),
        };
        Err((presented, pinned, name))
    }
}

/// Accepts the leaf whose digest is `pin` (any leaf when `None`: the insecure opt-in), and
/// still verifies the handshake signatures against that leaf's public key.
#[derive(Debug)]
struct PinnedVerifier {
    pin: Option<LeafDigest>,
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        leaf: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(pin) = self.pin else {
            return Ok(ServerCertVerified::assertion());
        };
        match pin.check(leaf.as_ref()) {
            Ok(()) => Ok(ServerCertVerified::assertion()),
            Err((presented, pinned, digest)) => Err(rejected(
                TlsFailureKind::FingerprintMismatch,
                format!(
                    "fingerprint mismatch: {} presented a certificate with {digest} {presented}, expected (pinned) {pinned}",
                    name.to_str(),
                ),
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// The TLS handshake failed (certificate rejected, protocol mismatch): not transient. Clients
/// find it in a hyper-util error's source chain to classify the failure.
#[derive(Debug, thiserror::Error)]
#[error("TLS verification of {addr} failed: {message}")]
pub struct TlsHandshakeError {
    /// `host:port` connected to.
    pub addr: String,
    /// Why, as a stable kind.
    pub kind: TlsFailureKind,
    /// The complete explanation (fingerprints, names, the CA trusted).
    pub message: String,
}

/// The TCP connection could not be established (or the handshake did not finish in time): the
/// endpoint is unreachable, which may pass.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Nothing listens on the port (or a firewall rejects).
    #[error("cannot connect to {addr}: connection refused")]
    Refused {
        /// `host:port`.
        addr: String,
    },
    /// No connection (TCP and TLS handshake) within the timeout.
    #[error("cannot connect to {addr}: no answer within {timeout:?}")]
    TimedOut {
        /// `host:port`.
        addr: String,
        /// The connect timeout.
        timeout: Duration,
    },
    /// Any other failure (name resolution, unreachable network, reset during the handshake).
    #[error("cannot connect to {addr}: {source}")]
    Io {
        /// `host:port`.
        addr: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl ConnectError {
    fn io(addr: &str, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::ConnectionRefused {
            Self::Refused {
                addr: addr.to_owned(),
            }
        } else {
            Self::Io {
                addr: addr.to_owned(),
                source,
            }
        }
    }
}

/// A failed handshake: [`TlsHandshakeError`] when TLS itself refused (rustls reports a
/// certificate, protocol or alert error), a [`ConnectError`] when the connection broke during
/// the handshake (reset, closed by a restarting server): that one is transient.
fn handshake_error(addr: &str, e: std::io::Error) -> BoxError {
    let Some(tls) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return Box::new(ConnectError::io(addr, e));
    };
    let explained = match tls {
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other)) => {
            other.0.downcast_ref::<CertificateRejected>()
        }
        _ => None,
    };
    let (kind, message) = match explained {
        Some(r) => (r.kind, r.message.clone()),
        None => (TlsFailureKind::Other, tls.to_string()),
    };
    Box::new(TlsHandshakeError {
        addr: addr.to_owned(),
        kind,
        message,
    })
}

/// Connects TCP (with a timeout covering the handshake too) and runs the TLS handshake.
#[derive(Clone)]
pub struct HttpsConnector {
    /// The TLS configuration.
    pub tls: tokio_rustls::TlsConnector,
    /// Timeout of TCP connect plus handshake.
    pub connect_timeout: Duration,
    /// The name the certificate is verified against (and sent as SNI) when it differs from the
    /// URL's host (`tls.serverName`: an endpoint reached by address, a certificate issued for
    /// a name).
    pub server_name: Option<String>,
}

impl HttpsConnector {
    /// A connector for `config` with `connect_timeout`, verifying the URL's host.
    pub fn new(config: rustls::ClientConfig, connect_timeout: Duration) -> Self {
        Self {
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            connect_timeout,
            server_name: None,
        }
    }
}

/// Checks a `tls.serverName` before any connection: a DNS name or an IP address.
pub fn check_server_name(name: &str) -> Result<(), ConfigError> {
    ServerName::try_from(name.to_owned())
        .map(|_| ())
        .map_err(|_| ConfigError::ServerName(name.to_owned()))
}

impl tower_service::Service<http::Uri> for HttpsConnector {
    type Response = TlsConn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<TlsConn, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let tls = self.tls.clone();
        let timeout = self.connect_timeout;
        let server_name = self.server_name.clone();
        Box::pin(async move {
            let host = uri.host().ok_or("URL has no host")?;
            let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let addr = format!("{host}:{port}");
            let connect = async {
                let tcp = TcpStream::connect((host.as_str(), port))
                    .await
                    .map_err(|e| ConnectError::io(&addr, e))?;
                tcp.set_nodelay(true).map_err(|e| ConnectError::io(&addr, e))?;
                let name = ServerName::try_from(server_name.unwrap_or_else(|| host.clone()))?;
                let stream = tls
                    .connect(name, tcp)
                    .await
                    .map_err(|e| handshake_error(&addr, e))?;
                Ok::<_, BoxError>(TlsConn(TokioIo::new(stream)))
            };
            tokio::time::timeout(timeout, connect).await.map_err(|_| {
                Box::new(ConnectError::TimedOut {
                    addr: addr.clone(),
                    timeout,
                }) as BoxError
            })?
        })
    }
}

/// An error and its sources, `: `-joined, without hyper-util's detail-free wrappers
/// (`client error (Connect)`), so that a message names the real cause (refused address, rejected
/// certificate) wherever only `Display` is shown (conditions, Events, logs).
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        let mut cur = Some(self.0);
        while let Some(e) = cur {
            let text = e.to_string();
            let wrapper = text.starts_with("client error (") && e.source().is_some();
            // A source whose text its parent already shows (`x: {source}`) adds nothing.
            if !wrapper && !parts.last().is_some_and(|p| p.contains(&text)) {
                parts.push(text);
            }
            cur = e.source();
        }
        f.write_str(&parts.join(": "))
    }
}

/// A TLS connection usable by hyper.
pub struct TlsConn(TokioIo<TlsStream<TcpStream>>);

impl Connection for TlsConn {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for TlsConn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod handshake_error_tests {
    use super::*;

    #[test]
    fn an_error_chain_names_the_cause_without_hypers_wrapper() {
        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Wrapper(#[source] ConnectError);
        let refused = Wrapper(ConnectError::Refused {
            addr: "pve:8006".into(),
        });
        assert_eq!(
            ErrorChain(&refused).to_string(),
            "cannot connect to pve:8006: connection refused"
        );
        let io = ConnectError::io("pve:8006", std::io::Error::other("no route to host"));
        assert_eq!(
            ErrorChain(&io).to_string(),
            "cannot connect to pve:8006: no route to host",
            "a source its parent shows is not repeated"
        );
    }

    #[test]
    fn only_a_refusal_by_tls_is_a_handshake_error() {
        let refused = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert!(handshake_error("h:1", refused).is::<TlsHandshakeError>());
        let closed = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "tls handshake eof");
        assert!(handshake_error("h:1", closed).is::<ConnectError>());
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(handshake_error("h:1", reset).is::<ConnectError>());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_parse_with_and_without_colons_in_any_case() {
        let colon = format!("AB:{}:CD", ["00"; 30].join(":"));
        let parsed = parse_sha256(&colon).unwrap();
        assert_eq!((parsed[0], parsed[31]), (0xAB, 0xCD));
        assert_eq!(
            parse_sha256(&colon.replace(':', "").to_lowercase()).unwrap(),
            parsed
        );
    }

    #[test]
    fn a_server_name_is_a_dns_name_or_an_address() {
        for ok in ["pve.example.com", "pve1", "10.0.0.5", "::1"] {
            assert!(check_server_name(ok).is_ok(), "{ok}");
        }
        for bad in ["not a name", "", "pve..example"] {
            assert!(
                matches!(check_server_name(bad), Err(ConfigError::ServerName(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn malformed_pins_are_rejected() {
        assert!(parse_sha256("AB:CD").is_err());
        assert!(parse_sha256(&"ZZ".repeat(32)).is_err());
        assert!(parse_sha256("").is_err());
        assert!(parse_sha256(&"é".repeat(32)).is_err(), "non-ASCII, 64 bytes");
    }

    #[test]
    fn digest_formatting_round_trips() {
        let fp = sha256_of(b"not really a certificate");
        assert_eq!(fp.len(), 32 * 3 - 1);
        assert_eq!(
            parse_sha256(&fp).unwrap().as_slice(),
            Sha256::digest(b"not really a certificate").as_slice()
        );
    }

    #[test]
    fn a_bundle_without_certificates_is_an_error_and_every_mode_builds() {
        assert!(matches!(
            client_config(&Trust::CaBundle("no pem here".into())),
            Err(ConfigError::CaBundle(_))
        ));
        client_config(&Trust::WebPki).unwrap();
        client_config(&Trust::Insecure).unwrap();
        client_config(&Trust::Pinned([0; 32])).unwrap();
        client_config(&Trust::PinnedSha1([0; 20])).unwrap();
    }

    #[test]
    fn a_sha1_pin_accepts_its_leaf_only_and_names_both_digests() {
        // SHA-1("abc"), as vSphere writes an sslThumbprint.
        let abc = "A9:99:3E:36:47:06:81:6A:BA:3E:25:71:78:50:C2:6C:9C:D0:D8:9D";
        assert_eq!(sha1_of(b"abc"), abc);
        let pin = parse_sha1(abc).unwrap();
        assert_eq!(parse_sha1(&abc.replace(':', "").to_lowercase()).unwrap(), pin);
        assert!(parse_sha1("A9:99").is_err());
        assert!(parse_sha1(&"ZZ".repeat(20)).is_err());
        assert_eq!(LeafDigest::Sha1(pin).check(b"abc"), Ok(()));
        let (presented, pinned, digest) = LeafDigest::Sha1(pin).check(b"abd").unwrap_err();
        assert_eq!(
            (presented, pinned.as_str(), digest),
            (sha1_of(b"abd"), abc, "SHA-1")
        );
        // A SHA-256 pin of the same bytes is another digest.
        assert!(LeafDigest::Sha256([0; 32]).check(b"abc").is_err());
    }
}
