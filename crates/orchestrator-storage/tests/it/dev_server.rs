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
        };
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        format!("ws://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on the same port and storage, and waits
    /// until it accepts connections.
    pub fn restart(&mut self) {
        self.kill();
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
        while std::net::TcpStream::connect(&bind).is_err() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!("surreal-dev-server exited at start with {status}");
            }
            assert!(
                Instant::now() < deadline,
                "surreal-dev-server never listened on {bind}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
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
