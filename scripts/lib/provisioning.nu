# lib/provisioning.nu — helpers shared by the provisioning scripts
# (servers/create.nu, taskservs/install.nu, cluster/create.nu).
#
# A module, not a task script: running it directly does nothing. Each script
# imports it, resolving the path relative to the script's own file (not the cwd,
# which is the service's), at parse time:
#
#   const LIB = path self ../lib/provisioning.nu
#   use $LIB *
#
# Everything below is exported: the helpers and the name constants.

# Names used as path components (infra, server, taskserv, cluster, ...).
export const NAME_RE = '^[A-Za-z0-9][A-Za-z0-9._-]*$'
export const NAME_MAX = 128

# Print an error on stderr and exit. Never call from inside an `each`/`where`
# closure: `exit` there is turned into an internal error (exit code 1).
export def fail [code: int, msg: string] {
    print -e $"error: ($msg)"
    exit $code
}

# One-line description of a caught error, including the parser's inner message
# (e.g. line/column of a JSON or YAML syntax error) when there is one.
export def err-detail [e: record]: nothing -> string {
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
export def read-input [piped: any]: nothing -> record {
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
export def name-error [field: string, value: any]: nothing -> any {
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

export def require-name [input: record, field: string]: nothing -> string {
    let value = ($input | get -o $field)
    let err = (name-error $field $value)
    if $err != null { fail 2 $err }
    $value
}

# Check mode if the input says so OR the orchestrator environment says so.
export def is-check-mode [input: record]: nothing -> bool {
    let flag = ($input | get -o check_mode)
    if $flag != null and ($flag | describe) != "bool" {
        fail 2 $"field `check_mode` must be a boolean, got ($flag | describe)"
    }
    let env_flag = ($env.ORCHESTRATOR_CHECK_MODE? | default "false" | str trim | str lowercase)
    ($flag == true) or ($env_flag in ["true" "1" "yes"])
}

export def data-dir []: nothing -> string {
    let dir = ($env.ORCHESTRATOR_DATA_DIR? | default "")
    (if ($dir | is-empty) { "./data" } else { $dir }) | path expand
}

export def task-id []: nothing -> string { $env.ORCHESTRATOR_TASK_ID? | default "" }

export def now-utc []: nothing -> string {
    date now | date to-timezone UTC | format date "%Y-%m-%dT%H:%M:%S%.3fZ"
}

# Read a state file that must hold a JSON object.
export def read-json [path: string, what: string]: nothing -> record {
    let data = try { open --raw $path | from json } catch {|e|
        fail 1 $"($what) state file ($path) is unreadable or corrupt: (err-detail $e)"
    }
    if not (($data | describe) starts-with "record") {
        fail 1 $"($what) state file ($path) is corrupt: expected a JSON object"
    }
    $data
}

# Atomic write: temp file in the destination directory, then rename over it.
export def write-json-atomic [path: string, data: record] {
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
export def emit [result: record] {
    let line = ($result | to json --raw)
    let result_file = ($env.ORCHESTRATOR_RESULT_FILE? | default "")
    if ($result_file | is-not-empty) {
        try { $"($line)\n" | save --force --raw $result_file } catch {|e|
            print -e $"warning: could not write result file ($result_file): (err-detail $e)"
        }
    }
    print $line
}
