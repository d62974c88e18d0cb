// kernels/gemm_f16.cuh at the real DeepSeek-V4-Flash chunk projections (the compressors with the
// indexer's, a ratio-128 layer's compressor, the indexer's q_b) for prefill chunks of 1024 and
// 2048 rows. The contract (the matvec's order, a mul and an add per product, no FMA) makes the
// CUDA cores' issue rate the ceiling: TOP/s counts 2 * rows * outputs * in against SMs x 128
// lanes x the SM clock (one FP32 instruction per lane per cycle), pct_peak the share of it.
// Weights are one copy: each CTA tile reads them from L2 once per activation tile.
// gemm_f16_tc/... is kernels/gemm_f16_tc.cuh (TF32 tensor cores, bounded contract) at the same
// shapes: its TOP/s counts the same 2 * rows * outputs * in (each product once, though the split
// activation takes two mma), pct_peak against the same FP32 figure so the rows compare directly.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <random>
#include <string>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/core/half.hpp"
#include "ds4/kernels/gemm_f16.cuh"
#include "ds4/kernels/gemm_f16_tc.cuh"

namespace ds4::bench {
namespace {

struct bench_case {
    std::string name;
    int in;
    std::vector<int> rows;
};

double fp32_issue_peak() {
    int dev = 0, sms = 0, khz = 0;
    cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "sm count");
    cuda_check(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev), "clock rate");
    return double(sms) * 128.0 * double(khz) * 1e3;
}

void run(benchmark::State& state, const bench_case& c, int n_rows, bool tc) {
    std::mt19937_64 g(42);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    kernels::gemm_f16_args a;
    std::vector<device_buffer<std::uint16_t>> w;
    std::vector<device_buffer<float>> y;
    double outputs = 0;
    for (int rows : c.rows) {
        std::vector<std::uint16_t> h(std::size_t(rows) * c.in);
        for (auto& v : h) v = f32_to_f16(0.02f * n01(g));
        w.emplace_back(std::span<const std::uint16_t>(h));
        y.emplace_back(std::size_t(n_rows) * rows);
        outputs += rows;
    }
    for (std::size_t k = 0; k < c.rows.size(); ++k) a.m[k] = {w[k].data(), c.rows[k], y[k].data(), c.rows[k]};
    a.n_matrices = int(c.rows.size());
    std::vector<float> hx(std::size_t(n_rows) * c.in);
    for (auto& v : hx) v = n01(g);
    const device_buffer<float> x{std::span<const float>(hx)};
    a.x = x.data();
    a.x_stride = c.in;
    a.in = c.in;
    a.n_rows = n_rows;
    kernels::prepare_gemm_f16(current_device());
    kernels::prepare_gemm_f16_tc(current_device());
    const auto t = time_launches(
        [&](int, cudaStream_t s) {
            if (tc)
                kernels::gemm_f16_tc(a, n_rows, s);
            else
                kernels::gemm_f16(a, n_rows, s);
        },
        2, 11, 4);
    const double ops = 2.0 * n_rows * outputs * c.in, peak = fp32_issue_peak();
    for (auto _ : state) state.SetIterationTime(t.median_s);
    state.counters["us"] = t.median_s * 1e6;
    state.counters["TOP/s"] = ops / t.median_s * 1e-12;
    state.counters["peak_TOP/s"] = peak * 1e-12;
    state.counters["pct_peak"] = 100.0 * ops / t.median_s / peak;
}

const int registered = [] {
    const std::vector<bench_case> cases = {
        {"compressors+indexer_proj", 4096, {1024, 1024, 256, 256, 64}},
        {"compressor_ratio128", 4096, {512, 512}},
        {"indexer_q_b", 1024, {8192}},
        {"router", 4096, {256}},
        {"hc_mix", 16384, {24}},
    };
    for (const bool tc : {false, true})
        for (const auto& c : cases)
            for (int n : {1024, 2048}) {
                const std::string name = std::string(tc ? "gemm_f16_tc/" : "gemm_f16/") + c.name + "/rows:" + std::to_string(n);
                benchmark::RegisterBenchmark(name.c_str(), [c, n, tc](benchmark::State& st) { run(st, c, n, tc); })
                    ->UseManualTime()
                    ->Iterations(1);
            }
    return 0;
}();

}  // namespace
}  // namespace ds4::bench
