//! `POST /backup` (admins): a backup archive of the store this service runs
//! on. `orchestrator backup` asks for it when the store cannot be read from
//! outside the service: embedded SurrealDB keeps its files locked by the
//! process that has them open. Any other store it reads itself.

use std::io::{Seek, SeekFrom};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use orchestrator_storage::backup::{self, BackupOptions};
use orchestrator_storage::transfer::Silent;
use tokio::io::AsyncReadExt;

use crate::error::ErrorBody;
use crate::{ApiError, AppState};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(create_backup))
}

/// Bytes of the archive sent per chunk of the response.
const CHUNK: usize = 256 * 1024;

/// A backup archive of the store (a zstd-compressed tar with a manifest
/// and checksums; see docs/deployment.md), for `orchestrator backup` when
/// the store cannot be read from outside the service (embedded SurrealDB).
#[utoipa::path(post, path = "/backup", tag = "admin",
    extensions(("x-role" = json!("admin")), ("x-audit" = json!("backup.create"))),
    responses(
        (status = 200, description = "The archive", content_type = "application/zstd", body = Vec<u8>),
        (status = 409, description = "The store kept changing; try again later", body = ErrorBody),
        (status = 503, description = "The backup failed; the service log says why", body = ErrorBody),
    ))]
pub(crate) async fn create_backup(State(state): State<AppState>) -> Result<Response, ApiError> {
    let engine = &state.engine;
    let store = engine.store();
    // Staged in the data dir, which has room for the store (a service's
    // private /tmp may be a small tmpfs) and is writable under the unit's
    // sandbox.
    let work_dir = engine.executor().config().data_dir.clone();
    let path = work_dir.join(format!(".backup-{}.tar.zst", uuid::Uuid::now_v7().simple()));
    // Details go to the service log; the admin gets what to do. A store
    // that never settles is not a fault of the service: that is said, as a
    // conflict.
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        tracing::error!(error = %e, path = %path.display(), "backup failed: {what}");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "backup_failed",
            format!("the backup failed ({what}); the service log has the details"),
        )
    };
    let file = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| failed("cannot create the archive in the data dir", &e))?;
    // Unlinked at once: the open handle keeps it until the response is
    // sent, and nothing is left behind if the client goes away.
    let _ = std::fs::remove_file(&path);
    let writer = file
        .try_clone()
        .map_err(|e| failed("cannot reopen the archive", &e))?;
    let options = BackupOptions::new(
        format!("{} (through the running service)", store.name()),
        &work_dir,
    );
    let manifest = match backup::create(store.transfer(), &options, &Silent, writer).await {
        Ok(manifest) => manifest,
        // The request is fine; the store's state forbids it for now.
        Err(e @ backup::BackupError::KeptChanging { .. }) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                e.to_string(),
            ));
        }
        Err(e) => return Err(failed("cannot copy the store", &e)),
    };
    tracing::info!(
        passes = manifest.passes,
        records = ?manifest.records,
        "backup taken"
    );
    let mut file = file;
    file.seek(SeekFrom::Start(0))
        .map_err(|e| failed("cannot read the archive back", &e))?;
    let reader = tokio::fs::File::from_std(file);
    let chunks = futures_util::stream::unfold(reader, |mut reader| async move {
        let mut buffer = Vec::with_capacity(CHUNK);
        match (&mut reader)
            .take(CHUNK as u64)
            .read_to_end(&mut buffer)
            .await
        {
            Ok(0) => None,
            Ok(_) => Some((Ok::<_, std::io::Error>(Bytes::from(buffer)), reader)),
            Err(e) => Some((Err(e), reader)),
        }
    });
    let name = format!(
        "orchestrator-{}.tar.zst",
        manifest.created_at.format("%Y%m%dT%H%M%SZ")
    );
    Ok((
        [
            (header::CONTENT_TYPE, "application/zstd".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        Body::from_stream(chunks),
    )
        .into_response())
}
