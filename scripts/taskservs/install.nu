# taskservs/install.nu — install (simulate) a task service on an existing server.
#
# Run by the orchestrator as `nu taskservs/install.nu`, with the task input as
# one JSON object on stdin. Local simulation only: no network, no package manager.
#
# Input (stdin, JSON object):
#   infra       string, required   infra name, ^[A-Za-z0-9][A-Za-z0-9._-]*$ (max 128 chars)
#   server      string, required   target server (must exist: servers/create.nu ran)
#   taskserv    string, required   task service name, e.g. "containerd"; same pattern
#   version     string, optional   ^[A-Za-z0-9][A-Za-z0-9._+~-]*$; default: keep the
#                                  installed version, or "latest" on first install
#   settings    string, optional   accepted for symmetry with the other scripts; unused
#   check_mode  bool, optional     dry run (also enabled by ORCHESTRATOR_CHECK_MODE=true)
#   Unknown fields are ignored.
#
# Result (last stdout line, compact JSON):
#   {"infra", "server", "taskserv", "version", "state_file", "changed": bool,
#    "check_mode": bool, "warnings": [string], "would_change": bool (check mode only)}
#
# State layout ($ORCHESTRATOR_DATA_DIR, default ./data):
#   infra/<infra>/servers/<server>/server.json              (read: must exist)
#   infra/<infra>/servers/<server>/taskservs/<taskserv>.json (written)
#     {name, server, infra, version, installed_at, installed_by, workflow_id,
#      previous_version (only after a version change)}
#
# Behaviour: idempotent. Already installed and no version requested, or the same
# version requested => nothing written, "changed": false. A different explicit
# version => record rewritten (upgrade/downgrade), "changed": true. Writes are
# atomic (temp file in the same directory, then rename).
# Check mode writes nothing; a missing server is reported in "warnings" instead of
# failing, because in a check-mode workflow run the servers/create step before
# this one does not create it.
#
# Exit codes: 0 ok, 1 failure (server missing, corrupt state, I/O error),
#             2 invalid input.

# ---------------------------------------------------------------- helpers ----
# fail, err-detail, read-input, name-error, require-name, is-check-mode,
# data-dir, task-id, now-utc, read-json, write-json-atomic, emit, NAME_RE and
# NAME_MAX come from ../lib/provisioning.nu, the module shared with
# servers/create.nu and cluster/create.nu. `path self` resolves it against
# this file's directory at parse time, so the service's cwd does not matter.
const LIB = path self ../lib/provisioning.nu
use $LIB *

# ----------------------------------------------------------- this script ----

const VERSION_RE = '^[A-Za-z0-9][A-Za-z0-9._+~-]*$'

def requested-version [input: record]: nothing -> any {
    let v = ($input | get -o version)
    if $v == null { return null }
    if ($v | describe) != "string" {
        fail 2 $"field `version` must be a string, got ($v | describe) \(quote numeric versions\)"
    }
    if ($v | str length) > $NAME_MAX or not ($v =~ $VERSION_RE) {
        fail 2 $"field `version` = ($v | to json) is invalid: must match ($VERSION_RE)"
    }
    $v
}

def main [] {
    let input = (read-input $in)
    let infra = (require-name $input infra)
    let server = (require-name $input server)
    let taskserv = (require-name $input taskserv)
    let requested = (requested-version $input)
    let check = (is-check-mode $input)

    let server_dir = (data-dir | path join infra $infra servers $server)
    let state_file = ($server_dir | path join taskservs $"($taskserv).json")
    mut warnings = []

    print -e $"taskservs/install: infra=($infra) server=($server) taskserv=($taskserv) version=($requested | default '(default)') check_mode=($check) attempt=($env.ORCHESTRATOR_ATTEMPT? | default 1)"

    if not ($server_dir | path join server.json | path exists) {
        let msg = $"server ($server) does not exist in infra ($infra); create it first"
        if not $check { fail 1 $msg }
        $warnings = ($warnings | append $"($msg) \(check mode: assuming an earlier step creates it\)")
    }

    let existing = if ($state_file | path exists) { read-json $state_file "taskserv" } else { null }
    let installed = if $existing == null { null } else { $existing | get -o version }
    let version = ($requested | default $installed | default "latest")
    let needs_write = ($existing == null) or ($version != $installed)

    if not $needs_write {
        print -e $"taskserv ($taskserv) ($version) already installed on ($server); nothing to do"
    } else if $check {
        if $existing == null {
            print -e $"check mode: would install ($taskserv) ($version) on ($server)"
        } else {
            print -e $"check mode: would change ($taskserv) on ($server): ($installed) -> ($version)"
        }
    } else {
        let record = {
            name: $taskserv
            server: $server
            infra: $infra
            version: $version
            installed_at: (now-utc)
            installed_by: (task-id)
            workflow_id: ($env.ORCHESTRATOR_WORKFLOW_ID? | default "")
        }
        write-json-atomic $state_file (if $existing == null { $record } else { $record | insert previous_version $installed })
        if $existing == null {
            print -e $"installed ($taskserv) ($version) on ($server)"
        } else {
            print -e $"changed ($taskserv) on ($server): ($installed) -> ($version)"
        }
    }

    for w in $warnings { print -e $"warning: ($w)" }

    let result = {
        infra: $infra
        server: $server
        taskserv: $taskserv
        version: $version
        state_file: $state_file
        changed: ($needs_write and not $check)
        check_mode: $check
        warnings: $warnings
    }
    emit (if $check { $result | insert would_change $needs_write } else { $result })
}
