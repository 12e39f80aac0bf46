//! Life under systemd (`Type=notify`, see `debian/orchestrator.service`):
//! readiness once the API answers, and whether stderr is the journal.
//! Outside systemd (no `NOTIFY_SOCKET`, no `JOURNAL_STREAM`) nothing here
//! does anything.

use std::net::SocketAddr;
use std::time::Duration;

use sd_notify::NotifyState;

/// Tells systemd the service is ready once its API answers `GET /health`
/// (any answer: a 503 still means the API is up, with the reason), so that
/// units ordered after it, and `systemctl start`, wait for a service that
/// really serves rather than one that has only bound its port.
pub(crate) async fn notify_ready(addr: SocketAddr) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let url = format!("http://{addr}/health");
    let Ok(http) = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
    else {
        return;
    };
    while http.get(&url).send().await.is_err() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = format!("listening on http://{addr}");
    if let Err(e) = sd_notify::notify(&[NotifyState::Ready, NotifyState::Status(&status)]) {
        tracing::warn!(error = %e, "cannot tell systemd that the service is ready");
    }
}

/// Tells systemd the service is shutting down, so that `systemctl status`
/// says so during the grace period.
pub(crate) fn notify_stopping() {
    let _ = sd_notify::notify(&[
        NotifyState::Stopping,
        NotifyState::Status("shutting down: letting running tasks finish"),
    ]);
}

/// Whether stderr goes to the journal: systemd says so in `JOURNAL_STREAM`
/// (the device and inode of the stream), which is checked against stderr
/// itself, since a child of the service inherits the variable with another
/// stderr.
pub(crate) fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(stderr) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    stream.to_string_lossy() == format!("{}:{}", stderr.dev(), stderr.ino())
}
