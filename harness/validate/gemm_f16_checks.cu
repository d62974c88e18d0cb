// ds4-validate rows for kernels/gemm_f16.cuh: the F16 x F32 chunk projection against
// reference/matvec's f16 row dot (one reference matvec per activation row), bitwise. Odd shapes:
// inputs that end inside a 512-input segment (a lane slot past the end adds 0.0f), below one
// segment, weight rows off the 32-row tile and activation rows off the 24-row tile, several
// matrices per launch, values with signed zeros, infinities and NaN in the products; a graph
// captured at the capacity and replayed at live counts from device memory; the real shapes.
// gemm_f16_tc rows: kernels/gemm_f16_tc.cuh (TF32 tensor cores) under its bound, each output
// within 2^-12 * sum_i |w_i x_i| of the same reference (computed in double on the host), and
// non-finite exactly where the reference is; the note gives the largest error in units of that sum.
// matvec_f16_tc rows: the decode twin (1-16 rows) bitwise against gemm_f16_tc on the same rows
// placed at another offset of a larger launch (so at other positions of the GEMM's tiles).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ds4/core/device_buffer.hpp"
#include "ds4/core/half.hpp"
#include "ds4/kernels/gemm_f16.cuh"
#include "ds4/kernels/gemm_f16_tc.cuh"
#include "ds4/kernels/matvec_f16_tc.cuh"
#include "harness/validate/checks.hpp"
#include "harness/validate/row_inputs.hpp"
#include "reference/matvec.hpp"

namespace ds4::validate {
namespace {

struct f16_case {
    std::string name;
    int in;
    std::vector<int> rows;
    bool specials = false;  // a few weights and activations are +-0, +-inf or NaN
};

std::string shape_of(const f16_case& c, int n_rows) {
    std::string s = std::to_string(c.in) + "->";
    for (std::size_t k = 0; k < c.rows.size(); ++k) {
        if (k) s.push_back('+');
        s.append(std::to_string(c.rows[k]));
    }
    s.append(" x");
    s.append(std::to_string(n_rows));
    return s;
}

// Weights like a trained projection (normal, sigma 0.02, as F16).
std::vector<std::uint16_t> random_f16(std::mt19937_64& g, std::size_t n, bool specials) {
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<std::uint16_t> w(n);
    for (auto& v : w) v = f32_to_f16(0.02f * n01(g));
    if (specials)
        for (int i = 0; i < 8 && n > 0; ++i) {
            const std::uint16_t codes[4] = {0x8000u, 0x0000u, 0x7c00u, 0xfc00u};  // -0, +0, +inf, -inf
            w[g() % n] = codes[g() % 4];
        }
    return w;
}

// One launch at n_rows (capacity n_rows + 3: rows past the live count must stay poisoned), or a
// graph captured at `capacity` and replayed at each count of `lives`.
// The tensor-core kernel's bound, in units of sum_i |w_i x_i|.
constexpr double tc_bound = 1.0 / 4096.0;

check_row run_case(std::mt19937_64& g, const f16_case& c, int n_rows, const std::vector<int>& lives = {},
                   bool tc = false) {
    const bool graph = !lives.empty();
    const int capacity = graph ? n_rows : n_rows + 3;
    const int nm = int(c.rows.size());
    const int x_stride = c.in + 4;  // rows not packed: the stride is honoured
    std::vector<std::vector<std::uint16_t>> hw;
    std::vector<device_buffer<std::uint16_t>> dw;
    std::vector<device_buffer<float>> dy;
    kernels::gemm_f16_args a;
    a.in = c.in;
    a.x_stride = x_stride;
    a.n_matrices = nm;
    for (int k = 0; k < nm; ++k) {
        hw.push_back(random_f16(g, std::size_t(c.rows[k]) * c.in, c.specials));
        dw.emplace_back(std::span<const std::uint16_t>(hw.back()));
        dy.emplace_back(std::size_t(capacity) * (c.rows[k] + 1));
    }
    for (int k = 0; k < nm; ++k)
        a.m[k] = {dw[std::size_t(k)].data(), c.rows[k], dy[std::size_t(k)].data(), c.rows[k] + 1};
    device_buffer<float> dx(std::size_t(capacity) * x_stride);
    device_count live_count;
    kernels::prepare_gemm_f16(current_device());
    kernels::prepare_gemm_f16_tc(current_device());
    if (graph) a.live_rows = live_count.get();
    auto body = [&](cudaStream_t s) {
        if (tc)
            kernels::gemm_f16_tc(a, capacity, s);
        else
            kernels::gemm_f16(a, capacity, s);
    };
    std::optional<replayed_graph> rg;
    comparison total;
    std::size_t outside = 0;
    double worst = 0;  // tc: the largest |got - want| / sum |w x|
    for (int live : graph ? lives : std::vector<int>{n_rows}) {
        std::vector<float> x = spread_values(g, std::size_t(capacity) * x_stride, 1.0f);
        if (c.specials)
            for (int i = 0; i < 6; ++i) {
                const float v[3] = {-0.0f, std::numeric_limits<float>::infinity(), std::nanf("")};
                x[std::size_t(g() % std::uint64_t(live)) * x_stride + g() % std::uint64_t(c.in)] = v[g() % 3];
            }
        for (std::size_t i = std::size_t(live) * x_stride; i < x.size(); ++i) x[i] = std::nanf("");
        dx.upload(std::span<const float>(x));
        a.x = dx.data();
        a.n_rows = live;
        for (auto& y : dy) y.fill_bytes(0xff);
        run_eager_or_replayed(graph, live_count, rg, live, body, "gemm_f16");
        for (int k = 0; k < nm; ++k) {
            const int rows = c.rows[k], ys = rows + 1;
            const auto got = dy[std::size_t(k)].download();
            std::vector<float> want(std::size_t(live) * rows), have(want.size());
            for (int r = 0; r < live; ++r) {
                ref::matvec_f16(hw[std::size_t(k)].data(), x.data() + std::size_t(r) * x_stride, c.in, rows,
                                want.data() + std::size_t(r) * rows);
                for (int o = 0; o < rows; ++o) have[std::size_t(r) * rows + o] = got[std::size_t(r) * ys + o];
                outside += written_outside(got, std::size_t(r) * ys + rows, std::size_t(r + 1) * ys, 0xff);
            }
            if (!tc) {
                total.add(compare(std::span<const float>(have), want));
            } else {
                comparison cmp = compare(std::span<const float>(have), want, 1e30, 0);
                cmp.special_mismatches = 0;
                for (int r = 0; r < live; ++r)
                    for (int o = 0; o < rows; ++o) {
                        const std::size_t i = std::size_t(r) * rows + o;
                        if (!std::isfinite(want[i]) || !std::isfinite(have[i])) {
                            cmp.special_mismatches += std::isfinite(want[i]) != std::isfinite(have[i]);
                            continue;
                        }
                        double mag = 0;
                        const std::uint16_t* w = hw[std::size_t(k)].data() + std::size_t(o) * c.in;
                        const float* xr = x.data() + std::size_t(r) * x_stride;
                        for (int j = 0; j < c.in; ++j) mag += std::fabs(double(f16_to_f32(w[j])) * double(xr[j]));
                        const double err = std::fabs(double(have[i]) - double(want[i]));
                        if (mag > 0) worst = std::max(worst, err / mag);
                        if (err > tc_bound * mag) ++cmp.mismatches;
                    }
                total.add(cmp);
            }
            outside += written_outside(got, std::size_t(live) * ys, got.size(), 0xff);
        }
    }
    total.mismatches += outside;
    std::string note = graph ? "captured at capacity, live rows from device memory:" : "rows past the live count untouched";
    if (graph)
        for (int l : lives) {
            note.push_back(' ');
            note.append(std::to_string(l));
        }
    if (c.specials) note += "; +-0, +-inf, NaN among the inputs";
    if (tc) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "; max |err| / sum|wx| = %.3g", worst);
        note += buf;
    }
    std::string label = c.name;
    label.push_back(' ');
    label.append(shape_of(c, n_rows));
    const char* kernel = tc ? (graph ? "gemm_f16_tc_graph" : "gemm_f16_tc") : graph ? "gemm_f16_graph" : "gemm_f16";
    return row_of(kernel, label, tc ? "2^-12 sum|wx|" : "exact", total, note);
}

// n rows through matvec_f16_tc, and the same rows as rows [at, at + n) of a `total`-row
// gemm_f16_tc launch: every output bitwise equal.
check_row run_twin(std::mt19937_64& g, const f16_case& c, int n, int at, int total) {
    const int nm = int(c.rows.size()), x_stride = c.in + 4;
    std::vector<std::vector<std::uint16_t>> hw;
    std::vector<device_buffer<std::uint16_t>> dw;
    std::vector<device_buffer<float>> y_mv, y_gemm;
    kernels::gemm_f16_args mv, gm;
    mv.in = gm.in = c.in;
    mv.x_stride = gm.x_stride = x_stride;
    mv.n_matrices = gm.n_matrices = nm;
    for (int k = 0; k < nm; ++k) {
        hw.push_back(random_f16(g, std::size_t(c.rows[k]) * c.in, c.specials));
        dw.emplace_back(std::span<const std::uint16_t>(hw.back()));
        y_mv.emplace_back(std::size_t(n) * c.rows[k]);
        y_gemm.emplace_back(std::size_t(total) * c.rows[k]);
    }
    for (int k = 0; k < nm; ++k) {
        mv.m[k] = {dw[std::size_t(k)].data(), c.rows[k], y_mv[std::size_t(k)].data(), c.rows[k]};
        gm.m[k] = {dw[std::size_t(k)].data(), c.rows[k], y_gemm[std::size_t(k)].data(), c.rows[k]};
    }
    const std::vector<float> x = spread_values(g, std::size_t(total) * x_stride, 1.0f);
    const device_buffer<float> dx{std::span<const float>(x)};
    mv.x = dx.data() + std::size_t(at) * x_stride;
    mv.n_rows = n;
    gm.x = dx.data();
    gm.n_rows = total;
    kernels::prepare_gemm_f16_tc(current_device());
    kernels::prepare_matvec_f16_tc(current_device(), c.in);
    kernels::matvec_f16_tc(mv, nullptr);
    kernels::gemm_f16_tc(gm, total, nullptr);
    cuda_check(cudaDeviceSynchronize(), "matvec_f16_tc twin");
    comparison total_cmp;
    for (int k = 0; k < nm; ++k) {
        const auto got = y_mv[std::size_t(k)].download(), all = y_gemm[std::size_t(k)].download();
        const std::vector<float> want(all.begin() + std::ptrdiff_t(at) * c.rows[k],
                                      all.begin() + std::ptrdiff_t(at + n) * c.rows[k]);
        total_cmp.add(compare(std::span<const float>(got), want));
    }
    std::string label = c.name;
    label.push_back(' ');
    label.append(shape_of(c, n));
    return row_of("matvec_f16_tc", label, "== gemm_f16_tc", total_cmp,
                  "rows at " + std::to_string(at) + " of a " + std::to_string(total) + "-row GEMM");
}

}  // namespace

std::vector<check_row> check_gemm_f16(std::uint64_t seed, bool quick) {
    std::mt19937_64 g(seed);
    std::vector<check_row> out;
    // in = 48: one partial segment (3 lane slots); 1040: two segments and one slot; 272: 17 slots.
    const std::vector<f16_case> odd = {
        {"odd", 48, {54}},
        {"odd", 1040, {97, 24}},
        {"odd", 272, {33, 1, 70}},
        {"specials", 1040, {40}, true},
    };
    for (const auto& c : odd)
        for (int n : {1, 7, 17, 33, 130}) out.push_back(run_case(g, c, n));
    out.push_back(run_case(g, {"odd", 1040, {97, 24}}, 130, {1, 16, 17, 130}));
    // The tensor-core kernel (in a multiple of 32): one step; a segment and one step; two
    // segments and one step with weight rows off the 128-row tile; activation rows off its
    // 64-row tile; specials; a replayed graph.
    const std::vector<f16_case> tc_odd = {
        {"odd", 32, {54}},
        {"odd", 544, {97, 24}},
        {"odd", 1056, {33, 1, 130}},
        {"specials", 544, {40}, true},
    };
    for (const auto& c : tc_odd)
        for (int n : {1, 7, 17, 65, 130}) out.push_back(run_case(g, c, n, {}, true));
    out.push_back(run_case(g, {"odd", 1056, {97, 24}}, 130, {1, 16, 65, 130}, true));
    // The decode twin against the GEMM, rows placed off the GEMM's 16-row mma tiles and 64-row CTAs.
    for (const auto& c : tc_odd)
        for (const auto& [n, at] : std::vector<std::pair<int, int>>{{1, 0}, {1, 77}, {5, 9}, {16, 40}, {16, 113}})
            out.push_back(run_twin(g, c, n, at, 130));
    if (!quick) {
        // The real chunk projections of DeepSeek-V4-Flash (the reference costs rows x outputs x in
        // on the host: 130 rows, and 1024 for the narrowest).
        const std::vector<f16_case> real = {
            {"compressors+indexer proj", 4096, {1024, 1024, 256, 256, 64}},
            {"compressor kv+gate (ratio 128)", 4096, {512, 512}},
            {"indexer q_b", 1024, {8192}},
        };
        for (const auto& c : real) out.push_back(run_case(g, c, 130));
        out.push_back(run_case(g, {"indexer proj", 4096, {64}}, 1024));
        for (const auto& c : real) out.push_back(run_case(g, c, 130, {}, true));
        out.push_back(run_case(g, {"router", 4096, {256}}, 130, {}, true));
        out.push_back(run_case(g, {"hc mix", 16384, {24}}, 130, {}, true));
        for (const auto& c : real)
            for (int n : {1, 16}) out.push_back(run_twin(g, c, n, 37, 130));
    }
    return out;
}

}  // namespace ds4::validate
