//! Importing an OVF package: `OvfManager.CreateImportSpec` turns the descriptor into an import
//! spec, `ResourcePool.ImportVApp` creates the VM and hands out an `HttpNfcLease`, whose device
//! URLs receive the disk files; the lease is then completed (or aborted).

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::Client;
use crate::client::UploadBody;
use crate::error::{Error, Result};
use crate::objects::MoRef;
use crate::xml::{self, Element};

/// Size of the pieces a disk file is streamed in.
const CHUNK: u64 = 1 << 20;
/// How often a lease's state is looked at while it initializes.
const LEASE_POLL: Duration = Duration::from_millis(500);

/// What `CreateImportSpec` made of a descriptor.
#[derive(Clone, Debug)]
pub struct ImportSpec {
    /// The import spec, passed on to [`Client::import_vapp`] as it is.
    pub spec: Element,
    /// The files the import needs uploaded.
    pub files: Vec<FileItem>,
    /// Errors vSphere found in the descriptor (the import cannot go on).
    pub errors: Vec<String>,
}

/// A file an import needs (`OvfFileItem`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileItem {
    /// Matches a lease device URL's `importKey`.
    pub device_id: String,
    /// The file's path in the package (`disk-0.vmdk`).
    pub path: String,
    /// Whether the file is created by the upload (`PUT`) rather than written into a disk
    /// vSphere created (`POST`).
    pub create: bool,
}

/// Where a lease takes one file (`HttpNfcLeaseDeviceUrl`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseDevice {
    /// Matches a [`FileItem::device_id`].
    pub import_key: String,
    /// Upload URL (its host may be `*`: the server's).
    pub url: String,
    /// SHA-1 thumbprint of the certificate of the URL's host (an ESXi host), as vCenter gives
    /// it: the upload pins it (the host's certificate is not vCenter's).
    pub ssl_thumbprint: Option<String>,
}

fn decode(method: &str, message: impl Into<String>) -> Error {
    Error::Decode {
        method: method.into(),
        message: message.into(),
    }
}

impl Client {
    /// `OvfManager.CreateImportSpec` for `descriptor`, the VM named `name` in `pool` on
    /// `datastore`.
    pub async fn create_import_spec(
        &self,
        descriptor: &str,
        pool: &MoRef,
        datastore: &MoRef,
        name: &str,
    ) -> Result<ImportSpec> {
        const METHOD: &str = "CreateImportSpec";
        let manager = self
            .service_content()
            .await?
            .ovf_manager
            .clone()
            .ok_or_else(|| decode(METHOD, "the server has no OvfManager"))?;
        let mut body = manager.to_xml("_this");
        let _ = write!(
            body,
            "<ovfDescriptor>{}</ovfDescriptor>{}{}<cisp><locale></locale><deploymentOption></deploymentOption>\
             <entityName>{}</entityName></cisp>",
            xml::escape(descriptor),
            pool.to_xml("resourcePool"),
            datastore.to_xml("datastore"),
            xml::escape(name),
        );
        let resp = self.call(METHOD, &body).await?;
        let rv = resp
            .child("returnval")
            .ok_or_else(|| decode(METHOD, "no returnval"))?;
        let errors = rv
            .children_named("error")
            .map(|e| {
                e.child_text("localizedMessage")
                    .unwrap_or("an error without a message")
                    .trim()
                    .to_owned()
            })
            .collect();
        let spec = rv.child("importSpec").cloned().unwrap_or_else(|| Element {
            name: "importSpec".into(),
            attrs: Vec::new(),
            children: Vec::new(),
            text: String::new(),
        });
        let files = rv
            .children_named("fileItem")
            .map(|f| FileItem {
                device_id: f.child_text("deviceId").unwrap_or_default().trim().to_owned(),
                path: f.child_text("path").unwrap_or_default().trim().to_owned(),
                create: f.child_text("create").is_some_and(|c| c.trim() == "true"),
            })
            .collect();
        Ok(ImportSpec { spec, files, errors })
    }

    /// `ResourcePool.ImportVApp`: creates the VM of `spec` in `folder` (on `host`, if given);
    /// returns the `HttpNfcLease`.
    pub async fn import_vapp(
        &self,
        pool: &MoRef,
        spec: &Element,
        folder: &MoRef,
        host: Option<&MoRef>,
    ) -> Result<MoRef> {
        let mut body = pool.to_xml("_this");
        body.push_str(&spec.to_xml("spec"));
        body.push_str(&folder.to_xml("folder"));
        if let Some(host) = host {
            body.push_str(&host.to_xml("host"));
        }
        let resp = self.call("ImportVApp", &body).await?;
        resp.child("returnval")
            .and_then(MoRef::from_xml)
            .ok_or_else(|| decode("ImportVApp", "no lease returned"))
    }

    /// Waits (at most `timeout`) until `lease` is ready; its device URLs.
    pub async fn lease_ready(&self, lease: &MoRef, timeout: Duration) -> Result<Vec<LeaseDevice>> {
        const METHOD: &str = "HttpNfcLease.state";
        let started = Instant::now();
        loop {
            let props = self
                .properties(lease, &["state", "error", "info"])
                .await?
                .ok_or_else(|| decode(METHOD, format!("lease {} vanished", lease.value)))?;
            match props.get("state").map(|s| s.text.trim()) {
                Some("ready") => {
                    let devices = props
                        .get("info")
                        .map(|info| {
                            info.children_named("deviceUrl")
                                .map(|d| LeaseDevice {
                                    import_key: d
                                        .child_text("importKey")
                                        .unwrap_or_default()
                                        .trim()
                                        .to_owned(),
                                    url: d.child_text("url").unwrap_or_default().trim().to_owned(),
                                    ssl_thumbprint: d
                                        .child_text("sslThumbprint")
                                        .map(|t| t.trim().to_owned())
                                        .filter(|t| !t.is_empty()),
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    return Ok(devices);
                }
                Some("error") => {
                    let message = props
                        .get("error")
                        .and_then(|e| e.child_text("localizedMessage"))
                        .unwrap_or("the lease failed")
                        .trim()
                        .to_owned();
                    return Err(decode(METHOD, message));
                }
                state => {
                    if started.elapsed() >= timeout {
                        return Err(Error::Timeout {
                            method: format!("{METHOD} ({})", state.unwrap_or("unknown")),
                            timeout,
                        });
                    }
                    tokio::time::sleep(LEASE_POLL).await;
                }
            }
        }
    }

    /// Uploads `length` bytes of the local file `path` from `offset` to a lease's `device`
    /// (`PUT` for a file the upload creates, else `POST`), streamed; bounded by `timeout`. An
    /// upload to another host than vCenter (an ESXi host) pins the device's `sslThumbprint` and
    /// carries no vCenter session cookie (the URL is the ticket).
    #[allow(clippy::too_many_arguments)]
    pub async fn upload_to_lease(
        &self,
        device: &LeaseDevice,
        path: &Path,
        offset: u64,
        length: u64,
        create: bool,
        timeout: Duration,
    ) -> Result<()> {
        let url = device.url.as_str();
        let what = format!("uploading {} to {}", path.display(), self.on_server(url));
        let io = |e: std::io::Error| Error::Config(format!("{what}: {e}"));
        let mut file = tokio::fs::File::open(path).await.map_err(io)?;
        file.seek(std::io::SeekFrom::Start(offset)).await.map_err(io)?;
        let pieces = file_pieces(file, length);
        let body: UploadBody = StreamBody::new(pieces).boxed_unsync();
        let method = if create { Method::PUT } else { Method::POST };
        let target = crate::client::UploadTarget {
            url,
            host_thumbprint: device.ssl_thumbprint.as_deref(),
        };
        self.upload(method, target, length, body, timeout, &what).await
    }

    /// `HttpNfcLease.HttpNfcLeaseProgress`: keeps the lease alive during long uploads.
    pub async fn lease_progress(&self, lease: &MoRef, percent: u8) -> Result<()> {
        let body = format!("{}<percent>{}</percent>", lease.to_xml("_this"), percent.min(100));
        self.call("HttpNfcLeaseProgress", &body).await.map(|_| ())
    }

    /// `HttpNfcLease.HttpNfcLeaseComplete`: the VM is usable.
    pub async fn lease_complete(&self, lease: &MoRef) -> Result<()> {
        self.call("HttpNfcLeaseComplete", &lease.to_xml("_this"))
            .await
            .map(|_| ())
    }

    /// `HttpNfcLease.HttpNfcLeaseAbort`: vSphere removes what the import created.
    pub async fn lease_abort(&self, lease: &MoRef, message: &str) -> Result<()> {
        let body = format!(
            "{}<fault xsi:type=\"LocalizedMethodFault\"><fault xsi:type=\"SystemError\"><reason>{}</reason></fault>\
             <localizedMessage>{}</localizedMessage></fault>",
            lease.to_xml("_this"),
            xml::escape(message),
            xml::escape(message)
        );
        self.call("HttpNfcLeaseAbort", &body).await.map(|_| ())
    }
}

/// The file's next `left` bytes as body frames of [`CHUNK`] bytes.
fn file_pieces(
    file: tokio::fs::File,
    left: u64,
) -> impl futures::Stream<Item = std::result::Result<Frame<Bytes>, std::io::Error>> + Send + 'static {
    futures::stream::unfold((file, left), |(mut file, left)| async move {
        if left == 0 {
            return None;
        }
        let mut buf = vec![0u8; CHUNK.min(left) as usize];
        match file.read(&mut buf).await {
            Ok(0) => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("the file ended {left} bytes early"),
                )),
                (file, 0),
            )),
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Frame::data(Bytes::from(buf))), (file, left - n as u64)))
            }
            Err(e) => Some((Err(e), (file, 0))),
        }
    })
}
