//! TLS for the SOAP endpoint: verification modes and the HTTPS connector used by hyper.

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

use crate::error::{BoxError, Error, Result};

/// How vCenter's certificate is checked. The default verifies against the web PKI roots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TlsVerification {
    /// Chain and host name against the Mozilla roots (webpki-roots).
    #[default]
    WebPki,
    /// Chain and host name against the certificates of this PEM bundle only.
    CaBundle(String),
    /// Exactly the leaf certificate with this SHA-256 thumbprint (hex, `:` optional); chain and
    /// host name are not checked, handshake signatures are.
    Thumbprint(String),
    /// Any certificate: explicit opt-in for labs, never the default.
    InsecureSkipVerify,
}

/// Parses a SHA-256 thumbprint: 64 hex digits, optionally colon-separated.
pub fn parse_thumbprint(text: &str) -> Result<[u8; 32]> {
    let hex: String = text.chars().filter(|c| *c != ':' && !c.is_whitespace()).collect();
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(Error::Config(format!(
            "SHA-256 thumbprint {text:?}: expected 64 hex digits"
        )));
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|e| Error::Config(format!("SHA-256 thumbprint: {e}")))?;
    }
    Ok(out)
}

/// The SHA-256 thumbprint of a DER certificate, as `AB:CD:…`.
pub fn thumbprint_of(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The rustls configuration for a verification mode.
pub(crate) fn client_config(mode: &TlsVerification) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS protocol versions: {e}")))?;
    let pinned = |pin| {
        Arc::new(PinnedVerifier {
            pin,
            algs: provider.signature_verification_algorithms,
        })
    };
    Ok(match mode {
        TlsVerification::WebPki => builder
            .with_root_certificates(rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            })
            .with_no_client_auth(),
        TlsVerification::CaBundle(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_pemfile::certs(&mut std::io::BufReader::new(pem.as_bytes())) {
                let cert = cert.map_err(|e| Error::Config(format!("CA bundle: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| Error::Config(format!("CA bundle certificate: {e}")))?;
            }
            if roots.is_empty() {
                return Err(Error::Config("CA bundle contains no PEM certificate".into()));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        TlsVerification::Thumbprint(tp) => builder
            .dangerous()
            .with_custom_certificate_verifier(pinned(Some(parse_thumbprint(tp)?)))
            .with_no_client_auth(),
        TlsVerification::InsecureSkipVerify => builder
            .dangerous()
            .with_custom_certificate_verifier(pinned(None))
            .with_no_client_auth(),
    })
}

/// Accepts the leaf whose SHA-256 is `pin` (any leaf when `None`), still checking signatures.
#[derive(Debug)]
struct PinnedVerifier {
    pin: Option<[u8; 32]>,
    algs: WebPkiSupportedAlgorithms,
}

#[derive(Debug, thiserror::Error)]
#[error("server certificate thumbprint {0} does not match the pinned thumbprint")]
struct ThumbprintMismatch(String);

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        leaf: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self.pin {
            None => Ok(ServerCertVerified::assertion()),
            Some(pin) if Sha256::digest(leaf.as_ref()).as_slice() == pin => {
                Ok(ServerCertVerified::assertion())
            }
            Some(_) => Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Other(rustls::OtherError(Arc::new(ThumbprintMismatch(
                    thumbprint_of(leaf.as_ref()),
                )))),
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// The TLS handshake failed (certificate rejected): not transient.
#[derive(Debug, thiserror::Error)]
#[error("TLS handshake failed: {0}")]
pub(crate) struct TlsHandshakeError(pub(crate) String);

/// TCP connect (with a timeout) plus TLS handshake.
#[derive(Clone)]
pub(crate) struct HttpsConnector {
    pub(crate) tls: tokio_rustls::TlsConnector,
    pub(crate) connect_timeout: Duration,
}

impl tower_service::Service<http::Uri> for HttpsConnector {
    type Response = TlsConn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<TlsConn, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::result::Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let tls = self.tls.clone();
        let timeout = self.connect_timeout;
        Box::pin(async move {
            let host = uri.host().ok_or("URL has no host")?;
            let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let connect = async {
                let tcp = TcpStream::connect((host.as_str(), port)).await?;
                tcp.set_nodelay(true)?;
                let name = ServerName::try_from(host.clone())?;
                let stream = tls
                    .connect(name, tcp)
                    .await
                    .map_err(|e| TlsHandshakeError(e.to_string()))?;
                Ok::<_, BoxError>(TlsConn(TokioIo::new(stream)))
            };
            tokio::time::timeout(timeout, connect)
                .await
                .map_err(|_| format!("connecting to {host}:{port} timed out after {timeout:?}"))?
        })
    }
}

/// A TLS connection usable by hyper.
pub(crate) struct TlsConn(TokioIo<TlsStream<TcpStream>>);

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
mod tests {
    use super::*;

    #[test]
    fn thumbprints_parse_with_and_without_colons() {
        let colon = "AB:".repeat(31) + "CD";
        let parsed = parse_thumbprint(&colon).unwrap();
        assert_eq!((parsed[0], parsed[31]), (0xAB, 0xCD));
        assert_eq!(
            parse_thumbprint(&colon.replace(':', "").to_lowercase()).unwrap(),
            parsed
        );
        assert!(parse_thumbprint("AB:CD").is_err());
        assert!(parse_thumbprint(&"ZZ".repeat(32)).is_err());
    }

    #[test]
    fn empty_ca_bundle_is_a_config_error() {
        assert!(matches!(
            client_config(&TlsVerification::CaBundle("nothing".into())),
            Err(Error::Config(_))
        ));
    }
}
