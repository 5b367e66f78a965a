//! The "secrets never leak" check every provider runs: a machine's life is logged at the most
//! verbose level (the provider's, the Kubernetes client's, the HTTP stack's) into memory, then
//! every output (logs, Events, statuses) is searched for each secret value, as written and
//! base64-encoded.

use std::sync::{Arc, Mutex, PoisonError};

use base64::Engine as _;
use tracing::subscriber::DefaultGuard;

/// Logs at TRACE, kept in memory, of everything run on this thread (use a current-thread
/// runtime so the controllers' tasks are included) until dropped. Seen to miss most events
/// when other tests of the same binary run beside it: give the test a binary of its own.
pub struct VerboseLogs {
    buffer: Captured,
    _guard: DefaultGuard,
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl VerboseLogs {
    /// Starts capturing.
    pub fn capture() -> Self {
        let buffer = Captured::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        Self {
            buffer,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// What was logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.buffer.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

/// Fails naming the output and the value when any of `outputs` (name, text) contains one of
/// `secrets`, as written or base64-encoded.
pub fn assert_no_secret(outputs: &[(&str, String)], secrets: &[&str]) {
    let b64 = base64::engine::general_purpose::STANDARD;
    for secret in secrets {
        for form in [(*secret).to_owned(), b64.encode(secret)] {
            for (what, text) in outputs {
                assert!(!text.contains(&form), "{what} contain a secret value ({form:?})");
            }
        }
    }
}
