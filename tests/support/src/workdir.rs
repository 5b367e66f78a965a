//! Per-environment scratch directories that are cleaned up even when a test binary dies.
//!
//! A static shared environment is never dropped, so its directory (etcd data, certificates, logs)
//! cannot be removed by `Drop`. Every directory therefore carries its owner's pid and process
//! start time in its name; creating a new one first removes those whose owner is gone.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Error, Result};

/// Environment variable: keep scratch directories after the environment stops (for debugging).
pub const KEEP_ENV_VAR: &str = "BANLIEUE_TESTENV_KEEP";

static SEQUENCE: AtomicU32 = AtomicU32::new(0);

/// A scratch directory owned by this process; removed on drop unless [`KEEP_ENV_VAR`] is set.
#[derive(Debug)]
pub(crate) struct WorkDir {
    path: PathBuf,
    keep: bool,
}

impl WorkDir {
    /// Creates a fresh directory under `<tmp>/banlieue-testenv/`, after removing stale ones.
    pub(crate) fn create() -> Result<Self> {
        let root = std::env::temp_dir().join("banlieue-testenv");
        std::fs::create_dir_all(&root).map_err(|e| Error::io("creating directory", &root, e))?;
        remove_stale(&root);
        let pid = std::process::id();
        let start = process_start_time(pid).unwrap_or(0);
        let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let path = root.join(format!("{pid}-{start}-{seq}-{:08x}", rand::random::<u32>()));
        std::fs::create_dir(&path).map_err(|e| Error::io("creating directory", &path, e))?;
        let keep = std::env::var_os(KEEP_ENV_VAR).is_some_and(|v| !v.is_empty() && v != "0");
        Ok(Self { path, keep })
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Creates (if needed) and returns a subdirectory.
    pub(crate) fn subdir(&self, name: &str) -> Result<PathBuf> {
        let dir = self.path.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating directory", &dir, e))?;
        Ok(dir)
    }

    /// Writes a file readable only by its owner (it may hold a key or a token).
    pub(crate) fn write(&self, name: &str, contents: &str) -> Result<PathBuf> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = self.path.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&file)
            .and_then(|mut f| f.write_all(contents.as_bytes()))
            .map_err(|e| Error::io("writing", &file, e))?;
        Ok(file)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.keep {
            eprintln!(
                "banlieue-testenv: keeping {} ({KEEP_ENV_VAR} is set)",
                self.path.display()
            );
        } else if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove scratch directory");
        }
    }
}

/// The start time (clock ticks since boot, field 22 of `/proc/<pid>/stat`) of a live, non-zombie
/// process, or `None` if there is no such process.
pub(crate) fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces: parse after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    if fields.first() == Some(&"Z") || fields.first() == Some(&"X") {
        return None;
    }
    fields.get(22 - 3)?.parse().ok()
}

/// Whether the directory name `<pid>-<start>-…` belongs to a process that is gone.
fn is_stale(name: &str) -> bool {
    let mut parts = name.split('-');
    let (Some(pid), Some(start)) = (parts.next(), parts.next()) else {
        return false;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return false;
    };
    process_start_time(pid) != Some(start)
}

fn remove_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if is_stale(&name.to_string_lossy()) {
            let path = entry.path();
            match std::fs::remove_dir_all(&path) {
                Ok(()) => tracing::debug!(path = %path.display(), "removed stale scratch directory"),
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "could not remove stale directory")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_has_a_start_time_and_dead_pids_are_stale() {
        let me = std::process::id();
        let start = process_start_time(me).expect("own start time");
        assert!(!is_stale(&format!("{me}-{start}-0-abc")));
        assert!(
            is_stale(&format!("{me}-{}-0-abc", start + 1)),
            "same pid, other start time"
        );
        // pid_max is at most 2^22 on Linux, so this pid cannot exist.
        assert!(is_stale("4294967295-1-0-abc"));
        assert!(!is_stale("not-a-pid"), "foreign names are left alone");
    }

    #[test]
    fn creates_unique_directories_and_removes_them_on_drop() {
        let a = WorkDir::create().unwrap();
        let b = WorkDir::create().unwrap();
        assert_ne!(a.path(), b.path());
        let sub = a.subdir("x").unwrap();
        assert!(sub.is_dir());
        let file = a.write("f.txt", "hello").unwrap();
        assert_eq!(std::fs::read_to_string(file).unwrap(), "hello");
        let path = a.path().to_owned();
        drop(a);
        assert_eq!(path.exists(), std::env::var_os(KEEP_ENV_VAR).is_some());
    }
}
