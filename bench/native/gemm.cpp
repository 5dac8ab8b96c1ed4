// The products the llama.cpp trainer's BLAS backend runs, timed three ways on the same shapes: OpenBLAS's F32
// `sgemm`, oneDNN's F32 matmul and oneDNN's bf16 matmul with F32 sums (bin/patches/ggml-blas-bf16.diff). One
// window of 256 rows against a K × N weight, as a forward product. Needs libopenblas-dev and libdnnl-dev:
//
//   g++ -O2 -o /tmp/gemm bench/native/gemm.cpp -I/usr/include/x86_64-linux-gnu/openblas-pthread -lopenblas -ldnnl
//   OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 /tmp/gemm 1536 8960 8960 1536 896 4864
#include <oneapi/dnnl/dnnl.hpp>
#include <cblas.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

using namespace dnnl;

static uint16_t to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (uint16_t) ((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// GFLOPS of `run` over 30 calls after 3 to warm up.
static double gflops(double flops, const std::function<void()> & run) {
    for (int i = 0; i < 3; i++) run();
    const auto start = std::chrono::steady_clock::now();
    const int reps = 30;
    for (int i = 0; i < reps; i++) run();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
    return flops / seconds / 1e9;
}

int main(int argc, char ** argv) {
    if (argc < 3 || argc % 2 == 0) {
        std::fprintf(stderr, "usage: gemm K N [K N ...]\n");
        return 2;
    }
    engine eng(engine::kind::cpu, 0);
    stream strm(eng);
    const int64_t m = 256;
    std::printf("| rows x K x N | OpenBLAS F32 | oneDNN F32 | oneDNN bf16 | bf16 / OpenBLAS |\n|---|---|---|---|---|\n");
    for (int arg = 1; arg + 1 < argc; arg += 2) {
        const int64_t k = std::atol(argv[arg]), n = std::atol(argv[arg + 1]);
        std::vector<float> a(m * k), b(k * n), c(m * n);
        for (auto & x : a) x = (float) (std::rand() % 1000) / 1000.0f - 0.5f;
        for (auto & x : b) x = (float) (std::rand() % 1000) / 1000.0f - 0.5f;
        std::vector<uint16_t> a16(a.size()), b16(b.size());
        for (size_t i = 0; i < a.size(); i++) a16[i] = to_bf16(a[i]);
        for (size_t i = 0; i < b.size(); i++) b16[i] = to_bf16(b[i]);
        const double flops = 2.0 * m * n * k;
        // The weight is stored N × K, rows of K (ggml's layout): the product takes it transposed.
        const double sgemm = gflops(flops, [&] {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1, a.data(), k, b.data(), k, 0, c.data(), n);
        });
        const auto matmul_of = [&](memory::data_type type, void * a_data, void * b_data) {
            const memory::desc a_md({m, k}, type, memory::format_tag::ab);
            const memory::desc b_md({k, n}, type, memory::format_tag::ba);
            const memory::desc c_md({m, n}, memory::data_type::f32, memory::format_tag::ab);
            const matmul product(matmul::primitive_desc(matmul::desc(a_md, b_md, c_md), eng));
            memory a_mem(a_md, eng, a_data), b_mem(b_md, eng, b_data), c_mem(c_md, eng, c.data());
            return gflops(flops, [&] {
                product.execute(strm, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
                strm.wait();
            });
        };
        const double f32 = matmul_of(memory::data_type::f32, a.data(), b.data());
        const double bf16 = matmul_of(memory::data_type::bf16, a16.data(), b16.data());
        std::printf("| %ld x %ld x %ld | %.1f GFLOPS | %.1f GFLOPS | %.1f GFLOPS | %.2f |\n", (long) m, (long) k, (long) n,
                    sgemm, f32, bf16, bf16 / sgemm);
    }
    return 0;
}
