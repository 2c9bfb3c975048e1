#!/usr/bin/env bash
# CI: make a container engine and everything the compose test (tests/test_compose.py) builds from,
# with no image registry: Debian's docker.io and docker-compose, a Debian bookworm base image made
# with debootstrap (python3 included), and a wheelhouse of the project's dependencies made on this
# host (the image installs the project itself from the source, offline).
#
# Idempotent and cheap on a second run (about a second): the base image (also as a tarball) and
# the dependency wheels are cached under $ZMQRL_CI_CACHE (default /var/cache/zmqrl-ci) and rebuilt
# only when missing or when the dependency list changes. Needs root (apt, dockerd, debootstrap). Where any step is not
# possible (not root, no apt, an engine that will not start) it says why and exits 0, so the test
# then skips with that reason instead of CI failing here; where a later step fails (debootstrap,
# the wheelhouse) with an engine up, it exits non-zero.
#
# Leaves dockerd running (a daemon like any other system service, reused by the next run); its
# log is $ZMQRL_CI_CACHE/dockerd.log. Stop it with: kill "$(cat /var/run/docker.pid)".
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${ZMQRL_CI_CACHE:-/var/cache/zmqrl-ci}
# The Dockerfile's default BASE: the debootstrap image is tagged with it, so a plain
# `docker build -f docker/Dockerfile .` uses it here and the real one where a registry is reachable.
BASE_TAG=${ZMQRL_BASE_IMAGE:-debian:bookworm-slim}
MIRROR=${ZMQRL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# Inside the build context. Nothing uses it unless told: ZMQRL_WHEELHOUSE=build/wheelhouse for
# compose (tests/test_compose.py sets it), --build-arg WHEELHOUSE=build/wheelhouse for docker build.
WHEELHOUSE=build/wheelhouse
PIP=${PIP:-.venv/bin/pip}
DOCKER=/usr/bin/docker               # Debian's client, matched to Debian's dockerd (not another on PATH)

say() { echo "docker-setup: $*"; }

if [[ $(id -u) -ne 0 ]]; then
    say "not root: cannot install or start a container engine; the compose test will skip"
    exit 0
fi
mkdir -p "$CACHE"

# 1. Packages.
missing=()
[[ -x /usr/sbin/dockerd && -x /usr/bin/docker ]] || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if (( ${#missing[@]} )); then
    if ! command -v apt-get >/dev/null; then
        say "no apt-get to install ${missing[*]}; the compose test will skip"
        exit 0
    fi
    say "installing ${missing[*]}"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. The engine. --iptables=false: these machines allow no NAT rules; containers then have no
# outbound network, which the build does not need (python3 is in the base, wheels are local).
if ! "$DOCKER" info >/dev/null 2>&1; then
    running=$(cat /var/run/docker.pid 2>/dev/null || true)
    if [[ -n $running ]] && kill -0 "$running" 2>/dev/null; then
        say "dockerd (pid $running) is running but not answering yet: waiting for it"
    else
        say "starting dockerd (log: $CACHE/dockerd.log)"
        rm -f /var/run/docker.pid
        setsid /usr/sbin/dockerd --iptables=false >>"$CACHE/dockerd.log" 2>&1 </dev/null &
    fi
    deadline=$((SECONDS + 60))
    until "$DOCKER" info >/dev/null 2>&1; do
        if (( SECONDS > deadline )); then
            # Where an engine cannot run at all (no cgroups, no overlay, a locked-down sandbox)
            # the compose test skips, saying so; CI goes on.
            say "dockerd did not answer within 60 s; the compose test will skip. Its log ends:"
            tail -n 20 "$CACHE/dockerd.log" >&2
            exit 0
        fi
        sleep 0.5
    done
fi

# 3. The base image: Debian bookworm minbase with python3 and venv, so building the project image
# needs no network. Cached as a tarball too, in case the engine's own store is wiped.
if ! "$DOCKER" image inspect "$BASE_TAG" >/dev/null 2>&1; then
    tarball="$CACHE/bookworm-base.tar"
    if [[ ! -s $tarball ]]; then
        say "debootstrap bookworm into a new base image (a few minutes, once per machine)"
        root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
        trap 'rm -rf "$root"' EXIT
        debootstrap --variant=minbase --include=python3,python3-venv bookworm "$root" "$MIRROR" \
            >"$CACHE/debootstrap.log" 2>&1 || { tail -n 20 "$CACHE/debootstrap.log" >&2; exit 1; }
        # What an image never needs: package caches and lists, docs, man pages, translations.
        rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
            "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
            "$root"/var/log/*.log "$root"/tmp/*
        tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
        mv "$tarball.tmp" "$tarball"
        rm -rf "$root"
        trap - EXIT
    fi
    say "importing $tarball as $BASE_TAG"
    "$DOCKER" import \
        --change 'CMD ["bash"]' \
        --change 'LABEL org.zmqrl.base="debootstrap --variant=minbase --include=python3,python3-venv bookworm"' \
        "$tarball" "$BASE_TAG" >/dev/null
fi

# 4. The wheelhouse: every dependency as a wheel (torch pinned to the CPU build on this machine's
# disk), cached per pyproject.toml and Python version, hard-linked into the build context. The
# project itself is not in it: the image installs it from the source in the context (offline, its
# build backend comes from the wheelhouse), so editing the code does not invalidate the layer that
# installs torch.
[[ -x $PIP ]] || PIP="python3 -m pip"
# Keyed on what decides its contents: the dependency list and the Python version.
key=$(python3 -c 'import sys, tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sys.version_info[:2])' | sha256sum | cut -c1-16)
deps="$CACHE/wheels-$key"
if [[ ! -d $deps ]]; then
    say "building the dependency wheelhouse $deps"
    # One wheelhouse is enough: the ones for older dependency lists go.
    find "$CACHE" -maxdepth 1 -name 'wheels-*' ! -name "wheels-$key" -exec rm -rf {} +
    $PIP wheel -q --wheel-dir "$deps.tmp" torch==2.13.0 setuptools . 2> >(grep -v "is ignored: it is neither" >&2)
    rm -f "$deps.tmp"/zmqrl-*.whl
    mv "$deps.tmp" "$deps"
fi
rm -rf "$WHEELHOUSE"
mkdir -p "$WHEELHOUSE"
cp -l "$deps"/*.whl "$WHEELHOUSE"/ 2>/dev/null || cp "$deps"/*.whl "$WHEELHOUSE"/
say "ready: engine $("$DOCKER" version --format '{{.Server.Version}}'), base $BASE_TAG," \
    "wheelhouse $WHEELHOUSE ($(ls "$WHEELHOUSE" | wc -l) wheels)"
say "build offline with: ZMQRL_WHEELHOUSE=$WHEELHOUSE docker-compose -f docker/compose.yaml build" \
    "(or docker build -f docker/Dockerfile --build-arg WHEELHOUSE=$WHEELHOUSE -t zmqrl .)"
