//! The accept loop: every connection the service holds is bounded in
//! time and in number.
//!
//! `axum::serve` has neither a header timeout nor a connection cap, so a
//! client that opens connections and sends half a request holds them
//! (and a file descriptor each) for ever. Here each connection is served
//! by hyper's HTTP/1 connection with a timer:
//!
//! - **Header timeout.** A request's head must arrive within
//!   `header_timeout` of the connection opening, or of the previous
//!   response ending: the same clock closes a connection that sends half
//!   a request and a keep-alive connection left idle. The connection is
//!   closed (hyper answers nothing to a head it never finished reading).
//!   A request whose head arrived is never cut by it: a long `wait` or an
//!   event stream runs under its own deadline.
//! - **Connection cap.** At most `max_connections` connections are served
//!   at once. One more is answered `503 too_many_connections` naming the
//!   limit, with `Connection: close`, and closed; a client that retries
//!   once another connection closes is served. The answer is written by a
//!   short task of its own, and at most [`REFUSING_AT_ONCE`] of those run
//!   at once: past that, a connection over the cap is closed unanswered,
//!   so that a flood cannot grow them either.
//!
//! Shutdown: once `shutdown` resolves the listener is closed, every
//! connection finishes the request it is serving and closes (idle ones at
//! once), and the loop returns when they all have.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower::ServiceExt as _;

/// How many over-cap connections are being answered at most at once.
pub(crate) const REFUSING_AT_ONCE: usize = 64;

/// How long an over-cap connection is given to take its answer.
const REFUSAL_TIME: Duration = Duration::from_secs(2);

/// The bounds of the accept loop.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    pub header_timeout: Duration,
    pub max_connections: usize,
}

/// Serves `router` on `listener` within `limits` until `shutdown`
/// resolves, then closes gracefully (see the module's text).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let refusing = Arc::new(Semaphore::new(REFUSING_AT_ONCE));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors (or another transient
                    // failure): the connections already open go on;
                    // accept again a moment later rather than spin.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            metrics::counter!("orchestrator_http_connections_refused_total").increment(1);
            refuse(stream, &refusing, limits.max_connections);
            continue;
        };
        let _ = stream.set_nodelay(true);
        metrics::gauge!("orchestrator_http_connections").increment(1.0);
        let router = router.clone();
        // The peer address, as `ConnectInfo`: the guard and the client
        // address read it.
        let service = tower::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            router.clone().oneshot(request)
        });
        let connection =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // A header timeout, a reset or a client gone mid-request ends
            // the connection; nothing to do but free its place.
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
            drop(permit);
            metrics::gauge!("orchestrator_http_connections").decrement(1.0);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Answers a connection over the cap with a short `503` and closes it.
fn refuse(stream: TcpStream, refusing: &Arc<Semaphore>, max_connections: usize) {
    let Ok(permit) = refusing.clone().try_acquire_owned() else {
        return; // dropped: closed unanswered
    };
    let body = serde_json::json!({"error": {
        "code": "too_many_connections",
        "message": format!(
            "the service holds {max_connections} open connections, its limit \
             (--max-connections); try again shortly"
        ),
    }})
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tokio::spawn(async move {
        let _permit = permit;
        let mut stream = stream;
        let _ = tokio::time::timeout(REFUSAL_TIME, async {
            stream.write_all(answer.as_bytes()).await?;
            stream.shutdown().await?;
            // What the client sent is read and dropped until it closes:
            // closing with unread data would reset the connection, and a
            // reset can discard the answer before the client reads it.
            let mut sink = [0u8; 1024];
            while stream.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        })
        .await;
    });
}
