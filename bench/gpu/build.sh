#!/usr/bin/env bash
# bench/gpu/build.sh — CUDA binaries for the GPU measurements of issue #32, compiled on a machine WITHOUT a GPU
# (needs nvcc 13.x, CMake, Ninja; cuBLAS comes from PyPI). Idempotent; everything lands under .cache/.
#
#   1. The same llama.cpp source as bench/setup.sh (node-llama-cpp's gitRelease.bundle, v0.5.0, + its patch).
#   2. cuBLAS 13 headers and libraries for linking: `pip download nvidia-cublas==13.0.0.19` (matches nvcc 13.0;
#      at run time the device's own libcublas.so.13 is used), and a stub libcuda.so.1 (the driver's, at run time).
#   3. One CMake build, .cache/llama.cpp/build-cuda, with node-llama-cpp's options for its prebuilt CUDA binaries
#      (shared libs, GGML_BACKEND_DL=ON, GGML_NATIVE=OFF, GGML_OPENMP=OFF, CUDA graphs on, FA kernels without
#      all quants, GGML_BUILD_NUMBER=1) but for Hopper only (CMAKE_CUDA_ARCHITECTURES=90-real, which is the
#      machine code the driver would JIT from the prebuilt's compute_90 PTX), targets ggml-cuda, llama-bench,
#      llama-server. The prebuilt's CPU variants are reused at run time instead of building ours (see stage.sh).
#
# Knobs: JOBS (default 2, capped at 2), CUDA_HOME (default /usr/local/cuda-13.0 or /usr/local/cuda),
#        CUDA_ARCHS (default 90-real), FORCE_RECONFIGURE=1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="$ROOT/.cache"
NLC="$ROOT/node_modules/node-llama-cpp"
SRC="$CACHE/llama.cpp/src"
BUILD="$CACHE/llama.cpp/build-cuda"
DEPS="$CACHE/cuda-deps"
JOBS="${JOBS:-2}"; [ "$JOBS" -gt 2 ] && JOBS=2
CUDA_ARCHS="${CUDA_ARCHS:-90-real}"
CUBLAS_VERSION=13.0.0.19
if [ -z "${CUDA_HOME:-}" ]; then
  for c in /usr/local/cuda-13.0 /usr/local/cuda; do [ -x "$c/bin/nvcc" ] && CUDA_HOME=$c && break; done
fi
say() { printf '[bench/gpu/build] %s\n' "$*"; }
die() { printf '[bench/gpu/build] ERROR: %s\n' "$*" >&2; exit 1; }
[ -x "${CUDA_HOME:-}/bin/nvcc" ] || die "no nvcc (set CUDA_HOME)"
say "nvcc: $("$CUDA_HOME/bin/nvcc" --version | tail -n 2 | head -n 1)"

# 1. source
BUNDLE="$NLC/llama/gitRelease.bundle"
[ -f "$BUNDLE" ] || die "missing $BUNDLE (npm install first)"
want="$(git bundle list-heads "$BUNDLE" | awk '$2=="HEAD"{print $1}')"
if [ "$(git -C "$SRC" rev-parse HEAD 2>/dev/null)" != "$want" ]; then
  rm -rf "$SRC"; mkdir -p "$(dirname "$SRC")"
  git -c advice.detachedHead=false clone -q "$BUNDLE" "$SRC"
fi
if ! grep -q "n_tensors = gguf_get_n_tensors(metadata);" "$SRC/src/llama-model-loader.cpp"; then
  git -C "$SRC" apply --ignore-whitespace "$NLC/llama/patches/PR-22566.diff"
fi
say "source $SRC at $(git -C "$SRC" rev-parse --short HEAD) (+ PR-22566)"

# 2. cuBLAS from PyPI, stub driver
OVL="$DEPS/overlay"
if [ ! -f "$OVL/lib/libcublas.so.13" ]; then
  mkdir -p "$DEPS" "$OVL/include" "$OVL/lib"
  ls "$DEPS"/nvidia_cublas-"$CUBLAS_VERSION"-*.whl >/dev/null 2>&1 ||
    python3 -m pip download --no-deps --only-binary=:all: "nvidia-cublas==$CUBLAS_VERSION" -d "$DEPS"
  rm -rf "$DEPS/cublas"; mkdir -p "$DEPS/cublas"
  unzip -q -o "$DEPS"/nvidia_cublas-"$CUBLAS_VERSION"-*.whl -d "$DEPS/cublas"
  cp "$DEPS"/cublas/nvidia/cu13/include/*.h "$OVL/include/"
  cp "$DEPS"/cublas/nvidia/cu13/lib/libcublas.so.13 "$DEPS"/cublas/nvidia/cu13/lib/libcublasLt.so.13 "$OVL/lib/"
  ln -sfn libcublas.so.13 "$OVL/lib/libcublas.so"
  ln -sfn libcublasLt.so.13 "$OVL/lib/libcublasLt.so"
  rm -rf "$DEPS/cublas"
fi
if [ ! -f "$OVL/lib/libcuda.so.1" ]; then
  # The driver API functions ggml-cuda calls (VMM pool); only the SONAME and the names matter for linking.
  cat > "$DEPS/cuda_stub.c" <<'C'
int cuDeviceGet(void) { return 999; }
int cuDeviceGetAttribute(void) { return 999; }
int cuGetErrorString(void) { return 999; }
int cuMemAddressFree(void) { return 999; }
int cuMemAddressReserve(void) { return 999; }
int cuMemCreate(void) { return 999; }
int cuMemGetAllocationGranularity(void) { return 999; }
int cuMemMap(void) { return 999; }
int cuMemRelease(void) { return 999; }
int cuMemSetAccess(void) { return 999; }
int cuMemUnmap(void) { return 999; }
int cuDriverGetVersion(void) { return 999; }
int cuInit(void) { return 999; }
C
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$OVL/lib/libcuda.so.1" "$DEPS/cuda_stub.c"
  ln -sfn libcuda.so.1 "$OVL/lib/libcuda.so"
fi

# 3. configure + build
args=(
  -S "$SRC" -B "$BUILD" -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=ON -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON  # unversioned names, as node-llama-cpp's
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN'  # RUNPATH $ORIGIN only, nothing of this machine
  -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=OFF
  -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF -DGGML_BUILD_NUMBER=1
  -DGGML_CUDA=ON -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_CUDA_NCCL=OFF
  "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS"
  "-DCMAKE_CUDA_COMPILER=$CUDA_HOME/bin/nvcc" "-DCUDAToolkit_ROOT=$CUDA_HOME"
  "-DCUDA_cublas_LIBRARY=$OVL/lib/libcublas.so" "-DCUDA_cublasLt_LIBRARY=$OVL/lib/libcublasLt.so"
  "-DCUDA_cuda_driver_LIBRARY=$OVL/lib/libcuda.so"
  "-DCMAKE_CUDA_FLAGS=-I$OVL/include" "-DCMAKE_CXX_FLAGS=-I$OVL/include"
  "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath-link,$OVL/lib" "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$OVL/lib"
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
)
stamp="$BUILD/.bench-gpu-cmake-args"
if [ -f "$BUILD/CMakeCache.txt" ] && [ -z "${FORCE_RECONFIGURE:-}" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${args[*]}" ]; then
  say "build dir already configured with these options"
else
  cmake "${args[@]}"
  printf '%s' "${args[*]}" > "$stamp"
fi
t0=$SECONDS
nice -n 5 cmake --build "$BUILD" -j "$JOBS" --target ggml-cuda llama-bench llama-server
say "build took $((SECONDS - t0)) s"
ls -la "$BUILD/bin"
