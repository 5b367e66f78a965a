//! Child processes that cannot outlive the test binary.
//!
//! Every control-plane process is started through `setpriv --pdeathsig KILL`, so the kernel sends
//! it SIGKILL when its parent dies. Linux delivers the parent-death signal when the *thread* that
//! forked the child exits, not the process; test threads and tokio workers come and go, so all
//! children are forked by one dedicated thread that lives as long as the process (it blocks on a
//! channel whose sender sits in a static). When the test binary exits, panics or is killed, that
//! thread dies with it and the kernel kills every child, even those of a static shared
//! [`crate::TestEnv`] that is never dropped.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

struct SpawnRequest {
    command: Command,
    reply: mpsc::SyncSender<std::io::Result<Child>>,
}

static SPAWNER: OnceLock<std::io::Result<mpsc::Sender<SpawnRequest>>> = OnceLock::new();

fn spawner() -> std::io::Result<&'static mpsc::Sender<SpawnRequest>> {
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("banlieue-testenv-spawner".into())
            .spawn(move || {
                // The sender lives in a static, so this loop (and the thread) ends only with the process.
                for mut request in rx {
                    let result = request.command.spawn();
                    // The requester may have given up; the child is then killed by `Drop` of nobody,
                    // but still by the parent-death signal when the process exits.
                    let _ = request.reply.send(result);
                }
            })?;
        Ok(tx)
    });
    sender
        .as_ref()
        .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))
}

/// Finds a program on `PATH`.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// A child process tied to the test binary: killed (SIGKILL) and reaped on drop, and killed by the
/// kernel if the test binary dies first. Use it for any helper a test runs next to the control
/// plane (a CAPI manager, a controller under test, a simulator).
///
/// It runs under `setpriv --pdeathsig KILL` (util-linux), forked by one dedicated thread that
/// lives as long as the test binary (the parent-death signal fires when the forking *thread*
/// exits, and test threads and tokio workers come and go): when the binary exits, panics or is
/// killed, the kernel kills the child, even if this value was leaked or sits in a static.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    log: PathBuf,
    child: Child,
}

impl ManagedProcess {
    /// Starts `program args…` with stdout and stderr written to the file `log` (created or
    /// truncated), tied to the test binary's lifetime by a parent-death signal. `name` is used in
    /// messages.
    pub fn start(name: &str, program: &Path, args: &[String], log: &Path) -> Result<Self> {
        let setpriv = which("setpriv").ok_or(Error::MissingProgram {
            name: "setpriv",
            hint: "Debian package util-linux",
        })?;
        let out = File::create(log).map_err(|e| Error::io("creating log file", log, e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io("duplicating log file handle", log, e))?;
        let mut command = Command::new(setpriv);
        command
            .arg("--pdeathsig")
            .arg("KILL")
            .arg("--")
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let (reply, response) = mpsc::sync_channel(1);
        let spawn_error = |source| Error::Spawn {
            name: name.to_owned(),
            source,
        };
        spawner()
            .map_err(spawn_error)?
            .send(SpawnRequest { command, reply })
            .map_err(|_| spawn_error(std::io::Error::other("spawner thread is gone")))?;
        let child = response
            .recv_timeout(Duration::from_secs(30))
            .map_err(|e| {
                spawn_error(std::io::Error::other(format!(
                    "no answer from spawner thread: {e}"
                )))
            })?
            .map_err(spawn_error)?;
        tracing::debug!(component = name, pid = child.id(), log = %log.display(), "started");
        Ok(Self {
            name: name.to_owned(),
            log: log.to_owned(),
            child,
        })
    }

    /// Fails with [`Error::ProcessExited`] (including the end of the log) if the process is gone.
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.exited(status.to_string())),
            Err(e) => Err(self.exited(format!("unknown: {e}"))),
        }
    }

    fn exited(&self, status: String) -> Error {
        Error::ProcessExited {
            name: self.name.clone(),
            status,
            log: self.log.clone(),
            tail: log_tail(&self.log, 40),
        }
    }

    /// The process id (of `setpriv`, which has exec'd into the component).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The process's log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the process's log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// Kills the process and waits (bounded) for it to be reaped.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let _ = self.child.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                _ => return,
            }
        }
        tracing::warn!(component = %self.name, pid = self.child.id(), "process did not exit after SIGKILL");
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a log file (at most 64 KiB are read), or a note why there are none.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    const MAX: u64 = 64 * 1024;
    let read = || -> std::io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(MAX)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(log unreadable: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_returns_last_lines() {
        let dir = std::env::temp_dir().join(format!("banlieue-testenv-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("log");
        let body: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&file, body).unwrap();
        assert_eq!(log_tail(&file, 3), "line 98\nline 99\nline 100");
        assert!(log_tail(&dir.join("missing"), 3).starts_with("(log unreadable"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn child_is_killed_on_drop_and_exit_is_detected() {
        let dir = std::env::temp_dir().join(format!("banlieue-testenv-proc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sleep = which("sleep").expect("coreutils sleep");
        let mut process =
            ManagedProcess::start("sleeper", &sleep, &["600".to_owned()], &dir.join("sleep.log")).unwrap();
        process.check_running().unwrap();
        let pid = process.child.id();
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        drop(process);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "child {pid} survived drop"
        );

        let sh = which("sh").expect("sh");
        let args = ["-c".to_owned(), "echo boom; exit 3".to_owned()];
        let mut failing = ManagedProcess::start("failing", &sh, &args, &dir.join("fail.log")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let err = loop {
            match failing.check_running() {
                Ok(()) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Ok(()) => panic!("process did not exit"),
                Err(e) => break e,
            }
        };
        let text = err.to_string();
        assert!(
            text.contains("failing exited unexpectedly") && text.contains("boom"),
            "{text}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
