#!/usr/bin/env bash
# `make deb-test`: checks the Debian package that `make deb` built.
#
#   1. its control data and file list (dpkg-deb -I / -c);
#   2. lintian, failing on errors, when lintian is installed;
#   3. a real install into a throwaway Debian root made by debootstrap
#      (cached in ~/.cache/orchestrator-deb-test): the unit checked with
#      systemd-analyze verify, the system user, the files and their owners,
#      `orchestrator doctor` and a start of the service as that user, a
#      reinstall, a remove, a purge that keeps the data, a reinstall that
#      adopts it, and a purge asked to delete it.
#
# Step 3 needs root (chroot) and, the first time, the Debian mirror; it is
# skipped with a message when either is missing.
#
#   check-deb.sh <package.deb>
set -euo pipefail

deb=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
fail() { echo "deb-test: FAIL: $*" >&2; exit 1; }
ok() { echo "deb-test: ok: $*"; }

# 1. Control data and contents.
[ "$(dpkg-deb -f "$deb" Package)" = orchestrator ] || fail "package name"
dpkg-deb -f "$deb" Depends | grep -q adduser || fail "Depends lacks adduser"
# Scripts run in a bubblewrap sandbox by default (docs/security.md).
dpkg-deb -f "$deb" Depends | grep -q bubblewrap || fail "Depends lacks bubblewrap"
# Read whole before grep looks: `grep -q` stops reading early, which
# pipefail would count as a failure of the writer.
conffiles=$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles)
grep -qx /etc/orchestrator/config.toml <<<"$conffiles" \
    || fail "/etc/orchestrator/config.toml is not a conffile"
control=$(dpkg-deb --ctrl-tarfile "$deb" | tar -t)
for script in postinst postrm prerm; do
    grep -qx "./$script" <<<"$control" || fail "no $script"
done
ok "control: $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version), Depends: $(dpkg-deb -f "$deb" Depends)"
contents=$(dpkg-deb -c "$deb" | awk '{print $6}')
expect() {
    grep -qx "$1" <<<"$contents" || fail "the package lacks $1"
}
expect ./usr/bin/orchestrator
expect ./usr/libexec/orchestrator/orchestrator-sandbox-exec
expect ./etc/orchestrator/config.toml
expect ./usr/lib/systemd/system/orchestrator.service
expect ./usr/share/orchestrator/systemd/test-environments.conf
expect ./usr/share/doc/orchestrator/deployment.md
expect ./usr/share/doc/orchestrator/copyright
# Every shipped script and template, and no state: /var/lib/orchestrator
# is made by postinst, so that removing the package never takes it along.
(cd "$repo" && find scripts templates -type f) | while read -r file; do
    expect "./usr/share/orchestrator/$file"
done
! grep -q '^\./var/' <<<"$contents" || fail "the package ships files under /var"
ok "contents: $(grep -vc '/$' <<<"$contents") files"

# 2. lintian.
if command -v lintian >/dev/null; then
    status=0
    report=$(lintian --fail-on error --suppress-tags initial-upload-closes-no-bugs "$deb" 2>&1) \
        || status=$?
    grep -v 'running with root privileges' <<<"$report" || true
    [ "$status" = 0 ] || fail "lintian reports errors (above)"
    ok "lintian: no errors"
else
    echo "deb-test: SKIP lintian: not installed (apt-get install lintian)"
fi

# 3. A throwaway Debian root.
if [ "$(id -u)" != 0 ] || ! command -v debootstrap >/dev/null; then
    echo "deb-test: SKIP the install test: it needs root and debootstrap (apt-get install debootstrap)"
    exit 0
fi
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
cache=${ORCHESTRATOR_DEB_TEST_CACHE:-$HOME/.cache/orchestrator-deb-test}
# Named after what it holds beyond minbase: a root made before bubblewrap
# became a dependency would fail the install.
base="$cache/$suite-minbase-adduser-systemd-bubblewrap.tar.gz"
root=$(mktemp -d /tmp/orchestrator-deb-root.XXXXXX)
serve_pid=
cleanup() {
    [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null || true
    rm -rf "$root"
}
trap cleanup EXIT
if [ ! -f "$base" ]; then
    mkdir -p "$cache"
    echo "deb-test: making a $suite root with debootstrap (cached in $base)"
    # systemd for systemd-analyze; adduser for the maintainer scripts;
    # bubblewrap, a dependency.
    debootstrap --variant=minbase --include=adduser,systemd,bubblewrap "$suite" "$root" \
        http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 \
        || { tail "$cache/debootstrap.log" >&2; fail "debootstrap $suite"; }
    tar -C "$root" -czf "$base.tmp" . && mv "$base.tmp" "$base"
else
    tar -C "$root" -xzf "$base"
fi
# The root of a system (mktemp made it 0700, and the archive keeps that):
# the service's user must be able to enter it.
chmod 755 "$root"
in_root() { chroot "$root" "$@"; }
cp "$deb" "$root/tmp/orchestrator.deb"

in_root dpkg -i /tmp/orchestrator.deb >/dev/null
verify() {
    local out
    out=$(in_root systemd-analyze verify /usr/lib/systemd/system/orchestrator.service 2>&1) \
        || { echo "$out" >&2; fail "systemd-analyze verify $*"; }
    [ -z "$out" ] || { echo "$out" >&2; fail "systemd-analyze verify $* has warnings"; }
}
verify "of the unit"
# Once more with the test-environments drop-in in place, as documented.
dropins="$root/etc/systemd/system/orchestrator.service.d"
mkdir -p "$dropins"
cp "$root/usr/share/orchestrator/systemd/test-environments.conf" "$dropins/"
verify "with the test-environments drop-in"
rm -r "$dropins"
ok "systemd-analyze verify: the unit, alone and with the test-environments drop-in"
# The calls the sandbox's helper makes beyond @system-service: no script
# could start without them (they cannot run in this chroot to show it).
filter=$(grep '^SystemCallFilter=' "$root/usr/lib/systemd/system/orchestrator.service")
for call in seccomp unshare @mount; do
    grep -qw -- "$call" <<<"$filter" || fail "the unit's SystemCallFilter= lacks $call: $filter"
done
ok "the unit allows what the script sandbox calls: seccomp, unshare, @mount"
exposure=$(in_root systemd-analyze security --offline=true \
    /usr/lib/systemd/system/orchestrator.service 2>/dev/null | tail -1 || true)
[ -z "$exposure" ] || ok "systemd-analyze security: ${exposure#→ }"

user=$(in_root getent passwd orchestrator) || fail "no orchestrator user after the install"
IFS=: read -r _ _ uid _ _ home shell <<<"$user"
[ "$uid" -lt 1000 ] || fail "orchestrator is not a system user (uid $uid)"
[ "$home" = /var/lib/orchestrator ] && [ "$shell" = /usr/sbin/nologin ] || fail "user: $user"
owner() { in_root stat -c '%U:%G %a' "$1"; }
[ "$(owner /var/lib/orchestrator)" = "orchestrator:orchestrator 750" ] \
    || fail "/var/lib/orchestrator is $(owner /var/lib/orchestrator)"
[ "$(owner /etc/orchestrator/config.toml)" = "root:orchestrator 640" ] \
    || fail "config.toml is $(owner /etc/orchestrator/config.toml)"
[ -L "$root/etc/systemd/system/multi-user.target.wants/orchestrator.service" ] \
    || fail "the unit is not enabled"
[ "$(owner /etc/orchestrator/secret-key)" = "root:root 600" ] \
    || fail "/etc/orchestrator/secret-key is $(owner /etc/orchestrator/secret-key)"
grep -Eqx '[0-9a-f]{64}' "$root/etc/orchestrator/secret-key" || fail "the secret key is not 64 hex digits"
ok "install: user $user, state dir and config owned as they should be, unit enabled"

as_service() { chroot --userspec=orchestrator:orchestrator "$root" "$@"; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
doctor=$(as_service /usr/bin/orchestrator doctor --config /etc/orchestrator/config.toml \
    --port "$port" 2>&1 || true)
grep -q '^ok    data dir .*/var/lib/orchestrator' <<<"$doctor" \
    || { echo "$doctor" >&2; fail "doctor: the data dir"; }
grep -q '^ok    scripts dir' <<<"$doctor" || { echo "$doctor" >&2; fail "doctor: the scripts dir"; }
# Nushell is not a Debian package: the root has none, and doctor says so.
grep -q '^FAIL  interpreter nu' <<<"$doctor" || { echo "$doctor" >&2; fail "doctor: nu"; }
# A chroot can make no user namespace (the kernel refuses it), so the
# sandbox cannot run here; doctor must say so rather than pass.
grep -q '^FAIL  script sandbox' <<<"$doctor" || { echo "$doctor" >&2; fail "doctor: the script sandbox"; }
ok "doctor as the service's user: data dir and scripts ok, nu reported missing, sandbox checked"

log="$root/tmp/serve.log"
# The key as systemd's LoadCredential= hands it over: a copy only the
# service's user can read, in $CREDENTIALS_DIRECTORY.
credentials=/run/orchestrator-test-credentials
mkdir -p "$root$credentials"
install -m 400 "$root/etc/orchestrator/secret-key" "$root$credentials/secret-key"
in_root chown -R orchestrator:orchestrator "$credentials"
# chroot itself, not a function, in the background: $! must be the
# process that becomes the service, for the SIGTERM below. Without the
# script sandbox (none can run in a chroot: see doctor above).
CREDENTIALS_DIRECTORY=$credentials chroot --userspec=orchestrator:orchestrator "$root" \
    /usr/bin/orchestrator serve --config /etc/orchestrator/config.toml --port "$port" \
    --script-sandbox none >"$log" 2>&1 &
serve_pid=$!
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 0.1
done
health=$(curl -sf "http://127.0.0.1:$port/health") || { cat "$log" >&2; fail "the service did not start"; }
kill -TERM "$serve_pid"
wait "$serve_pid" || fail "the service did not stop cleanly"
serve_pid=
grep -q 'bootstrap admin token' "$log" || fail "no bootstrap token printed"
[ -f "$root/var/lib/orchestrator/journal.jsonl" ] || fail "no store in /var/lib/orchestrator"
# The key came from the credential: none was made in the state dir.
[ ! -e "$root/var/lib/orchestrator/secret.key" ] || fail "the service made a secret.key beside the credential"
grep -q 'SCRIPTS ARE NOT SANDBOXED' "$log" || fail "--script-sandbox none was not logged as unsafe"
ok "serve as the service's user: $health"

in_root dpkg -i /tmp/orchestrator.deb >/dev/null
[ -f "$root/var/lib/orchestrator/journal.jsonl" ] || fail "a reinstall lost the store"
in_root dpkg -r orchestrator >/dev/null
[ ! -e "$root/usr/bin/orchestrator" ] || fail "remove left the binary"
[ -f "$root/etc/orchestrator/config.toml" ] || fail "remove took the conffile"
in_root getent passwd orchestrator >/dev/null || fail "remove took the user"
in_root dpkg --purge orchestrator >/dev/null 2>&1
! in_root getent passwd orchestrator >/dev/null || fail "purge left the user"
! in_root getent group orchestrator >/dev/null || fail "purge left the group"
[ ! -e "$root/etc/orchestrator/config.toml" ] || fail "purge left the conffile"
[ -f "$root/var/lib/orchestrator/journal.jsonl" ] || fail "purge deleted the data unasked"
[ -f "$root/etc/orchestrator/secret-key" ] || fail "purge deleted the key of the kept data"
ok "reinstall keeps the store; remove keeps config, data and user; purge removes the user, keeps the data"

# The next user may get another uid than the one that owned the data.
chown -R 4242:4242 "$root/var/lib/orchestrator"
in_root dpkg -i /tmp/orchestrator.deb >/dev/null
owned=$(in_root stat -c '%U:%G' /var/lib/orchestrator/journal.jsonl)
[ "$owned" = orchestrator:orchestrator ] || fail "a reinstall did not adopt the kept data: $owned"
ORCHESTRATOR_PURGE_DATA=yes in_root dpkg --purge orchestrator >/dev/null 2>&1
[ ! -e "$root/var/lib/orchestrator" ] || fail "ORCHESTRATOR_PURGE_DATA=yes kept the data"
[ ! -e "$root/etc/orchestrator/secret-key" ] || fail "ORCHESTRATOR_PURGE_DATA=yes kept the key"
ok "a reinstall adopts the kept data; ORCHESTRATOR_PURGE_DATA=yes purges it"
echo "deb-test: all checks passed"
