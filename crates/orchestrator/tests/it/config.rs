//! `orchestrator serve --print-config`: the real binary merges the config
//! file, the `ORCHESTRATOR_*` variables and the flags, each over the one
//! before, prints the result with its secrets masked, and starts nothing.

use std::path::Path;
use std::process::{Command, Output};

use crate::cli::BIN;

/// `orchestrator serve --print-config <flags>` with only the given
/// variables (none of the caller's `ORCHESTRATOR_*` leak in).
fn print_config(flags: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(BIN)
        .env_clear()
        .envs(env.iter().copied())
        .args(["serve", "--print-config"])
        .args(flags)
        .output()
        .unwrap()
}

fn printed(output: &Output) -> toml::Table {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    toml::from_str(&stdout).unwrap()
}

fn write_config(dir: &Path, text: &str) -> String {
    let path = dir.join("orchestrator.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn print_config_merges_file_variables_and_flags_and_masks_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("never-made");
    let config = write_config(
        dir.path(),
        &format!(
            "port = 9000\nworkers = 3\nrate_limit = 7\nlog_format = \"json\"\n\
             data_dir = \"{}\"\nhttp_allow = [\"file.example\"]\n\
             surrealdb_url = \"surreal+ws://admin:url-pass@db.example:8000\"\n\
             surrealdb_password = \"file-pass\"\n\
             secret_key_file = \"/etc/orchestrator/secret-key\"\n\
             templates_dir = \"/file/templates\"\nsurrealdb_namespace = \"file-ns\"\n\
             surrealdb_database = \"file-db\"\n",
            data_dir.display()
        ),
    );
    let output = print_config(
        &[
            "--config",
            &config,
            "--port",
            "9100",
            "--max-streams",
            "4",
            "--surrealdb-database",
            "flag-db",
        ],
        &[
            ("ORCHESTRATOR_PORT", "9050"),
            ("ORCHESTRATOR_WORKERS", "5"),
            ("ORCHESTRATOR_NO_AUTH", "true"),
            (
                "ORCHESTRATOR_HTTP_ALLOW",
                "env-a.example,env-b.example:8080",
            ),
            ("ORCHESTRATOR_SURREALDB_PASSWORD", "env-pass"),
            ("ORCHESTRATOR_RETAIN_AUDIT", "30d"),
            ("ORCHESTRATOR_TEMPLATES_DIR", "/env/templates"),
            ("ORCHESTRATOR_SURREALDB_NAMESPACE", "env-ns"),
            ("ORCHESTRATOR_SURREALDB_DATABASE", "env-db"),
        ],
    );
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let shown = printed(&output);
    // A flag beats its variable, which beats the file, which beats the default.
    assert_eq!(shown["port"].as_integer(), Some(9100), "{stdout}");
    assert_eq!(shown["workers"].as_integer(), Some(5), "{stdout}");
    assert_eq!(shown["rate_limit"].as_integer(), Some(7), "{stdout}");
    assert_eq!(shown["log_format"].as_str(), Some("json"));
    assert_eq!(shown["templates_dir"].as_str(), Some("/env/templates"));
    assert_eq!(shown["surrealdb_namespace"].as_str(), Some("env-ns"));
    assert_eq!(shown["surrealdb_database"].as_str(), Some("flag-db"));
    assert_eq!(shown["max_streams"].as_integer(), Some(4));
    assert_eq!(shown["address_rate_limit"].as_integer(), Some(200));
    assert_eq!(shown["storage_type"].as_str(), Some("filesystem"));
    assert_eq!(shown["no_auth"].as_bool(), Some(true));
    assert_eq!(shown["retain_audit"].as_str(), Some("30d"));
    assert_eq!(shown["retain_finished"].as_str(), Some("forever"));
    // A list from a variable replaces the file's whole.
    assert_eq!(
        shown["http_allow"],
        toml::Value::Array(vec!["env-a.example".into(), "env-b.example:8080".into()])
    );
    // Secrets are masked, wherever they came from; a key file's path is not one.
    assert_eq!(shown["surrealdb_password"].as_str(), Some("***"));
    assert_eq!(
        shown["surrealdb_url"].as_str(),
        Some("surreal+ws://***@db.example:8000")
    );
    assert_eq!(
        shown["secret_key_file"].as_str(),
        Some("/etc/orchestrator/secret-key")
    );
    for secret in ["env-pass", "file-pass", "url-pass"] {
        assert!(!stdout.contains(secret), "{secret} shown: {stdout}");
    }
    // Nothing started: the data dir was not made.
    assert!(!data_dir.exists());
}

#[test]
fn print_config_refuses_a_bad_value_naming_its_setting() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "workers = 0\n");
    let unknown = dir.path().join("unknown.toml");
    std::fs::write(&unknown, "prot = 8080\n").unwrap();
    let unknown = unknown.to_str().unwrap();
    refused(
        &["--max-connections", "0"],
        &[],
        "--max-connections: must be at least 1",
    );
    refused(&["--config", &config], &[], "--workers: must be at least 1");
    refused(
        &[],
        &[("ORCHESTRATOR_LOG_FORMAT", "xml")],
        "--log-format: unknown format `xml`",
    );
    refused(&["--config", unknown], &[], "prot: unknown field");
    refused(
        &["--script-sandbox-reuse", "token"],
        &[],
        "--script-sandbox-reuse: unknown value `token` (expected submitter, workflow or any)",
    );
    // A flag that fixes the file's bad value wins.
    printed(&print_config(&["--config", &config, "--workers", "2"], &[]));
}

/// `--print-config` exits non-zero, prints nothing on stdout, and says
/// `expected` on stderr.
fn refused(flags: &[&str], env: &[(&str, &str)], expected: &str) {
    let output = print_config(flags, env);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{flags:?} {env:?}");
    assert!(stderr.contains(expected), "{flags:?} {env:?}: {stderr}");
    assert!(output.stdout.is_empty(), "{flags:?} {env:?}");
}
