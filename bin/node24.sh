#!/usr/bin/env bash
# npm run test:node24 -- <command> — runs a command (default: `npm test`) on Node.js 24 LTS, in a copy of this
# tree under .cache/node24-tree, so that the two builds of the native module better-sqlite3 (one per Node
# ABI) never overwrite each other: this tree keeps working on the system Node meanwhile. The copy takes the
# tracked and untracked (not ignored) files, the dashboard's build, node_modules (hard links, except
# better-sqlite3, rebuilt there for Node 24 against Node 24.18.1's headers (.cache/node24-headers), and
# npm's and the tools' own files at its top, copied) and links to the other .cache entries (the trainers' and
# clients' virtual environments). Node 24 comes from bin/setup-node.sh; npm is the
# one on PATH, run by Node 24. Examples: `bash bin/node24.sh`, `bash bin/node24.sh npm run test:unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
say() { printf '[node24] %s\n' "$*" >&2; }
[ -d node_modules ] || { say "node_modules is missing: run npm install first"; exit 1; }
node24=$(bash bin/setup-node.sh)
tree=.cache/node24-tree
mkdir -p "$tree/.cache"

# Files: what git knows of (tracked, or untracked and not ignored), deleted ones included.
git ls-files -z --cached --others --exclude-standard |
  rsync -a --delete --from0 --files-from=- ./ "$tree/"
git ls-files -z --deleted | (cd "$tree" && xargs -0 -r rm -f --)
# Built files the tests read (the dashboard's bundle) come along when present.
if [ -d ui/dist ]; then rsync -a --delete ui/dist/ "$tree/ui/dist/"; fi

# node_modules: hard links, fresh each time so an `npm install` here shows there; better-sqlite3 is a real
# copy whose build is kept between runs while its version is the same.
keep=""
if cmp -s node_modules/better-sqlite3/package.json "$tree/node_modules/better-sqlite3/package.json"; then
  keep=$(mktemp -d) && mv "$tree/node_modules/better-sqlite3" "$keep/"
fi
rm -rf "$tree/node_modules"
cp -al node_modules "$tree/node_modules"
# What npm and the tools write in place (npm's record of the tree, caches) must not write through to this tree.
for entry in node_modules/.[!.]*; do
  [ -e "$entry" ] || continue
  case "$(basename "$entry")" in .bin) continue ;; esac
  rm -rf "${tree:?}/$entry" && cp -a "$entry" "$tree/$entry"
done
rm -rf "$tree/node_modules/better-sqlite3"
if [ -n "$keep" ]; then
  mv "$keep/better-sqlite3" "$tree/node_modules/" && rmdir "$keep"
else
  cp -a node_modules/better-sqlite3 "$tree/node_modules/"
fi

# The other .cache entries (virtual environments, the trainer's BLAS plugin, models) are shared.
for entry in .cache/* .cache/.[!.]*; do
  [ -e "$entry" ] || continue
  case "$(basename "$entry")" in node24 | node24-tree) continue ;; esac
  ln -sfn "$root/$entry" "$tree/$entry"
done

export PATH="$node24/bin:$PATH"
cd "$tree"
# Against Node 24.18.1's headers: later ones make better-sqlite3 12 abort the process (see bin/setup-node.sh).
bash bin/sqlite-node24.sh
say "Node $(node -v), npm $(npm -v), in $tree"
if [ $# -eq 0 ]; then set -- npm test; fi
export npm_config_nodedir="$root/.cache/node24-headers"
exec "$@"
