// kernels/matvec.cuh at the real DeepSeek-V4-Flash shapes: one row (decode) and 2..16 rows
// (verify, batched decode). Bytes counted: the tiled weights (quants + scales, or halves) once,
// plus activations in and outputs out. Weights are rotated over enough copies that the working
// set is several times the 60 MB L2.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/matvec.cuh"
#include "ds4/kernels/matvec_f16_tc.cuh"
#include "harness/fixtures/matvec_args.hpp"

namespace ds4::bench {
namespace {

using kernels::matvec_format;

struct bench_case {
    std::string name;
    matvec_format format;
    int in;
    std::vector<int> rows;
    bool prequant = false;
    std::vector<int> x_cols = {};  // matrix k reads columns [x_cols[k], +in) of a wider x
    bool norm = false;             // x's RMSNorm folded into the launch
    int x_width() const {
        int w = in;
        for (int c : x_cols) w = std::max(w, c + in);
        return w;
    }
};

// Random bytes are fine for timing (F16 payloads are drawn as finite values so no NaN paths
// are taken); correctness is ds4-validate's job.
struct matrix_set {
    device_buffer<std::uint8_t> quants;
    device_buffer<std::uint16_t> scales;
    std::size_t quant_bytes = 0, scale_count = 0;
};

std::vector<std::uint16_t> random_halves(std::mt19937_64& g, std::size_t n, float sigma) {
    std::normal_distribution<float> d(0.0f, sigma);
    std::vector<std::uint16_t> v(n);
    for (auto& h : v) h = f32_to_f16(d(g));
    return v;
}

void run(benchmark::State& state, const bench_case& c, int n_rows, bool tc = false) {
    std::mt19937_64 g(42);
    const int capacity = kernels::matvec_capacity_for(n_rows);
    const int nm = int(c.rows.size());
    std::size_t bytes_per_set = 0;
    std::vector<std::size_t> qb(nm), sc(nm);
    for (int k = 0; k < nm; ++k) {
        if (c.format == matvec_format::q8_0) {
            const auto L = q8_0_tiled_layout::make(c.rows[k], c.in);
            qb[k] = L.quant_bytes();
            sc[k] = L.scale_count();
        } else {
            qb[k] = std::size_t(c.rows[k]) * c.in * 2;
            sc[k] = 0;
        }
        bytes_per_set += qb[k] + sc[k] * 2;
    }
    const int sets = rotation_count(bytes_per_set);
    // One allocation per matrix holding all rotated copies.
    std::vector<device_buffer<std::uint8_t>> q(nm);
    std::vector<device_buffer<std::uint16_t>> s(nm);
    // One random set per matrix, replicated on the device into every rotation slot: equal bytes
    // at different addresses are different lines to the L2.
    for (int k = 0; k < nm; ++k) {
        std::vector<std::uint8_t> hq(qb[k]);
        if (c.format == matvec_format::q8_0) {
            for (std::size_t i = 0; i + 8 <= hq.size(); i += 8) {
                const std::uint64_t r = g();
                std::memcpy(hq.data() + i, &r, 8);
            }
        } else {
            auto h = random_halves(g, hq.size() / 2, 0.02f);
            std::memcpy(hq.data(), h.data(), hq.size());
        }
        q[k] = device_buffer<std::uint8_t>(qb[k] * sets);
        q[k].upload(std::span<const std::uint8_t>(hq));
        for (int r = 1; r < sets; ++r)
            cuda_check(cudaMemcpy(q[k].data() + qb[k] * r, q[k].data(), qb[k], cudaMemcpyDeviceToDevice), "replicate");
        if (sc[k]) {
            s[k] = device_buffer<std::uint16_t>(sc[k] * sets);
            s[k].upload(std::span<const std::uint16_t>(random_halves(g, sc[k], 2e-4f)));
            for (int r = 1; r < sets; ++r)
                cuda_check(cudaMemcpy(s[k].data() + sc[k] * r, s[k].data(), sc[k] * 2, cudaMemcpyDeviceToDevice),
                           "replicate");
        }
    }
    std::normal_distribution<float> n01;
    std::vector<float> hx(std::size_t(capacity) * c.x_width());
    for (auto& v : hx) v = n01(g);
    device_buffer<float> x{std::span<const float>(hx)};
    std::vector<float> hw(std::size_t(c.in));
    for (auto& v : hw) v = 1.0f + 0.1f * n01(g);
    device_buffer<float> norm_w{std::span<const float>(hw)}, x_normed(hx.size());
    std::vector<device_buffer<float>> y;
    for (int k = 0; k < nm; ++k) y.emplace_back(std::size_t(capacity) * c.rows[k]);
    device_buffer<std::int8_t> aq(std::size_t(capacity) * c.in);
    device_buffer<float> ad(std::size_t(capacity) * c.in / 32 + 1);
    aq.fill_bytes(3);
    ad.fill_bytes(0x3c);

    const int sms = fixtures::sm_count();
    std::vector<fixtures::matvec_operand> ms;
    for (int k = 0; k < nm; ++k) ms.push_back({nullptr, nullptr, y[k].data(), c.rows[k]});  // weights per rotation
    kernels::matvec_launch base = fixtures::matvec_args(c.format, x.data(), c.in, n_rows, ms);
    base.x_stride = c.x_width();
    for (int k = 0; k < nm; ++k) {
        if (c.prequant) {
            base.m[k].act_qs = aq.data();
            base.m[k].act_d = ad.data();
            base.m[k].act_stride = c.in;
        }
        if (!c.x_cols.empty()) base.m[k].x_col = c.x_cols[std::size_t(k)];
    }
    if (c.norm) {
        base.norm_weight = norm_w.data();
        base.norm_eps = 1e-6f;
        base.x_normed = x_normed.data();
    }
    // DS4_MATVEC_ITEMS overrides the split target (a tuning sweep; results are the same bits).
    const char* items_env = std::getenv("DS4_MATVEC_ITEMS");
    const fixtures::matvec_scratch scratch(kernels::plan_matvec(base, capacity, sms, items_env ? std::atoi(items_env) : 0));
    const kernels::matvec_workspace ws = scratch.ws();

    kernels::prepare_matvec(current_device());
    if (tc) kernels::prepare_matvec_f16_tc(current_device(), c.in);
    const auto t = time_launches([&](int i, cudaStream_t st) {
        const int set = i % sets;
        if (tc) {
            kernels::gemm_f16_args g;
            g.x = x.data();
            g.x_stride = c.x_width();
            g.in = c.in;
            g.n_rows = n_rows;
            g.n_matrices = nm;
            for (int k = 0; k < nm; ++k)
                g.m[k] = {reinterpret_cast<const std::uint16_t*>(q[k].data() + qb[k] * set), c.rows[k], y[k].data(), c.rows[k]};
            kernels::matvec_f16_tc(g, st);
            return;
        }
        kernels::matvec_launch a = base;
        for (int k = 0; k < nm; ++k) {
            a.m[k].weights = q[k].data() + qb[k] * set;
            a.m[k].scales = sc[k] ? s[k].data() + sc[k] * set : nullptr;
        }
        kernels::launch_matvec(a, capacity, ws, sms, st);
    });
    double out_rows = 0;
    for (int r : c.rows) out_rows += r;
    // In-kernel activations: each matrix's slice of x (the norm adds its weight and x_normed).
    const double x_floats = c.x_cols.empty() ? double(c.in) : double(nm) * c.in;
    const double act_bytes = c.prequant ? double(nm) * n_rows * c.in * 1.125
                                        : double(n_rows) * x_floats * 4 + (c.norm ? c.in * 4.0 * (1 + n_rows) : 0.0);
    const double bytes = double(bytes_per_set) + act_bytes + out_rows * n_rows * 4;
    const double flops = 2.0 * out_rows * c.in * n_rows;
    report(state, t, bytes, flops);
}

const int registered = [] {
    using F = matvec_format;
    const std::vector<bench_case> cases = {
        {"q_a", F::q8_0, 4096, {1024}},
        {"kv", F::q8_0, 4096, {512}},
        {"q_a+kv", F::q8_0, 4096, {1024, 512}},
        {"q_b", F::q8_0, 1024, {32768}},
        {"out_a_8groups", F::q8_0, 4096, {1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024}, true},
        // What out_proj launches now: each group quantizes its heads of o in-kernel (no
        // quantize_act launch before it).
        {"out_a_8groups_of_o", F::q8_0, 4096, {1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024}, false,
         {0, 4096, 8192, 12288, 16384, 20480, 24576, 28672}},
        // What q_path launches now: q_a_norm folded into q_b (compare q_b + norm_rope_bench's
        // rms_norm at 1024).
        {"q_a_norm+q_b", F::q8_0, 1024, {32768}, false, {}, true},
        {"out_b", F::q8_0, 8192, {4096}},
        {"shexp_gate+up", F::q8_0, 4096, {2048, 2048}},
        {"shexp_down", F::q8_0, 2048, {4096}},
        {"output_head", F::q8_0, 4096, {129280}},
        {"hc_mix", F::f16, 16384, {24}},
        {"router", F::f16, 4096, {256}},
        {"compressor_kv+gate_r4", F::f16, 4096, {1024, 1024}},
        // A ratio-4 layer's side-stream launch: both compressors and the indexer's head weights.
        {"compressors+indexer_proj_r4", F::f16, 4096, {1024, 1024, 256, 256, 64}},
        {"indexer_q_b", F::f16, 1024, {8192}},
        {"indexer_proj", F::f16, 4096, {64}},
    };
    for (const auto& c : cases)
        for (int n : {1, 2, 4, 8, 16}) {
            const std::string name = "matvec/" + c.name + "/rows:" + std::to_string(n);
            benchmark::RegisterBenchmark(name.c_str(), [c, n](benchmark::State& st) { run(st, c, n); })
                ->UseManualTime()
                ->Iterations(1);
        }
    // The tensor-core twin (kernels/matvec_f16_tc.cuh) on the F16 launches of at least 128 weight
    // rows: those DS4_F16_TC moves to it, and the router for comparison (the backend keeps the
    // router's logits in moe_router_kernel, in the matvec's order).
    for (const auto& c : cases) {
        int rows = 0;
        for (int r : c.rows) rows += r;
        if (c.format != F::f16 || rows < kernels::gemm_f16_tc_wn) continue;
        for (int n : {1, 2, 4, 8, 16}) {
            const std::string name = "matvec_f16_tc/" + c.name + "/rows:" + std::to_string(n);
            benchmark::RegisterBenchmark(name.c_str(), [c, n](benchmark::State& st) { run(st, c, n, true); })
                ->UseManualTime()
                ->Iterations(1);
        }
    }
    return 0;
}();

}  // namespace
}  // namespace ds4::bench
