//! Downloading an [`ImageDownload`] to a local file while computing its digest: `http://` or
//! `https://` (web PKI), redirects followed, every wait bounded, the checksum compared before
//! the caller may use the file.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use banlieue_api::common::{ChecksumAlgorithm, ImageDownload};
use banlieue_provider_runtime::tls::{self, ErrorChain, HttpsConnector, Trust};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::digest::DynDigest;
use sha2::{Digest, Sha256, Sha512};
use tokio::io::AsyncWriteExt;

/// TCP connect (plus TLS handshake) timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for the response headers, or between two pieces of the body.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Redirects followed before giving up.
pub const MAX_REDIRECTS: usize = 5;

/// Bytes received so far, and the announced size (0: not announced). Shared with whoever
/// reports the progress.
#[derive(Debug, Default)]
pub struct Progress {
    received: AtomicU64,
    total: AtomicU64,
}

impl Progress {
    /// `(received, total)`; `total` is `None` when the server did not announce it.
    pub fn get(&self) -> (u64, Option<u64>) {
        let total = self.total.load(Ordering::Relaxed);
        (
            self.received.load(Ordering::Relaxed),
            (total > 0).then_some(total),
        )
    }
}

/// A download that failed.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// The URL does not parse or is not http(s).
    #[error("{}: {reason}", shown_url(.url))]
    InvalidUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No connection, or the transfer broke off.
    #[error("downloading {}: {message}", shown_url(.url))]
    Transfer {
        /// The URL.
        url: String,
        /// The cause, with its sources.
        message: String,
    },
    /// The server answered with an error status.
    #[error("downloading {}: the server answered {status}", shown_url(.url))]
    Status {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: http::StatusCode,
    },
    /// Nothing arrived for [`IDLE_TIMEOUT`].
    #[error("downloading {}: nothing received for {}s", shown_url(.url), IDLE_TIMEOUT.as_secs())]
    Stalled {
        /// The URL.
        url: String,
    },
    /// More than [`MAX_REDIRECTS`] redirects.
    #[error("downloading {}: more than {MAX_REDIRECTS} redirects", shown_url(.url))]
    TooManyRedirects {
        /// The URL.
        url: String,
    },
    /// The local file could not be written.
    #[error("writing the download of {} to {path}: {source}", shown_url(.url))]
    Io {
        /// The URL.
        url: String,
        /// The local file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The image is not the one the checksum names.
    #[error(
        "{} has {algorithm} {actual}, not the {expected} that spec.source.image.checksum names: the download was discarded",
        shown_url(.url)
    )]
    ChecksumMismatch {
        /// The URL.
        url: String,
        /// `sha256` or `sha512`.
        algorithm: &'static str,
        /// The checksum asked for.
        expected: String,
        /// The checksum of what was served.
        actual: String,
    },
}

impl DownloadError {
    fn invalid(url: impl ToString, reason: impl ToString) -> Self {
        Self::InvalidUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        }
    }

    fn transfer(url: impl ToString, message: impl ToString) -> Self {
        Self::Transfer {
            url: url.to_string(),
            message: message.to_string(),
        }
    }

    /// Whether trying again as it is cannot help (the input or the served file is wrong);
    /// otherwise the network or the server may recover.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::InvalidUrl { .. } | Self::ChecksumMismatch { .. } | Self::TooManyRedirects { .. } => true,
            Self::Status { status, .. } => status.is_client_error(),
            Self::Transfer { .. } | Self::Stalled { .. } | Self::Io { .. } => false,
        }
    }
}

/// A hasher of `algorithm`.
fn hasher(algorithm: ChecksumAlgorithm) -> Box<dyn DynDigest + Send> {
    match algorithm {
        ChecksumAlgorithm::Sha256 => Box::new(Sha256::new()),
        ChecksumAlgorithm::Sha512 => Box::new(Sha512::new()),
    }
}

type Body = Empty<Bytes>;

/// The two clients, one per scheme.
struct Clients {
    http: Client<HttpConnector, Body>,
    https: Client<HttpsConnector, Body>,
}

impl Clients {
    fn new(url: &str) -> Result<Self, DownloadError> {
        let config = tls::client_config(&Trust::WebPki).map_err(|e| DownloadError::transfer(url, e))?;
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        Ok(Self {
            http: Client::builder(TokioExecutor::new()).build(http),
            https: Client::builder(TokioExecutor::new()).build(HttpsConnector::new(config, CONNECT_TIMEOUT)),
        })
    }

    async fn get(&self, url: &url::Url) -> Result<http::Response<Incoming>, DownloadError> {
        // The URI parsed by the builder: its error says the parse's.
        let request = http::Request::get(url.as_str())
            .header(http::header::USER_AGENT, "banlieue-image-import")
            .body(Body::new())
            .map_err(|e| DownloadError::invalid(url, e))?;
        let sent = match url.scheme() {
            "https" => tokio::time::timeout(IDLE_TIMEOUT, self.https.request(request)).await,
            _ => tokio::time::timeout(IDLE_TIMEOUT, self.http.request(request)).await,
        };
        match sent {
            Err(_) => Err(DownloadError::Stalled { url: url.to_string() }),
            Ok(Err(e)) => Err(DownloadError::transfer(url, ErrorChain(&e))),
            Ok(Ok(response)) => Ok(response),
        }
    }
}

/// `url` as messages, conditions and logs show it: without user name and password, and with
/// `?…` for a query (a presigned URL's signature is a credential); the URL itself when it does
/// not parse.
pub fn shown_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return url.split(['?', '#']).next().unwrap_or_default().to_owned();
    };
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    parsed.set_fragment(None);
    let query = parsed.query().is_some();
    parsed.set_query(None);
    let mut shown = parsed.to_string();
    if query {
        shown.push_str("?…");
    }
    shown
}

/// Checks that `url` is an absolute http(s) URL.
pub fn parse_url(url: &str) -> Result<url::Url, DownloadError> {
    let parsed = url::Url::parse(url).map_err(|e| DownloadError::invalid(url, e))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        let reason = "only http:// and https:// URLs with a host can be downloaded";
        return Err(DownloadError::invalid(url, reason));
    }
    Ok(parsed)
}

/// Downloads `image` into `dest` (created or truncated), counting into `progress`, and checks
/// its checksum; returns the number of bytes. On a mismatch the file is emptied, so that
/// nothing of it can be used by mistake.
pub async fn download(image: &ImageDownload, dest: &Path, progress: &Progress) -> Result<u64, DownloadError> {
    let clients = Clients::new(&image.url)?;
    let mut url = parse_url(&image.url)?;
    let mut response = None;
    for _ in 0..=MAX_REDIRECTS {
        let r = clients.get(&url).await?;
        if r.status().is_redirection()
            && let Some(location) = r.headers().get(http::header::LOCATION)
        {
            let location = location.to_str().unwrap_or_default();
            let from = shown_url(url.as_str());
            url = url
                .join(location)
                .map_err(|e| DownloadError::invalid(location, format!("redirect from {from}: {e}")))?;
            parse_url(url.as_str())?;
            continue;
        }
        response = Some(r);
        break;
    }
    let Some(response) = response else {
        return Err(DownloadError::TooManyRedirects {
            url: image.url.clone(),
        });
    };
    if !response.status().is_success() {
        return Err(DownloadError::Status {
            url: url.to_string(),
            status: response.status(),
        });
    }
    let total = response
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    progress.total.store(total, Ordering::Relaxed);
    progress.received.store(0, Ordering::Relaxed);
    let io = |source| DownloadError::Io {
        url: image.url.clone(),
        path: dest.display().to_string(),
        source,
    };
    let mut file = tokio::fs::File::create(dest).await.map_err(io)?;
    let mut hasher = hasher(image.checksum_algorithm);
    let mut body = response.into_body();
    let mut received = 0u64;
    loop {
        let frame = match tokio::time::timeout(IDLE_TIMEOUT, body.frame()).await {
            Err(_) => return Err(DownloadError::Stalled { url: url.to_string() }),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(DownloadError::transfer(&url, ErrorChain(&e))),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else { continue };
        hasher.update(&data);
        file.write_all(&data).await.map_err(io)?;
        received += data.len() as u64;
        progress.received.store(received, Ordering::Relaxed);
    }
    if total > 0 && received != total {
        let message = format!("the connection closed after {received} of {total} bytes");
        return Err(DownloadError::transfer(&url, message));
    }
    file.flush().await.map_err(io)?;
    let actual = hex::encode(hasher.finalize());
    if actual != image.checksum.to_ascii_lowercase() {
        file.set_len(0).await.map_err(io)?;
        return Err(DownloadError::ChecksumMismatch {
            url: image.url.clone(),
            algorithm: image.checksum_algorithm.as_str(),
            expected: image.checksum.clone(),
            actual,
        });
    }
    file.sync_all().await.map_err(io)?;
    Ok(received)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_checksum_algorithms_hash_as_published() {
        let hex_of = |algorithm| {
            let mut h = hasher(algorithm);
            h.update(b"abc");
            hex::encode(h.finalize())
        };
        assert_eq!(
            hex_of(ChecksumAlgorithm::Sha256),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex_of(ChecksumAlgorithm::Sha512),
            "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a\
             2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f"
        );
    }

    #[test]
    fn only_http_and_https_urls_are_downloaded() {
        assert!(parse_url("https://example.com/a.img").is_ok());
        assert!(parse_url("http://10.0.0.1:8080/a.img").is_ok());
        for bad in ["file:///etc/passwd", "ftp://example.com/a.img", "not a url"] {
            let e = parse_url(bad).unwrap_err();
            assert!(e.is_permanent(), "{bad}: {e}");
        }
    }

    #[test]
    fn credentials_in_a_url_are_never_shown() {
        let url = "https://user:s3cret@images.example/noble.img?X-Amz-Signature=abc#frag";
        assert_eq!(shown_url(url), "https://images.example/noble.img?…");
        assert_eq!(
            shown_url("http://images.example/a.img"),
            "http://images.example/a.img"
        );
        let e = DownloadError::Status {
            url: url.into(),
            status: http::StatusCode::FORBIDDEN,
        };
        let text = e.to_string();
        assert!(!text.contains("s3cret") && !text.contains("abc"), "{text}");
    }

    #[test]
    fn a_client_error_is_permanent_a_server_error_is_not() {
        let status = |status| DownloadError::Status {
            url: "http://x/".into(),
            status,
        };
        assert!(status(http::StatusCode::NOT_FOUND).is_permanent());
        assert!(!status(http::StatusCode::SERVICE_UNAVAILABLE).is_permanent());
    }
}
