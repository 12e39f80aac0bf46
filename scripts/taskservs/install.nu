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

const NAME_RE = '^[A-Za-z0-9][A-Za-z0-9._-]*$'
const NAME_MAX = 128

# ---------------------------------------------------------------- helpers ----
# (Shared verbatim by servers/create.nu, taskservs/install.nu, cluster/create.nu.)

# Print an error on stderr and exit. Never call from inside an `each`/`where`
# closure: `exit` there is turned into an internal error (exit code 1).
def fail [code: int, msg: string] {
    print -e $"error: ($msg)"
    exit $code
}

# One-line description of a caught error, including the parser's inner message
# (e.g. line/column of a JSON or YAML syntax error) when there is one.
def err-detail [e: record]: nothing -> string {
    let inner = ($e.details?.inner?.0?.labels?.0?.text? | default "")
    let cause = if ($inner | is-not-empty) { $inner } else {
        # e.g. YAML: "  `->   x unclosed bracket '[' at char 3 line 1 column 4"
        $e.rendered? | default "" | lines | where {|l| $l =~ '^\s*`->' }
        | each {|l| $l | str replace -r '^\s*`->\s*x\s*' '' } | get -o 0 | default ""
    }
    if ($cause | is-empty) { $e.msg } else { $"($e.msg): ($cause)" }
}

# Parse the task input. `nu script.nu` does NOT bind stdin to `$in` inside
# `main` (only `nu --stdin script.nu` does), so fall back to /dev/stdin.
def read-input [piped: any]: nothing -> record {
    let raw = if $piped != null { $piped } else { open --raw /dev/stdin | collect }
    let text = if ($raw | describe) == "binary" { $raw | decode utf-8 } else { $raw | into string }
    if ($text | str trim | is-empty) {
        fail 2 "no task input on stdin (expected one JSON object)"
    }
    let input = try { $text | from json } catch {|e| fail 2 $"task input is not valid JSON: (err-detail $e)" }
    if not (($input | describe) starts-with "record") {
        fail 2 $"task input must be a JSON object, got ($input | describe)"
    }
    $input
}

# Validate a name used as a path component; returns an error string or null.
def name-error [field: string, value: any]: nothing -> any {
    if $value == null { return $"missing required field `($field)`" }
    let t = ($value | describe)
    if $t != "string" { return $"field `($field)` must be a string, got ($t)" }
    if ($value | is-empty) { return $"field `($field)` must not be empty" }
    if ($value | str length) > $NAME_MAX {
        return $"field `($field)` is longer than ($NAME_MAX) characters"
    }
    if not ($value =~ $NAME_RE) {
        return $"field `($field)` = ($value | to json) is invalid: must match ($NAME_RE)"
    }
    null
}

def require-name [input: record, field: string]: nothing -> string {
    let value = ($input | get -o $field)
    let err = (name-error $field $value)
    if $err != null { fail 2 $err }
    $value
}

# Check mode if the input says so OR the orchestrator environment says so.
def is-check-mode [input: record]: nothing -> bool {
    let flag = ($input | get -o check_mode)
    if $flag != null and ($flag | describe) != "bool" {
        fail 2 $"field `check_mode` must be a boolean, got ($flag | describe)"
    }
    let env_flag = ($env.ORCHESTRATOR_CHECK_MODE? | default "false" | str trim | str lowercase)
    ($flag == true) or ($env_flag in ["true" "1" "yes"])
}

def data-dir []: nothing -> string {
    let dir = ($env.ORCHESTRATOR_DATA_DIR? | default "")
    (if ($dir | is-empty) { "./data" } else { $dir }) | path expand
}

def task-id []: nothing -> string { $env.ORCHESTRATOR_TASK_ID? | default "" }

def now-utc []: nothing -> string {
    date now | date to-timezone UTC | format date "%Y-%m-%dT%H:%M:%S%.3fZ"
}

# Read a state file that must hold a JSON object.
def read-json [path: string, what: string]: nothing -> record {
    let data = try { open --raw $path | from json } catch {|e|
        fail 1 $"($what) state file ($path) is unreadable or corrupt: (err-detail $e)"
    }
    if not (($data | describe) starts-with "record") {
        fail 1 $"($what) state file ($path) is corrupt: expected a JSON object"
    }
    $data
}

# Atomic write: temp file in the destination directory, then rename over it.
def write-json-atomic [path: string, data: record] {
    let dir = ($path | path dirname)
    let tmp = ($dir | path join $".($path | path basename).tmp-($nu.pid)-(random chars --length 6)")
    try {
        mkdir $dir
        $"($data | to json --indent 2)\n" | save --raw $tmp
        mv --force $tmp $path
    } catch {|e|
        try { rm --force $tmp }
        fail 1 $"could not write ($path): (err-detail $e)"
    }
}

# Emit the result: compact JSON as the last stdout line (and a copy in
# $ORCHESTRATOR_RESULT_FILE when set — that file belongs to the orchestrator,
# so it is written in check mode too).
def emit [result: record] {
    let line = ($result | to json --raw)
    let result_file = ($env.ORCHESTRATOR_RESULT_FILE? | default "")
    if ($result_file | is-not-empty) {
        try { $"($line)\n" | save --force --raw $result_file } catch {|e|
            print -e $"warning: could not write result file ($result_file): (err-detail $e)"
        }
    }
    print $line
}

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
