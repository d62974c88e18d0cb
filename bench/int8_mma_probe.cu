// The int8 tensor-core ceiling the GEMM rows report against, measured on the machine the
// benchmark runs on: every warp of a full grid issues mma.sync m16n8k32 s8 back to back over
// 8 independent accumulators (enough to cover the mma latency), operands in registers, so
// nothing but the tensor cores limits it. The dense GEMMs of kernels/gemm_q8_0.cuh and
// kernels/moe_gemm.cuh use this instruction, so this (not the wgmma datasheet figure) is their peak.
#include <benchmark/benchmark.h>

#include "bench/gpu_timer.hpp"
#include "bench/int8_mma_probe.hpp"
#include "ds4/core/device_buffer.hpp"

namespace ds4::bench {
namespace {

constexpr int probe_chains = 8;
constexpr int probe_iters = 4096;
constexpr int probe_warps_per_cta = 8;
constexpr int probe_ctas_per_sm = 4;
constexpr double ops_per_mma = 2.0 * 16 * 8 * 32;

__global__ void __launch_bounds__(probe_warps_per_cta * 32) int8_mma_loop(int seed, int* sink) {
    unsigned a[4], b[2];
    for (int i = 0; i < 4; ++i) a[i] = unsigned(seed * 0x01010101 + i + threadIdx.x);
    for (int i = 0; i < 2; ++i) b[i] = unsigned(seed * 0x02020202 + i * 7 + threadIdx.x);
    int d[probe_chains][4] = {};
    for (int it = 0; it < probe_iters; ++it) {
#pragma unroll
        for (int c = 0; c < probe_chains; ++c)
            asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                         : "+r"(d[c][0]), "+r"(d[c][1]), "+r"(d[c][2]), "+r"(d[c][3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    int x = 0;
    for (int c = 0; c < probe_chains; ++c) x ^= d[c][0] ^ d[c][1] ^ d[c][2] ^ d[c][3];
    if (x == 0x7fffffff) sink[0] = x;  // keeps the mma live; never true in practice
}

struct mma_probe {
    timing t;
    double ops = 0;
};

mma_probe run_probe() {
    int sms = 0;
    cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "sm count");
    device_buffer<int> sink(1);
    const int ctas = sms * probe_ctas_per_sm;
    mma_probe p;
    p.t = time_launches([&](int i, cudaStream_t s) {
        int8_mma_loop<<<ctas, probe_warps_per_cta * 32, 0, s>>>(i, sink.data());
        cuda_check_launch("int8_mma_loop");
    }, 2, 11, 4);
    p.ops = double(ctas) * probe_warps_per_cta * probe_iters * probe_chains * ops_per_mma;
    return p;
}

const mma_probe& probe() {
    static const mma_probe p = run_probe();
    return p;
}

void BM_int8_mma_peak(benchmark::State& state) {
    const auto& p = probe();
    for (auto _ : state) state.SetIterationTime(p.t.median_s);
    state.counters["us"] = p.t.median_s * 1e6;
    state.counters["TOP/s"] = p.ops / p.t.median_s * 1e-12;
}
BENCHMARK(BM_int8_mma_peak)->UseManualTime()->Iterations(1);

}  // namespace

double measured_int8_mma_peak() { return probe().ops / probe().t.median_s; }

void report_int8(benchmark::State& state, const timing& t, double ops) {
    for (auto _ : state) state.SetIterationTime(t.median_s);
    const double peak = measured_int8_mma_peak();
    state.counters["us"] = t.median_s * 1e6;
    state.counters["TOP/s"] = ops / t.median_s * 1e-12;
    state.counters["peak_TOP/s"] = peak * 1e-12;
    state.counters["pct_peak"] = 100.0 * (ops / t.median_s) / peak;
}

}  // namespace ds4::bench
