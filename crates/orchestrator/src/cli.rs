//! The command line.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use orchestrator_core::retention::Keep;

#[derive(Debug, Parser)]
#[command(
    name = "orchestrator",
    version,
    about = "A self-hosted provisioning orchestrator"
)]
pub struct Cli {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the orchestrator service.
    Serve(ServeCommand),
    /// List tasks of a running service.
    Tasks(TasksArgs),
    /// Show one task.
    Task(TaskArgs),
    /// Print a task's log.
    Logs(LogsArgs),
    /// Cancel a queued or running task.
    Cancel(TaskArgs),
    /// Submit, follow, cancel and retry template workflows.
    #[command(subcommand)]
    Workflow(WorkflowCommand),
    /// List the approval gates waiting for a decision, with their digests.
    Approvals(ApprovalsArgs),
    /// Approve a workflow's waiting approval gate.
    Approve(DecideArgs),
    /// Reject a workflow's waiting approval gate: the gated steps never run.
    Reject(DecideArgs),
    /// Check and list workflow templates.
    #[command(subcommand)]
    Template(TemplateCommand),
    /// Recurring runs of a template on a cron expression.
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Test environments: a taskserv, a server or a cluster in Linux
    /// namespaces, made, checked and torn down by the service.
    #[command(subcommand)]
    Test(TestCommand),
    /// Look at the store itself.
    #[command(subcommand)]
    Db(DbCommand),
    /// Create, list and revoke API tokens (needs an admin token).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Store, list, scope and delete secrets (needs an admin token).
    #[command(subcommand)]
    Secret(SecretCommand),
    /// Read the audit log (needs an admin token).
    Audit(AuditArgs),
    /// Webhook subscriptions, their delivery log and re-sends (needs an
    /// admin token); see docs/notifications.md.
    #[command(subcommand)]
    Webhook(WebhookCommand),
    /// Store copy: copy every record of a stopped store into another, of
    /// any backend (`--from` is only read), resumable and verifiable; see
    /// docs/migration.md.
    Migrate(MigrateArgs),
    /// Storage move: move a running service to another store while it
    /// serves, watch or cancel the move, or roll it back (needs an admin
    /// token); see docs/migration.md.
    #[command(subcommand)]
    Storage(StorageCommand),
    /// Save or read the checkpoint of the running task (for scripts: the
    /// task id and service URL come from ORCHESTRATOR_TASK_ID and ORCHESTRATOR_URL).
    #[command(subcommand)]
    Checkpoint(CheckpointCommand),
    /// Back the store up into one compressed archive, consistently, while
    /// the service runs; see docs/deployment.md.
    Backup(BackupArgs),
    /// Restore a backup archive into an empty store of any backend, and
    /// verify it record by record.
    Restore(RestoreArgs),
    /// Delete finished workflows (with their tasks and logs) and audit
    /// records older than given, now, through the running service (needs an
    /// admin token). The service also prunes by itself under
    /// `--retain-finished` and `--retain-audit`.
    Prune(PruneArgs),
    /// Check this host before the first start (interpreters, data dir,
    /// disk, clock, port, namespaces, SurrealDB); exits non-zero if a check
    /// fails. Takes the settings of `serve`.
    Doctor(ServeArgs),
    /// The first process of a test environment's node, started by the
    /// service inside the node's new namespaces: builds the node's root
    /// filesystem, enters it, and reaps orphans until killed.
    #[command(hide = true, name = "testenv-node-init")]
    TestenvNodeInit(NodeInitArgs),
    /// List the named locks that are held or waited for: holders with
    /// their fencing token, waiters in order (docs/locks.md).
    Locks(LocksArgs),
}

#[derive(Debug, Args)]
pub struct LocksArgs {
    /// Print the JSON answer.
    #[arg(long)]
    pub json: bool,
}

/// `testenv-node-init`: what `orchestrator_testenv::node_init::NodeSpec`
/// carries, as the provider writes it.
#[derive(Debug, Args)]
pub struct NodeInitArgs {
    /// The node's dir on the host (its layers and /etc/hosts).
    #[arg(long)]
    pub node_dir: PathBuf,
    #[arg(long)]
    pub hostname: String,
    /// A path of the service's, masked in the node.
    #[arg(long = "hide")]
    pub hidden: Vec<PathBuf>,
    /// A host path bound read-only at the same path when needed.
    #[arg(long = "expose")]
    pub exposed: Vec<PathBuf>,
}

impl From<NodeInitArgs> for orchestrator_testenv::node_init::NodeSpec {
    fn from(args: NodeInitArgs) -> Self {
        orchestrator_testenv::node_init::NodeSpec {
            node_dir: args.node_dir,
            hostname: args.hostname,
            hidden: args.hidden,
            exposed: args.exposed,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum StorageCommand {
    /// Start a storage move to `--to` and follow it to its end (exits
    /// non-zero unless it completes).
    Migrate {
        /// The store to move to: `filesystem:DIR`, `surrealdb-embedded:DIR`
        /// or `surrealdb-server:ws://HOST:PORT/NAMESPACE/DATABASE`.
        #[arg(long, value_name = "SPEC")]
        to: String,
        /// Records per batch (default 2000).
        #[arg(long)]
        batch_size: Option<usize>,
        /// Print the first status and return at once.
        #[arg(long)]
        no_wait: bool,
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The current store and the storage moves, or one move.
    Status {
        id: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Cancel a storage move before its switch; the service stays on its store.
    Cancel { id: String },
    /// Switch back to the store left at the last switch, while it is level.
    Rollback {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Finished workflows that ended longer ago than this: `7d`, `12h`.
    /// A workflow's own `meta.retain` still wins, and the newest revision
    /// of each `meta.ref` stays.
    #[arg(long, value_name = "PERIOD", value_parser = parse_keep)]
    pub older_than: Option<Keep>,
    /// Audit records older than this.
    #[arg(long, value_name = "PERIOD", value_parser = parse_keep)]
    pub audit_older_than: Option<Keep>,
    /// Count what would go; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the service's report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// A retention period: `30d`, `12h`, `forever`.
pub fn parse_keep(text: &str) -> Result<Keep, String> {
    text.parse()
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The archive to write (`.tar.zst`); refused if it exists.
    #[arg(long, value_name = "FILE")]
    pub to: PathBuf,
    /// Copy passes before giving up on a store that never stops changing.
    #[arg(long, default_value_t = 10)]
    pub max_passes: u32,
    /// The store to back up: the settings of `serve` (flags,
    /// ORCHESTRATOR_* variables, --config). An embedded SurrealDB store
    /// that a service holds is backed up through that service, with an
    /// admin token (--token or ORCHESTRATOR_TOKEN).
    #[command(flatten)]
    pub store: ServeArgs,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The archive written by `orchestrator backup`.
    #[arg(long, value_name = "FILE")]
    pub from: PathBuf,
    /// The empty store to restore into, a spec as for `migrate --to`:
    /// `filesystem:DIR`, `surrealdb-embedded:DIR` or
    /// `surrealdb-server:ws://HOST:PORT/<namespace>/<database>`.
    #[arg(long, value_name = "SPEC")]
    pub to: String,
    #[command(flatten)]
    pub target: TargetArgs,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token; it is printed once and never again.
    Create {
        /// What the token is for, e.g. `ci` or `alice`.
        #[arg(long)]
        name: String,
        /// viewer (reads), operator (also submits, cancels, retries) or
        /// admin (also tokens, secrets, the audit log).
        #[arg(long)]
        role: String,
        /// Write the token straight into the store instead of asking a
        /// service: the way back in after losing every admin token. Needs
        /// the data dir (and, for a filesystem store, the service
        /// stopped); takes the store settings of `serve`.
        #[arg(long)]
        local: bool,
        #[command(flatten)]
        store: Box<ServeArgs>,
    },
    /// List tokens (never the tokens themselves).
    List,
    /// Revoke a token by its id (see `token list`).
    Revoke { id: String },
}

#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Store a secret, or replace its value; the value is read from stdin
    /// (one trailing newline dropped), never from the command line.
    Put {
        name: String,
        /// Registered templates (`ref_name`, comma-separated) whose
        /// workflows may use it. Absent: a replaced secret keeps its list,
        /// a new one gets none (usable nowhere).
        #[arg(long, value_delimiter = ',')]
        templates: Option<Vec<String>>,
        /// Origins (`scheme://host[:port]`, comma-separated) http steps
        /// may send it to. Absent: as for `--templates`.
        #[arg(long, value_delimiter = ',')]
        origins: Option<Vec<String>>,
    },
    /// Change who may use a secret, without its value; `--templates ''`
    /// empties a list.
    Scope {
        name: String,
        #[arg(long, value_delimiter = ',')]
        templates: Option<Vec<String>>,
        #[arg(long, value_delimiter = ',')]
        origins: Option<Vec<String>>,
    },
    /// List secrets with their scopes (never their values).
    List,
    /// Delete a secret.
    Delete { name: String },
}

#[derive(Debug, Args)]
pub struct ApprovalsArgs {
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DecideArgs {
    /// The workflow's id.
    pub workflow: String,
    /// Why; kept with the decision and in the audit log.
    #[arg(long)]
    pub comment: Option<String>,
    /// The gate's step, when the workflow has several waiting.
    #[arg(long)]
    pub step: Option<String>,
    /// The digest you reviewed (`orchestrator approvals`); refused if the
    /// gate now covers anything else. Without it, the digest the gate
    /// covers now is shown and decided on.
    #[arg(long)]
    pub digest: Option<String>,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Records at or after this RFC 3339 time.
    #[arg(long)]
    pub since: Option<String>,
    /// Records before this RFC 3339 time.
    #[arg(long)]
    pub until: Option<String>,
    /// A token name (`anonymous` for calls without one).
    #[arg(long)]
    pub actor: Option<String>,
    /// e.g. `workflow.submit`, `token.create`.
    #[arg(long)]
    pub action: Option<String>,
    #[arg(long)]
    pub target: Option<String>,
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    #[arg(long, default_value_t = 0)]
    pub offset: usize,
    /// Print the JSON answer.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct MigrateArgs {
    #[command(subcommand)]
    pub command: Option<MigrateCommand>,
    #[command(flatten)]
    pub stores: StoreArgs,
    /// Continue an earlier store copy into a target that already holds
    /// records, or catch up with what changed in the source since.
    #[arg(long)]
    pub resume: bool,
    /// Read and count everything, report unreadable records, write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Copy everything readable and list unreadable source records in the
    /// summary, instead of stopping at the first.
    #[arg(long)]
    pub skip_unreadable: bool,
    /// Compare source and target record by record after copying.
    #[arg(long, conflicts_with = "dry_run")]
    pub verify: bool,
}

#[derive(Debug, Subcommand)]
pub enum MigrateCommand {
    /// Compare two stores record by record, changing nothing; exits
    /// non-zero and names the first differing records on any mismatch.
    Verify(StoreArgs),
}

/// The two stores of a store copy. A spec is `<backend>:<location>`:
/// `filesystem:./data`, `surrealdb-embedded:./data` (its data dir) or
/// `surrealdb-server:ws://127.0.0.1:8000/<namespace>/<database>`.
/// Credentials never go in a spec.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The store to read.
    #[arg(long, value_name = "SPEC", required = true)]
    pub from: Option<String>,
    /// The store to write.
    #[arg(long, value_name = "SPEC", required = true)]
    pub to: Option<String>,
    #[arg(long, env = "ORCHESTRATOR_MIGRATE_FROM_USERNAME")]
    pub from_username: Option<String>,
    #[arg(
        long,
        env = "ORCHESTRATOR_MIGRATE_FROM_PASSWORD",
        hide_env_values = true
    )]
    pub from_password: Option<orchestrator_storage::Secret>,
    #[command(flatten)]
    pub target: TargetArgs,
}

/// What `migrate` and `restore` take beside the specs: the target's
/// credentials, the config file whose `surrealdb_*` settings are the
/// defaults of every store named (credentials included), and how to copy
/// and report.
#[derive(Debug, Args)]
pub struct TargetArgs {
    #[arg(long, env = "ORCHESTRATOR_MIGRATE_TO_USERNAME")]
    pub to_username: Option<String>,
    #[arg(long, env = "ORCHESTRATOR_MIGRATE_TO_PASSWORD", hide_env_values = true)]
    pub to_password: Option<orchestrator_storage::Secret>,
    /// TOML config file: its surrealdb_* settings are the defaults of every
    /// store (credentials included).
    #[arg(long, env = "ORCHESTRATOR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Records per read and write.
    #[arg(long, default_value_t = 500)]
    pub batch_size: usize,
    /// Print a JSON summary on stdout at the end.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum DbCommand {
    /// Show the applied and pending schema migrations (the layout version
    /// for the filesystem backend), changing nothing. Takes the storage
    /// settings of `serve` (flags, ORCHESTRATOR_* variables, --config).
    Status(ServeArgs),
}

#[derive(Debug, Subcommand)]
pub enum WorkflowCommand {
    /// Submit a workflow from a registered template.
    Submit(SubmitArgs),
    /// Show a workflow's DAG with the status of every step.
    Status(WorkflowStatusArgs),
    /// List workflows.
    List(WorkflowListArgs),
    /// Cancel a workflow: running steps stop, pending ones never start.
    Cancel(WorkflowArgs),
    /// Re-run what did not complete in a finished workflow.
    Retry(WorkflowArgs),
    /// Re-run a finished workflow from a step, as a new revision: the
    /// steps before it keep their outputs.
    Rerun(RerunArgs),
    /// Pause a workflow: no new step of it starts until it is resumed;
    /// running steps finish.
    Pause(WorkflowArgs),
    /// Resume a paused workflow.
    Resume(WorkflowArgs),
    /// Compare two runs of one template (or two revisions of one
    /// workflow): inputs, template revision, and each step's status,
    /// script, outputs and first differing log line.
    Diff(DiffArgs),
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The first workflow's id.
    pub a: String,
    /// The workflow to compare it with.
    pub b: String,
    /// Show every input and step, the same ones too (with durations).
    #[arg(long)]
    pub all: bool,
    /// Print the API's answer as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RerunArgs {
    pub id: String,
    /// The ref_name of the first step to run again.
    #[arg(long)]
    pub from: String,
    /// Run only that step again; the steps after it keep their outputs.
    #[arg(long)]
    pub no_downstream: bool,
    /// A new input for the steps that run again: `key=value`, as for
    /// `workflow submit`. Repeatable.
    #[arg(short = 'i', long = "input", value_name = "KEY=VALUE")]
    pub inputs: Vec<String>,
    /// Follow the new revision until it finishes; exit non-zero unless it completed.
    #[arg(long)]
    pub wait: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum WebhookCommand {
    /// Subscribe a URL to events; prints the signing secret, shown once.
    Add(WebhookAddArgs),
    /// List the subscriptions (never their secrets).
    List(WebhookListArgs),
    /// Delete a subscription; its pending deliveries are not sent.
    Rm { id: String },
    /// The delivery log: each delivery with its attempts.
    Deliveries(WebhookDeliveriesArgs),
    /// Send a delivered or failed delivery again (same id and body).
    Resend {
        id: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct WebhookAddArgs {
    /// Where to POST; its host must be in the service's --http-allow.
    /// (Not `url`: that is the client's own `--url`.)
    #[arg(value_name = "URL")]
    pub target: String,
    /// Event types, comma-separated: workflow.completed, workflow.failed,
    /// workflow.cancelled, step.failed, schedule.missed.
    #[arg(long, value_delimiter = ',', required = true)]
    pub events: Vec<String>,
    /// A JSON file with the body template (`${event.<field>}` placeholders).
    #[arg(long, value_name = "FILE")]
    pub body_template: Option<std::path::PathBuf>,
    #[arg(long)]
    pub description: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct WebhookListArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct WebhookDeliveriesArgs {
    /// Only the deliveries of this subscription.
    #[arg(long)]
    pub webhook: Option<String>,
    /// Only deliveries in this status: pending, delivered or failed.
    #[arg(long)]
    pub status: Option<String>,
    #[arg(long)]
    pub limit: Option<usize>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Create a schedule: a registered template run on a cron expression.
    Create(Box<ScheduleCreateArgs>),
    /// List the schedules with when each is next due.
    List(ScheduleListArgs),
    /// Show a schedule and what became of its newest due runs.
    Show(ScheduleArgs),
    /// Pause a schedule: nothing starts until it is resumed.
    Pause(ScheduleArgs),
    /// Resume a paused schedule (it does not catch up on the pause).
    Resume(ScheduleArgs),
    /// Delete a schedule; runs already started go on.
    Delete(ScheduleArgs),
}

#[derive(Debug, Args)]
pub struct ScheduleCreateArgs {
    /// The template's ref_name (see `orchestrator template list`).
    pub template: String,
    /// Five fields (minute hour day month weekday), or six with seconds first.
    #[arg(long)]
    pub cron: String,
    /// The IANA time zone the cron expression is read in [default: UTC].
    #[arg(long)]
    pub timezone: Option<String>,
    #[arg(long)]
    pub name: Option<String>,
    /// A workflow input: `key=value`, as for `workflow submit`. Repeatable.
    #[arg(short = 'i', long = "input", value_name = "KEY=VALUE")]
    pub inputs: Vec<String>,
    /// While the previous run still goes: skip, queue or cancel_previous [default: skip].
    #[arg(long)]
    pub overlap: Option<String>,
    /// Due times missed while no node ran: none, latest or all [default: none].
    #[arg(long)]
    pub catch_up: Option<String>,
    /// How old a missed due time may be and still start [default: 86400].
    #[arg(long)]
    pub catch_up_window_secs: Option<u64>,
    /// No due time before this (RFC 3339).
    #[arg(long)]
    pub start_at: Option<String>,
    /// No due time after this (RFC 3339).
    #[arg(long)]
    pub end_at: Option<String>,
    /// Create it paused.
    #[arg(long)]
    pub paused: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ScheduleListArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ScheduleArgs {
    pub id: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The template's ref_name (see `orchestrator template list`).
    pub template: String,
    /// A workflow input: `key=value`; the value is read as JSON when it
    /// parses (numbers, booleans, lists), else as text. Repeatable.
    #[arg(short = 'i', long = "input", value_name = "KEY=VALUE")]
    pub inputs: Vec<String>,
    /// Your name for this piece of work; resubmitting it with the same
    /// inputs returns the same workflow.
    #[arg(long = "ref")]
    pub reference: Option<String>,
    #[arg(long)]
    pub trace_id: Option<String>,
    /// Dry run: scripts are told to change nothing.
    #[arg(long = "check")]
    pub check_mode: bool,
    /// low, normal, high or critical.
    #[arg(long)]
    pub priority: Option<String>,
    /// Start at this time (RFC 3339) instead of now.
    #[arg(long)]
    pub at: Option<String>,
    /// Follow the workflow until it finishes; exit non-zero unless it completed.
    #[arg(long)]
    pub wait: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct WorkflowArgs {
    pub id: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct WorkflowStatusArgs {
    pub id: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Redraw the DAG as the service announces changes, until the
    /// workflow ends.
    #[arg(long, short = 'w', conflicts_with = "json")]
    pub watch: bool,
}

#[derive(Debug, Args)]
pub struct WorkflowListArgs {
    #[arg(long)]
    pub status: Option<String>,
    #[arg(long)]
    pub template: Option<String>,
    #[arg(long = "ref")]
    pub reference: Option<String>,
    #[arg(long)]
    pub trace_id: Option<String>,
    /// Text in the name, template, ref or an input value, any case.
    #[arg(long)]
    pub search: Option<String>,
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// Only workflows older than this one: the next page, as the last
    /// page's footer names it.
    #[arg(long)]
    pub after: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum TemplateCommand {
    /// Check a template file offline: syntax, steps, references, cycles
    /// and that its scripts exist.
    Validate(TemplateValidateArgs),
    /// List the templates a running service knows.
    List(TemplateListArgs),
}

#[derive(Debug, Args)]
pub struct TemplateValidateArgs {
    pub file: PathBuf,
    /// Where the template's scripts must exist.
    #[arg(long, default_value = "./scripts")]
    pub scripts_dir: PathBuf,
    /// Hosts its http steps may reach, as for `serve` (host or host:port;
    /// repeatable, or comma-separated).
    #[arg(
        long = "http-allow",
        env = "ORCHESTRATOR_HTTP_ALLOW",
        value_delimiter = ','
    )]
    pub http_allow: Vec<String>,
}

#[derive(Debug, Args)]
pub struct TemplateListArgs {
    #[arg(long)]
    pub json: bool,
}

/// How client subcommands reach the service.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// Base URL of a running service.
    #[arg(
        long,
        global = true,
        env = "ORCHESTRATOR_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub url: String,
    /// API token, sent as `Authorization: Bearer <token>`.
    #[arg(
        long,
        global = true,
        env = "ORCHESTRATOR_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<orchestrator_storage::Secret>,
}

/// `serve`: the service's settings, and whether to only show them.
#[derive(Debug, Args)]
pub struct ServeCommand {
    #[command(flatten)]
    pub settings: ServeArgs,
    /// Print the merged settings (defaults, config file, variables, flags)
    /// as TOML, secrets masked, and exit without starting.
    #[arg(long)]
    pub print_config: bool,
}

/// A password given as a flag or variable, as itself, for merging the
/// settings' layers (never for showing: `--print-config` masks it).
fn expose_given_secret<S: serde::Serializer>(
    secret: &Option<orchestrator_storage::Secret>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match secret {
        Some(secret) => serializer.serialize_some(secret.expose()),
        None => serializer.serialize_none(),
    }
}

/// Service settings. Each can also come from an `ORCHESTRATOR_*` variable
/// or the config file; a flag beats the variable, which beats the file,
/// which beats the default (the settings module merges them). Serialized,
/// these are the top layer: only the flags and variables given count.
#[derive(Debug, Args, Default, serde::Serialize)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(long, env = "ORCHESTRATOR_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Port to listen on [default: 8080].
    #[arg(long, env = "ORCHESTRATOR_PORT")]
    pub port: Option<u16>,
    /// Address to listen on [default: 127.0.0.1].
    #[arg(long, env = "ORCHESTRATOR_BIND")]
    pub bind: Option<IpAddr>,
    /// Where state is kept [default: ./data].
    #[arg(long, env = "ORCHESTRATOR_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// filesystem, surrealdb-embedded or surrealdb-server [default: filesystem].
    #[arg(long, env = "ORCHESTRATOR_STORAGE_TYPE")]
    pub storage_type: Option<String>,
    /// Root of the provisioning scripts [default: ./scripts].
    #[arg(long, env = "ORCHESTRATOR_SCRIPTS_DIR")]
    pub scripts_dir: Option<PathBuf>,
    /// Workflow templates (YAML or JSON) to load at start [default: ./templates].
    #[arg(long, env = "ORCHESTRATOR_TEMPLATES_DIR")]
    pub templates_dir: Option<PathBuf>,
    /// Scripts that may run at once [default: number of CPUs].
    #[arg(long, env = "ORCHESTRATOR_WORKERS")]
    pub workers: Option<usize>,
    /// Attempts per task unless a submission says otherwise [default: 3].
    #[arg(long, env = "ORCHESTRATOR_MAX_ATTEMPTS")]
    pub max_attempts: Option<u32>,
    /// Per-attempt timeout in seconds unless a submission says otherwise [default: 3600].
    #[arg(long, env = "ORCHESTRATOR_TASK_TIMEOUT")]
    pub task_timeout: Option<u64>,
    /// First retry delay in milliseconds; doubles per attempt [default: 1000].
    #[arg(long, env = "ORCHESTRATOR_RETRY_BASE_MS")]
    pub retry_base_ms: Option<u64>,
    /// Longest retry delay in milliseconds [default: 60000].
    #[arg(long, env = "ORCHESTRATOR_RETRY_MAX_MS")]
    pub retry_max_ms: Option<u64>,
    /// Seconds running scripts get to finish on shutdown [default: 30].
    #[arg(long, env = "ORCHESTRATOR_SHUTDOWN_GRACE")]
    pub shutdown_grace: Option<u64>,
    /// Seconds between SIGTERM and SIGKILL for a stopped script [default: 10].
    #[arg(long, env = "ORCHESTRATOR_KILL_GRACE")]
    pub kill_grace: Option<u64>,
    /// The most bytes of one attempt's output kept in its log; the rest is
    /// dropped after a line saying so [default: 67108864 (64 MiB)].
    #[arg(long, env = "ORCHESTRATOR_MAX_LOG_BYTES")]
    pub max_log_bytes: Option<u64>,
    /// This node's id, recorded on every attempt it runs [default: kept
    /// in <data-dir>/node-id, created on first start].
    #[arg(long, env = "ORCHESTRATOR_NODE_ID")]
    pub node_id: Option<String>,
    /// Seconds a node's claim on a running task holds without a heartbeat;
    /// past it, another node on the same SurrealDB server takes over [default: 15].
    #[arg(long, env = "ORCHESTRATOR_LEASE_SECS")]
    pub lease_secs: Option<u64>,
    /// Milliseconds between a node's looks through a shared store for work
    /// other nodes accepted and leases that ran out; new work also arrives
    /// at once through the store's change feed [default: 1000].
    #[arg(long, env = "ORCHESTRATOR_POLL_MS")]
    pub poll_ms: Option<u64>,
    /// Log format: pretty or json [default: pretty].
    #[arg(long, env = "ORCHESTRATOR_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// Serve without API tokens: everyone may do everything. Allowed only
    /// on a loopback address.
    #[arg(long, env = "ORCHESTRATOR_NO_AUTH")]
    pub no_auth: bool,
    /// Clients reach the service over HTTPS (TLS ends here or at a proxy in
    /// front): the dashboard's session cookie is `Secure` and named
    /// `__Host-orch_session`.
    #[arg(long, env = "ORCHESTRATOR_SECURE_COOKIES")]
    pub secure_cookies: bool,
    /// Delete finished workflows, with their tasks and logs, this long
    /// after they end (`30d`, `12h`; a workflow's `meta.retain` wins; the
    /// newest revision of a `meta.ref` stays) [default: forever].
    #[arg(long, env = "ORCHESTRATOR_RETAIN_FINISHED", value_name = "PERIOD", value_parser = parse_keep)]
    pub retain_finished: Option<Keep>,
    /// Delete audit records this long after they are written [default: forever].
    #[arg(long, env = "ORCHESTRATOR_RETAIN_AUDIT", value_name = "PERIOD", value_parser = parse_keep)]
    pub retain_audit: Option<Keep>,
    /// Attempts per round of a webhook delivery, 1 to 30 [default: 8].
    #[arg(long, env = "ORCHESTRATOR_WEBHOOK_MAX_ATTEMPTS")]
    pub webhook_max_attempts: Option<u32>,
    /// Milliseconds before a webhook delivery's first retry; doubling,
    /// at most 10 minutes [default: 1000].
    #[arg(long, env = "ORCHESTRATOR_WEBHOOK_RETRY_BASE_MS")]
    pub webhook_retry_base_ms: Option<u64>,
    /// Delete delivered and failed webhook deliveries from the log this
    /// long after their last attempt; the newest 10,000 at most are kept
    /// whatever the period [default: 7d].
    #[arg(long, env = "ORCHESTRATOR_WEBHOOK_RETAIN", value_name = "PERIOD", value_parser = parse_keep)]
    pub webhook_retain: Option<Keep>,
    /// Requests per second per token (or per address without one) before
    /// 429; 0 for no limit [default: 50].
    #[arg(long, env = "ORCHESTRATOR_RATE_LIMIT")]
    pub rate_limit: Option<u32>,
    /// Requests per second per client address, counted before the token
    /// is checked, before 429; 0 for no limit [default: 200].
    #[arg(long, env = "ORCHESTRATOR_ADDRESS_RATE_LIMIT")]
    pub address_rate_limit: Option<u32>,
    /// SurrealDB server for `--storage-type surrealdb-server` [default: ws://127.0.0.1:8000].
    #[arg(long, env = "ORCHESTRATOR_SURREALDB_URL")]
    pub surrealdb_url: Option<String>,
    /// SurrealDB user (a root user) [default: root].
    #[arg(long, env = "ORCHESTRATOR_SURREALDB_USERNAME")]
    pub surrealdb_username: Option<String>,
    /// SurrealDB password [default: root]; prefer the variable or the
    /// config file to a flag, which other users can see in `ps`.
    #[arg(long, env = "ORCHESTRATOR_SURREALDB_PASSWORD", hide_env_values = true)]
    #[serde(serialize_with = "expose_given_secret")]
    pub surrealdb_password: Option<orchestrator_storage::Secret>,
    /// SurrealDB namespace [default: orchestrator].
    #[arg(long, env = "ORCHESTRATOR_SURREALDB_NAMESPACE")]
    pub surrealdb_namespace: Option<String>,
    /// SurrealDB database [default: orchestrator].
    #[arg(long, env = "ORCHESTRATOR_SURREALDB_DATABASE")]
    pub surrealdb_database: Option<String>,
    /// Engine of `--storage-type surrealdb-embedded`: surrealkv or rocksdb [default: surrealkv].
    #[arg(long, env = "ORCHESTRATOR_SURREALDB_ENGINE")]
    pub surrealdb_engine: Option<String>,
    /// Seconds to connect and sign in before start-up fails [default: 10].
    #[arg(long, env = "ORCHESTRATOR_SURREALDB_CONNECT_TIMEOUT")]
    pub surrealdb_connect_timeout: Option<u64>,
    /// Seconds one storage call may wait for SurrealDB [default: 10].
    #[arg(long, env = "ORCHESTRATOR_SURREALDB_REQUEST_TIMEOUT")]
    pub surrealdb_request_timeout: Option<u64>,
    /// A host (any port) or host:port that http steps may send requests
    /// to; repeatable, or comma-separated [default: none].
    #[arg(
        long = "http-allow",
        env = "ORCHESTRATOR_HTTP_ALLOW",
        value_delimiter = ','
    )]
    pub http_allow: Vec<String>,
    /// Seconds a connection may take to send a request's head, counted
    /// from when it opens or its previous response ended (so also how long
    /// an idle keep-alive connection is kept); then it is closed [default: 30].
    #[arg(long, env = "ORCHESTRATOR_HEADER_TIMEOUT")]
    pub header_timeout: Option<u64>,
    /// Connections served at once; one more is answered 503 and closed
    /// [default: 1024].
    #[arg(long, env = "ORCHESTRATOR_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Event streams and followed logs open at once per token (or for the
    /// one local user without auth); one more is answered 429 [default: 16].
    #[arg(long, env = "ORCHESTRATOR_MAX_STREAMS")]
    pub max_streams: Option<usize>,
    /// A reverse proxy (address or CIDR range) whose X-Forwarded-For names
    /// the client, for rate limits and the audit log; repeatable, or
    /// comma-separated [default: none: the header is ignored].
    #[arg(
        long = "trusted-proxy",
        env = "ORCHESTRATOR_TRUSTED_PROXY",
        value_delimiter = ','
    )]
    pub trusted_proxy: Vec<String>,
    /// A name the service is reached by (behind a proxy), accepted in the
    /// Host and Origin headers besides IP addresses and localhost;
    /// repeatable, or comma-separated [default: none].
    #[arg(
        long = "public-host",
        env = "ORCHESTRATOR_PUBLIC_HOST",
        value_delimiter = ','
    )]
    pub public_host: Vec<String>,
    // Limits on the work of one submission (docs/configuration.md,
    // docs/security.md): each counted before anything is built.
    /// Instances of one `for_each` step (the product of its list lengths) [default: 1000].
    #[arg(long, env = "ORCHESTRATOR_MAX_STEP_INSTANCES")]
    pub max_step_instances: Option<u64>,
    /// Tasks of one workflow (the instances of all its steps) [default: 10000].
    #[arg(long, env = "ORCHESTRATOR_MAX_WORKFLOW_TASKS")]
    pub max_workflow_tasks: Option<u64>,
    /// Steps of one template [default: 10000].
    #[arg(long, env = "ORCHESTRATOR_MAX_TEMPLATE_STEPS")]
    pub max_template_steps: Option<u64>,
    /// Items of one list input, `for_each` list or built-in name list [default: 1000].
    #[arg(long, env = "ORCHESTRATOR_MAX_LIST_ITEMS")]
    pub max_list_items: Option<u64>,
    /// Bytes of an inline template, as compact JSON [default: 1048576 (1 MiB)].
    #[arg(long, env = "ORCHESTRATOR_MAX_TEMPLATE_BYTES")]
    pub max_template_bytes: Option<u64>,
    /// Bytes of a submission's inputs (`vars`), as compact JSON [default: 65536 (64 KiB)].
    #[arg(long, env = "ORCHESTRATOR_MAX_INPUT_BYTES")]
    pub max_input_bytes: Option<u64>,
    /// How scripts are isolated from the service: `bubblewrap` (each in
    /// its own sandbox, without the service's files or capabilities; needs
    /// the `bubblewrap` package) or `none` (unsafe: a script can read the
    /// service's secret key, config and store) [default: bubblewrap].
    #[arg(
        long,
        env = "ORCHESTRATOR_SCRIPT_SANDBOX",
        value_name = "bubblewrap|none"
    )]
    pub script_sandbox: Option<String>,
    /// How many attempts, one after another, one script sandbox serves at
    /// most (1 to 1000; 1: each attempt its own). Making a sandbox costs
    /// more than a short script. Between two attempts its helper kills
    /// what is left and empties /tmp, /var/tmp, /dev/shm and the message
    /// queues; an attempt whose input holds a secret gets a sandbox alone;
    /// what one attempt can still leave for the next is in
    /// docs/security.md [default: 100].
    #[arg(long, env = "ORCHESTRATOR_SCRIPT_SANDBOX_ATTEMPTS")]
    pub script_sandbox_attempts: Option<u32>,
    /// Whose attempts one script sandbox serves in a row: `submitter`
    /// (attempts of the workflows one token submitted; every caller is
    /// one without auth; a schedule's runs are its token's), `workflow`
    /// (attempts of one workflow) or `any` (of any workflow, for hosts
    /// whose scripts all trust each other) [default: submitter].
    #[arg(
        long,
        env = "ORCHESTRATOR_SCRIPT_SANDBOX_REUSE",
        value_name = "submitter|workflow|any"
    )]
    pub script_sandbox_reuse: Option<String>,
    /// A path scripts may write in the sandbox besides their work dir,
    /// the state dir and their private /tmp; repeatable, or
    /// comma-separated [default: none].
    #[arg(
        long = "script-writable",
        env = "ORCHESTRATOR_SCRIPT_WRITABLE",
        value_delimiter = ','
    )]
    pub script_writable: Vec<PathBuf>,
    /// What test environments' nodes are: Linux namespaces of this host,
    /// or containers of a Docker Engine API (Docker, or Podman's
    /// compatible socket) [default: namespaces].
    #[arg(
        long,
        env = "ORCHESTRATOR_TESTENV_PROVIDER",
        value_name = "namespaces|docker"
    )]
    pub testenv_provider: Option<String>,
    /// The Docker Engine API's socket, for `--testenv-provider docker`
    /// [default: unix:///var/run/docker.sock].
    #[arg(long, env = "ORCHESTRATOR_DOCKER_HOST", value_name = "unix:///PATH")]
    pub docker_host: Option<String>,
    /// The image the docker provider's nodes run (built locally by
    /// scripts/testenv/build-image.sh)
    /// [default: localhost/orchestrator-testenv:latest].
    #[arg(long, env = "ORCHESTRATOR_DOCKER_IMAGE")]
    pub docker_image: Option<String>,
    /// File holding the secret key (64 hex digits) that seals secrets and
    /// signs sessions [default: $CREDENTIALS_DIRECTORY/secret-key under
    /// systemd, else <data-dir>/secret.key, made on first start].
    #[arg(long, env = "ORCHESTRATOR_SECRET_KEY_FILE")]
    pub secret_key_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TasksArgs {
    /// Only tasks in this status.
    #[arg(long)]
    pub status: Option<String>,
    /// Only tasks of this workflow.
    #[arg(long)]
    pub workflow: Option<String>,
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    #[arg(long, default_value_t = 0)]
    pub offset: usize,
    /// Only tasks older than this one: the next page, as the last page's
    /// footer names it (exact while tasks are added, unlike `--offset`).
    #[arg(long)]
    pub after: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TaskArgs {
    pub id: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    pub id: String,
    /// Keep printing new output until the task finishes.
    #[arg(long, short)]
    pub follow: bool,
}

#[derive(Debug, Subcommand)]
pub enum CheckpointCommand {
    /// Save `key` = `value` (JSON when it parses, else text); durable when
    /// the command returns.
    Set(CheckpointSetArgs),
    /// Print the checkpoint (one key, or all as JSON).
    Get(CheckpointGetArgs),
}

#[derive(Debug, Args)]
pub struct CheckpointSetArgs {
    pub key: String,
    pub value: String,
    #[arg(long, env = "ORCHESTRATOR_TASK_ID")]
    pub task: String,
}

#[derive(Debug, Args)]
pub struct CheckpointGetArgs {
    pub key: Option<String>,
    #[arg(long, env = "ORCHESTRATOR_TASK_ID")]
    pub task: String,
}

#[derive(Debug, Subcommand)]
pub enum TestCommand {
    /// Create, list, show, run, read the logs of and delete environments.
    #[command(subcommand)]
    Env(TestEnvCommand),
    /// The topology templates (templates/topologies/).
    #[command(subcommand)]
    Topology(TopologyCommand),
    /// Create an environment of a topology (or of one taskserv), run its
    /// checks, tear it down, and print a pass/fail table; exits non-zero
    /// unless every check passed.
    Quick(TestQuickArgs),
}

#[derive(Debug, Subcommand)]
pub enum TestEnvCommand {
    /// Create an environment (and with --wait, wait until it is ready).
    Create(TestEnvCreateArgs),
    /// List the environments.
    List(JsonFlag),
    /// Show one environment and its newest run's checks.
    Show(TestEnvIdArgs),
    /// Run its checks, wait for them, and print a pass/fail table; exits
    /// non-zero unless every check passed.
    Run(TestEnvIdArgs),
    /// Print every step's and check's output.
    Logs(TestEnvIdArgs),
    /// Tear it down (and wait until it is gone).
    Delete(TestEnvIdArgs),
}

#[derive(Debug, Subcommand)]
pub enum TopologyCommand {
    /// List the topology templates and the taskservs nodes can run.
    List(JsonFlag),
    /// Show one topology template.
    Show(TopologyShowArgs),
}

#[derive(Debug, Args)]
pub struct JsonFlag {
    /// Print the service's JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TestEnvIdArgs {
    pub id: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TopologyShowArgs {
    pub name: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TestEnvCreateArgs {
    /// single_taskserv, server or cluster.
    #[arg(long = "type", value_name = "TYPE")]
    pub env_type: String,
    /// single_taskserv: the taskserv.
    #[arg(long)]
    pub taskserv: Option<String>,
    /// server: the server's name.
    #[arg(long)]
    pub server: Option<String>,
    /// server: its taskservs, in order (comma-separated or repeated).
    #[arg(long, value_delimiter = ',')]
    pub taskservs: Vec<String>,
    /// cluster: a topology template's name.
    #[arg(long, conflicts_with = "topology_file")]
    pub topology: Option<String>,
    /// cluster: a topology of your own, as a YAML or JSON file.
    #[arg(long)]
    pub topology_file: Option<std::path::PathBuf>,
    /// A label for the environment.
    #[arg(long)]
    pub name: Option<String>,
    /// Install the taskservs but start them only at the first run.
    #[arg(long)]
    pub no_auto_start: bool,
    /// Tear it down once a run has finished.
    #[arg(long)]
    pub auto_cleanup: bool,
    /// Tear it down after this long: seconds, or like 90s, 15m, 2h.
    #[arg(long)]
    pub ttl: Option<String>,
    /// Wait until it is ready (or failed).
    #[arg(long)]
    pub wait: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TestQuickArgs {
    /// A topology template (kubernetes_3node, ...) or a taskserv (postgres, ...).
    pub subject: String,
    /// Leave the environment up after the run (its ttl still applies).
    #[arg(long)]
    pub keep: bool,
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use orchestrator_testenv::node_init::NodeSpec;

    use super::{Cli, Command};

    /// What the provider writes on the init's command line is what the
    /// binary reads back.
    #[test]
    fn a_node_spec_survives_the_command_line() {
        let spec = NodeSpec {
            node_dir: "/var/lib/orchestrator/testenv/ab12-cd34ef/n1".into(),
            hostname: "n1".into(),
            hidden: vec!["/var/lib/orchestrator".into(), "/etc/orchestrator".into()],
            exposed: vec![
                "/usr/share/orchestrator/scripts".into(),
                "/opt/nu/bin".into(),
            ],
        };
        let cli = Cli::try_parse_from(
            ["orchestrator".into(), "testenv-node-init".into()]
                .into_iter()
                .chain(spec.to_args()),
        )
        .unwrap();
        let Command::TestenvNodeInit(args) = cli.command else {
            panic!("not testenv-node-init: {:?}", cli.command);
        };
        assert_eq!(NodeSpec::from(args), spec);
    }
}
