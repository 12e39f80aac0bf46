//! A real SurrealDB server for the tests: the workspace's `surreal-dev-server`
//! binary (the official server crate), started on a free port.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the server binary is: `$SURREAL_DEV_SERVER` (the Makefile sets
/// it), else next to this test binary's own target directory.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SURREAL_DEV_SERVER") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "SURREAL_DEV_SERVER={} does not exist; build it with `cargo build -p surreal-dev-server` (or run `make test`)",
            path.display()
        );
        return path;
    }
    // target/debug/deps/it-<hash> -> target/debug/surreal-dev-server
    let exe = std::env::current_exe().unwrap();
    let guess = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("surreal-dev-server"))
        .unwrap();
    assert!(
        guess.is_file(),
        "the SurrealDB dev server is not built ({} is missing): run `make test`, or \
         `cargo build -p surreal-dev-server` and set SURREAL_DEV_SERVER to its path",
        guess.display()
    );
    guess
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running server; killed when dropped.
pub struct DevServer {
    child: Option<Child>,
    pub port: u16,
    /// `memory`, or `surrealkv://<dir>` to survive a restart.
    storage: String,
    /// Whether a start may move to another port (only the first).
    movable: bool,
}

/// One `GET path` over HTTP/1.0: the whole answer, or `None` when nothing
/// answers.
fn http_get(bind: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(bind).ok()?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET {path} HTTP/1.0\r\nHost: {bind}\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    let _ = stream.take(64 * 1024).read_to_string(&mut answer);
    Some(answer)
}

fn is_ok(answer: &str) -> bool {
    answer.starts_with("HTTP/1.") && answer.contains(" 200 ")
}

/// Whether what listens on `bind` is a SurrealDB server (its `GET
/// /version` names it: anything else, or nothing, is not) that is ready to
/// serve. The server binds its port before its start-up work is done and
/// answers `/version` at once, but refuses queries (`/rpc`, the WebSocket
/// the backends use) with 503 until then; `GET /ready` says 200 only when
/// that is over. Under load the gap lasts seconds.
fn answers_as_surrealdb(bind: &str) -> bool {
    http_get(bind, "/version").is_some_and(|a| is_ok(&a) && a.contains("surrealdb"))
        && http_get(bind, "/ready").is_some_and(|a| is_ok(&a))
}

impl DevServer {
    /// A fresh in-memory server on a free port.
    pub fn start_memory() -> DevServer {
        DevServer::start(free_port(), "memory".into())
    }

    /// A server that keeps its data in `dir`, so a restart finds it again.
    pub fn start_persistent(dir: &std::path::Path) -> DevServer {
        DevServer::start(free_port(), format!("surrealkv://{}", dir.display()))
    }

    fn start(port: u16, storage: String) -> DevServer {
        let mut server = DevServer {
            child: None,
            port,
            storage,
            movable: true,
        };
        server.restart();
        // From now on a restart keeps the port: clients were given it.
        server.movable = false;
        server
    }

    pub fn url(&self) -> String {
        format!("ws://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on the same port and storage, and waits
    /// until it answers as a SurrealDB server. A port picked free may be
    /// taken by another test's listener before the server binds it (the
    /// server then exits, while the port accepts connections): a fresh
    /// server then moves to another free port; a restart, which must keep
    /// its port, fails saying so.
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..5 {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(status) if self.movable => {
                    eprintln!(
                        "surreal-dev-server could not start on port {} ({status}); trying another",
                        self.port
                    );
                    self.port = free_port();
                }
                Err(status) => panic!(
                    "surreal-dev-server exited at start on port {} with {status}",
                    self.port
                ),
            }
        }
        panic!("surreal-dev-server could not start on five free ports");
    }

    /// Spawns the server and waits until it answers as a SurrealDB server
    /// ready to serve; the child's exit status if it ends first.
    fn spawn_and_wait(&mut self) -> Result<(), std::process::ExitStatus> {
        let bind = format!("127.0.0.1:{}", self.port);
        let child = Command::new(binary())
            .args(["start", "--bind", &bind, "--user", "root", "--pass", "root"])
            .arg(&self.storage)
            .env("SURREAL_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start surreal-dev-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !answers_as_surrealdb(&bind) {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                self.child = None;
                return Err(status);
            }
            assert!(
                Instant::now() < deadline,
                "surreal-dev-server never answered on {bind}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// SIGKILL: the server vanishes mid-operation, as in a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for DevServer {
    fn drop(&mut self) {
        self.kill();
    }
}
