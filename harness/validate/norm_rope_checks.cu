// ds4-validate rows for kernels/norm_rope.cuh against reference/norm_rope, bitwise: RMSNorm with
// weight (4096, 8192, 1024 and odd lengths), the q heads' norm + RoPE (64 x 512 at both layer
// kinds' RoPE), the kv norm with weight + RoPE, inverse RoPE, in place, and odd head shapes (both
// kernel forms); capacities 1, 3 and 16 at the decode shapes; positions cross the
// window, compressor and YaRN-relevant values up to 2^20. The graph row captures the q launch at
// two rows and position 0 and replays it at eight rows and the contract's positions.
#include <cuda_runtime.h>

#include <random>
#include <string>
#include <vector>

#include "ds4/core/device_buffer.hpp"
#include "ds4/core/half.hpp"
#include "ds4/kernels/attention_q16.hpp"
#include "ds4/kernels/norm_rope.cuh"
#include "harness/validate/checks.hpp"
#include "harness/validate/row_inputs.hpp"
#include "reference/norm_rope.hpp"

namespace ds4::validate {
namespace {

constexpr unsigned char poison = 0xff;  // NaN pattern

struct norm_case {
    std::string name;
    int n_head, head_dim, n_rot;
    bool weight, compressed, inverse;
    bool in_place = false;  // out = x
};

// The reference for one row: rms_norm (weight, one head) or head_rms_norm, then rope_tail.
void reference_row(const norm_case& c, const float* x, const float* w, std::uint32_t pos, float eps, float* out) {
    const int n = c.n_head * c.head_dim;
    std::copy(x, x + n, out);
    if (c.weight) ref::rms_norm(out, w, c.head_dim, eps, out);
    else ref::head_rms_norm(out, c.n_head, c.head_dim, eps);
    if (c.n_rot) ref::rope_tail(out, c.n_head, c.head_dim, c.n_rot, ds4_rope_params(c.compressed, c.n_rot), pos, c.inverse);
}

struct norm_run {
    device_buffer<float> x, out, w;
    device_buffer<std::int32_t> pos;
    device_count rows;
    kernels::norm_rope_launch a;
};

void setup(norm_run& d, const norm_case& c, int capacity, float eps) {
    const std::size_t n = std::size_t(c.n_head) * c.head_dim;
    d.x = device_buffer<float>(capacity * n);
    d.out = device_buffer<float>(capacity * n);
    d.w = device_buffer<float>(c.head_dim);
    d.pos = device_buffer<std::int32_t>(capacity);
    d.a.x = d.x.data();
    d.a.out = c.in_place ? d.x.data() : d.out.data();
    d.a.x_stride = d.a.out_stride = std::int64_t(n);
    d.a.weight = c.weight ? d.w.data() : nullptr;
    d.a.n_head = c.n_head;
    d.a.head_dim = c.head_dim;
    d.a.eps = eps;
    d.a.n_rot = c.n_rot;
    d.a.rope = ds4_rope_params(c.compressed, c.n_rot > 0 ? c.n_rot : 64);
    d.a.pos = d.pos.data();
    d.a.n_rows = d.rows.get();
    d.a.inverse = c.inverse;
}

// Uploads fresh inputs for n_rows rows at `positions`, runs `run`, compares with the reference;
// rows past n_rows must stay poisoned (in place: keep their input).
template <class Run>
comparison run_and_compare(std::mt19937_64& g, norm_run& d, const norm_case& c, int capacity, int n_rows,
                           const std::vector<std::int32_t>& positions, float eps, Run&& run) {
    const std::size_t n = std::size_t(c.n_head) * c.head_dim;
    const std::vector<float> x = spread_values(g, capacity * n, 1.0f);
    std::vector<float> w = spread_values(g, c.head_dim, 0.3f);
    for (auto& v : w) v += 1.0f;
    d.x.upload(x);
    d.w.upload(w);
    d.pos.upload(positions);
    d.rows.set(n_rows);
    d.out.fill_bytes(poison);
    cuda_check(cudaDeviceSynchronize(), "norm_rope inputs");
    run();
    const std::vector<float> got = c.in_place ? d.x.download() : d.out.download();
    std::vector<float> want(c.in_place ? x : std::vector<float>(n_rows * n));
    for (int r = 0; r < n_rows; ++r)
        reference_row(c, x.data() + r * n, w.data(), std::uint32_t(positions[r]), eps, want.data() + r * n);
    comparison cmp = compare(std::span<const float>(got.data(), want.size()), want);
    if (!c.in_place) cmp.mismatches += written_outside(got, n_rows * n, capacity * n, poison);
    return cmp;
}

std::vector<std::int32_t> random_positions(std::mt19937_64& g, int n) {
    static const std::int32_t marks[] = {0, 1, 25, 49, 127, 128, 129, 2047, 2048, 2051, 65535, 1 << 20};
    std::vector<std::int32_t> p(n);
    for (auto& v : p) v = g() % 2 ? marks[g() % std::size(marks)] : std::int32_t(g() % 300000);
    return p;
}

std::string shape_of(const norm_case& c, int rows) {
    return c.name + " " + std::to_string(c.n_head) + "x" + std::to_string(c.head_dim) +
           (c.n_rot ? " rot" + std::to_string(c.n_rot) : "") + " x" + std::to_string(rows);
}

}  // namespace

std::vector<check_row> check_norm_rope(std::uint64_t seed, bool quick) {
    std::mt19937_64 g(seed ^ 0x6e6f726du);
    const float eps = 1e-6f;
    std::vector<norm_case> cases = {
        {"rms odd", 1, 517, 0, true, false, false},
        {"rms odd", 1, 37, 0, true, false, false},
        {"heads odd", 3, 80, 64, false, true, false},
        {"heads odd", 5, 130, 2, false, false, false},
        {"kv odd", 1, 192, 64, true, false, true},
        {"rms tiny", 1, 256, 0, true, false, false},
        {"q tiny", 8, 128, 64, false, true, false},
    };
    if (!quick) {
        const std::vector<norm_case> real = {
            {"attn_norm", 1, 4096, 0, true, false, false},
            {"q_a_norm", 1, 1024, 0, true, false, false},
            {"q heads", 64, 512, 64, false, false, false},
            {"q heads yarn", 64, 512, 64, false, true, false},
            {"kv", 1, 512, 64, true, true, false},
            {"inverse rope", 64, 512, 64, false, true, true},
        };
        cases.insert(cases.end(), real.begin(), real.end());
    }
    std::vector<check_row> out;
    auto add_row = [&](const norm_case& c, int capacity, int rows) {
        norm_run d;
        setup(d, c, capacity, eps);
        const comparison cmp = run_and_compare(g, d, c, capacity, rows, random_positions(g, capacity), eps,
                                               [&] { kernels::launch_norm_rope(d.a, capacity, nullptr); });
        const std::string note = std::string(c.inverse ? "inverse" : "") + (c.in_place ? " in place" : "");
        out.push_back(row_of("norm_rope", shape_of(c, rows) + " cap" + std::to_string(capacity), "exact", cmp, note));
    };
    for (const auto& c : cases)
        for (int rows : quick ? std::vector<int>{1, 3} : std::vector<int>{1, 5, 16}) add_row(c, rows + 2, rows);
    // The decode shapes at capacities 1, 3 and 16, every row live (quick too), each kernel form:
    // 4096 (256 threads, 4 chunks), 8192 (16 chunks), 1024 and the kv head (128 threads), in
    // place, and a RoPE length that is even but not a multiple of 4 (the scalar form).
    const std::vector<norm_case> decode = {
        {"attn_norm", 1, 4096, 0, true, false, false},
        {"wide norm", 1, 8192, 0, true, false, false},
        {"q_a_norm", 1, 1024, 0, true, false, false},
        {"kv", 1, 512, 64, true, true, false},
        {"attn_norm", 1, 4096, 0, true, false, false, true},
        {"q heads", 4, 512, 64, false, false, false, true},
        {"rot 6", 2, 136, 6, false, false, false},
    };
    for (const auto& c : decode)
        for (int capacity : {1, 3, 16}) add_row(c, capacity, capacity);
    // The q heads with the attention's F16 operand beside (attention_q16.hpp): 64 and 40 heads of
    // 512, live rows 2 and 3 of capacity 4. The operand must equal F16(out * scale) of the
    // reference's out at the core-matrix offsets, and head rows past n_head and rows past the
    // live count stay untouched.
    for (const int heads : {64, 40})
        for (const int live : {2, 3}) {
            const norm_case c{"q heads f16 operand", heads, 512, 64, false, true, false};
            const int cap = 4;
            const std::size_t per_tok = std::size_t(kernels::q16_token_halves(512));
            norm_run d;
            setup(d, c, cap, eps);
            device_buffer<std::uint16_t> q16(cap * per_tok);
            q16.fill_bytes(poison);
            d.a.q16 = reinterpret_cast<__half*>(q16.data());
            const std::vector<std::int32_t> pos = random_positions(g, cap);
            comparison cmp = run_and_compare(g, d, c, cap, live, pos, eps, [&] { kernels::launch_norm_rope(d.a, cap, nullptr); });
            const std::vector<float> fout = d.out.download();  // equal to the reference (cmp above)
            const std::vector<std::uint16_t> got = q16.download();
            const float scale = kernels::attention_q_scale_log2(512);
            std::size_t bad = 0;
            for (int r = 0; r < cap; ++r)
                for (int h = 0; h < kernels::q16_rows; ++h)
                    for (int i = 0; i < 512; ++i) {
                        const std::uint16_t v = got[std::size_t(r) * per_tok + std::size_t(kernels::core_matrix_offset(h, i, 512))];
                        const bool written = r < live && h < heads;
                        const std::uint16_t want =
                            written ? f32_to_f16(fout[(std::size_t(r) * heads + std::size_t(h)) * 512 + std::size_t(i)] * scale)
                                    : std::uint16_t(0xffff);
                        bad += v != want;
                    }
            cmp.mismatches += bad;
            out.push_back(row_of("norm_rope", shape_of(c, live) + " cap" + std::to_string(cap), "exact", cmp,
                                 "F16 operand: " + std::to_string(bad) + " halves differ"));
        }
    // Graph: captured at 2 rows and position 0, replayed at 8 rows and the contract's positions.
    const norm_case q = quick ? norm_case{"graph q", 8, 128, 64, false, true, false}
                              : norm_case{"graph q", 64, 512, 64, false, true, false};
    const int capacity = 8;
    norm_run d;
    setup(d, q, capacity, eps);
    comparison total;
    total.add(run_and_compare(g, d, q, capacity, 2, std::vector<std::int32_t>(capacity, 0), eps,
                                      [&] { kernels::launch_norm_rope(d.a, capacity, nullptr); }));
    const replayed_graph graph([&](cudaStream_t st) { kernels::launch_norm_rope(d.a, capacity, st); });
    const std::vector<std::int32_t> steps = {25, 49, 127, 128, 129, 2047, 2048, 2051};
    for (int live : {5, 8}) total.add(run_and_compare(g, d, q, capacity, live, steps, eps, graph));
    out.push_back(row_of("norm_rope", shape_of(q, 8), "exact", total, "graph captured at 2 rows, pos 0; replayed"));
    return out;
}

}  // namespace ds4::validate
