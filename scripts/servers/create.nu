# servers/create.nu — create (simulate) a server in an infra.
#
# Run by the orchestrator as `nu servers/create.nu`, with the task input as one
# JSON object on stdin. Local simulation only: no network, no cloud API.
#
# Input (stdin, JSON object):
#   infra       string, required   infra name, ^[A-Za-z0-9][A-Za-z0-9._-]*$ (max 128 chars)
#   server      string, required   server name, same pattern
#   settings    string, optional   path (relative to cwd) to a settings file, YAML
#                                  (.yaml/.yml, also the fallback) or JSON (.json).
#                                  Missing file => "settings_loaded": false + warning.
#                                  Keys used: plan, zone, image (top level), overridden
#                                  by servers.<server>.{plan,zone,image} (record keyed
#                                  by name, or a list of records with `name`).
#   plan, zone, image  string, optional   explicit overrides of the settings values
#   check_mode  bool, optional     dry run (also enabled by ORCHESTRATOR_CHECK_MODE=true)
#   Unknown fields are ignored.
#
# Result (last stdout line, compact JSON):
#   {"server", "id", "ip", "infra", "plan", "zone", "image", "state_dir",
#    "settings_loaded": bool, "changed": bool, "check_mode": bool,
#    "warnings": [string], "would_change": bool (check mode only)}
#
# State layout ($ORCHESTRATOR_DATA_DIR, default ./data):
#   infra/<infra>/servers/<server>/server.json
#     {name, infra, id, ip, plan, zone, image, status, created_at, created_by, workflow_id}
#
# Identity and addressing (deterministic):
#   h  = sha256("<infra>/<server>") as hex
#   id = "srv-" + h[0..12]
#   ip = 10.A.B.C in 10.64.0.0/10 (10.64.0.0 - 10.127.255.255):
#        A = 64 + (h byte 0 mod 64), B = h byte 1, C = 1 + (h byte 2 mod 254)
#        (C is never 0 or 255). If that address is already used by another server
#        of the same infra, the next candidate hashes "<infra>/<server>#1", "#2", ...
#        Allocation is not locked: concurrent creates in one infra could in theory
#        collide (probability ~n^2/2^23).
#
# Behaviour: idempotent (an existing server.json is never rewritten; its stored
# state is returned with "changed": false). Writes are atomic (temp file in the
# same directory, then rename). Check mode writes nothing.
#
# Exit codes: 0 ok, 1 failure (corrupt state, I/O error), 2 invalid input.

# ---------------------------------------------------------------- helpers ----
# fail, err-detail, read-input, name-error, require-name, is-check-mode,
# data-dir, task-id, now-utc, read-json, write-json-atomic, emit, NAME_RE and
# NAME_MAX come from ../lib/provisioning.nu, the module shared with
# taskservs/install.nu and cluster/create.nu. `path self` resolves it against
# this file's directory at parse time, so the service's cwd does not matter.
const LIB = path self ../lib/provisioning.nu
use $LIB *

# ----------------------------------------------------------- this script ----

const DEFAULTS = {plan: "small", zone: "local-1", image: "debian-12"}

# Load the settings file.
# Returns {loaded: bool, layers: [{label, prefix, values}], warning: string|null};
# later layers win.
def load-settings [path: any, server: string]: nothing -> record {
    if $path == null { return {loaded: false, layers: [], warning: null} }
    if ($path | describe) != "string" or ($path | is-empty) {
        fail 2 "field `settings` must be a non-empty string (path to a YAML or JSON file)"
    }
    if not ($path | path exists) {
        return {loaded: false, layers: [], warning: $"settings file ($path) not found; using defaults"}
    }
    if ($path | path type) != "file" { fail 2 $"field `settings`: ($path) is not a regular file" }
    let ext = ($path | path parse | get extension | str lowercase)
    let doc = try {
        let text = (open --raw $path | decode utf-8)
        if $ext == "json" { $text | from json } else { $text | from yaml }
    } catch {|e| fail 2 $"field `settings`: cannot parse ($path): (err-detail $e)" }
    if $doc == null { return {loaded: true, layers: [], warning: null} }
    if not (($doc | describe) starts-with "record") {
        fail 2 $"field `settings`: ($path) must contain a mapping at top level"
    }
    let servers = ($doc | get -o servers)
    let servers_type = ($servers | describe)
    let override = if ($servers_type starts-with "record") {
        $servers | get -o $server
    } else if ($servers_type starts-with "list") or ($servers_type starts-with "table") {
        $servers | where {|s| (($s | describe) starts-with "record") and ($s | get -o name) == $server } | get -o 0
    } else {
        null
    }
    if $override != null and not (($override | describe) starts-with "record") {
        fail 2 $"field `settings`: servers.($server) in ($path) must be a mapping"
    }
    {
        loaded: true
        layers: [
            {label: $"settings ($path): key", prefix: "", values: $doc}
            {label: $"settings ($path): key", prefix: $"servers.($server).", values: ($override | default {})}
        ]
        warning: null
    }
}

# Resolve plan/zone/image: defaults < settings < settings servers.<name> < input.
# Returns {config: record, explicit: [key]} (explicit = not from DEFAULTS).
def resolve-config [input: record, layers: list]: nothing -> record {
    mut config = $DEFAULTS
    mut explicit = []
    for key in [plan zone image] {
        for layer in ($layers | append {label: "field", prefix: "", values: $input}) {
            let value = ($layer.values | get -o $key)
            if $value == null { continue }
            if ($value | describe) != "string" or ($value | is-empty) {
                fail 2 $"($layer.label) `($layer.prefix)($key)` must be a non-empty string, got ($value | to json --raw)"
            }
            $config = ($config | upsert $key $value)
            $explicit = ($explicit | append $key)
        }
    }
    {config: $config, explicit: ($explicit | uniq)}
}

# Note: bytes are read from the binary digest, not with `into int --radix 16`:
# in Nushell 0.115 that treats a leading "0b"/"0x"/"0o" as a radix prefix, so
# e.g. "0b" | into int --radix 16 fails.
def ip-for [seed: string]: nothing -> string {
    let digest = ($seed | hash sha256 --binary)
    let b = (0..2 | each {|i| $digest | bytes at $i..$i | into int })
    $"10.(64 + ($b.0 mod 64)).($b.1).(1 + ($b.2 mod 254))"
}

# IPs already allocated to other servers of this infra.
def used-ips [servers_dir: string]: nothing -> list<string> {
    if not ($servers_dir | path exists) { return [] }
    ls $servers_dir
    | where type == dir
    | each {|d| $d.name | path join server.json }
    | where {|f| $f | path exists }
    | each {|f| try { open --raw $f | from json | get -o ip } catch { null } }
    | compact
}

def allocate-ip [infra: string, server: string, servers_dir: string]: nothing -> string {
    let used = (used-ips $servers_dir)
    for k in 0..63 {
        let seed = if $k == 0 { $"($infra)/($server)" } else { $"($infra)/($server)#($k)" }
        let ip = (ip-for $seed)
        if $ip not-in $used { return $ip }
    }
    fail 1 $"could not allocate an IP for ($server) in infra ($infra)"
}

def main [] {
    let input = (read-input $in)
    let infra = (require-name $input infra)
    let server = (require-name $input server)
    let check = (is-check-mode $input)
    let settings = (load-settings ($input | get -o settings) $server)
    let desired = (resolve-config $input $settings.layers)

    let server_dir = (data-dir | path join infra $infra servers $server)
    let server_file = ($server_dir | path join server.json)
    mut warnings = if $settings.warning == null { [] } else { [$settings.warning] }

    print -e $"servers/create: infra=($infra) server=($server) check_mode=($check) attempt=($env.ORCHESTRATOR_ATTEMPT? | default 1)"

    let exists = ($server_file | path exists)
    let state = if $exists {
        let s = (read-json $server_file "server")
        if ($s | get -o ip) == null or ($s | get -o id) == null {
            fail 1 $"server state file ($server_file) is corrupt \(no id/ip\)"
        }
        print -e $"server ($server) already exists \(id ($s.id), ip ($s.ip)\); not changing it"
        $s
    } else {
        let h = ($"($infra)/($server)" | hash sha256)
        {
            name: $server
            infra: $infra
            id: $"srv-($h | str substring 0..11)"
            ip: (allocate-ip $infra $server ($server_dir | path dirname))
            ...$desired.config
            status: "running"
            created_at: (now-utc)
            created_by: (task-id)
            workflow_id: ($env.ORCHESTRATOR_WORKFLOW_ID? | default "")
        }
    }

    if $exists {
        for key in $desired.explicit {
            let have = ($state | get -o $key)
            let want = ($desired.config | get $key)
            if $have != $want {
                $warnings = ($warnings | append $"server ($server) exists with ($key)=($have); requested ($want) is not applied")
            }
        }
    } else if $check {
        print -e $"check mode: would create server ($server) \(id ($state.id), ip ($state.ip)\) in ($server_file)"
    } else {
        write-json-atomic $server_file $state
        print -e $"created server ($server) \(id ($state.id), ip ($state.ip)\)"
    }

    for w in $warnings { print -e $"warning: ($w)" }

    let result = {
        server: $server
        id: $state.id
        ip: $state.ip
        infra: $infra
        plan: ($state | get -o plan)
        zone: ($state | get -o zone)
        image: ($state | get -o image)
        state_dir: $server_dir
        settings_loaded: $settings.loaded
        changed: ((not $exists) and (not $check))
        check_mode: $check
        warnings: $warnings
    }
    emit (if $check { $result | insert would_change (not $exists) } else { $result })
}
