//! A typed, async Proxmox VE API client.
//!
//! Small surface: what banlieue needs (version, nodes, cluster resources, VMID allocation, qemu
//! lifecycle and config, tasks, storage upload, pools, guest-agent interfaces, HA resources and
//! rules), with
//!
//! - authentication by API token (preferred) or by ticket + CSRF token (re-login once on 401),
//! - TLS verified by default (web PKI roots, a CA bundle, or a pinned SHA-256 leaf fingerprint;
//!   skipping verification is an explicit opt-in),
//! - a timeout on every request, retries with backoff for transient faults of idempotent requests,
//! - one error type keeping PVE's status, message and `errors` map, with a classification
//!   ([`ErrorClass`]) for controllers,
//! - deserialisation tolerant of Perl-typed values (numbers as strings, 0/1 booleans).
//!
//! ```no_run
//! # async fn demo() -> banlieue_pve_client::Result<()> {
//! use banlieue_pve_client::{Client, CloneRequest, TlsVerification};
//! let pve = Client::builder("https://pve.example:8006")
//!     .token("root@pam!banlieue", "2d6c…")
//!     .tls(TlsVerification::Fingerprint("AB:CD:…".into()))
//!     .build()?;
//! let newid = pve.next_id().await?;
//! let task = pve.clone_vm("pve1", 9000, &CloneRequest { newid, name: Some("web-1".into()), ..Default::default() }).await?;
//! let status = pve.task_status(&task).await?;
//! # let _ = status; Ok(()) }
//! ```

mod api;
mod client;
pub mod config;
pub mod de;
mod error;
mod ha;
pub mod limit;
mod secret;
mod task;
mod tls;
mod types;

pub use api::{CloneRequest, ConfigUpdate, DeleteVmOptions, DownloadUrlRequest};
pub use client::{
    API_PREFIX, Auth, Client, ClientBuilder, MAX_IN_FLIGHT, POOL_IDLE_TIMEOUT, RequestHook, RequestRecord,
    RetryPolicy, TICKET_LIFETIME, path_segment,
};
pub use config::{
    DiskSpec, IpAssign, IpConfig, NetDevice, PendingConfig, PendingItem, Size, SizeChange, VmConfig,
};
pub use error::{BoxError, Error, ErrorClass, Result};
pub use ha::{HaMigration, HaResource, HaResourceSettings, HaRule, vm_sid};
pub use secret::Secret;
pub use task::{TaskLogLine, TaskOutcome, TaskStatus, Upid};
pub use tls::{TlsFailureKind, TlsHandshakeError, TlsVerification, fingerprint_of, parse_fingerprint};
pub use types::*;
