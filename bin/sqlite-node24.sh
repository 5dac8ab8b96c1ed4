#!/usr/bin/env bash
# npm's postinstall: on Node.js 24, makes sure better-sqlite3 is compiled against Node 24.18.1's headers. From
# 24.19.0 on, Node's headers make better-sqlite3 12 abort the process when V8 collects a statement outside a
# JavaScript scope (at exit, or at any idle collection; see bin/setup-node.sh), so a build that imports
# `node::RemoveEnvironmentCleanupHook` (what those headers add), or one that does not load, is built again
# against the older headers (downloaded once into .cache/node24-headers, ~30 MB; the same ABI). Does nothing on
# any other Node. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[sqlite-node24] %s\n' "$*" >&2; }
[ "$(node -p 'process.versions.node.split(".")[0]')" = 24 ] || exit 0
addon=node_modules/better-sqlite3/build/Release/better_sqlite3.node
[ -d node_modules/better-sqlite3 ] || exit 0
loads() { node -e 'new (require("better-sqlite3"))(":memory:").close()' 2>/dev/null; }
if [ -f "$addon" ] && loads && ! grep -qa RemoveEnvironmentCleanupHook "$addon"; then exit 0; fi
headers=$(bash bin/setup-node.sh headers)
say "building better-sqlite3 for Node $(node -v) against Node $(cat "$headers/VERSION")'s headers (~90 s)"
npm_config_nodedir="$headers" npm rebuild better-sqlite3 >/dev/null
loads || { say "better-sqlite3 does not load after the build"; exit 1; }
if grep -qa RemoveEnvironmentCleanupHook "$addon"; then
  say "better-sqlite3 still imports RemoveEnvironmentCleanupHook; it would abort on this Node"
  exit 1
fi
