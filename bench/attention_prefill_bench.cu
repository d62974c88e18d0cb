// Prefill attention (kernels/attention_prefill.cuh) at the DeepSeek-V4-Flash head shape (64 heads,
// head_dim 512, n_swa 128) for one chunk of T tokens at positions 0 .. T-1 of a ratio-4 layer
// with all compressed rows visible: token t sees min(t+1, 128) raw rows and (t+1)/4 compressed.
// FLOPs: 2 * 2 * H * D per visible (token, row) pair (scores + P.V); bytes: every stored row once
// (raw + compressed, 592 B) + q + out (F32). Target (kernels.md): >= 40% of 642 TFLOP/s.
// Args: chunk tokens.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/attention_prefill.cuh"

namespace {

using namespace ds4;
using ds4::bench::report;
using ds4::bench::time_launches;
using ds4::bench::timing;

constexpr int H = 64, D = 512, n_rot = 64, n_swa = 128, ratio = 4, page_rows = model::kv_page_rows;

void BM_attention_prefill(benchmark::State& state) {
    const int T = static_cast<int>(state.range(0));
    const model::attention_row_layout lay{D, n_rot};
    const int n_comp = T / ratio;
    const int raw_pages = (T - 1) / page_rows + 1, comp_pages = (n_comp + page_rows - 1) / page_rows;
    const std::size_t page_bytes = std::size_t(page_rows) * std::size_t(lay.bytes());
    std::vector<std::uint8_t> pool(std::size_t(raw_pages + comp_pages) * page_bytes);
    {
        std::mt19937_64 rng(7);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> row(static_cast<std::size_t>(D));
        for (std::size_t r = 0; r < pool.size() / std::size_t(lay.bytes()); ++r) {
            for (auto& v : row) v = nd(rng);
            model::encode_attention_row(lay, row.data(), pool.data() + r * std::size_t(lay.bytes()));
        }
    }
    std::vector<std::int32_t> rt(static_cast<std::size_t>(raw_pages)), ct(static_cast<std::size_t>(std::max(1, comp_pages)), 0);
    for (int i = 0; i < raw_pages; ++i) rt[std::size_t(i)] = i;
    for (int i = 0; i < comp_pages; ++i) ct[std::size_t(i)] = raw_pages + i;
    std::vector<float> q(std::size_t(T) * H * D), sinks(static_cast<std::size_t>(H), 0.5f);
    {
        std::mt19937_64 rng(11);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (auto& v : q) v = nd(rng);
    }
    device_buffer<std::uint8_t> d_pool{std::span<const std::uint8_t>(pool)};
    device_buffer<std::int32_t> d_rt{std::span<const std::int32_t>(rt)}, d_ct{std::span<const std::int32_t>(ct)};
    device_buffer<float> d_q{std::span<const float>(q)}, d_sinks{std::span<const float>(sinks)}, d_out(q.size());
    kernels::attention_prefill_args a{};
    a.q = d_q.data();
    a.out = d_out.data();
    a.sinks = d_sinks.data();
    a.raw_pages = d_pool.data();
    a.raw_page_table = d_rt.data();
    a.comp_pages = d_pool.data();
    a.comp_page_table = d_ct.data();
    a.p0 = 0;
    a.n_tok = T;
    a.rope = ds4_rope_params(true, n_rot);
    const kernels::attention_prefill_shape s{H, D, n_rot, n_swa, ratio};
    // One chunk is ~0.1-0.5 s of work on q/out alone (T x 128 KiB each): larger than L2, so no rotation.
    const timing t = time_launches([&](int, cudaStream_t stream) { kernels::attention_prefill(s, a, stream); }, 1, 5, 2);
    double pairs = 0;
    for (int i = 0; i < T; ++i) pairs += double(std::min(i + 1, n_swa)) + double((i + 1) / ratio);
    const double flops = 4.0 * H * D * pairs;
    const double bytes = double(T + n_comp) * lay.bytes() + 2.0 * double(T) * H * D * 4;
    report(state, t, bytes, flops);
    state.counters["pct_642T"] = 100.0 * flops / t.median_s * 1e-12 / 642.0;
    state.counters["tokens"] = T;
}

BENCHMARK(BM_attention_prefill)->Arg(2048)->Arg(4096)->UseManualTime()->Iterations(1);

}  // namespace
