// ds4-validate rows for kernels/moe_gemm.cuh: the grouped prefill MoE (routed experts) against
// reference/moe's moe_routed for the same route, bitwise. Odd row counts (1, 7, 33, 130), experts
// with no pair (routes confined to some experts), one expert named by many rows, hash-style
// routes that name one expert in two slots of a row, and a graph replayed at other live counts.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ds4/core/device_buffer.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/moe_gemm.cuh"
#include "harness/validate/checks.hpp"
#include "harness/validate/row_inputs.hpp"
#include "reference/moe.hpp"

namespace ds4::validate {
namespace {

using kernels::moe_slots;

struct gemm_moe_case {
    std::string name;
    kernels::moe_gemm_shape shape;
    int n_used_experts;  // routes pick among experts [0, n_used_experts); the rest get no pair
    bool hash = false;   // slot 1 repeats slot 0's expert on every third row
    bool crowd = false;  // every row names expert 0 in slot 0
    bool gate_up_wgmma = false, down_wgmma = false;  // on the sm_90a warpgroup-MMA kernels
    bool gate_up_regs = false, down_regs = false;    // decoded into the mma fragments
};

template <class T>
device_buffer<T> up(const std::vector<T>& v) {
    return device_buffer<T>(std::span<const T>(v));
}

// Random valid Q2_K blocks (every byte pattern is valid) with d, dmin of either magnitude.
std::vector<q2_k_block> random_q2_k_blocks(std::mt19937_64& g, std::size_t n) {
    std::vector<q2_k_block> v(n);
    std::uniform_real_distribution<float> d(1e-3f, 3e-3f);
    for (auto& b : v) {
        for (int i = 0; i < 16; i += 8) {
            const std::uint64_t r = g();
            std::memcpy(b.scales + i, &r, 8);
        }
        for (int i = 0; i < 64; i += 8) {
            const std::uint64_t r = g();
            std::memcpy(b.qs + i, &r, 8);
        }
        b.d = f32_to_f16(d(g));
        b.dmin = f32_to_f16(d(g));
    }
    return v;
}

check_row run_case(std::mt19937_64& g, const gemm_moe_case& c, int n_rows, const std::vector<int>& lives = {}) {
    const auto& s = c.shape;
    const bool graph = !lives.empty();
    const int capacity = graph ? n_rows : n_rows + 3;
    const int ne = c.n_used_experts, nb_in = s.n_embd / 256, nb_ff = s.n_ff / 256;
    // Host weights for the experts routes can name; the device arrays are as long.
    std::vector<iq2_xxs_block> gate(std::size_t(ne) * s.n_ff * nb_in), upw(gate.size());
    std::uint64_t state = g();
    const float d = 0.02f / float(iq2_xxs_random_rms(1.0f));
    fill_random_iq2_xxs(state, gate.data(), gate.size(), d);
    fill_random_iq2_xxs(state, upw.data(), upw.size(), d);
    const std::vector<q2_k_block> down = random_q2_k_blocks(g, std::size_t(ne) * s.n_embd * nb_ff);
    const auto GL = iq2_xxs_tiled_layout::make(s.n_ff, s.n_embd);
    const auto DL = q2_k_tiled_layout::make(s.n_embd, s.n_ff);
    std::vector<std::uint8_t> gq(GL.quant_bytes() * ne), uq(gq.size()), dq(DL.quant_bytes() * ne);
    std::vector<std::uint16_t> gd(GL.scale_count() * ne), ud(gd.size());
    std::vector<std::uint32_t> ddd(DL.dd_count() * ne);
    for (int e = 0; e < ne; ++e) {
        repack_iq2_xxs(GL, gate.data() + std::size_t(e) * s.n_ff * nb_in, gq.data() + e * GL.quant_bytes(),
                       gd.data() + e * GL.scale_count());
        repack_iq2_xxs(GL, upw.data() + std::size_t(e) * s.n_ff * nb_in, uq.data() + e * GL.quant_bytes(),
                       ud.data() + e * GL.scale_count());
        repack_q2_k(DL, down.data() + std::size_t(e) * s.n_embd * nb_ff, dq.data() + e * DL.quant_bytes(),
                    ddd.data() + e * DL.dd_count());
    }
    const auto d_gq = up(gq), d_uq = up(uq), d_dq = up(dq);
    const auto d_gd = up(gd), d_ud = up(ud);
    const auto d_dd = up(ddd);

    auto plan = kernels::moe_gemm_plan::make(s, capacity);
    plan.set_gate_up_wgmma(c.gate_up_wgmma);
    plan.set_down_wgmma(c.down_wgmma);
    plan.set_gate_up_regs(c.gate_up_regs);
    plan.set_down_regs(c.down_regs);
    device_buffer<std::uint8_t> ws(plan.workspace_bytes());
    device_buffer<float> dx(std::size_t(capacity) * s.n_embd), dout(std::size_t(capacity) * s.n_embd);
    device_buffer<std::int32_t> dsel(std::size_t(capacity) * moe_slots);
    device_buffer<float> dw(std::size_t(capacity) * moe_slots);
    device_count live_count;
    kernels::moe_gemm_args a;
    a.n_rows = n_rows;
    a.live_rows = graph ? live_count.get() : nullptr;
    a.xn = dx.data();
    a.x_stride = s.n_embd;
    a.sel = dsel.data();
    a.wts = dw.data();
    a.gate_q = d_gq.data();
    a.gate_d = d_gd.data();
    a.up_q = d_uq.data();
    a.up_d = d_ud.data();
    a.down_q = d_dq.data();
    a.down_dd = d_dd.data();
    a.out = dout.data();
    a.out_stride = s.n_embd;
    kernels::moe_gemm_plan::prepare(current_device());
    auto body = [&](cudaStream_t st) { kernels::moe_gemm(plan, a, ws.data(), st); };
    std::optional<replayed_graph> rg;

    comparison total;
    std::size_t outside = 0;
    for (int live : graph ? lives : std::vector<int>{n_rows}) {
        // Activations with outliers (the clamps at +-10 then bite), routes and weights.
        std::vector<float> x = spread_values(g, std::size_t(capacity) * s.n_embd, 1.0f);
        for (int r = 0; r < capacity; ++r) x[std::size_t(r) * s.n_embd + g() % s.n_embd] = 400.0f;
        std::vector<std::int32_t> sel(std::size_t(capacity) * moe_slots);
        std::vector<float> w(sel.size());
        std::uniform_real_distribution<float> wd(0.05f, 0.6f);
        std::vector<int> ids(ne);
        for (int r = 0; r < capacity; ++r) {
            std::iota(ids.begin(), ids.end(), 0);
            std::shuffle(ids.begin(), ids.end(), g);
            if (c.crowd) std::iter_swap(ids.begin(), std::find(ids.begin(), ids.end(), 0));
            for (int k = 0; k < moe_slots; ++k) {
                sel[std::size_t(r) * moe_slots + k] = ids[std::size_t(k)];
                w[std::size_t(r) * moe_slots + k] = wd(g);
            }
            if (c.hash && r % 3 == 0) sel[std::size_t(r) * moe_slots + 1] = sel[std::size_t(r) * moe_slots];
        }
        dx.upload(std::span<const float>(x));
        dsel.upload(std::span<const std::int32_t>(sel));
        dw.upload(std::span<const float>(w));
        dout.fill_bytes(0xff);
        run_eager_or_replayed(graph, live_count, rg, live, body, "moe_gemm");
        const auto got = dout.download();
        std::vector<float> want(std::size_t(live) * s.n_embd);
        for (int r = 0; r < live; ++r) {
            ref::moe_route route;
            route.n_used = moe_slots;
            for (int k = 0; k < moe_slots; ++k) {
                route.expert[k] = sel[std::size_t(r) * moe_slots + k];
                route.weight[k] = w[std::size_t(r) * moe_slots + k];
            }
            ref::moe_routed(gate.data(), upw.data(), down.data(), route, x.data() + std::size_t(r) * s.n_embd, s.n_embd,
                            s.n_ff, 10.0f, want.data() + std::size_t(r) * s.n_embd);
        }
        total.add(compare(std::span<const float>(got.data(), want.size()), want));
        outside += written_outside(got, want.size(), got.size(), 0xff);
    }
    total.mismatches += outside;
    std::string shape = std::to_string(s.n_embd);
    shape.push_back('/');
    shape.append(std::to_string(s.n_ff));
    shape.append(" experts ");
    shape.append(std::to_string(ne));
    shape.push_back('/');
    shape.append(std::to_string(s.n_expert));
    shape.append(" x");
    shape.append(std::to_string(n_rows));
    std::string label = c.name;
    label.push_back(' ');
    label.append(shape);
    std::string note = graph ? "captured at capacity, live rows from device memory:" : "rows past the live count untouched";
    for (int l : lives) {
        note.push_back(' ');
        note.append(std::to_string(l));
    }
    const char* kernels = c.gate_up_wgmma ? (c.down_wgmma ? "moe_gemm_wgmma" : "moe_gemm_wgmma_gate_up")
                          : c.gate_up_regs ? (c.down_regs ? "moe_gemm_regs" : "moe_gemm_regs_gate_up")
                          : c.down_regs    ? "moe_gemm_regs_down"
                                           : (c.down_wgmma ? "moe_gemm_wgmma_down" : "moe_gemm");
    return row_of(std::string(kernels) + (graph ? "_graph" : ""), label, "exact", total, note);
}

}  // namespace

std::vector<check_row> check_moe_gemm(std::uint64_t seed, bool quick) {
    std::mt19937_64 g(seed);
    std::vector<check_row> out;
    const kernels::moe_gemm_shape small{512, 512, 16};
    const std::vector<gemm_moe_case> odd = {
        {"top6", small, 12},             // experts 12..15 get no pair
        {"hash", small, 16, true},       // a row naming one expert twice
        {"crowd", small, 9, false, true},  // expert 0 in every row: its group spans several 64-pair items
    };
    // The mma.sync kernels everywhere; sm_90a's warpgroup-MMA kernels where the device runs them
    // (the same cases and contract; each alone once, to tell a failure's kernel).
    std::vector<bool> wgmma = {false};
    if (kernels::moe_gemm_wgmma_available_on(current_device())) wgmma.push_back(true);
    for (const bool wg : wgmma) {
        for (auto c : odd) {
            c.gate_up_wgmma = c.down_wgmma = wg;
            for (int n : {1, 7, 33, 130}) out.push_back(run_case(g, c, n));
        }
        out.push_back(run_case(g, {"top6", small, 12, false, false, wg, wg}, 130, {1, 64, 130}));
        if (!quick) {
            // The flash shape, routes confined to 40 of the 256 experts (the host holds their weights only).
            const kernels::moe_gemm_shape flash{4096, 2048, 256};
            out.push_back(run_case(g, {"flash", flash, 40, true, false, wg, wg}, 33));  // the reference costs ~150 M MAC per row
        }
    }
    if (wgmma.size() > 1) {
        out.push_back(run_case(g, {"top6", small, 12, false, false, true, false}, 33));
        out.push_back(run_case(g, {"top6", small, 12, false, false, false, true}, 33));
    }
    // Gate/up and down decoded into the mma fragments: the same cases (any device), then each alone.
    for (auto c : odd) {
        c.gate_up_regs = c.down_regs = true;
        for (int n : {1, 7, 33, 130}) out.push_back(run_case(g, c, n));
    }
    out.push_back(run_case(g, {"top6", small, 12, false, false, false, false, true, true}, 130, {1, 64, 130}));
    if (!quick) out.push_back(run_case(g, {"flash", {4096, 2048, 256}, 40, true, false, false, false, true, true}, 33));
    out.push_back(run_case(g, {"crowd", small, 9, false, true, false, false, true, false}, 130));
    out.push_back(run_case(g, {"crowd", small, 9, false, true, false, false, false, true}, 130));
    return out;
}

}  // namespace ds4::validate
