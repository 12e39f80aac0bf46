//! The built-in provisioning endpoints: servers, taskservs and clusters.
//!
//! Each request is checked field by field (names become directory names in
//! scripts, so they are held to a safe alphabet), then submitted as the
//! matching template shipped in `templates/`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::{Error, Meta, Result, SubmitRequest, TemplateSource};
use orchestrator_core::Priority;
use orchestrator_core::template::{Limit, Limits, is_safe_name};

/// Which built-in endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    /// `POST /workflows/servers/create`: create servers, in parallel.
    ServersCreate,
    /// `POST /workflows/taskserv/create`: every taskserv on every server.
    TaskservCreate,
    /// `POST /workflows/cluster/create`: servers, then taskservs, then the join.
    ClusterCreate,
}

/// How an endpoint takes a field that only some endpoints take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldUse {
    Required,
    Optional,
    Refused,
}

impl Builtin {
    /// Every endpoint.
    pub const ALL: [Builtin; 3] = [
        Builtin::ServersCreate,
        Builtin::TaskservCreate,
        Builtin::ClusterCreate,
    ];

    /// The fields of [`BuiltinRequest`] that differ by endpoint.
    pub const PER_ENDPOINT: [&'static str; 2] = ["taskservs", "cluster"];

    /// How this endpoint takes `field` (one of [`Builtin::PER_ENDPOINT`];
    /// any other is taken alike everywhere). The checks of
    /// [`BuiltinRequest::into_request`] and the API's document of each
    /// endpoint both read it.
    pub fn field_use(self, field: &str) -> FieldUse {
        match (self, field) {
            (Builtin::TaskservCreate, "taskservs") | (Builtin::ClusterCreate, "cluster") => {
                FieldUse::Required
            }
            (Builtin::ClusterCreate, "taskservs") => FieldUse::Optional,
            (_, "taskservs" | "cluster") => FieldUse::Refused,
            _ => FieldUse::Optional,
        }
    }

    fn template(self) -> &'static str {
        match self {
            Builtin::ServersCreate => "servers-create",
            Builtin::TaskservCreate => "taskserv-create",
            Builtin::ClusterCreate => "cluster-create",
        }
    }
}

/// The body of every built-in endpoint. One shape, so that a misplaced
/// field (`cluster` sent to servers/create) gets a message naming the
/// endpoint that takes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({
    "infra": "demo", "servers": ["web-01"], "check_mode": true
})))]
pub struct BuiltinRequest {
    /// A name (see [`NAME_PATTERN`]).
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    )]
    pub infra: String,
    pub settings: Option<String>,
    /// At least one name, each once.
    #[cfg_attr(feature = "openapi", schema(schema_with = names_schema))]
    pub servers: Vec<String>,
    /// taskserv/create (required, at least one) and cluster/create
    /// (optional); servers/create refuses it. Each name once.
    #[cfg_attr(feature = "openapi", schema(schema_with = optional_names_schema))]
    pub taskservs: Option<Vec<String>>,
    /// cluster/create only (and required there).
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    )]
    pub cluster: Option<String>,
    #[serde(default)]
    pub priority: Priority,
    /// Attempts per task; the service default when absent.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100))]
    #[serde(
        default,
        deserialize_with = "orchestrator_core::whole_number::option_u32"
    )]
    pub max_attempts: Option<u32>,
    /// Per-attempt timeout in seconds (at most 30 days); the service
    /// default when absent.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 2592000))]
    #[serde(
        default,
        deserialize_with = "orchestrator_core::whole_number::option_u32"
    )]
    pub timeout_secs: Option<u32>,
    /// Dry run: scripts are told to change nothing.
    #[serde(default)]
    pub check_mode: bool,
    /// Honoured by the API: answer only when the workflow has finished.
    #[serde(default)]
    pub wait: bool,
    /// Honoured by the API: the most seconds `wait` may block.
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 4294967295u32))]
    #[serde(
        default,
        deserialize_with = "orchestrator_core::whole_number::option_u32"
    )]
    pub wait_timeout_secs: Option<u32>,
}

/// What [`is_safe_name`] accepts, as the API's document states it (a test
/// checks the two agree).
pub const NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$";

/// A list of names as [`check_names`] accepts it.
#[cfg(feature = "openapi")]
fn names_schema() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(NAME_PATTERN)),
        )
        .min_items(Some(1))
        .unique_items(true)
        .build()
}

#[cfg(feature = "openapi")]
fn optional_names_schema() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
    ArrayBuilder::new()
        .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
            Type::Array,
            Type::Null,
        ]))
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(NAME_PATTERN)),
        )
        .unique_items(true)
        .build()
}

/// Names of infras, servers, taskservs and clusters become directory names
/// in scripts, so they are held to a safe, portable alphabet.
fn check_name(field: &str, value: &str) -> Result<()> {
    if is_safe_name(value) {
        Ok(())
    } else {
        Err(Error::validation(
            field,
            format!(
                "`{value}` is not a valid name (1-63 letters, digits, `.`, `_` or `-`, starting with a letter or digit)"
            ),
        ))
    }
}

/// Checks a list of names: its length against the limit on list inputs
/// first (200,000 names must not cost a check each), then each name once.
fn check_names(field: &str, values: &[String], allow_empty: bool, limits: &Limits) -> Result<()> {
    if values.is_empty() && !allow_empty {
        return Err(Error::validation(field, "must list at least one name"));
    }
    limits
        .check(field, Limit::ListItems, u64::try_from(values.len()).ok())
        .map_err(|e| Error::validation(e.field, e.message))?;
    let mut seen = std::collections::HashSet::with_capacity(values.len());
    for (i, value) in values.iter().enumerate() {
        check_name(&format!("{field}[{i}]"), value)?;
        if !seen.insert(value) {
            return Err(Error::validation(
                format!("{field}[{i}]"),
                format!("`{value}` is listed twice"),
            ));
        }
    }
    Ok(())
}

impl BuiltinRequest {
    /// Checks the request for `endpoint` and turns it into a submission of
    /// the matching template; its lists are held to `limits`.
    pub fn into_request(self, endpoint: Builtin, limits: &Limits) -> Result<SubmitRequest> {
        check_name("infra", &self.infra)?;
        check_names("servers", &self.servers, false, limits)?;
        let taskservs = match (endpoint.field_use("taskservs"), &self.taskservs) {
            (FieldUse::Refused, Some(_)) => {
                return Err(Error::validation(
                    "taskservs",
                    "servers/create does not install taskservs; use /workflows/taskserv/create",
                ));
            }
            (FieldUse::Required, None) => {
                return Err(Error::validation("taskservs", "missing field `taskservs`"));
            }
            (use_, Some(list)) => {
                check_names("taskservs", list, use_ == FieldUse::Optional, limits)?;
                Some(list)
            }
            (_, None) => None,
        };
        match (endpoint.field_use("cluster"), &self.cluster) {
            (FieldUse::Refused, Some(_)) => {
                return Err(Error::validation(
                    "cluster",
                    "only /workflows/cluster/create takes a cluster",
                ));
            }
            (FieldUse::Required, None) => {
                return Err(Error::validation("cluster", "missing field `cluster`"));
            }
            (_, Some(cluster)) => check_name("cluster", cluster)?,
            (_, None) => {}
        }
        let mut vars = Map::new();
        vars.insert("infra".into(), json!(self.infra));
        vars.insert("servers".into(), json!(self.servers));
        if let Some(settings) = &self.settings {
            vars.insert("settings".into(), json!(settings));
        }
        if let Some(taskservs) = taskservs {
            vars.insert("taskservs".into(), json!(taskservs));
        }
        if let Some(cluster) = &self.cluster {
            vars.insert("cluster".into(), json!(cluster));
        }
        let request = SubmitRequest {
            template: TemplateSource::Named {
                ref_name: endpoint.template().to_owned(),
                version: None,
            },
            vars,
            meta: Meta::default(),
            start_at: None,
            check_mode: self.check_mode,
            priority: self.priority,
            max_attempts: self.max_attempts,
            timeout: self.timeout_secs.map(|s| Duration::from_secs(s.into())),
            parallel_limit: None,
            idempotency_key: None,
            // The whole request, options included, is kept with the workflow.
            body: serde_json::to_value(&self).unwrap_or(Value::Null),
        };
        crate::submit::check_numbers(&request)?;
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_map_onto_their_templates() {
        let request: BuiltinRequest = serde_json::from_value(json!({
            "infra": "prod", "cluster": "k8s", "servers": ["cp-01", "wk-01"],
            "taskservs": ["containerd"], "priority": "high", "max_attempts": 2, "check_mode": true
        }))
        .unwrap();
        let submission = request
            .into_request(Builtin::ClusterCreate, &Limits::default())
            .unwrap();
        match &submission.template {
            TemplateSource::Named {
                ref_name,
                version: None,
            } => assert_eq!(ref_name, "cluster-create"),
            other => panic!("{other:?}"),
        }
        assert_eq!(submission.vars["servers"], json!(["cp-01", "wk-01"]));
        assert!(
            !submission.vars.contains_key("settings"),
            "absent settings use the template default"
        );
        assert_eq!(submission.priority, Priority::High);
        assert_eq!(submission.max_attempts, Some(2));
        assert!(submission.check_mode);
        // The whole request, options included, is kept with the workflow.
        assert_eq!(submission.body["max_attempts"], 2);
        assert_eq!(submission.body["priority"], "high");
    }

    #[test]
    fn name_lists_are_counted_against_the_limit_before_any_name_is_checked() {
        let limits = Limits {
            max_list_items: 2,
            ..Limits::default()
        };
        // The third name is bad too: the count is what is refused.
        let request: BuiltinRequest = serde_json::from_value(json!({
            "infra": "prod", "servers": ["a", "b", "../c"]
        }))
        .unwrap();
        match request.into_request(Builtin::ServersCreate, &limits) {
            Err(Error::Validation { field, message }) => {
                assert_eq!(field, "servers");
                assert!(
                    message.contains("3 items exceed the limit of 2 per list (--max-list-items)"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_names_are_refused_naming_the_field() {
        let cases = [
            (json!({"infra": "prod", "servers": []}), "servers"),
            (json!({"infra": "", "servers": ["a"]}), "infra"),
            (
                json!({"infra": "prod", "servers": ["ok", "../etc"]}),
                "servers[1]",
            ),
            (
                json!({"infra": "prod", "servers": ["a", "a"]}),
                "servers[1]",
            ),
            (
                json!({"infra": "prod", "servers": ["a"], "max_attempts": 0}),
                "max_attempts",
            ),
            (
                json!({"infra": "prod", "servers": ["a"], "timeout_secs": 0}),
                "timeout_secs",
            ),
            (
                json!({"infra": "prod", "servers": ["a"], "cluster": "k"}),
                "cluster",
            ),
            (
                json!({"infra": "prod", "servers": ["a"], "taskservs": ["x"]}),
                "taskservs",
            ),
        ];
        for (body, field) in cases {
            let request: BuiltinRequest = serde_json::from_value(body.clone()).unwrap();
            match request.into_request(Builtin::ServersCreate, &Limits::default()) {
                Err(Error::Validation { field: f, .. }) => assert_eq!(f, field, "{body}"),
                other => panic!("{body}: {other:?}"),
            }
        }
    }
}
