#!/usr/bin/env bash
# Builds the image the Docker provider's nodes run, with no registry: a
# Debian root made by debootstrap (minbase plus what the taskservs need),
# packed once into a tarball cached under ~/.cache and keyed by a hash of
# its package list, then `podman import`ed under a fixed tag. Idempotent:
# a second call with the same list and the same podman storage does
# nothing but print the tag.
#
# Usage: build-image.sh [podman global option...]
#   e.g. build-image.sh --root /x/storage --runroot /x/run
# (the tests import it into a store of their own, under ~/.cache, that
# each test's podman reads as an additional image store).
# Prints the image's tag (orchestrator-testenv:<hash>, also tagged
# orchestrator-testenv:latest) on stdout. Needs root and debootstrap the
# first time (and the Debian mirror); podman every time.
set -euo pipefail

packages=python3,etcd-server,etcd-client,postgresql,redis-server,iproute2,procps
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
hash=$(printf '%s %s' "$suite" "$packages" | sha256sum | cut -c1-12)
cache=${ORCHESTRATOR_TESTENV_IMAGE_CACHE:-$HOME/.cache/orchestrator-testenv-image}
tarball="$cache/$suite-$hash.tar.gz"
tag="localhost/orchestrator-testenv:$hash"

podman=(podman "$@")

# One build at a time (tests run in parallel): the others wait, then find
# the image.
mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9

if "${podman[@]}" image exists "$tag" 2>/dev/null; then
    "${podman[@]}" tag "$tag" localhost/orchestrator-testenv:latest >/dev/null
    echo "$tag"
    exit 0
fi

if [ ! -f "$tarball" ]; then
    [ "$(id -u)" = 0 ] || { echo "build-image: debootstrap needs root" >&2; exit 1; }
    command -v debootstrap >/dev/null \
        || { echo "build-image: needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
    mkdir -p "$cache"
    root=$(mktemp -d "$cache/root.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    echo "build-image: making a $suite root with debootstrap ($packages), cached in $tarball" >&2
    debootstrap --variant=minbase --include="$packages" "$suite" "$root" \
        http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 \
        || { tail "$cache/debootstrap.log" >&2; echo "build-image: debootstrap $suite failed" >&2; exit 1; }
    # The services are started by the taskservs' scripts, never by the
    # package's own init (there is none in a node).
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    chmod 755 "$root"
    tar -C "$root" --numeric-owner -czf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
fi

"${podman[@]}" import --quiet --change 'CMD ["sleep", "infinity"]' "$tarball" "$tag" >/dev/null
"${podman[@]}" tag "$tag" localhost/orchestrator-testenv:latest >/dev/null
echo "$tag"
