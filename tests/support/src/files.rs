//! A throw-away HTTP file server on loopback for the tests that make a provider download
//! something (images imported from a URL): fixed files by path, every request counted.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Longest a test client may take to send its request head.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a request waits for [`FileServer::release`] while the server holds its answers.
const HOLD_TIMEOUT: Duration = Duration::from_secs(120);

/// Serves `files` over plain HTTP/1.1 (one request per connection) until dropped.
pub struct FileServer {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
    open: Arc<tokio::sync::watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl FileServer {
    /// Starts serving `files` (path → content, paths starting with `/`) on `127.0.0.1`.
    pub async fn start(files: impl IntoIterator<Item = (String, Vec<u8>)>) -> std::io::Result<Self> {
        Self::serve(files, true).await
    }

    /// [`Self::start`], but every answer waits for [`Self::release`] (at most two minutes), so
    /// that a test can look at a download while it runs.
    pub async fn holding(files: impl IntoIterator<Item = (String, Vec<u8>)>) -> std::io::Result<Self> {
        Self::serve(files, false).await
    }

    /// Lets the held answers (and every later one) go.
    pub fn release(&self) {
        self.open.send_replace(true);
    }

    async fn serve(files: impl IntoIterator<Item = (String, Vec<u8>)>, open: bool) -> std::io::Result<Self> {
        let files: Arc<HashMap<String, Vec<u8>>> = Arc::new(files.into_iter().collect());
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let open = Arc::new(tokio::sync::watch::Sender::new(open));
        let gate = open.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (files, seen, mut gate) = (files.clone(), seen.clone(), gate.subscribe());
                tokio::spawn(async move {
                    let Ok(Some(path)) = tokio::time::timeout(REQUEST_TIMEOUT, read_path(&mut conn))
                        .await
                        .map(Result::ok)
                        .map(Option::flatten)
                    else {
                        return;
                    };
                    seen.lock().unwrap_or_else(|e| e.into_inner()).push(path.clone());
                    let _ = tokio::time::timeout(HOLD_TIMEOUT, gate.wait_for(|open| *open)).await;
                    let (status, body) = match files.get(&path) {
                        Some(content) => ("200 OK", content.as_slice()),
                        None => ("404 Not Found", b"not found\n".as_slice()),
                    };
                    let head = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(body).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        Ok(Self {
            addr,
            requests,
            open,
            task,
        })
    }

    /// The URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The paths asked for so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The path of a `GET` request; `None` for anything else.
async fn read_path(conn: &mut tokio::net::TcpStream) -> std::io::Result<Option<String>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            return Ok(None);
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut words = line.split_whitespace();
    Ok(match (words.next(), words.next()) {
        (Some("GET"), Some(path)) => Some(path.to_owned()),
        _ => None,
    })
}

/// The block size of a ustar archive.
const USTAR_BLOCK: usize = 512;

/// A ustar archive of `files` (path, content), as an OVA is packed (what a test serves as an
/// OVA).
pub fn ustar(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, content) in files {
        let mut header = [0u8; USTAR_BLOCK];
        header[..name.len().min(100)].copy_from_slice(&name.as_bytes()[..name.len().min(100)]);
        header[100..107].copy_from_slice(b"0000644");
        header[108..115].copy_from_slice(b"0000000");
        header[116..123].copy_from_slice(b"0000000");
        header[124..135].copy_from_slice(format!("{:011o}", content.len()).as_bytes());
        header[136..147].copy_from_slice(b"00000000000");
        header[156] = b'0';
        header[257..263].copy_from_slice(b"ustar\0");
        header[263..265].copy_from_slice(b"00");
        header[148..156].copy_from_slice(b"        ");
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        header[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(content);
        out.resize(out.len().div_ceil(USTAR_BLOCK) * USTAR_BLOCK, 0);
    }
    out.resize(out.len() + 2 * USTAR_BLOCK, 0);
    out
}
