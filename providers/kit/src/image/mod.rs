//! Images imported from a URL ([`ImageDownload`]): the download itself ([`download`]) and the
//! imports a provider process runs in the background ([`Imports`]), one per target (host and
//! storage and checksum) whatever the number of machines waiting on it.
//!
//! The registry is a cache, not state: an import interrupted by a restart is started again by
//! the next reconcile, and a backend makes its import idempotent (it looks for the finished
//! image first and publishes it under its final name only once it is complete).

pub mod download;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use banlieue_api::common::ImageDownload;

pub use download::{DownloadError, Progress, shown_url};

/// The environment variable naming the folder downloads are kept in while they are imported
/// (the Deployments give it an emptyDir of its own); unset: the system's temporary folder.
pub const IMAGE_DIR_ENV: &str = "BANLIEUE_IMAGE_DIR";

/// A fresh temporary folder for one import's download, in [`IMAGE_DIR_ENV`]'s folder (created
/// when missing) or the system's; removed when dropped.
pub fn download_dir() -> std::io::Result<tempfile::TempDir> {
    let base = std::env::var_os(IMAGE_DIR_ENV).map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    std::fs::create_dir_all(&base)?;
    tempfile::Builder::new()
        .prefix("banlieue-image-")
        .tempdir_in(base)
}

/// `<algorithm><separator><checksum>` of `image`, the checksum in lower case: what names (or
/// marks) what an image was imported as.
pub fn checksum_id(image: &ImageDownload, separator: char) -> String {
    let checksum = image.checksum.to_ascii_lowercase();
    format!("{}{separator}{checksum}", image.checksum_algorithm.as_str())
}

/// Condition reason while an image is being imported.
pub const IMPORTING_IMAGE: &str = "ImportingImage";
/// Condition reason: the served image does not have the checksum asked for.
pub const IMAGE_CHECKSUM_MISMATCH: &str = "ImageChecksumMismatch";
/// Condition reason: the import failed (download or upload).
pub const IMAGE_IMPORT_FAILED: &str = "ImageImportFailed";
/// How long a failed import is reported before the next reconcile may start it again.
pub const RETRY_AFTER: Duration = Duration::from_secs(120);
/// The same after a failure that only a change can mend (a checksum that differs, a file that is
/// not an image): the whole image is not downloaded again every two minutes. A changed checksum
/// or URL is another import, started at once.
pub const PERMANENT_RETRY_AFTER: Duration = Duration::from_secs(1800);
/// How often a machine waiting for an import looks again (its progress is reported each time).
pub const IMPORT_POLL: Duration = Duration::from_secs(5);
/// Longest an import may run (download, upload, copy) before it is given up.
pub const IMPORT_DEADLINE: Duration = Duration::from_secs(6 * 3600);

/// Why an import failed, as a condition shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportFailure {
    /// [`IMAGE_CHECKSUM_MISMATCH`] or [`IMAGE_IMPORT_FAILED`].
    pub reason: &'static str,
    /// What happened, for a human.
    pub message: String,
    /// Whether only a change of the input (or of the served file) can help.
    pub permanent: bool,
}

impl ImportFailure {
    /// A failure that may pass (a hypervisor or network error): the import runs again later.
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            reason: IMAGE_IMPORT_FAILED,
            message: message.into(),
            permanent: false,
        }
    }

    /// A refusal of the image itself: only a change of the input (or of the served file) helps.
    pub fn refused(message: impl Into<String>) -> Self {
        Self {
            permanent: true,
            ..Self::failed(message)
        }
    }

    /// How long this failure is reported before the import may run again.
    pub fn retry_after(&self) -> Duration {
        if self.permanent {
            PERMANENT_RETRY_AFTER
        } else {
            RETRY_AFTER
        }
    }
}

/// The machine's step failure: the reason, and the message naming `spec.source.image` and when
/// the import may be tried again.
impl<E: std::error::Error + 'static> From<ImportFailure> for crate::machine::StepError<E> {
    fn from(failure: ImportFailure) -> Self {
        Self::permanent(
            failure.reason,
            format!(
                "spec.source.image: {} (tried again after {}s at the earliest)",
                failure.message,
                failure.retry_after().as_secs()
            ),
        )
    }
}

/// A failure that may pass while doing `what`: "`what`: `error`".
pub fn failed(what: &str, error: impl std::fmt::Display) -> ImportFailure {
    ImportFailure::failed(format!("{what}: {error}"))
}

impl From<DownloadError> for ImportFailure {
    fn from(e: DownloadError) -> Self {
        Self {
            reason: if matches!(e, DownloadError::ChecksumMismatch { .. }) {
                IMAGE_CHECKSUM_MISMATCH
            } else {
                IMAGE_IMPORT_FAILED
            },
            permanent: e.is_permanent(),
            message: e.to_string(),
        }
    }
}

/// What the import task reports it is doing.
#[derive(Debug, Default)]
pub struct ImportProgress {
    /// The download's bytes.
    pub download: Progress,
    /// What the import does, when the backend says it itself (e.g. writing the verified image
    /// to the hypervisor, or a download the hypervisor runs, whose bytes the provider does not
    /// see); replaces the download's bytes.
    stage: Mutex<Option<String>>,
}

impl ImportProgress {
    /// Says what the import does now (shown instead of the download's bytes).
    pub fn set_stage(&self, stage: impl Into<String>) {
        *crate::lock(&self.stage) = Some(stage.into());
    }

    fn describe(&self, image: &ImageDownload) -> String {
        if let Some(stage) = crate::lock(&self.stage).clone() {
            return stage;
        }
        const MIB: u64 = 1 << 20;
        let url = shown_url(&image.url);
        match self.download.get() {
            (done, Some(total)) => format!(
                "downloading {}: {} of {} MiB ({}%)",
                url,
                done / MIB,
                total.div_ceil(MIB),
                done.saturating_mul(100) / total.max(1)
            ),
            (done, None) => format!("downloading {}: {} MiB", url, done / MIB),
        }
    }
}

enum Entry {
    Running(Arc<ImportProgress>),
    Failed(ImportFailure, Instant),
}

/// The imports of one provider process, by key (e.g. `uri/pool/volume`).
#[derive(Clone, Default)]
pub struct Imports {
    entries: Arc<Mutex<HashMap<String, Entry>>>,
}

impl std::fmt::Debug for Imports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Imports").finish_non_exhaustive()
    }
}

impl Imports {
    /// Whether an import of `key` runs in this process (what it writes may be there, unfinished).
    pub fn is_running(&self, key: &str) -> bool {
        matches!(crate::lock(&self.entries).get(key), Some(Entry::Running(_)))
    }

    /// How far the import of `key` is (for the `Ready` condition), or its failure within its
    /// [`ImportFailure::retry_after`]; starts it with `start` (on a task of its own) when none
    /// runs and none failed within its [`ImportFailure::retry_after`]. The caller looks for the finished image
    /// before asking: a finished import leaves no entry.
    pub fn poll<F, Fut>(&self, key: &str, image: &ImageDownload, start: F) -> Result<String, ImportFailure>
    where
        F: FnOnce(Arc<ImportProgress>) -> Fut,
        Fut: Future<Output = Result<(), ImportFailure>> + Send + 'static,
    {
        let mut entries = crate::lock(&self.entries);
        match entries.get(key) {
            Some(Entry::Running(progress)) => return Ok(progress.describe(image)),
            Some(Entry::Failed(failure, at)) if at.elapsed() < failure.retry_after() => {
                return Err(failure.clone());
            }
            _ => {}
        }
        let progress = Arc::new(ImportProgress::default());
        entries.insert(key.to_owned(), Entry::Running(progress.clone()));
        let work = start(progress.clone());
        let (registry, key_owned) = (self.entries.clone(), key.to_owned());
        tracing::info!(key, url = %shown_url(&image.url), "image import started");
        tokio::spawn(async move {
            // On a task of its own, so that a panic is a failure, not an import running forever.
            let outcome = match tokio::spawn(tokio::time::timeout(IMPORT_DEADLINE, work)).await {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(_)) => Err(ImportFailure::failed(format!(
                    "the import did not end within {}h",
                    IMPORT_DEADLINE.as_secs() / 3600
                ))),
                Err(e) => Err(failed("the import stopped", e)),
            };
            let mut entries = crate::lock(&registry);
            match outcome {
                Ok(()) => {
                    tracing::info!(key = %key_owned, "image import finished");
                    entries.remove(&key_owned);
                }
                Err(failure) => {
                    tracing::warn!(key = %key_owned, reason = failure.reason, message = %failure.message, "image import failed");
                    entries.insert(key_owned, Entry::Failed(failure, Instant::now()));
                }
            }
        });
        Ok(progress.describe(image))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> ImageDownload {
        ImageDownload {
            url: "http://images.test/a.qcow2".into(),
            ..ImageDownload::default()
        }
    }

    #[tokio::test]
    async fn one_import_runs_per_key_however_often_it_is_polled() {
        let imports = Imports::default();
        let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let mut wait = Some(wait);
        for _ in 0..3 {
            let started = started.clone();
            let wait = wait.take();
            let state = imports.poll("h/p/v", &image(), move |_| async move {
                started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if let Some(w) = wait {
                    let _ = w.await;
                }
                Ok(())
            });
            assert!(matches!(state, Ok(ref m) if m.contains("downloading http://images.test/a.qcow2")));
        }
        tokio::task::yield_now().await;
        assert_eq!(started.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(imports.is_running("h/p/v") && !imports.is_running("other"));
        release.send(()).unwrap();
        for _ in 0..100 {
            if imports.entries.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            imports.entries.lock().unwrap().is_empty(),
            "a finished import leaves no entry"
        );
        assert!(!imports.is_running("h/p/v"));
    }

    #[tokio::test]
    async fn an_import_that_panics_is_a_failure_not_a_run_forever() {
        let imports = Imports::default();
        let started = imports.poll("p", &image(), |_| async { panic!("a bug in a backend") });
        assert!(started.is_ok(), "{started:?}");
        for _ in 0..100 {
            if let Err(f) = imports.poll("p", &image(), |_| async { Ok(()) }) {
                assert!(f.message.contains("the import stopped"), "{f:?}");
                assert!(!f.permanent, "tried again later");
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the panicking import stays Running");
    }

    #[tokio::test]
    async fn a_failure_is_reported_and_not_retried_at_once() {
        let imports = Imports::default();
        let failure = ImportFailure {
            reason: IMAGE_CHECKSUM_MISMATCH,
            message: "wrong".into(),
            permanent: true,
        };
        let f = failure.clone();
        let started = imports.poll("k", &image(), move |_| async move { Err(f) });
        assert!(started.is_ok(), "{started:?}");
        let mut state = None;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let s = imports.poll("k", &image(), |_| async { panic!("must not start again") });
            if s.is_err() {
                state = Some(s);
                break;
            }
        }
        assert_eq!(state, Some(Err(failure)));
    }
}
