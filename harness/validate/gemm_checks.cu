// ds4-validate rows for kernels/gemm_q8_0.cuh: the Q8_0 x Q8_0 tensor-core GEMM against
// reference/matvec (one reference matvec per activation row), bitwise. Odd row counts (1, 7, 33,
// 130, 2047), inputs that end inside a pipeline stage and inside a 16-block segment, matrices
// whose rows are not a multiple of the 128-row CTA tile, several matrices per launch,
// pre-quantized grouped inputs (out_a), and a graph captured at the capacity with the live row
// count in device memory. Both kernels (gemm_q8_0: the pipelined 128 x 128 tile;
// gemm_q8_0_v64: the first 64 x 128 kernel, the backend's default) run the odd shapes; the real shapes run the tile kernel.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/gemm_q8_0.cuh"
#include "harness/fixtures/gemm_args.hpp"
#include "harness/validate/checks.hpp"
#include "harness/validate/row_inputs.hpp"
#include "reference/matvec.hpp"

namespace ds4::validate {
namespace {

// Trained-projection-like blocks: F16 scales of either sign around 2e-4, codes over the full
// int8 range (-128 included), one block in 64 with a zero scale.
std::vector<q8_0_block> random_q8_0(std::mt19937_64& g, int rows, int in) {
    std::vector<q8_0_block> w(std::size_t(rows) * (in / 32));
    std::uniform_int_distribution<int> q(-128, 127);
    std::uniform_real_distribution<float> d(1e-4f, 4e-4f);
    for (auto& b : w) {
        b.d = g() % 64 == 0 ? 0 : f32_to_f16(g() & 1 ? d(g) : -d(g));
        for (auto& v : b.qs) v = std::int8_t(q(g));
    }
    return w;
}

// Activations with magnitudes changing every 64 values, and per row one block of exact
// quantization ties (amax 127 makes d = 1, so k + 0.5 are ties for round-half-even).
std::vector<float> gemm_activations(std::mt19937_64& g, int n_rows, int in) {
    std::vector<float> x = spread_values(g, std::size_t(n_rows) * in, 1.0f);
    for (int r = 0; r < n_rows; ++r) {
        float* b = x.data() + std::size_t(r) * in + (g() % (in / 32)) * 32;
        for (int i = 0; i < 32; ++i) b[i] = float(int(g() % 200) - 100) + 0.5f;
        b[0] = 127.0f;
    }
    return x;
}

struct gemm_case {
    std::string name;
    int in;
    std::vector<int> rows;
    int groups = 0;  // > 0: matrix k reads input slice k of a pre-quantized row of groups * in
};

std::string shape_of(const gemm_case& c, int n_rows) {
    std::string s = std::to_string(c.in) + "->";
    for (std::size_t k = 0; k < c.rows.size(); ++k) {
        if (k) s.push_back('+');
        s.append(std::to_string(c.rows[k]));
    }
    s.append(" x");
    s.append(std::to_string(n_rows));
    return s;
}

// Reference rows [0, n_rows) of matrix k, reading x (width `width`) at column offset `off`.
std::vector<float> reference_rows(const std::vector<q8_0_block>& w, int out_rows, int in, const std::vector<float>& x,
                                  int width, int off, int n_rows) {
    std::vector<float> y(std::size_t(n_rows) * out_rows);
    for (int r = 0; r < n_rows; ++r)
        ref::matvec_q8_0(w.data(), x.data() + std::size_t(r) * width + off, in, out_rows, y.data() + std::size_t(r) * out_rows);
    return y;
}

// The split layout quantize_act writes, from the host quantizer.
void quantize_rows(const std::vector<float>& x, int n_rows, int width, std::vector<std::int8_t>& qs, std::vector<float>& d) {
    std::vector<q8_0_act_block> blocks(std::size_t(n_rows) * width / 32);
    quantize_q8_0_act(x.data(), blocks.data(), n_rows * width);
    qs.resize(std::size_t(n_rows) * width);
    d.resize(blocks.size());
    for (std::size_t b = 0; b < blocks.size(); ++b) {
        std::memcpy(qs.data() + b * 32, blocks[b].qs, 32);
        d[b] = blocks[b].d;
    }
}

// One launch at n_rows (capacity n_rows + 5, so rows past the live count exist and must stay
// poisoned), or a graph captured at `capacity` and replayed at each live count of `lives`.
// `variant`: the plan's kernel (here the pipelined 128 x 128 tile unless told, or the first 64 x 128).
check_row run_case(std::mt19937_64& g, const gemm_case& c, int n_rows, const std::vector<int>& lives = {},
                   kernels::gemm_q8_0_variant variant = kernels::gemm_q8_0_variant::tile_128x128) {
    const bool graph = !lives.empty();
    const int capacity = graph ? n_rows : n_rows + 5;
    const int nm = int(c.rows.size());
    const int width = c.groups > 0 ? c.groups * c.in : c.in;
    std::vector<std::vector<q8_0_block>> hw;
    std::vector<fixtures::tiled_q8_0> dw;
    std::vector<device_buffer<float>> dy;
    for (int k = 0; k < nm; ++k) {
        hw.push_back(random_q8_0(g, c.rows[k], c.in));
        dw.push_back(fixtures::upload_tiled_q8_0(hw.back(), c.rows[k], c.in));
        dy.emplace_back(std::size_t(capacity) * c.rows[k]);
    }
    std::vector<const fixtures::tiled_q8_0*> wp;
    std::vector<float*> yp;
    for (int k = 0; k < nm; ++k) {
        wp.push_back(&dw[std::size_t(k)]);
        yp.push_back(dy[std::size_t(k)].data());
    }
    device_buffer<float> dx(std::size_t(capacity) * width);
    device_buffer<std::int8_t> dq(std::size_t(capacity) * width);
    device_buffer<float> dd(std::size_t(capacity) * width / 32);
    const auto plan = kernels::gemm_q8_0_plan::make(fixtures::gemm_shape(c.in, c.rows), capacity, variant);
    device_buffer<std::uint8_t> ws(plan.workspace_bytes());
    kernels::gemm_q8_0_args a = fixtures::gemm_args(wp, yp, dx.data(), c.in, n_rows);
    if (c.groups > 0)
        for (int k = 0; k < nm; ++k) {
            a.m[k].act_qs = dq.data() + std::size_t(k) * c.in;
            a.m[k].act_d = dd.data() + std::size_t(k) * c.in / 32;
            a.m[k].act_stride = width;
        }
    device_count live_count;
    kernels::gemm_q8_0_plan::prepare(current_device());
    std::vector<int> runs = graph ? lives : std::vector<int>{n_rows};
    comparison total;
    std::size_t outside = 0;
    auto body = [&](cudaStream_t s) { kernels::gemm_q8_0(plan, a, ws.data(), s); };
    if (graph) a.live_rows = live_count.get();
    std::optional<replayed_graph> rg;  // captured on the first replay, after the inputs exist
    for (int live : runs) {
        auto x = gemm_activations(g, capacity, width);
        // Idle rows of a replay hold NaN: a live row must not depend on them.
        for (std::size_t i = std::size_t(live) * width; i < x.size(); ++i) x[i] = std::nanf("");
        dx.upload(std::span<const float>(x));
        if (c.groups > 0) {
            std::vector<std::int8_t> qs;
            std::vector<float> d;
            quantize_rows(x, live, width, qs, d);  // the producer quantizes live rows only
            dq.upload(std::span<const std::int8_t>(qs));
            dd.upload(std::span<const float>(d));
        }
        for (auto& y : dy) y.fill_bytes(0xff);
        run_eager_or_replayed(graph, live_count, rg, live, body, "gemm_q8_0");
        for (int k = 0; k < nm; ++k) {
            const auto got = dy[std::size_t(k)].download();
            const auto want = reference_rows(hw[std::size_t(k)], c.rows[k], c.in, x, width,
                                             c.groups > 0 ? k * c.in : 0, live);
            total.add(compare(std::span<const float>(got.data(), want.size()), want));
            outside += written_outside(got, want.size(), got.size(), 0xff);
        }
    }
    total.mismatches += outside;
    std::string note = graph ? "captured at capacity, live rows from device memory:" : "rows past the live count untouched";
    if (graph)
        for (int l : lives) {
            note.push_back(' ');
            note.append(std::to_string(l));
        }
    if (c.groups > 0) note += "; pre-quantized group slices";
    std::string label = c.name;
    label.push_back(' ');
    label.append(shape_of(c, n_rows));
    const std::string family = variant == kernels::gemm_q8_0_variant::tile_64x128    ? "gemm_q8_0_v64"
                               : variant == kernels::gemm_q8_0_variant::wgmma_128x64 ? "gemm_q8_0_wgmma"
                                                                                     : "gemm_q8_0";
    return row_of(graph ? family + "_graph" : family, label, "exact", total, note);
}

}  // namespace

std::vector<check_row> check_gemm(std::uint64_t seed, bool quick) {
    std::mt19937_64 g(seed);
    std::vector<check_row> out;
    // in = 96: 3 blocks, inside the first stage; 544: 17 blocks, one past a segment end; 1056:
    // 33 blocks, a stage and a segment both partial. Row counts off the 32-row tile and the
    // 128-row CTA tile.
    const std::vector<gemm_case> odd = {
        {"odd", 96, {54}},
        {"odd", 544, {97, 33}},
        {"odd", 1056, {300}},
        {"odd-groups", 512, {40, 70, 129}, 3},
    };
    // The three kernels on the same odd cases (the wgmma one where the device runs it).
    std::vector<kernels::gemm_q8_0_variant> variants = {kernels::gemm_q8_0_variant::tile_128x128,
                                                        kernels::gemm_q8_0_variant::tile_64x128};
    const bool wgmma = kernels::gemm_q8_0_wgmma_available_on(current_device());
    if (wgmma) variants.push_back(kernels::gemm_q8_0_variant::wgmma_128x64);
    for (auto v : variants) {
        for (const auto& c : odd)
            for (int n : {1, 7, 33, 130}) out.push_back(run_case(g, c, n, {}, v));
        out.push_back(run_case(g, {"odd", 544, {97, 33}}, 130, {1, 64, 65, 130}, v));
        out.push_back(run_case(g, {"odd-groups", 512, {40, 70}, 2}, 70, {7, 70}, v));
    }
    // The pipelined tile's own boundaries: 128 and 129 rows, 257 rows over three row tiles, an
    // input of 4 blocks (one full stage) and of 20 (a segment end, then one full stage).
    out.push_back(run_case(g, {"tile", 128, {128, 129}}, 128));
    out.push_back(run_case(g, {"tile", 640, {257}}, 129));
    out.push_back(run_case(g, {"tile", 640, {100}}, 257));
    if (!quick) {
        // The real shapes of DeepSeek-V4-Flash; the reference costs rows x outputs x in on the
        // host, so the widest (q_b, the output head) run at 130 rows and the others at 2047.
        const std::vector<gemm_case> real = {
            {"q_a+kv", 4096, {1024, 512}},
            {"out_a(8 groups)", 4096, {1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024}, 8},
            {"out_b", 8192, {4096}},
            {"shexp gate+up", 4096, {2048, 2048}},
            {"shexp down", 2048, {4096}},
        };
        for (const auto& c : real)
            for (int n : {130, 2047}) out.push_back(run_case(g, c, n));
        out.push_back(run_case(g, {"q_b", 1024, {32768}}, 130));
        out.push_back(run_case(g, {"output head", 4096, {129280}}, 130));
        out.push_back(run_case(g, {"q_a+kv", 4096, {1024, 512}}, 2048, {1, 1000, 2048}));
        if (wgmma) {
            // The wgmma kernel at the real shapes the prefill chunk runs (2047 rows; 130 for q_b).
            for (const auto& c : real) out.push_back(run_case(g, c, 2047, {}, kernels::gemm_q8_0_variant::wgmma_128x64));
            out.push_back(run_case(g, {"q_b", 1024, {32768}}, 130, {}, kernels::gemm_q8_0_variant::wgmma_128x64));
        }
    }
    return out;
}

}  // namespace ds4::validate
