//! `orchestrator doctor` through the real binary: one line per check, a
//! failure with its fix, and a non-zero exit when a check fails.

use std::process::Command;

use crate::harness::fixture_scripts;

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

fn doctor(config: &std::path::Path, data: &std::path::Path, port: u16) -> (bool, String) {
    let output = Command::new(BIN)
        .args(["doctor", "--port", &port.to_string(), "--config"])
        .arg(config)
        .arg("--data-dir")
        .arg(data)
        .arg("--scripts-dir")
        .arg(fixture_scripts())
        .env_remove("ORCHESTRATOR_CONFIG")
        .output()
        .unwrap();
    let text = crate::harness::output_text(&output);
    (output.status.success(), text)
}

fn line<'a>(text: &'a str, check: &str) -> &'a str {
    text.lines()
        .find(|l| l.get(6..).is_some_and(|rest| rest.starts_with(check)))
        .unwrap_or_else(|| panic!("no `{check}` line in:\n{text}"))
}

#[test]
fn a_missing_interpreter_and_a_taken_port_fail_with_their_fixes() {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("config.toml");
    std::fs::write(&config, "[interpreters]\nnu = \"/nonexistent/nu\"\n").unwrap();
    let data = root.path().join("data");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();

    let (ok, text) = doctor(&config, &data, port);
    assert!(!ok, "{text}");
    let nu = line(&text, "interpreter nu");
    assert!(nu.starts_with("FAIL"), "{nu}");
    assert!(nu.contains("/nonexistent/nu not found"), "{nu}");
    assert!(
        nu.contains("fix: set [interpreters] nu in the config file"),
        "{nu}"
    );
    assert!(line(&text, "interpreter bash").starts_with("ok"), "{text}");
    assert!(
        line(&text, "data dir").contains("does not exist yet"),
        "{text}"
    );
    let port_line = line(&text, "port");
    assert!(
        port_line.starts_with("FAIL") && port_line.contains("already in use"),
        "{text}"
    );
    assert!(
        line(&text, "storage filesystem").contains("no store yet"),
        "{text}"
    );
    assert!(text.contains("error: 2 of 11 checks failed"), "{text}");

    // Fixed: nothing fails (warnings, such as an unsynchronized clock, may stay).
    std::fs::write(&config, "[interpreters]\nnu = \"bash\"\n").unwrap();
    drop(taken);
    let (ok, text) = doctor(&config, &data, port);
    assert!(ok, "{text}");
    assert!(!text.contains("FAIL"), "{text}");
    assert_eq!(text.lines().count(), 11, "{text}");
    // CI installs bubblewrap (.ci/run): the sandbox runs here, kept for
    // the attempts of one token's workflows by default.
    assert!(line(&text, "script sandbox").starts_with("ok"), "{text}");
    assert!(
        line(&text, "script sandbox").contains(
            "one sandbox serves up to 100 attempts in a row of the workflows one token submitted"
        ),
        "{text}"
    );

    // The settings of kept sandboxes are said as set.
    std::fs::write(
        &config,
        "script_sandbox_attempts = 10\nscript_sandbox_reuse = \"any\"\n\
         [interpreters]\nnu = \"bash\"\n",
    )
    .unwrap();
    let (ok, text) = doctor(&config, &data, port);
    assert!(ok, "{text}");
    assert!(
        line(&text, "script sandbox")
            .contains("one sandbox serves up to 10 attempts in a row of any workflow"),
        "{text}"
    );
    std::fs::write(
        &config,
        "script_sandbox_attempts = 1\n[interpreters]\nnu = \"bash\"\n",
    )
    .unwrap();
    let (ok, text) = doctor(&config, &data, port);
    assert!(ok, "{text}");
    assert!(
        line(&text, "script sandbox").contains("each attempt in a sandbox of its own"),
        "{text}"
    );
}

/// The script sandbox: `bwrap` missing fails naming the package and the
/// setting; turned off, a warning says what that means.
#[test]
fn the_script_sandbox_is_checked() {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("config.toml");
    std::fs::write(&config, "[interpreters]\nnu = \"bash\"\n").unwrap();
    let data = root.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let output = Command::new(BIN)
        .args(["doctor", "--port", &port.to_string(), "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(&data)
        .arg("--scripts-dir")
        .arg(fixture_scripts())
        .env("PATH", root.path())
        .output()
        .unwrap();
    let text = crate::harness::output_text(&output);
    assert!(!output.status.success(), "{text}");
    let sandbox = line(&text, "script sandbox");
    assert!(
        sandbox.starts_with("FAIL")
            && sandbox.contains("bubblewrap")
            && sandbox.contains("--script-sandbox none"),
        "{sandbox}"
    );

    let output = Command::new(BIN)
        .args([
            "doctor",
            "--script-sandbox",
            "none",
            "--port",
            &port.to_string(),
            "--config",
        ])
        .arg(&config)
        .arg("--data-dir")
        .arg(&data)
        .arg("--scripts-dir")
        .arg(fixture_scripts())
        .output()
        .unwrap();
    let text = crate::harness::output_text(&output);
    let sandbox = line(&text, "script sandbox");
    assert!(
        sandbox.starts_with("WARN") && sandbox.contains("secret key"),
        "{sandbox}"
    );
}
