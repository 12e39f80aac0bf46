#!/usr/bin/env bash
# The API contract test: schemathesis against a real `orchestrator serve`
# as it ships (the debug build, the filesystem backend in a temporary data
# dir, the project's own templates/ and scripts/, every limit at its
# default, a real admin token), every operation of /openapi.json, all
# checks, all phases (examples, coverage, fuzzing, stateful). `make contract-test` installs
# schemathesis and calls this; see docs/api.md ("The contract test").
#
#   run.sh <orchestrator binary> <schemathesis binary>
#
# ST_MAX_EXAMPLES (default 20) bounds the generated cases per operation
# and phase; the run takes a couple of minutes on 2 cores.
set -euo pipefail
bin="$1"
st="$2"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"

work="$(mktemp -d)"
server=""
# The test environments the run made are real (CI runs as root: network
# namespaces, node processes, cgroups) and outlive a stopped service by
# design; each is deleted through the API before the service stops, so
# that nothing of the run stays on the host.
delete_environments() {
  python3 - "$base" "$token" <<'PY' || true
import json, sys, time, urllib.error, urllib.request
base, token = sys.argv[1], sys.argv[2]
def call(method, path):
    request = urllib.request.Request(
        base + path, method=method, headers={"Authorization": "Bearer " + token})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as e:
        return {"error": e.code}
def alive():
    listed = call("GET", "/test/environments").get("environments", [])
    return [e["id"] for e in listed if e.get("status") != "deleted"]
deadline = time.monotonic() + 180
for env in alive():
    call("DELETE", f"/test/environments/{env}")
while alive() and time.monotonic() < deadline:
    time.sleep(0.5)
left = alive()
if left:
    print(f"contract: environments not deleted: {left}", file=sys.stderr)
PY
}
cleanup() {
  if [ -n "$server" ]; then
    delete_environments
    kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
token="contract-test-admin-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
base="http://127.0.0.1:$port"

# The limits stay at their defaults, the rate limits too: schemathesis
# honours the documented `429` and its `Retry-After` (`rate-limit =
# "auto"` in schemathesis.toml). The scripts are the shipped Nushell ones
# (`nu` on PATH, as `make` sets it). Only timings are shortened: a
# generated submission may ask for 100 attempts of a script that fails on
# its made-up inputs, and a followed log (`?follow=true`) lasts until its
# task ends, so retries minutes apart would keep such requests open until
# the client's timeout, and the run for an hour.
ORCHESTRATOR_BOOTSTRAP_TOKEN="$token" "$bin" serve \
  --port "$port" \
  --data-dir "$work/data" \
  --scripts-dir "$root/scripts" \
  --templates-dir "$root/templates" \
  --retry-base-ms 50 --retry-max-ms 200 --kill-grace 1 --shutdown-grace 5 \
  > "$work/serve.log" 2>&1 &
server=$!
for _ in $(seq 1 100); do
  if curl -sf "$base/health" >/dev/null 2>&1; then break; fi
  kill -0 "$server" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.1
done
curl -sf "$base/health" >/dev/null || { echo "the service did not answer on $base" >&2; cat "$work/serve.log" >&2; exit 1; }

# Excluded, and why (as little as possible):
# - GET /events: a stream that never ends by design (server-sent events);
#   a request to it only ends at the client's timeout.
# - DELETE /tokens/{id}: revoking the token the run authenticates with
#   (its id is in GET /tokens) would turn every later answer into 401.
#   POST /tokens is tested; revocation has its own tests (tests/it/auth.rs).
# - POST /admin/storage/migrations and POST /admin/storage/rollback: a
#   schema-valid request moves the service under test to a store at a path
#   the fuzzer invents (anywhere on the disk, and CI runs as root), after
#   which the run checks another store than it started on. The other
#   /admin/storage operations are tested; the moves have their own tests
#   (tests/it/storage_moves.rs).
# From the temporary directory: schemathesis keeps its example database
# and crash files under the working directory, which must not be the tree.
cd "$work"
# hooks.py: requests that would wait for their workflow are sent without.
PYTHONPATH="$here" SCHEMATHESIS_HOOKS=hooks \
"$st" --config-file "$here/schemathesis.toml" --no-color run "$base/openapi.json" \
  --header "Authorization: Bearer $token" \
  --checks all \
  --phases examples,coverage,fuzzing,stateful \
  --max-examples "${ST_MAX_EXAMPLES:-20}" \
  --exclude-operation-id events \
  --exclude-operation-id revoke_token \
  --exclude-operation-id start_migration \
  --exclude-operation-id rollback \
  --request-timeout 30 \
  "${@:3}"
