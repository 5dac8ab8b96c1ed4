#!/usr/bin/env bash
# npm run setup:trainer — gives the embedded llama.cpp trainer a BLAS backend: ggml's BLAS backend
# (ggml/src/ggml-blas, one C++ file) compiled from the exact llama.cpp source node-llama-cpp ships
# (node_modules/node-llama-cpp/llama/gitRelease.bundle) against OpenBLAS, as a plugin of node-llama-cpp's
# prebuilt ggml: .cache/trainer-blas/libggml-blas.so, with one patch (bin/patches/). The trainer loads it by itself
# (CONDUIT_TRAINER_BLAS) and runs the matrix products, the backward pass's included, through cblas_sgemm.
# Generation does not use it. Safe to run again; a node-llama-cpp upgrade needs it run again (the trainer
# says so).
#
# Needs g++ and OpenBLAS's headers and library (Debian: libopenblas-dev, ~30 MB; installed here with apt-get
# when missing and this runs as root). With oneDNN's as well (Debian: libdnnl-dev, ~20 MB, installed the same way)
# the products of a weight that is not F32 (a LoRA base trained as it is) run in bf16 on a CPU that multiplies
# bf16 natively (AVX512-BF16): bin/patches/ggml-blas-bf16.diff. Without it they stay in F32. Takes ~10 s.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.cache/trainer-blas
say() { printf '[setup:trainer] %s\n' "$*"; }

have_openblas() {
  [ -f /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h ] || [ -f /usr/include/openblas/cblas.h ] ||
    [ -f /usr/include/cblas.h ]
}
if ! have_openblas; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing libopenblas-dev (apt-get)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas-dev) >/dev/null
  else
    say "OpenBLAS's headers are missing: install libopenblas-dev (Debian/Ubuntu) or openblas-devel, then run this again" >&2
    exit 1
  fi
fi
# oneDNN: the bf16 products (optional; the backend is F32 throughout without it).
have_dnnl() {
  [ -f /usr/include/oneapi/dnnl/dnnl.hpp ] || return 1
  for lib in /usr/lib/*/libdnnl.so /usr/lib/libdnnl.so /usr/local/lib/libdnnl.so; do [ -e "$lib" ] && return 0; done
  return 1
}
if ! have_dnnl && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  say "installing libdnnl-dev (apt-get) for bf16 products"
  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libdnnl-dev ||
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libdnnl-dev)) >/dev/null 2>&1 || true
fi
blas_include=""
for dir in /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas /usr/include; do
  if [ -f "$dir/cblas.h" ]; then
    blas_include="$dir"
    break
  fi
done
command -v g++ >/dev/null || { say "g++ is missing (Debian: apt-get install g++)" >&2; exit 1; }

bundle=node_modules/node-llama-cpp/llama/gitRelease.bundle
bins=$(node -e '
  import("./src/train/libllama/llamaLib.ts").then((m) => console.log(m.findBinDir("cpu")))' --import tsx)
[ -f "$bundle" ] || { say "$bundle is missing: run npm install first" >&2; exit 1; }
head=$(git bundle list-heads "$bundle" | head -n1 | cut -d' ' -f1)
version=$(node -p 'require("./node_modules/node-llama-cpp/package.json").version')

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say "ggml source of node-llama-cpp $version (llama.cpp ${head:0:12})"
git clone --quiet --bare "$bundle" "$work/src.git"
git --git-dir="$work/src.git" archive "$head" ggml/include ggml/src/ggml-blas ggml/src/ggml-impl.h \
  ggml/src/ggml-backend-impl.h ggml/src/ggml-common.h | tar -x -C "$work"

# ggml-blas sets OpenBLAS's threads to the trainer's on every call; the trainer gives OpenBLAS its own count
# instead (OPENBLAS_NUM_THREADS: every core by default, while ggml's CPU ops keep one thread), so that call goes.
grep -q 'openblas_set_num_threads(ctx->n_threads);' "$work/ggml/src/ggml-blas/ggml-blas.cpp" ||
  { say "ggml-blas.cpp no longer sets OpenBLAS's threads as expected; update bin/setup-trainer.sh" >&2; exit 1; }
sed -i 's|openblas_set_num_threads(ctx->n_threads);|/* threads: OPENBLAS_NUM_THREADS, set by the trainer */|' \
  "$work/ggml/src/ggml-blas/ggml-blas.cpp"

# The backward pass's products of a frozen quantized (or F16) weight (OUT_PROD) go through BLAS too, the weight
# converted to F32 once a product: a LoRA base then trains as it is, at about an F32 copy's speed, in its own
# file's memory (bench/README.md). ggml's CPU backend converts the weight again for every row of the result.
(cd "$work" && patch -p1 --quiet --forward) <bin/patches/ggml-blas-out-prod-quantized.diff ||
  { say "bin/patches/ggml-blas-out-prod-quantized.diff does not apply to this ggml: the patch needs updating" >&2; exit 1; }

bf16_flags=()
bf16=false
if have_dnnl; then
  (cd "$work" && patch -p1 --quiet --forward) <bin/patches/ggml-blas-bf16.diff ||
    { say "bin/patches/ggml-blas-bf16.diff does not apply to this ggml: the patch needs updating" >&2; exit 1; }
  bf16_flags=(-DGGML_BLAS_USE_DNNL_BF16 -ldnnl -lgomp)
  bf16=true
  say "with oneDNN: the products of non-F32 weights run in bf16 on a CPU with AVX512-BF16 (GGML_BLAS_BF16=0: F32)"
else
  say "no oneDNN (Debian: libdnnl-dev): every product in F32"
fi

mkdir -p "$OUT"
say "compiling ggml-blas against OpenBLAS ($blas_include) for $bins"
# As ggml's CMake builds a dynamically loaded backend (GGML_BACKEND_DL, shared): it exports ggml_backend_init
# and links the prebuilt libggml-base.so.
g++ -O2 -std=c++17 -shared -fPIC -DNDEBUG -DGGML_BACKEND_DL -DGGML_BACKEND_BUILD -DGGML_BACKEND_SHARED \
  -DGGML_SHARED -DGGML_BLAS_USE_OPENBLAS -I "$work/ggml/include" -I "$work/ggml/src" -I "$blas_include" \
  "$work/ggml/src/ggml-blas/ggml-blas.cpp" -L "$bins" -l:libggml-base.so -lopenblas "${bf16_flags[@]}" -Wl,-rpath,"$bins" \
  -o "$OUT/libggml-blas.so.tmp"
mv "$OUT/libggml-blas.so.tmp" "$OUT/libggml-blas.so"
printf '{"nodeLlamaCpp": "%s", "llamaCpp": "%s", "blas": "OpenBLAS", "quantizedOutProd": true, "bf16": %s}\n' \
  "$version" "$head" "$bf16" \
  >"$OUT/build.json"

say "checking: the trainer's llama.cpp loads it"
node --import tsx -e '
  import("./src/train/native/blasBackend.ts").then((m) => {
    const found = m.probeBlasBackend(process.argv[1]);
    console.log("[setup:trainer] " + found);
  })' "$PWD/$OUT/libggml-blas.so"
say "done: the llama.cpp trainer uses it from its next run (CONDUIT_TRAINER_BLAS; /healthz says so)"
