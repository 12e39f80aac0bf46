# lib/testenv.nu — the check shared by the taskservs' check.nu scripts in
# test environments. A module, not a task script.
#
# A check runs inside a node of a test environment, with one JSON object on
# stdin: {"taskserv": string, "port": int, "targets": [node names]}. It asks
# the taskserv's service on each target node, by name (the node's private
# /etc/hosts), at its port, across the environment's bridge, and expects the
# answer {"service": <taskserv>, "node": <target>}.

const LIB = path self provisioning.nu
use $LIB *

# Checks `taskserv` on every target; exits 1 naming the first that fails.
export def check-service [expected_service: string] {
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
    let here = (sys host | get hostname)
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
