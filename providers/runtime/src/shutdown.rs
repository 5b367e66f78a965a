//! Graceful shutdown: SIGTERM or SIGINT (Ctrl-C) as a cloneable future.

use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};

/// Completes on SIGTERM or SIGINT. Cloneable (every controller gets one), `Send + Sync`.
pub type Shutdown = Shared<BoxFuture<'static, ()>>;

/// A future completing on SIGTERM or SIGINT (Ctrl-C).
pub fn signal() -> Shutdown {
    async {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the process");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutdown signal received");
    }
    .boxed()
    .shared()
}

/// A [`Shutdown`] completing when `fut` does (for tests and embedding).
pub fn on(fut: impl Future<Output = ()> + Send + 'static) -> Shutdown {
    fut.boxed().shared()
}
