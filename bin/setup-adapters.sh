#!/usr/bin/env bash
# npm run setup:adapters — builds the mixed-adapter build: the llama.cpp release node-llama-cpp ships
# (node_modules/node-llama-cpp/llama/gitRelease.bundle) and node-llama-cpp's addon, each with a small patch
# (bin/patches/) that gives every sequence of a context its own LoRA adapters (`llama_set_adapters_lora_seq`),
# so that one decode serves sequences of different adapters: the base weights' products once for the whole
# batch, each token's low-rank products with its own sequence's adapter; the addon also reads the embedding of each
# sequence of a decode (`getSequenceEmbedding`), so an embeddings request's inputs share decodes. The engine finds it in
# .cache/llama-mixed-adapters/ and uses it on the CPU (src/engine/mixedAdapterBuild.ts; `/healthz` and the start
# log say so); without it adapters are decoded one group per adapter, as before.
#
# Only libllama and the addon are compiled (generic x86-64/arm64 code: they build graphs, ggml computes them):
# the ggml libraries are node-llama-cpp's prebuilt ones, linked in place, so the CPU variant that computes is
# the one the prebuilt binaries choose for this CPU (a `-march=native` ggml dies with SIGILL on AMX CPUs).
# A node-llama-cpp upgrade needs this run again (the engine says so). Needs g++, make and Node's headers.
# Takes ~5-10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.cache/llama-mixed-adapters
say() { printf '[setup:adapters] %s\n' "$*"; }

command -v g++ >/dev/null || { say "g++ is missing (Debian: apt-get install g++)" >&2; exit 1; }
command -v make >/dev/null || { say "make is missing (Debian: apt-get install make)" >&2; exit 1; }
bundle=node_modules/node-llama-cpp/llama/gitRelease.bundle
addon=node_modules/node-llama-cpp/llama/addon
[ -f "$bundle" ] && [ -d "$addon" ] || { say "$bundle is missing: run npm install first" >&2; exit 1; }

node_include=""
for dir in ${npm_config_nodedir:+"$npm_config_nodedir/include/node"} \
  "$(dirname "$(dirname "$(command -v node)")")/include/node" /usr/include/node /usr/local/include/node; do
  if [ -f "$dir/node_api.h" ]; then
    node_include="$dir"
    break
  fi
done
[ -n "$node_include" ] || { say "Node's headers (node_api.h) are missing: install nodejs-dev or set npm_config_nodedir" >&2; exit 1; }
napi_include=$(node -p 'require("node-addon-api").include_dir')

bins=$(node --import tsx -e '
  import("./src/train/libllama/llamaLib.ts").then((m) => console.log(m.findBinDir("cpu")))')
head=$(git bundle list-heads "$bundle" | head -n1 | cut -d' ' -f1)
version=$(node -p 'require("./node_modules/node-llama-cpp/package.json").version')

patches=$(cat bin/patches/llama.cpp-lora-seq.diff bin/patches/node-llama-cpp-addon-lora-seq.diff | sha256sum | cut -c1-16)
say "llama.cpp of node-llama-cpp $version (${head:0:12}), prebuilt ggml in $bins"

# The sources and objects stay in $work between runs: a second run with the same node-llama-cpp and patches
# compiles nothing again.
work="$PWD/.cache/llama-mixed-adapters.build"
stamp="$version $head $patches"
if [ "$(cat "$work/stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$work"
  mkdir -p "$work/src"
  git clone --quiet --bare "$bundle" "$work/src.git"
  git --git-dir="$work/src.git" archive "$head" include src common vendor ggml/include | tar -x -C "$work/src"
  rm -rf "$work/src.git"
  cp -r "$addon" "$work/addon"
  (cd "$work/src" && patch -p1 --quiet --forward) <bin/patches/llama.cpp-lora-seq.diff ||
    { say "bin/patches/llama.cpp-lora-seq.diff does not apply to this llama.cpp: the patch needs updating" >&2; exit 1; }
  (cd "$work/addon" && patch -p2 --quiet --forward) <bin/patches/node-llama-cpp-addon-lora-seq.diff ||
    { say "bin/patches/node-llama-cpp-addon-lora-seq.diff does not apply to this addon: the patch needs updating" >&2; exit 1; }
  printf '#pragma once\n#define LLAMA_VERSION "%s"\n#define LLAMA_COMMIT "%s"\n' "$version" "${head:0:12}" \
    >"$work/src/llama-version.h"
  printf '%s' "$stamp" >"$work/stamp"
fi

sed -e 's/@LLAMA_BUILD_NUMBER@/0/' -e "s/@LLAMA_BUILD_COMMIT@/${head:0:12}/" -e 's/@BUILD_COMPILER@/g++/' \
  -e "s/@BUILD_TARGET@/$(uname -m)/" "$work/src/common/build-info.cpp.in" >"$work/build-info.cpp"

# libllama-mixed.so, and the addon with llama.cpp's common library compiled in: their own names, so that they
# never stand in for (or bind to) the prebuilt libllama.v0.5.0.so and libllama-common.so that the tokenizer
# thread's node-llama-cpp loads into the same process. Both link the prebuilt ggml.
cat >"$work/Makefile" <<'MAKE'
DEFS = -DNDEBUG -DLLAMA_SHARED -DGGML_SHARED -DGGML_BACKEND_SHARED
INCLUDES = -Isrc -Isrc/include -Isrc/common -Isrc/ggml/include -Isrc/src -Isrc/vendor
CXXFLAGS = -O2 -std=c++17 -fPIC -fexceptions $(DEFS) $(INCLUDES)
LLAMA_OBJS = $(patsubst %.cpp,obj/%.o,$(wildcard src/src/*.cpp) $(wildcard src/src/models/*.cpp))
ADDON_SRCS = $(wildcard addon/*.cpp) $(wildcard addon/globals/*.cpp) $(wildcard src/common/*.cpp) \
  $(wildcard src/common/jinja/*.cpp) $(wildcard src/common/parsers/*.cpp) build-info.cpp
ADDON_OBJS = $(patsubst %.cpp,aobj/%.o,$(ADDON_SRCS))
all: out/libllama-mixed.so out/llama-addon.node
obj/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -DLLAMA_BUILD -c $< -o $@
aobj/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -DNAPI_VERSION=7 -I$(NODE_INCLUDE) -I$(NAPI_INCLUDE) -c $< -o $@
out/libllama-mixed.so: $(LLAMA_OBJS)
	@mkdir -p out
	$(CXX) -shared -o $@ $^ -L$(BINS) -l:libggml.v0.5.0.so -l:libggml-base.so -Wl,-soname,libllama-mixed.so \
	  -Wl,-rpath,'$$ORIGIN'
out/llama-addon.node: $(ADDON_OBJS) out/libllama-mixed.so
	$(CXX) -shared -o $@ $(ADDON_OBJS) -Lout -l:libllama-mixed.so -L$(BINS) -l:libggml.v0.5.0.so -l:libggml-base.so \
	  -Wl,-soname,llama-addon-mixed.node -Wl,-rpath,'$$ORIGIN'
MAKE
jobs=$(nproc 2>/dev/null || echo 2)
say "compiling libllama and the addon ($jobs jobs; ~5-10 minutes on 2 cores)"
make -s -C "$work" -j"$jobs" BINS="$(realpath "$bins")" NODE_INCLUDE="$node_include" NAPI_INCLUDE="$(realpath "$napi_include")" \
  >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log" >&2; say "the build failed" >&2; exit 1; }

# The prebuilt ggml libraries are linked (symbolic links), not copied: loaded from here and by node-llama-cpp's
# own binaries they are then the same files, so the process keeps one ggml and one CPU backend.
staging="$OUT.tmp"
rm -rf "$staging"
mkdir -p "$staging"
cp "$work/out/libllama-mixed.so" "$work/out/llama-addon.node" "$staging/"
cp "$bins/_nlcBuildMetadata.json" "$staging/"
for lib in "$bins"/libggml*.so; do
  ln -s "$(realpath --relative-to="$OUT" "$lib")" "$staging/$(basename "$lib")"
done
printf '{"nodeLlamaCpp": "%s", "llamaCpp": "%s", "patches": "%s", "addon": "llama-addon.node"}\n' \
  "$version" "$head" "$patches" >"$staging/build.json"
rm -rf "$OUT"
mv "$staging" "$OUT"

say "checking: the engine loads it and its contexts take adapters per sequence"
node --import tsx -e '
  import("./src/engine/mixedAdapterBuild.ts").then(async (m) => {
    const status = m.mixedAdapterBuildStatus("auto");
    if (!status.available) throw new Error(status.reason);
    const llama = await m.loadMixedAdapterLlama(status.dir, { maxThreads: 0, logLevel: "warn", logger: () => {} });
    console.log("[setup:adapters] loaded: " + (llama.gpu === false ? "cpu" : llama.gpu) + ", " + m.adapterBatchingOf(llama).batching);
    await llama.dispose();
  })'
say "done: the engine serves different adapters in one decode from its next start (/healthz: accelerator.adapters)"
