#!/usr/bin/env bash
# bench/gpu/stage.sh — packs what bench/gpu/run.sh needs on a GPU machine without Node.js into .device/gen/
# (git-ignored through .git/info/exclude), in parts small enough for the device tool's 64 MiB per call:
#
#   .device/gen/a/rt.tar.xz    node (this machine's /usr/bin/node, stripped), the runtime node_modules and the reference
#                              tools (.device/rt/ref/), for `tar -C <repo> -xJf`
#   .device/gen/{b,c}/model.xz.NN     SmolLM2-135M-Instruct Q4_1 (bench/setup.sh), xz'd and split in two halves
#   .device/gen/*/MANIFEST     sha256 of every part file and of the model
#
# The runtime node_modules is the production dependency tree (`npm ls --omit=dev`) minus what a Linux x64 CUDA
# host never loads: node-llama-cpp's binaries for other platforms and GPUs (only @node-llama-cpp/linux-x64-cuda
# stays, with its 159 MB all-architecture libggml-cuda.so replaced by bench/gpu/build.sh's sm_90 one), its
# llama.cpp source bundle, better-sqlite3's sources and objects, typescript (node-llama-cpp's CLI only),
# source maps and .d.ts files. The reference (.device/rt/ref/) is build.sh's llama-bench and llama-server with
# their own libllama/libggml, the same sm_90 libggml-cuda.so and node-llama-cpp's prebuilt CPU variants
# (hard links in the tarball), so both sides run the same kernels.
#
# Knob: PART_MIB (the most a part may hold, checked; default 58: each call also carries the repo, ~2.5 MiB).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BUILD="$ROOT/.cache/llama.cpp/build-cuda/bin"
MODEL="$ROOT/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
WORK="$ROOT/.cache/gpu-stage"
DEST="$ROOT/.device/gen"
PART_MIB="${PART_MIB:-58}"
say() { printf '[bench/gpu/stage] %s\n' "$*"; }
die() { printf '[bench/gpu/stage] ERROR: %s\n' "$*" >&2; exit 1; }
for f in llama-bench llama-server libggml-cuda.so libllama.so libggml.so libggml-base.so; do
  [ -e "$BUILD/$f" ] || die "missing $BUILD/$f: run bash bench/gpu/build.sh"
done
[ -f "$MODEL" ] || die "missing $MODEL: run SKIP_BUILD=1 bash bench/setup.sh"
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude

declare -A seen=()
rm -rf "$WORK"
mkdir -p "$WORK/root/node_modules" "$WORK/root/.device/rt/bin" "$WORK/root/.device/rt/ref"
R="$WORK/root"

# 1. node, without its symbol table and debug info (its dynamic symbols, which addons bind to, stay): 99 -> 86 MB
strip --strip-all -o "$R/.device/rt/bin/node" /usr/bin/node
[ "$("$R/.device/rt/bin/node" --version)" = "$(node --version)" ] || die "stripped node does not run"
say "node $(node --version) ($(stat -c %s "$R/.device/rt/bin/node") bytes stripped)"

# 2. node_modules: the production tree, pruned
npm ls --omit=dev --all --parseable 2>/dev/null | tail -n +2 | sed "s|^$ROOT/node_modules/||" | sort -u > "$WORK/deps.txt"
n=0
while read -r dep; do
  extra=()
  case "$dep" in
    @node-llama-cpp/linux-x64-cuda) extra=(--exclude '/bins/linux-x64-cuda/libggml-cuda.so') ;;
    @node-llama-cpp/*) continue ;;
    typescript | */typescript) continue ;;
    node-llama-cpp) extra=(--exclude '/llama/gitRelease.bundle') ;;
    better-sqlite3) extra=(--exclude '/deps/' --exclude '/src/' --include '/build/Release/'
      --include '/build/Release/better_sqlite3.node' --exclude '/build/Release/*' --exclude '/build/*') ;;
    koffi) extra=(--exclude '/vendor/' --exclude '/doc/' --exclude '*.cc' --exclude '*.hh') ;;
  esac
  mkdir -p "$R/node_modules/$dep"
  rsync -a --exclude node_modules --exclude '*.map' --exclude '*.d.ts' --exclude '*.d.mts' --exclude '*.d.cts' \
    "${extra[@]}" "node_modules/$dep/" "$R/node_modules/$dep/"
  n=$((n + 1))
done < "$WORK/deps.txt"
[ -f "$R/node_modules/better-sqlite3/build/Release/better_sqlite3.node" ] || die "better-sqlite3's addon not staged"
touch "$R/node_modules/.conduit-gpu-rt"
say "node_modules: $n packages, $(du -sm "$R/node_modules" | cut -f1) MiB"

# 3. the sm_90 CUDA plugin into node-llama-cpp's prebuilt CUDA folder, and the reference beside it
NB="$R/node_modules/@node-llama-cpp/linux-x64-cuda/bins/linux-x64-cuda"
[ -d "$NB" ] || die "no $NB"
strip --strip-unneeded -o "$NB/libggml-cuda.so" "$BUILD/libggml-cuda.so"
# The plugin must bind to the prebuilt libggml-base.so: every ggml/gguf symbol it imports is exported there (the
# prebuilt plugin imports the same set; checked here too).
need="$(nm -D --undefined-only "$NB/libggml-cuda.so" | awk '{print $2}' | grep -E '^(ggml|gguf)_' | sort)"
have="$(nm -D --defined-only "$NB/libggml-base.so" | awk '{print $3}' | sort)"
unresolved="$(comm -23 <(echo "$need") <(echo "$have"))"
[ -z "$unresolved" ] || die "the sm_90 plugin imports ggml symbols the prebuilt libggml-base.so lacks: $unresolved"
prebuilt_need="$(nm -D --undefined-only "node_modules/@node-llama-cpp/linux-x64-cuda/bins/linux-x64-cuda/libggml-cuda.so" |
  awk '{print $2}' | grep -E '^(ggml|gguf)_' | sort)"
[ "$need" = "$prebuilt_need" ] && say "plugin imports the same $(echo "$need" | wc -l) ggml symbols as the prebuilt one" ||
  say "WARNING: the plugin's ggml imports differ from the prebuilt plugin's (all resolve in the prebuilt base)"
[ "$(readelf -d "$NB/libggml-cuda.so" | sed -n 's/.*RUNPATH.*\[\(.*\)\]/\1/p')" = '$ORIGIN' ] ||
  die "the plugin's RUNPATH is not \$ORIGIN (rebuild with the current build.sh)"
REF="$R/.device/rt/ref"
ln "$NB/libggml-cuda.so" "$REF/libggml-cuda.so"
for f in "$NB"/libggml-cpu-*.so; do ln "$f" "$REF/$(basename "$f")"; done
for f in llama-bench llama-server libllama-bench-impl.so libllama-server-impl.so libllama.so libggml.so libggml-base.so \
  libllama-common.so libmtmd.so; do
  if [ -e "$BUILD/$f" ]; then strip --strip-unneeded -o "$REF/$f" "$BUILD/$f"; fi
done
# every library the reference tools need is there, or is the system's / CUDA's
missing="$(cd "$REF" && for f in llama-bench llama-server lib*.so; do readelf -d "$f" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p'; done |
  sort -u | while read -r lib; do [ -e "$REF/$lib" ] || case "$lib" in libc.so.6 | libm.so.6 | libstdc++.so.6 | libgcc_s.so.1 | ld-linux-x86-64.so.2 | libcuda.so.1 | libcudart.so.13 | libcublas.so.13) ;; *) echo "$lib" ;; esac; done)"
[ -z "$missing" ] || die "reference needs libraries not staged: $missing"
say "sm_90 libggml-cuda.so $(stat -c %s "$NB/libggml-cuda.so") bytes; reference: $(ls "$REF" | tr '\n' ' ')"

# identical files (esbuild's binary is in two packages) become hard links: tar stores them once
dups=0
while read -r _ f; do
  h="$(sha256sum "$f" | cut -c1-64)"
  if [ -n "${seen[$h]:-}" ]; then
    ln -f "${seen[$h]}" "$f"; dups=$((dups + 1))
  else
    seen[$h]="$f"
  fi
done < <(find "$R" -type f -size +256k -links 1 -printf '%s %p\n' | sort -n)
say "$dups duplicate files hard-linked"

# 4. pack
rm -rf "$DEST"; mkdir -p "$DEST/a" "$DEST/b" "$DEST/c"
say "packing rt.tar.xz (xz -9e, one thread: a few minutes)"
tar -C "$R" --owner=0 --group=0 --numeric-owner --sort=name -cf - node_modules .device | xz -9e -T1 > "$DEST/a/rt.tar.xz"
say "rt.tar.xz: $(stat -c %s "$DEST/a/rt.tar.xz") bytes"
say "packing the model (xz -9e)"
xz -9e -T1 -c "$MODEL" > "$WORK/model.xz"
# The model goes in two equal halves to b and c: a is the runtime alone (~56 MiB), and each call keeps room for the
# repository and, in the last call, bench/gpu/stageTorch.sh's .device/train (~3 MiB).
total=$(stat -c %s "$WORK/model.xz")
half=$(((total + 1) / 2))
dd if="$WORK/model.xz" of="$DEST/b/model.xz.00" bs=1M iflag=count_bytes count="$half" status=none
dd if="$WORK/model.xz" of="$DEST/c/model.xz.01" bs=1M iflag=skip_bytes skip="$half" status=none
cat "$DEST"/b/model.xz.00 "$DEST"/c/model.xz.01 | cmp - "$WORK/model.xz" || die "split mismatch"
for d in a b c; do
  size=$(du -cb "$DEST/$d" | tail -n 1 | cut -f1)
  [ "$size" -le $((PART_MIB * 1024 * 1024)) ] || die "part $d is $size bytes, over $PART_MIB MiB"
done
{
  echo "model $(sha256sum "$MODEL" | cut -d' ' -f1)"
  (cd "$DEST" && for f in */rt.tar.xz */model.xz.*; do echo "$(sha256sum "$f" | cut -d' ' -f1) $(basename "$f")"; done)
} > "$WORK/MANIFEST"
for d in "$DEST"/*/; do cp "$WORK/MANIFEST" "$d/MANIFEST"; done
rm -f "$WORK/model.xz"
say "staged (bytes):"
(cd "$DEST" && for d in */; do echo "  $d $(du -cb "$d" | tail -n 1 | cut -f1) = $(ls -l "$d" | awk 'NR>1{printf "%s %s  ", $NF, $5}')"; done)
