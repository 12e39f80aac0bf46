//! The binary under systemd, as the unit runs it (`Type=notify`, stderr to
//! the journal), with systemd's side played by the test: a datagram socket
//! in `NOTIFY_SOCKET`, and `JOURNAL_STREAM` naming the file stderr goes to.

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::fixture_scripts;

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn receive(socket: &UnixDatagram) -> String {
    let mut buffer = [0u8; 4096];
    let n = socket
        .recv(&mut buffer)
        .expect("a notification within a minute");
    String::from_utf8_lossy(&buffer[..n]).into_owned()
}

/// `GET /health` over a bare connection: its status line.
fn health(port: u16) -> String {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn readiness_waits_for_the_api_and_the_token_is_one_journal_line() {
    let root = tempfile::tempdir().unwrap();
    let socket_path = root.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let stderr_path = root.path().join("journal");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let stream = stderr.metadata().unwrap();
    let port = free_port();
    let mut child = Command::new(BIN)
        .args(["serve", "--port", &port.to_string(), "--data-dir"])
        .arg(root.path().join("data"))
        .arg("--scripts-dir")
        .arg(fixture_scripts())
        .env_remove("ORCHESTRATOR_CONFIG")
        .env("NOTIFY_SOCKET", &socket_path)
        .env(
            "JOURNAL_STREAM",
            format!("{}:{}", stream.dev(), stream.ino()),
        )
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();

    let ready = receive(&socket);
    assert!(ready.contains("READY=1"), "{ready}");
    assert!(
        ready.contains(&format!("STATUS=listening on http://127.0.0.1:{port}")),
        "{ready}"
    );
    // Ready means answering, not merely bound.
    assert_eq!(health(port), "HTTP/1.1 200 OK");

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let stopping = receive(&socket);
    assert!(stopping.contains("STOPPING=1"), "{stopping}");
    assert!(child.wait().unwrap().success());

    let journal = std::fs::read_to_string(&stderr_path).unwrap();
    let token_lines: Vec<&str> = journal
        .lines()
        .filter(|l| l.contains("bootstrap admin token"))
        .collect();
    assert_eq!(token_lines.len(), 1, "{journal}");
    assert!(
        token_lines[0].contains("(shown once, keep it safe): orch_"),
        "{journal}"
    );
}
