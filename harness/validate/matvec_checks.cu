// ds4-validate rows for kernels/matvec.cuh: Q8_0 (in-kernel and pre-quantized activations) and
// F16, 1..16 rows, multi-matrix launches, split and whole-row plans, matrices reading their own
// column slices of x, and the folded RMSNorm, against reference/matvec and reference/norm_rope.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ds4/core/cuda_graph.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/matvec.cuh"
#include "harness/fixtures/matvec_args.hpp"
#include "harness/validate/checks.hpp"
#include "reference/matvec.hpp"
#include "reference/norm_rope.hpp"

namespace ds4::validate {
namespace {

using kernels::matvec_format;

struct host_matrix {
    int rows = 0, in = 0;
    std::vector<q8_0_block> q8;    // GGUF layout
    std::vector<std::uint16_t> f16;
};

// Weights like a trained projection: F16 scales around 2e-4 (RMS ~0.02 after x 127/sqrt(3)),
// int8 codes over the full range; F16 values normal with sigma 0.02.
host_matrix random_matrix(std::mt19937_64& g, matvec_format f, int rows, int in) {
    host_matrix m;
    m.rows = rows;
    m.in = in;
    std::normal_distribution<float> n01(0.0f, 1.0f);
    if (f == matvec_format::q8_0) {
        m.q8.resize(std::size_t(rows) * (in / 32));
        std::uniform_int_distribution<int> q(-128, 127);
        std::uniform_real_distribution<float> d(1e-4f, 4e-4f);
        for (auto& b : m.q8) {
            b.d = f32_to_f16(g() & 1 ? d(g) : -d(g));
            for (auto& v : b.qs) v = std::int8_t(q(g));
        }
    } else {
        m.f16.resize(std::size_t(rows) * in);
        for (auto& v : m.f16) v = f32_to_f16(0.02f * n01(g));
    }
    return m;
}

// Activations with a realistic spread: per-row scale, a few large outliers, and exact
// quantization ties (values at k + 0.5 steps of a block's scale) that test round-half-even.
std::vector<float> random_activations(std::mt19937_64& g, int n_rows, int in) {
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> x(std::size_t(n_rows) * in);
    for (int r = 0; r < n_rows; ++r) {
        const float s = std::ldexp(1.0f, int(g() % 7) - 3);
        for (int i = 0; i < in; ++i) x[std::size_t(r) * in + i] = s * n01(g);
        x[std::size_t(r) * in + g() % in] = 40.0f * s;
        // A block whose amax is 127 makes d = 1 exactly: then x = k + 0.5 are exact ties.
        const int b = int(g() % (in / 32));
        for (int i = 0; i < 32; ++i) x[std::size_t(r) * in + b * 32 + i] = float(int(g() % 200) - 100) + 0.5f;
        x[std::size_t(r) * in + b * 32] = 127.0f;
    }
    return x;
}

struct device_matrix {
    device_buffer<std::uint8_t> quants;
    device_buffer<std::uint16_t> scales, halves;
    device_buffer<float> y;
};

device_matrix upload(const host_matrix& h, matvec_format f, int capacity) {
    device_matrix d;
    if (f == matvec_format::q8_0) {
        const auto L = q8_0_tiled_layout::make(h.rows, h.in);
        std::vector<std::uint8_t> q(L.quant_bytes());
        std::vector<std::uint16_t> s(L.scale_count());
        repack_q8_0(L, h.q8.data(), q.data(), s.data());
        d.quants = device_buffer<std::uint8_t>(std::span<const std::uint8_t>(q));
        d.scales = device_buffer<std::uint16_t>(std::span<const std::uint16_t>(s));
    } else {
        d.halves = device_buffer<std::uint16_t>(std::span<const std::uint16_t>(h.f16));
    }
    d.y = device_buffer<float>(std::size_t(capacity) * h.rows);
    d.y.fill_bytes(0xff);  // NaN poison: an unwritten output fails the comparison
    return d;
}

std::vector<float> reference(const host_matrix& h, matvec_format f, const std::vector<float>& x, int n_rows) {
    std::vector<float> y(std::size_t(n_rows) * h.rows);
    for (int r = 0; r < n_rows; ++r) {
        const float* xr = x.data() + std::size_t(r) * h.in;
        if (f == matvec_format::q8_0)
            ref::matvec_q8_0(h.q8.data(), xr, h.in, h.rows, y.data() + std::size_t(r) * h.rows);
        else
            ref::matvec_f16(h.f16.data(), xr, h.in, h.rows, y.data() + std::size_t(r) * h.rows);
    }
    return y;
}

struct launch_case {
    std::string name;
    matvec_format format;
    int in;
    std::vector<int> rows;  // one entry per matrix sharing the input
    bool prequant = false;  // each matrix reads its own pre-quantized input (out_a groups)
    // Matrix k reads columns [x_cols[k], x_cols[k] + in) of a wider x (out_a's groups on o);
    // empty: every matrix reads x whole.
    std::vector<int> x_cols = {};
    bool norm = false;  // the launch folds x's RMSNorm (q_a_norm before q_b)
    int f16_form = 0;   // F16: the kernel's form (kernels::f16_form); 0 = the default

    int x_width() const {
        int w = in;
        for (int c : x_cols) w = std::max(w, c + in);
        return w;
    }
    int x_col(int k) const { return x_cols.empty() ? 0 : x_cols[std::size_t(k)]; }
};

// An RMSNorm weight like a trained one: around 1, never zero.
std::vector<float> random_norm_weight(std::mt19937_64& g, int n) {
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    auto w = std::vector<float>(std::size_t(n));
    for (auto& v : w) v = g() & 1 ? u(g) : -u(g);
    return w;
}

// Matrix k's input rows as the reference sees them: its column slice of x, normalised by
// reference rms_norm when the case folds the norm.
std::vector<float> matrix_input(const launch_case& c, const std::vector<float>& x, int k, int n_rows,
                                const std::vector<float>& norm_w) {
    const int W = c.x_width();
    std::vector<float> in(std::size_t(n_rows) * c.in);
    for (int r = 0; r < n_rows; ++r) {
        const float* src = x.data() + std::size_t(r) * W + c.x_col(k);
        float* dst = in.data() + std::size_t(r) * c.in;
        if (c.norm)
            ref::rms_norm(src, norm_w.data(), c.in, 1e-6f, dst);
        else
            std::copy(src, src + c.in, dst);
    }
    return in;
}

using fixtures::sm_count;

// The launch over the case's matrices, reading x.
// With the case's column slices and, when it folds the norm, its weight (norm_w) and the
// normalised input's destination (x_normed, may be null).
kernels::matvec_launch launch_over(const launch_case& c, const std::vector<device_matrix>& dm, const float* x,
                                   int n_rows, const float* norm_w = nullptr, float* x_normed = nullptr) {
    std::vector<fixtures::matvec_operand> ms;
    for (std::size_t k = 0; k < dm.size(); ++k)
        ms.push_back({c.format == matvec_format::q8_0 ? static_cast<const void*>(dm[k].quants.data())
                                                      : static_cast<const void*>(dm[k].halves.data()),
                      dm[k].scales.data(), dm[k].y.data(), c.rows[k]});
    kernels::matvec_launch a = fixtures::matvec_args(c.format, x, c.in, n_rows, ms);
    a.x_stride = c.x_width();
    for (std::size_t k = 0; k < dm.size(); ++k) a.m[k].x_col = c.x_col(int(k));
    a.f16_form = c.f16_form;
    if (c.norm) {
        a.norm_weight = norm_w;
        a.norm_eps = 1e-6f;
        a.x_normed = x_normed;
    }
    return a;
}

// The case's matrices, random, on the host and (outputs for `capacity` rows) on the device.
struct case_matrices {
    std::vector<host_matrix> host;
    std::vector<device_matrix> dev;
    case_matrices(std::mt19937_64& g, const launch_case& c, int capacity) {
        for (int rows : c.rows) {
            host.push_back(random_matrix(g, c.format, rows, c.in));
            dev.push_back(upload(host.back(), c.format, capacity));
        }
    }
};

std::vector<check_row> run_case(std::mt19937_64& g, const launch_case& c, int n_rows) {
    const int capacity = kernels::matvec_capacity_for(n_rows);
    const int nm = int(c.rows.size());
    case_matrices mats(g, c, capacity);
    const std::vector<host_matrix>& hm = mats.host;
    std::vector<device_matrix>& dm = mats.dev;
    // Shared input, or one input per matrix (pre-quantized in the split activation layout).
    std::vector<std::vector<float>> xs(c.prequant ? nm : 1);
    for (auto& x : xs) x = random_activations(g, capacity, c.x_width());
    device_buffer<float> dx{std::span<const float>(xs[0])};
    const std::vector<float> norm_w = c.norm ? random_norm_weight(g, c.in) : std::vector<float>{};
    device_buffer<float> d_norm_w(std::max<std::size_t>(norm_w.size(), 1)), d_normed(xs[0].size());
    if (c.norm) d_norm_w.upload(std::span<const float>(norm_w));
    std::vector<device_buffer<std::int8_t>> aq;
    std::vector<device_buffer<float>> ad;
    if (c.prequant) {
        for (int k = 0; k < nm; ++k) {
            std::vector<q8_0_act_block> blocks(std::size_t(capacity) * c.in / 32);
            quantize_q8_0_act(xs[k].data(), blocks.data(), capacity * c.in);
            std::vector<std::int8_t> qs(std::size_t(capacity) * c.in);
            std::vector<float> ds(blocks.size());
            for (std::size_t b = 0; b < blocks.size(); ++b) {
                std::memcpy(qs.data() + b * 32, blocks[b].qs, 32);
                ds[b] = blocks[b].d;
            }
            aq.emplace_back(std::span<const std::int8_t>(qs));
            ad.emplace_back(std::span<const float>(ds));
        }
    }

    kernels::matvec_launch a = launch_over(c, dm, dx.data(), n_rows, d_norm_w.data(), d_normed.data());
    for (int k = 0; k < nm; ++k) {
        auto& m = a.m[k];
        if (c.prequant) {
            m.act_qs = aq[k].data();
            m.act_d = ad[k].data();
            m.act_stride = c.in;
        }
    }
    const int sms = sm_count();
    const fixtures::matvec_scratch scratch(kernels::plan_matvec(a, capacity, sms));
    const kernels::matvec_workspace ws = scratch.ws();
    // Twice: the second launch proves the kernel left its counters at zero (graph replay).
    for (int rep = 0; rep < 2; ++rep) {
        for (auto& d : dm) d.y.fill_bytes(0xff);
        d_normed.fill_bytes(0xff);
        kernels::launch_matvec(a, capacity, ws, sms, nullptr);
        cuda_check(cudaDeviceSynchronize(), "matvec");
    }

    std::vector<check_row> rows;
    comparison total;
    for (int k = 0; k < nm; ++k) {
        const auto got = dm[k].y.download();
        const auto input = matrix_input(c, xs[c.prequant ? k : 0], k, n_rows, norm_w);
        const auto want = reference(hm[k], c.format, input, n_rows);
        total.add(compare(std::span<const float>(got.data(), want.size()), want));
        if (c.norm && k == 0) {
            // The normalised input the first CTA stored (the indexer reads it as qn).
            const auto normed = d_normed.download();
            total.add(compare(std::span<const float>(normed.data(), input.size()), input));
        }
    }
    std::string shape = std::to_string(c.in) + "->";
    for (int k = 0; k < nm; ++k) {
        if (k) shape.push_back('+');
        shape.append(std::to_string(c.rows[k]));
    }
    shape.append(" x");
    shape.append(std::to_string(n_rows));
    int split = 0;
    for (int k = 0; k < nm; ++k) split += a.segs_per_item[k] < a.segments;
    std::string kernel = "matvec_";
    kernel.append(c.format == matvec_format::q8_0 ? "q8_0" : "f16");
    if (c.f16_form) kernel.append("_form" + std::to_string(c.f16_form));
    if (c.prequant) kernel.append("_pre");
    if (!c.x_cols.empty()) kernel.append("_cols");
    if (c.norm) kernel.append("_norm");
    std::string label = c.name;
    label.push_back(' ');
    label.append(shape);
    check_row row{kernel, label, "exact", total, passed(total),
                  std::string(split ? "split-K" : "whole rows") + (a.cta_quant ? ", CTA quantizes x" : "")};
    rows.push_back(row);
    return rows;
}

// Graph contract: one launch (shared input, non-prequantized) captured on its first call at
// n_rows = capacity, replayed at live counts 1 .. capacity with fresh inputs and NaN in the idle
// rows of x; the live rows of each replay must equal an uncaptured launch at n_rows = live,
// bitwise. The capacity 16 launch is two 8-row kernels (see launch_matvec).
check_row graph_case(std::mt19937_64& g, const launch_case& c, int capacity) {
    const int nm = int(c.rows.size());
    case_matrices mats(g, c, capacity);
    std::vector<device_matrix>& dm = mats.dev;
    const int W = c.x_width();
    device_buffer<float> dx(std::size_t(capacity) * W);
    device_buffer<float> d_norm_w{std::span<const float>(random_norm_weight(g, c.in))};
    kernels::matvec_launch a = launch_over(c, dm, dx.data(), capacity, d_norm_w.data());
    const int sms = sm_count();
    const fixtures::matvec_scratch scratch(kernels::plan_matvec(a, capacity, sms));
    const kernels::matvec_workspace ws = scratch.ws();
    const cuda_stream stream;
    kernels::prepare_matvec(current_device());
    const cuda_graph graph(stream, [&] { kernels::launch_matvec(a, capacity, ws, sms, stream); });
    auto run = [&](int live, bool replay) {
        for (auto& d : dm) d.y.fill_bytes(0xff);
        cuda_check(cudaDeviceSynchronize(), "poison");
        if (replay) {
            graph.launch(stream);
        } else {
            kernels::matvec_launch e = a;
            e.n_rows = live;
            kernels::launch_matvec(e, capacity, ws, sms, stream);
        }
        stream.synchronize("matvec graph case");
        std::vector<float> y;
        for (int k = 0; k < nm; ++k) {
            const auto all = dm[k].y.download();
            y.insert(y.end(), all.begin(), all.begin() + std::ptrdiff_t(live) * c.rows[k]);
        }
        return y;
    };
    comparison total;
    std::vector<int> lives;
    for (int live = 1; live <= capacity; live += live < 4 ? 1 : 3) lives.push_back(live);
    if (lives.back() != capacity) lives.push_back(capacity);
    for (int live : lives) {
        auto x = random_activations(g, capacity, W);
        std::fill(x.begin() + std::ptrdiff_t(live) * W, x.end(), std::nanf(""));
        dx.upload(std::span<const float>(x));
        const auto got = run(live, true), want = run(live, false);
        total.add(compare(got, want));
        for (float v : want) total.special_mismatches += !std::isfinite(v);  // finite live inputs
    }
    return row_of("matvec_graph", c.name + " capacity " + std::to_string(capacity), "exact", total,
                  "captured at n_rows = capacity, replayed at live 1..capacity vs uncaptured, bitwise");
}

}  // namespace

std::vector<check_row> check_matvec(std::uint64_t seed, bool quick) {
    std::mt19937_64 g(seed);
    using F = matvec_format;
    std::vector<launch_case> cases = {
        {"odd", F::q8_0, 96, {54}},
        {"odd", F::q8_0, 160, {97, 33}},
        {"odd", F::q8_0, 1056, {65}},
        {"odd-pre", F::q8_0, 512, {40, 70}, true},
        {"odd", F::f16, 48, {54}},
        {"odd", F::f16, 1040, {97, 24}},
        {"tiny-hc", F::f16, 1024, {24}},
        // Column slices of one x (out_a's groups quantizing their heads in-kernel): one segment
        // (whole-row items, per-warp quantization) and three (split-K, as out_a at flash).
        {"odd-cols", F::q8_0, 512, {40, 70, 33}, false, {0, 512, 1024}},
        {"odd-cols", F::q8_0, 1056, {65, 40}, false, {1056, 0}},
        {"odd-cols", F::q8_0, 96, {54, 65}, false, {96, 32}},
        {"odd-cols", F::f16, 1040, {97, 24}, false, {0, 1040}},
        // More CTA row groups than the persistent F16 forms' grid (3 CTAs per SM up to 132 SMs):
        // each CTA takes several, across a matrix boundary, with a part-filled last segment.
        {"many-groups", F::f16, 1040, {2999, 1001}},
        // Folded RMSNorm: split (per-warp quantization) and whole rows (the CTA quantizes x once:
        // 17000 rows are past 4 tiles per SM on every GPU up to 132 SMs).
        {"odd-norm", F::q8_0, 1056, {65, 40}, false, {}, true},
        {"odd-norm", F::q8_0, 96, {17000}, false, {}, true},
    };
    if (!quick) {
        const std::vector<launch_case> real = {
            {"q_a+kv", F::q8_0, 4096, {1024, 512}},
            {"q_b", F::q8_0, 1024, {32768}},
            {"out_a(8 groups)", F::q8_0, 4096, {1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024}, true},
            {"out_a(8 groups of o)", F::q8_0, 4096, {1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024}, false,
             {0, 4096, 8192, 12288, 16384, 20480, 24576, 28672}},
            {"q_a_norm+q_b", F::q8_0, 1024, {32768}, false, {}, true},
            {"compressors+indexer proj", F::f16, 4096, {1024, 1024, 256, 256, 64}},
            {"out_b", F::q8_0, 8192, {4096}},
            {"shexp gate+up", F::q8_0, 4096, {2048, 2048}},
            {"shexp down", F::q8_0, 2048, {4096}},
            {"output head", F::q8_0, 4096, {129280}},
            {"hc mix", F::f16, 16384, {24}},
            {"router", F::f16, 4096, {256}},
            {"compressor kv+gate", F::f16, 4096, {1024, 1024}},
            {"indexer q_b", F::f16, 1024, {8192}},
            {"indexer proj", F::f16, 4096, {64}},
        };
        cases.insert(cases.end(), real.begin(), real.end());
    }
    // Every F16 case in each of the kernel's forms (one-group CTAs, persistent one or two pairs ahead).
    for (std::size_t i = 0, n = cases.size(); i < n; ++i)
        if (cases[i].format == F::f16) {
            cases[i].f16_form = 1;
            for (int form : {2, 3}) {
                launch_case c = cases[i];
                c.f16_form = form;
                cases.push_back(c);
            }
        }
    std::vector<check_row> out;
    for (const auto& c : cases)
        for (int n : quick ? std::vector<int>{1, 3, 16} : std::vector<int>{1, 4, 16}) {
            auto r = run_case(g, c, n);
            out.insert(out.end(), r.begin(), r.end());
        }
    // A split-K pair (q_a+kv shaped, narrow) and a whole-row F16 launch, at capacities 4 and 16.
    // The column-slice and folded-norm launches too: the norm prologue must skip idle rows (NaN).
    for (int cap : {4, 16}) {
        out.push_back(graph_case(g, {"q8_0 split", F::q8_0, 1024, {96, 40}}, cap));
        for (int form : {1, 2, 3})
            out.push_back(graph_case(g, {"f16 form " + std::to_string(form), F::f16, 1040, {2999, 24}, false, {}, false, form}, cap));
        out.push_back(graph_case(g, {"q8_0 cols split", F::q8_0, 1056, {40, 70}, false, {0, 1056}}, cap));
        out.push_back(graph_case(g, {"q8_0 norm split", F::q8_0, 1056, {65, 40}, false, {}, true}, cap));
        out.push_back(graph_case(g, {"q8_0 norm whole", F::q8_0, 96, {17000}, false, {}, true}, cap));
    }
    return out;
}

}  // namespace ds4::validate
