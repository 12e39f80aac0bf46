//! The way back in without the API: a token written straight into the
//! store by someone who can open it (`orchestrator token create --local`),
//! for when every admin token is lost. Access to the data dir (or to the
//! database's credentials) is the proof of authority, as for the bootstrap
//! token; the act is audited like any other token creation.

use anyhow::{Context, bail};
use chrono::Utc;
use orchestrator_core::access::{AuditRecord, Role};
use orchestrator_engine::access::{Access, AccessConfig};

use crate::cli::ServeArgs;
use crate::settings::ServeSettings;

/// Creates a token in the configured store and prints it once.
pub async fn create_token_locally(name: &str, role: &str, args: ServeArgs) -> anyhow::Result<()> {
    let role: Role = role
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--role: {e}"))?;
    let settings = ServeSettings::resolve(args)?;
    let (config, _) = settings.store()?;
    let store = match orchestrator_storage::open(&config).await {
        Ok(store) => store,
        Err(orchestrator_storage::Error::Locked { dir }) => bail!(
            "the store in {} is in use by a running service; stop it first (a local token \
             is written to the store directly), or create the token through the API",
            dir.display()
        ),
        Err(e) => return Err(e).context("cannot open storage"),
    };
    let result = async {
        let access = Access::load(store.clone(), AccessConfig::default()).await?;
        let issued = access.create_token(name, role).await?;
        access
            .record(AuditRecord {
                id: uuid::Uuid::now_v7().to_string(),
                time: Utc::now(),
                actor: format!("local:{}", local_user()),
                role: Some(Role::Admin),
                action: "token.create".into(),
                target: Some(issued.record.id.clone()),
                outcome: "ok".into(),
                status: 201,
                request_id: None,
                count: None,
            })
            .await;
        anyhow::Ok(issued)
    }
    .await;
    store.close().await.context("closing storage")?;
    let issued = result?;
    println!(
        "created token {} ({}, {}) in the store at {}; it is shown only this once:\n\n{}",
        issued.record.id,
        issued.record.name,
        issued.record.role,
        settings.data_dir.display(),
        issued.token,
    );
    Ok(())
}

/// Who ran the command, for the audit log.
fn local_user() -> String {
    std::env::var("SUDO_USER")
        .or_else(|_| std::env::var("USER"))
        .unwrap_or_else(|_| "unknown".to_owned())
}
