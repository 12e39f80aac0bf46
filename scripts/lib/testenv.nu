# lib/testenv.nu — what the taskservs' check.nu scripts share in test
# environments. A module, not a task script.
#
# A check runs inside a node of a test environment, with one JSON object on
# stdin: {"taskserv": string, "port": int, "targets": [node names]}. It asks
# the taskserv on each target node, by name (the node's private
# /etc/hosts), at its port, across the environment's bridge: a real
# taskserv by its own protocol (its client: etcdctl, psql, redis-cli), a
# simulated one by an HTTP GET whose answer is {"service": <taskserv>,
# "node": <target>}. It prints `ok: ...` lines on stderr for what passed,
# and its result, one JSON object, as its last stdout line; it exits 1
# naming the first target that fails.

const LIB = path self provisioning.nu
export use $LIB *

# The check's input, checked: {taskserv, port, targets, here}.
export def check-input [expected_service: string]: nothing -> record {
    let input = (read-input null)
    let taskserv = (require-name $input taskserv)
    if $taskserv != $expected_service {
        fail 2 $"this check is for ($expected_service), not ($taskserv)"
    }
    let port = ($input | get -o port)
    if ($port | describe) != "int" or $port < 1 or $port > 65535 {
        fail 2 $"field `port` must be a port number, got ($port | to json)"
    }
    let targets = ($input | get -o targets | default [])
    if ($targets | is-empty) { fail 2 "field `targets` names no node" }
    for target in $targets {
        let err = (name-error target $target)
        if $err != null { fail 2 $err }
    }
    {taskserv: $taskserv, port: $port, targets: $targets, here: (sys host | get hostname)}
}

# Runs a client program (never through a shell): {ok, out, err, code}.
export def --wrapped client [program: string, ...args: string]: nothing -> record {
    let result = (do { ^$program ...$args } | complete)
    {
        ok: ($result.exit_code == 0)
        out: ($result.stdout | str trim)
        err: ($result.stderr | str trim)
        code: $result.exit_code
    }
}

# Exits 1: `taskserv` on `target` does not answer as it should.
export def no-answer [taskserv: string, target: string, at: string, here: string, detail: string] {
    fail 1 $"($taskserv) on ($target) does not answer at ($at) from ($here): ($detail)"
}

# A simulated taskserv's check: an HTTP GET on every target; exits 1
# naming the first that fails.
export def check-service [expected_service: string] {
    let input = (check-input $expected_service)
    let taskserv = $input.taskserv
    let port = $input.port
    let targets = $input.targets
    let here = $input.here
    mut results = []
    for target in $targets {
        let url = $"http://($target):($port)/"
        let answer = try {
            http get --max-time 5sec $url
        } catch {|e|
            fail 1 $"($taskserv) on ($target) does not answer at ($url) from ($here): (err-detail $e)"
        }
        let service = ($answer | get -o service)
        let node = ($answer | get -o node)
        if $service != $taskserv or $node != $target {
            fail 1 $"($url) answered as ($service) on ($node), expected ($taskserv) on ($target)"
        }
        print -e $"ok: ($taskserv) on ($target) answers at ($url) from ($here)"
        $results = ($results | append {target: $target, url: $url})
    }
    emit {taskserv: $taskserv, from: $here, reached: $results}
}
