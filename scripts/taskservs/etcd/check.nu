# taskservs/etcd/check.nu — in a test environment, etcd formed one cluster:
# on every target member, `etcdctl endpoint health --cluster` finds every
# member healthy and `member list` names them; a key put through the first
# target is read back through each target. See lib/testenv.nu for the
# input and docs/test-environments.md for writing a check.
const LIB = path self ../../lib/testenv.nu
use $LIB *

def --wrapped etcdctl [endpoint: string, ...args: string]: nothing -> record {
    client etcdctl --endpoints $endpoint --dial-timeout 3s --command-timeout 5s ...$args
}

def main [] {
    let input = (check-input etcd)
    let here = $input.here
    mut reached = []
    for target in $input.targets {
        let endpoint = $"http://($target):($input.port)"
        let health = (etcdctl $endpoint endpoint health --cluster -w json)
        if not $health.ok {
            no-answer etcd $target $endpoint $here ($health.err | default $health.out)
        }
        let endpoints = ($health.out | from json)
        let sick = ($endpoints | where health != true)
        if not ($sick | is-empty) {
            fail 1 $"etcd on ($target): members unhealthy from ($here): ($sick | get endpoint | str join ', ')"
        }
        let members = (etcdctl $endpoint member list -w simple)
        if not $members.ok {
            no-answer etcd $target $endpoint $here $members.err
        }
        # `id, started, name, peer urls, client urls, is learner`
        let names = ($members.out | lines | each {|l| $l | split row ', ' | get 2 } | sort)
        print -e $"ok: etcd on ($target) from ($here): ($endpoints | length) healthy members \(($names | str join ', ')\)"
        $reached = ($reached | append {target: $target, endpoint: $endpoint, members: $names, healthy: ($endpoints | get endpoint | sort)})
    }
    # Written through one member, read through each: one cluster.
    let first = $"http://($input.targets | first):($input.port)"
    let key = $"testenv/check/($here)/(random uuid)"
    let value = $"written from ($here) through ($input.targets | first)"
    let put = (etcdctl $first put $key $value)
    if not $put.ok { no-answer etcd ($input.targets | first) $first $here $"put: ($put.err)" }
    for target in $input.targets {
        let endpoint = $"http://($target):($input.port)"
        let got = (etcdctl $endpoint get $key --print-value-only)
        if not $got.ok or $got.out != $value {
            fail 1 $"etcd on ($target): the key put through ($input.targets | first) reads back as ($got.out | to json) \(($got.err)\), expected ($value | to json)"
        }
        print -e $"ok: etcd on ($target) reads ($key), put through ($input.targets | first)"
    }
    emit {taskserv: etcd, from: $here, reached: $reached, key: $key, put_through: ($input.targets | first), read_through: $input.targets}
}
