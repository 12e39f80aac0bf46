# taskservs/postgres/check.nu — in a test environment, PostgreSQL answers
# SQL on every target (`psql -h <target> -c 'select ...'`), from the node
# the check runs in. See lib/testenv.nu for the input and
# docs/test-environments.md for writing a check.
const LIB = path self ../../lib/testenv.nu
use $LIB *

def main [] {
    let input = (check-input postgres)
    let here = $input.here
    mut reached = []
    for target in $input.targets {
        let at = $"($target):($input.port)"
        let answer = (with-env {PGCONNECT_TIMEOUT: "5"} {
            client psql -h $target -p ($input.port | into string) -U postgres -d postgres -X -A -t -c "select 1, current_setting('server_version'), inet_server_addr()"
        })
        if not $answer.ok {
            no-answer postgres $target $at $here $answer.err
        }
        let row = ($answer.out | split row '|')
        if ($row | first) != "1" {
            fail 1 $"postgres on ($target) answered ($answer.out | to json) to `select 1`, expected 1"
        }
        print -e $"ok: postgres on ($target) answers SQL at ($at) from ($here): server ($row | get 1) at ($row | get 2)"
        $reached = ($reached | append {target: $target, server_version: ($row | get 1), server_address: ($row | get 2)})
    }
    emit {taskserv: postgres, from: $here, reached: $reached}
}
