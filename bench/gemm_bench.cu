// kernels/gemm_q8_0.cuh at the real DeepSeek-V4-Flash shapes for prefill chunks of 256 (a small
// chunk, where the 128-row tile halves the CTA count), 2048 and 4096 rows: int8 TOP/s (2 * rows *
// outputs * in) against the measured mma.sync int8 peak (int8_mma_probe.cu). A row times the
// whole launch, the activation quantization included (gemm_q8_0/...) or the pre-quantized GEMM
// alone (.../prequant); gemm_q8_0_v64/... is the first 64 x 128 kernel
// (gemm_q8_0_variant::tile_64x128) against the pipelined 128 x 128 tile. The weights are one copy: a
// GEMM reads each weight tile once per row tile from L2, so rotation would measure nothing extra;
// the activations are written fresh by the quantization launch.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "bench/int8_mma_probe.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/gemm_q8_0.cuh"
#include "harness/fixtures/gemm_args.hpp"

namespace ds4::bench {
namespace {

struct bench_case {
    std::string name;
    int in;
    std::vector<int> rows;
    int groups = 0;  // out_a: matrix k reads slice k of a pre-quantized row of groups * in
};

// Random codes and scales are fine for timing; correctness is ds4-validate's job.
fixtures::tiled_q8_0 random_tiled(std::mt19937_64& g, int rows, int in) {
    std::vector<q8_0_block> w(std::size_t(rows) * (in / 32));
    for (auto& b : w) {
        b.d = f32_to_f16(2e-4f);
        for (int i = 0; i < 32; i += 8) {
            const std::uint64_t r = g();
            std::memcpy(b.qs + i, &r, 8);
        }
    }
    return fixtures::upload_tiled_q8_0(w, rows, in);
}

void run(benchmark::State& state, const bench_case& c, int n_rows, bool prequant, kernels::gemm_q8_0_variant variant) {
    if (variant == kernels::gemm_q8_0_variant::wgmma_128x64 && !kernels::gemm_q8_0_wgmma_available_on(current_device())) {
        state.SkipWithError("the wgmma kernel needs an sm_90 device and this build's sm_90a code");
        return;
    }
    std::mt19937_64 g(42);
    const int nm = int(c.rows.size());
    const int width = c.groups > 0 ? c.groups * c.in : c.in;
    std::vector<fixtures::tiled_q8_0> w;
    std::vector<device_buffer<float>> y;
    std::vector<const fixtures::tiled_q8_0*> wp;
    std::vector<float*> yp;
    for (int k = 0; k < nm; ++k) {
        w.push_back(random_tiled(g, c.rows[k], c.in));
        y.emplace_back(std::size_t(n_rows) * c.rows[k]);
    }
    for (int k = 0; k < nm; ++k) {
        wp.push_back(&w[std::size_t(k)]);
        yp.push_back(y[std::size_t(k)].data());
    }
    std::normal_distribution<float> n01;
    std::vector<float> hx(std::size_t(n_rows) * width);
    for (auto& v : hx) v = n01(g);
    device_buffer<float> x{std::span<const float>(hx)};
    device_buffer<std::int8_t> aq(std::size_t(n_rows) * width);
    device_buffer<float> ad(std::size_t(n_rows) * width / 32);
    aq.fill_bytes(3);
    ad.fill_bytes(0x3c);
    const auto plan = kernels::gemm_q8_0_plan::make(fixtures::gemm_shape(c.in, c.rows), n_rows, variant);
    device_buffer<std::uint8_t> ws(plan.workspace_bytes());
    kernels::gemm_q8_0_args a = fixtures::gemm_args(wp, yp, x.data(), c.in, n_rows);
    if (prequant || c.groups > 0)
        for (int k = 0; k < nm; ++k) {
            a.m[k].act_qs = aq.data() + std::size_t(c.groups > 0 ? k : 0) * c.in;
            a.m[k].act_d = ad.data() + std::size_t(c.groups > 0 ? k : 0) * c.in / 32;
            a.m[k].act_stride = width;
        }
    kernels::gemm_q8_0_plan::prepare(current_device());
    const auto t = time_launches([&](int, cudaStream_t s) { kernels::gemm_q8_0(plan, a, ws.data(), s); }, 2, 11, 4);
    double outputs = 0;
    for (int r : c.rows) outputs += r;
    report_int8(state, t, 2.0 * n_rows * outputs * c.in);
    state.counters["smem_KB"] = double(plan.smem_bytes()) / 1024.0;
}

const int registered = [] {
    const std::vector<bench_case> cases = {
        {"q_a+kv", 4096, {1024, 512}},
        {"q_b", 1024, {32768}},
        {"out_a_8groups", 4096, {1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024}, 8},
        {"out_b", 8192, {4096}},
        {"shexp_gate+up", 4096, {2048, 2048}},
        {"shexp_down", 2048, {4096}},
        {"output_head", 4096, {129280}},
    };
    using kernels::gemm_q8_0_variant;
    for (auto v : {gemm_q8_0_variant::tile_128x128, gemm_q8_0_variant::tile_64x128, gemm_q8_0_variant::wgmma_128x64})
        for (const auto& c : cases)
            for (int n : {256, 2048, 4096})
                for (bool pre : {false, true}) {
                    if (pre && c.groups > 0) continue;  // out_a is always pre-quantized
                    if (pre && v != gemm_q8_0_variant::tile_128x128) continue;  // the comparison needs one row per shape
                    const char* family = v == gemm_q8_0_variant::tile_64x128    ? "gemm_q8_0_v64/"
                                         : v == gemm_q8_0_variant::wgmma_128x64 ? "gemm_q8_0_wgmma/"
                                                                               : "gemm_q8_0/";
                    const std::string name = std::string(family) + c.name + (pre ? "/prequant" : "") + "/rows:" + std::to_string(n);
                    benchmark::RegisterBenchmark(name.c_str(), [c, n, pre, v](benchmark::State& st) { run(st, c, n, pre, v); })
                        ->UseManualTime()
                        ->Iterations(1);
                }
    return 0;
}();

}  // namespace
}  // namespace ds4::bench
