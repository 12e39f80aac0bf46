# cluster/create.nu — join existing servers into a cluster (the final step of a
# cluster workflow: servers/create -> taskservs/install -> cluster/create).
#
# Run by the orchestrator as `nu cluster/create.nu`, with the task input as one
# JSON object on stdin. Local simulation only: no network.
#
# Input (stdin, JSON object):
#   infra       string, required   infra name, ^[A-Za-z0-9][A-Za-z0-9._-]*$ (max 128 chars)
#   cluster     string, required   cluster name, same pattern
#   servers     [string], required non-empty, no duplicates; the FIRST one is the
#                                  control plane
#   taskservs   [string], optional may be empty; every one must be installed on
#                                  every server
#   settings    string, optional   accepted for symmetry with the other scripts; unused
#   check_mode  bool, optional     dry run (also enabled by ORCHESTRATOR_CHECK_MODE=true)
#   Unknown fields are ignored.
#
# Result (last stdout line, compact JSON):
#   {"cluster", "infra", "control_plane": {"server", "ip"},
#    "members": [{"server", "id", "ip"}, ...], "taskservs": [string],
#    "state_file", "changed": bool, "check_mode": bool, "warnings": [string],
#    "would_change": bool (check mode only)}
#   In check mode a member whose server does not exist yet has "id"/"ip" null.
#
# State layout ($ORCHESTRATOR_DATA_DIR, default ./data):
#   infra/<infra>/servers/<server>/server.json               (read: id, ip)
#   infra/<infra>/servers/<server>/taskservs/<taskserv>.json (read: must exist)
#   infra/<infra>/clusters/<cluster>.json                    (written)
#     {name, infra, control_plane, members, taskservs, created_at, created_by,
#      updated_at, updated_by, workflow_id}
#
# Behaviour: every listed server must exist and have every listed taskserv
# installed, else exit 1 naming each missing server/taskserv. Idempotent: an
# existing cluster with the same members (same order, ids, ips) and the same set
# of taskservs is not rewritten ("changed": false); otherwise it is updated,
# keeping created_at/created_by ("changed": true). Writes are atomic (temp file
# in the same directory, then rename).
# Check mode writes nothing, and missing servers/taskservs are reported in
# "warnings" instead of failing: in a check-mode workflow run the earlier steps
# do not create them.
#
# Exit codes: 0 ok, 1 failure (missing server/taskserv, corrupt state, I/O error),
#             2 invalid input.

# ---------------------------------------------------------------- helpers ----
# fail, err-detail, read-input, name-error, require-name, is-check-mode,
# data-dir, task-id, now-utc, read-json, write-json-atomic, emit, NAME_RE and
# NAME_MAX come from ../lib/provisioning.nu, the module shared with
# servers/create.nu and taskservs/install.nu. `path self` resolves it against
# this file's directory at parse time, so the service's cwd does not matter.
const LIB = path self ../lib/provisioning.nu
use $LIB *

# ----------------------------------------------------------- this script ----

# A list of names from the input; `exit` must not run inside the closures, so
# errors are collected first.
def name-list [input: record, field: string, required: bool]: nothing -> list<string> {
    let value = ($input | get -o $field)
    if $value == null {
        if $required { fail 2 $"missing required field `($field)`" }
        return []
    }
    let t = ($value | describe)
    if not (($t starts-with "list") or ($t starts-with "table")) {
        fail 2 $"field `($field)` must be a list of names, got ($t)"
    }
    if $required and ($value | is-empty) { fail 2 $"field `($field)` must not be empty" }
    let errors = ($value | enumerate | each {|it| name-error $"($field)[($it.index)]" $it.item } | compact)
    if ($errors | is-not-empty) { fail 2 ($errors | first) }
    let dups = ($value | uniq --repeated)
    if ($dups | is-not-empty) { fail 2 $"field `($field)` lists ($dups | each {|d| $d | to json --raw } | str join ", ") more than once" }
    $value
}

def main [] {
    let input = (read-input $in)
    let infra = (require-name $input infra)
    let cluster = (require-name $input cluster)
    let servers = (name-list $input servers true)
    let taskservs = (name-list $input taskservs false)
    let check = (is-check-mode $input)

    let infra_dir = (data-dir | path join infra $infra)
    let state_file = ($infra_dir | path join clusters $"($cluster).json")

    print -e $"cluster/create: infra=($infra) cluster=($cluster) servers=($servers | str join ',') taskservs=($taskservs | str join ',') check_mode=($check) attempt=($env.ORCHESTRATOR_ATTEMPT? | default 1)"

    # Prerequisites: each server exists and has each taskserv installed.
    mut problems = []
    mut members = []
    for server in $servers {
        let server_dir = ($infra_dir | path join servers $server)
        let server_file = ($server_dir | path join server.json)
        if not ($server_file | path exists) {
            $problems = ($problems | append $"server ($server) does not exist in infra ($infra); create it first")
            $members = ($members | append {server: $server, id: null, ip: null})
            continue
        }
        let state = (read-json $server_file "server")
        if ($state | get -o id) == null or ($state | get -o ip) == null {
            fail 1 $"server state file ($server_file) is corrupt \(no id/ip\)"
        }
        $members = ($members | append {server: $server, id: $state.id, ip: $state.ip})
        for ts in $taskservs {
            if not ($server_dir | path join taskservs $"($ts).json" | path exists) {
                $problems = ($problems | append $"taskserv ($ts) is not installed on server ($server) in infra ($infra)")
            }
        }
    }
    if ($problems | is-not-empty) and not $check {
        for p in $problems { print -e $"error: ($p)" }
        exit 1
    }
    let warnings = ($problems | each {|p| $"($p) \(check mode: assuming an earlier step provides it\)" })

    let members = $members
    let control_plane = {server: $members.0.server, ip: $members.0.ip}
    let existing = if ($state_file | path exists) { read-json $state_file "cluster" } else { null }
    # Same members (order matters: the first is the control plane) and same set
    # of taskservs? A malformed existing file simply counts as different.
    let same = if $existing == null { false } else {
        try {
            let old_members = ($existing.members | each {|m| {server: $m.server, id: $m.id, ip: $m.ip} })
            let old_taskservs = ($existing.taskservs | sort)
            ($old_members | to json --raw) == ($members | to json --raw) and ($old_taskservs | to json --raw) == ($taskservs | sort | to json --raw)
        } catch { false }
    }
    let needs_write = not $same

    if not $needs_write {
        print -e $"cluster ($cluster) already has these members and taskservs; nothing to do"
    } else if $check {
        let what = if $existing == null { "create" } else { "update" }
        print -e $"check mode: would ($what) cluster ($cluster) with control plane ($control_plane.server)"
    } else {
        let now = (now-utc)
        let record = {
            name: $cluster
            infra: $infra
            control_plane: $control_plane
            members: $members
            taskservs: $taskservs
            created_at: (if $existing == null { $now } else { $existing | get -o created_at | default $now })
            created_by: (if $existing == null { task-id } else { $existing | get -o created_by | default (task-id) })
            updated_at: $now
            updated_by: (task-id)
            workflow_id: ($env.ORCHESTRATOR_WORKFLOW_ID? | default "")
        }
        write-json-atomic $state_file $record
        let what = if $existing == null { "created" } else { "updated" }
        print -e $"($what) cluster ($cluster): control plane ($control_plane.server) \(($control_plane.ip)\), ($members | length) members"
    }

    for w in $warnings { print -e $"warning: ($w)" }

    let result = {
        cluster: $cluster
        infra: $infra
        control_plane: $control_plane
        members: $members
        taskservs: $taskservs
        state_file: $state_file
        changed: ($needs_write and not $check)
        check_mode: $check
        warnings: $warnings
    }
    emit (if $check { $result | insert would_change $needs_write } else { $result })
}
