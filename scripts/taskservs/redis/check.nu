# taskservs/redis/check.nu — in a test environment, Redis answers on every
# target from the node the check runs in: PING is answered PONG, and a key
# SET there is read back with GET on a connection of its own. See
# lib/testenv.nu for the input and docs/test-environments.md for writing a
# check.
const LIB = path self ../../lib/testenv.nu
use $LIB *

def main [] {
    let input = (check-input redis)
    let here = $input.here
    let port = ($input.port | into string)
    mut reached = []
    for target in $input.targets {
        let at = $"($target):($port)"
        let ping = (client redis-cli -h $target -p $port PING)
        if not $ping.ok or $ping.out != "PONG" {
            no-answer redis $target $at $here ([$ping.out $ping.err] | str join ' ' | str trim)
        }
        let key = $"testenv:check:($here):(random uuid)"
        let value = $"set from ($here)"
        let set = (client redis-cli -h $target -p $port SET $key $value EX 600)
        if not $set.ok or $set.out != "OK" {
            fail 1 $"redis on ($target): SET from ($here) answered ($set.out | to json) ($set.err)"
        }
        let got = (client redis-cli -h $target -p $port GET $key)
        if not $got.ok or $got.out != $value {
            fail 1 $"redis on ($target): GET of the key SET from ($here) answered ($got.out | to json), expected ($value | to json)"
        }
        print -e $"ok: redis on ($target) answers PONG at ($at) from ($here), and GET returns what SET stored"
        $reached = ($reached | append {target: $target, key: $key})
    }
    emit {taskserv: redis, from: $here, reached: $reached}
}
