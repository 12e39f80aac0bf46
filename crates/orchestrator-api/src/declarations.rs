//! What each operation needs and records, read from its one declaration:
//! the `x-role` and `x-audit` extensions of its `#[utoipa::path]`. The
//! door (`auth`) looks a request up here by method and route template;
//! the document shows the same extensions to clients, so what the door
//! does and what the document says cannot drift.

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::Method;
use orchestrator_core::access::Role;
use utoipa::openapi::OpenApi;
use utoipa::openapi::path::Operation;

/// What a route requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Anyone: liveness, the API's own description, the dashboard's files.
    Open,
    /// Anyone; a credential changes the answer (the dashboard asks who it
    /// is on every load, signed in or not, and is told 401 by the handler,
    /// not refused as an audited act).
    Optional,
    /// Anyone on loopback; elsewhere any valid token.
    Metrics,
    /// The task's own token, or an operator.
    Checkpoint,
    Role(Role),
}

impl Need {
    /// The `x-role` value that declares it.
    pub(crate) fn parse(value: &str) -> Option<Need> {
        Some(match value {
            "open" => Need::Open,
            "optional" => Need::Optional,
            "local-or-token" => Need::Metrics,
            "own-task-or-operator" => Need::Checkpoint,
            "viewer" => Need::Role(Role::Viewer),
            "operator" => Need::Role(Role::Operator),
            "admin" => Need::Role(Role::Admin),
            _ => return None,
        })
    }

    /// Whether a request gets through without any credential.
    pub(crate) fn is_open(self) -> bool {
        matches!(self, Need::Open | Need::Optional)
    }
}

/// One operation's declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Declared {
    pub(crate) need: Need,
    /// `<resource>.<verb>`: the call changes something, and is audited
    /// whatever its outcome.
    pub(crate) audit: Option<String>,
}

/// Every operation's declaration, by method and route template. Built
/// once with the router; shared read-only by every request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Declarations(Arc<HashMap<(Method, String), Declared>>);

impl Declarations {
    /// Reads the declarations from the document. An operation without a
    /// valid `x-role` is an error naming it: the service must not start
    /// with a route whose role nobody decided.
    pub(crate) fn from_document(document: &OpenApi) -> Result<Declarations, String> {
        let mut table = HashMap::new();
        for (path, item) in &document.paths.paths {
            for (method, operation) in operations(item) {
                let extensions = operation.extensions.as_ref();
                let role = extensions
                    .and_then(|e| e.get("x-role"))
                    .and_then(|v| v.as_str());
                let need = role.and_then(Need::parse).ok_or_else(|| {
                    format!(
                        "{method} {path}: declares no valid x-role (got {role:?}; one of open, \
                         optional, local-or-token, own-task-or-operator, viewer, operator, admin)"
                    )
                })?;
                let audit = extensions
                    .and_then(|e| e.get("x-audit"))
                    .and_then(|v| v.as_str())
                    .map(str::to_owned);
                table.insert((method, path.clone()), Declared { need, audit });
            }
        }
        Ok(Declarations(Arc::new(table)))
    }

    /// What a request to `path` (the matched route template, `None` when
    /// no route matched) needs. No route: a viewer, so that probing
    /// without a token is answered 401 before 404. A method the route
    /// does not declare (answered 405): a viewer for a read, an operator
    /// for a change, audited as `<method> <path>`.
    pub(crate) fn of(&self, method: &Method, path: Option<&str>) -> Declared {
        let safe = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        let Some(path) = path else {
            return Declared {
                need: Need::Role(Role::Viewer),
                audit: None,
            };
        };
        // axum's catch-all `{*path}` is OpenAPI's `{path}`; HEAD is
        // answered by the GET handler.
        let template = path.replace("{*", "{");
        let declared_method = if *method == Method::HEAD {
            Method::GET
        } else {
            method.clone()
        };
        if let Some(declared) = self.0.get(&(declared_method, template)) {
            return declared.clone();
        }
        Declared {
            need: Need::Role(if safe { Role::Viewer } else { Role::Operator }),
            audit: (!safe).then(|| format!("{} {path}", method.as_str().to_lowercase())),
        }
    }
}

/// An item's operations with their methods.
pub(crate) fn operations(
    item: &utoipa::openapi::PathItem,
) -> impl Iterator<Item = (Method, &Operation)> {
    [
        (Method::GET, &item.get),
        (Method::PUT, &item.put),
        (Method::POST, &item.post),
        (Method::DELETE, &item.delete),
        (Method::PATCH, &item.patch),
        (Method::HEAD, &item.head),
        (Method::OPTIONS, &item.options),
    ]
    .into_iter()
    .filter_map(|(method, operation)| operation.as_ref().map(|o| (method, o)))
}
