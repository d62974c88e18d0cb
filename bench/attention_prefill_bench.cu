// Prefill attention (kernels/attention_prefill.cuh) at the DeepSeek-V4-Flash head shape (64 heads,
// head_dim 512, n_swa 128) for one chunk of T tokens at positions p0 .. p0+T-1:
//   mode 0: a ratio-4 layer with every compressed row visible (token at pos sees min(pos+1, 128)
//           raw rows and (pos+1)/4 compressed);
//   mode 1: a ratio-4 layer with the indexer: past 512 compressed rows a token sees its own
//           selection of 512 (random, ascending);
//   mode 2: a ratio-128 layer ((pos+1)/128 compressed rows, all visible).
// FLOPs: 2 * 2 * H * D per visible (token, row) pair (scores + P.V); bytes: every stored row once
// (raw + compressed, 592 B) + q + out (F32). Target (docs/kernels.md): >= 40% of 642 TFLOP/s.
// Args: chunk tokens, p0, mode.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/attention_prefill.cuh"
#include "harness/fixtures/prefill_args.hpp"

namespace {

using namespace ds4;
using ds4::bench::report;
using ds4::bench::time_launches;
using ds4::bench::timing;

constexpr int H = 64, D = 512, n_rot = 64, n_swa = 128, page_rows = model::kv_page_rows;

void BM_attention_prefill(benchmark::State& state) {
    const int T = static_cast<int>(state.range(0)), p0 = static_cast<int>(state.range(1)), mode = static_cast<int>(state.range(2));
    const int ratio = mode == 2 ? 128 : 4, top_k = 512;
    const model::attention_row_layout lay{D, n_rot};
    const int last = p0 + T - 1, n_comp = (last + 1) / ratio, raw_lo = std::max(0, p0 - n_swa + 1);
    const int raw_entries = last / page_rows + 1, raw_pages = raw_entries - raw_lo / page_rows;
    const int comp_pages = (n_comp + page_rows - 1) / page_rows;
    // One random page image repeated (values do not change the work).
    const auto d_pool = fixtures::repeated_pages(fixtures::random_page_image(lay, 7), std::size_t(raw_pages + comp_pages));
    std::vector<std::int32_t> rt(static_cast<std::size_t>(raw_entries), -1), ct(static_cast<std::size_t>(std::max(1, comp_pages)), 0);
    for (int i = 0; i < raw_pages; ++i) rt[std::size_t(raw_lo / page_rows + i)] = i;
    for (int i = 0; i < comp_pages; ++i) ct[std::size_t(i)] = raw_pages + i;
    // Mode 1: each token's selection once past top_k rows.
    std::vector<std::int32_t> sel(mode == 1 ? std::size_t(T) * top_k : 1, 0), nsel(static_cast<std::size_t>(T), 0);
    double pairs = 0;
    {
        std::mt19937_64 rng(5);
        std::vector<std::int32_t> all;
        for (int t = 0; t < T; ++t) {
            const int pos = p0 + t, nc = (pos + 1) / ratio;
            pairs += double(std::min(pos + 1, n_swa));
            if (mode == 1 && nc > top_k) {
                all.resize(static_cast<std::size_t>(nc));
                for (int i = 0; i < nc; ++i) all[std::size_t(i)] = i;
                for (int i = 0; i < top_k; ++i) std::swap(all[std::size_t(i)], all[std::size_t(i) + rng() % std::size_t(nc - i)]);
                std::sort(all.begin(), all.begin() + top_k);
                std::copy(all.begin(), all.begin() + top_k, sel.begin() + std::ptrdiff_t(t) * top_k);
                nsel[std::size_t(t)] = top_k;
                pairs += top_k;
            } else {
                pairs += nc;
            }
        }
    }
    device_buffer<std::int32_t> d_sel{std::span<const std::int32_t>(sel)}, d_nsel{std::span<const std::int32_t>(nsel)};
    std::mt19937_64 rng(11);
    const auto d_q = fixtures::to_device(fixtures::normal_vector(rng, std::size_t(T) * H * D));
    const auto d_sinks = fixtures::to_device(std::vector<float>(std::size_t(H), 0.5f));
    const auto d_rt = fixtures::to_device(rt), d_ct = fixtures::to_device(ct);
    device_buffer<float> d_out(d_q.size());
    const fixtures::paged_view pages{d_pool.data(), d_rt.data(), 0, d_pool.data(), d_ct.data(), 0};
    kernels::attention_prefill_args a =
        fixtures::prefill_args(pages, d_q.data(), d_out.data(), d_sinks.data(), p0, T, ds4_rope_params(true, n_rot));
    if (mode == 1) {
        a.comp_sel = d_sel.data();
        a.comp_nsel = d_nsel.data();
        a.comp_sel_stride = top_k;
    }
    const kernels::attention_prefill_shape s{H, D, n_rot, n_swa, ratio};
    // One chunk is ~0.1-0.5 s of work on q/out alone (T x 128 KiB each): larger than L2, so no rotation.
    kernels::prepare_attention_prefill(current_device());
    const timing t = time_launches([&](int, cudaStream_t stream) { kernels::attention_prefill(s, a, stream); }, 1, 5, 2);
    const double flops = 4.0 * H * D * pairs;
    const double bytes = double(raw_pages + comp_pages) * page_rows * lay.bytes() + 2.0 * double(T) * H * D * 4;
    report(state, t, bytes, flops);
    state.counters["pct_642T"] = 100.0 * flops / t.median_s * 1e-12 / 642.0;
    state.counters["tokens"] = T;
    state.counters["p0"] = p0;
    state.counters["mode"] = mode;
}

BENCHMARK(BM_attention_prefill)
    ->Args({2048, 0, 0})->Args({4096, 0, 0})
    ->Args({4096, 32768, 1})->Args({4096, 32768, 2})
    ->Args({4096, 262144, 1})->Args({4096, 262144, 2})
    ->UseManualTime()->Iterations(1);

}  // namespace
