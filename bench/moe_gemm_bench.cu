// kernels/moe_gemm.cuh at the DeepSeek-V4-Flash shape (n_embd 4096, n_ff 2048, 256 experts) for
// prefill chunks of 2048 and 4096 rows, top-6 routes drawn uniformly: int8 TOP/s counted as
// 2 * pairs * 3 * n_ff * n_embd (gate, up, down) against the measured mma.sync int8 peak
// (int8_mma_probe.cu). The whole launch sequence is timed (sort, quantizations, slot sum);
// moe_gemm_wgmma rows run gate/up and down on the sm_90a warpgroup-MMA kernels (_gate_up, _down:
// one of them).
// Weights are random bytes (every IQ2_XXS and Q2_K bit pattern is a valid block) with fixed
// finite scales; one copy, the experts' 1.8 GB are far beyond the L2.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "bench/int8_mma_probe.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/moe_gemm.cuh"

namespace ds4::bench {
namespace {

using kernels::moe_slots;

// One expert's random bytes replicated into every expert's slot of the device array.
device_buffer<std::uint8_t> random_experts(std::mt19937_64& g, std::size_t per_expert, int n_expert) {
    std::vector<std::uint8_t> h(per_expert);
    for (std::size_t i = 0; i + 8 <= h.size(); i += 8) {
        const std::uint64_t r = g();
        std::memcpy(h.data() + i, &r, 8);
    }
    device_buffer<std::uint8_t> d(per_expert * n_expert);
    for (int e = 0; e < n_expert; ++e)
        cuda_check(cudaMemcpy(d.data() + per_expert * e, h.data(), per_expert, cudaMemcpyHostToDevice), "upload");
    return d;
}

// wgmma: bit 0 the gate/up, bit 1 the down on the sm_90a warpgroup-MMA kernels; bits 2 and 3 the
// gate/up and the down with the weights decoded into the mma fragments (moe_gemm_*_regs.cuh).
void run(benchmark::State& state, int n_rows, int wgmma) {
    if ((wgmma & 3) != 0 && !kernels::moe_gemm_wgmma_available_on(current_device())) {
        state.SkipWithError("the wgmma gate/up needs an sm_90 device and this build's sm_90a code");
        return;
    }
    const kernels::moe_gemm_shape s{4096, 2048, 256};
    std::mt19937_64 g(42);
    const auto GL = iq2_xxs_tiled_layout::make(s.n_ff, s.n_embd);
    const auto DL = q2_k_tiled_layout::make(s.n_embd, s.n_ff);
    const auto gq = random_experts(g, GL.quant_bytes(), s.n_expert), uq = random_experts(g, GL.quant_bytes(), s.n_expert);
    const auto dq = random_experts(g, DL.quant_bytes(), s.n_expert);
    device_buffer<std::uint16_t> gd(GL.scale_count() * s.n_expert), ud(gd.size());
    device_buffer<std::uint32_t> dd(DL.dd_count() * s.n_expert);
    gd.fill_bytes(0x14);  // F16 0x1414: about 1.1e-3
    ud.fill_bytes(0x14);
    dd.fill_bytes(0x14);
    std::vector<std::int32_t> sel(std::size_t(n_rows) * moe_slots);
    std::vector<int> ids(s.n_expert);
    for (int r = 0; r < n_rows; ++r) {
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), g);
        for (int k = 0; k < moe_slots; ++k) sel[std::size_t(r) * moe_slots + k] = ids[std::size_t(k)];
    }
    std::vector<float> w(sel.size(), 0.25f);
    std::normal_distribution<float> n01;
    std::vector<float> hx(std::size_t(n_rows) * s.n_embd);
    for (auto& v : hx) v = n01(g);
    const device_buffer<std::int32_t> dsel{std::span<const std::int32_t>(sel)};
    const device_buffer<float> dw{std::span<const float>(w)}, dx{std::span<const float>(hx)};
    device_buffer<float> out(std::size_t(n_rows) * s.n_embd);
    auto plan = kernels::moe_gemm_plan::make(s, n_rows);
    plan.set_gate_up_wgmma((wgmma & 1) != 0);
    plan.set_down_wgmma((wgmma & 2) != 0);
    plan.set_gate_up_regs((wgmma & 4) != 0);
    plan.set_down_regs((wgmma & 8) != 0);
    device_buffer<std::uint8_t> ws(plan.workspace_bytes());
    kernels::moe_gemm_args a;
    a.n_rows = n_rows;
    a.xn = dx.data();
    a.x_stride = s.n_embd;
    a.sel = dsel.data();
    a.wts = dw.data();
    a.gate_q = gq.data();
    a.gate_d = gd.data();
    a.up_q = uq.data();
    a.up_d = ud.data();
    a.down_q = dq.data();
    a.down_dd = dd.data();
    a.out = out.data();
    a.out_stride = s.n_embd;
    kernels::moe_gemm_plan::prepare(current_device());
    const auto t = time_launches([&](int, cudaStream_t st) { kernels::moe_gemm(plan, a, ws.data(), st); }, 2, 11, 2);
    report_int8(state, t, 2.0 * n_rows * moe_slots * 3.0 * s.n_ff * s.n_embd);
}

const int registered = [] {
    const char* names[] = {"moe_gemm", "moe_gemm_wgmma_gate_up", "moe_gemm_wgmma_down", "moe_gemm_wgmma", "moe_gemm_regs_gate_up",
                           "moe_gemm_regs_down", "moe_gemm_regs"};
    for (int wg = 0; wg < 7; ++wg)
        for (int n : {1024, 2048, 4096}) {
            const std::string name = std::string(names[wg]) + "/flash/rows:" + std::to_string(n);
            const int mode = wg < 4 ? wg : wg == 4 ? 4 : wg == 5 ? 8 : 12;
            benchmark::RegisterBenchmark(name.c_str(), [n, mode](benchmark::State& st) { run(st, n, mode); })->UseManualTime()->Iterations(1);
        }
    return 0;
}();

}  // namespace
}  // namespace ds4::bench
