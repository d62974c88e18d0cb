// Flash decode attention (kernels/attention_decode.cuh) at the DeepSeek-V4-Flash head shape
// (64 heads, head_dim 512, n_swa 128) over a context of L rows per sequence: the raw window (128)
// plus L - 128 compressed rows, all visible (the worst case of a layer: no indexer mask).
// Bytes counted per step: every visible native row once (592 B) + q + out (64 x 512 x 4 each)
// per sequence; the split partials the merge reads back are overhead, not counted. Inputs are
// rotated over copies of the pages so that small contexts are not served from L2.
// Args: context rows, batch (sequences, 1 query row each).
// BM_attention_decode runs the exact CUDA-core kernel, BM_attention_decode_mma the bounded
// tensor-core kernel over the same rows (its roofline is the mma.sync f16 peak: 131 kFLOP per
// 592-byte row at 64 heads caps it at 642e12 / 131072 * 592 = 2.9 TB/s), and
// BM_attention_decode_mma_sel a ratio-4 layer as decode sees it: the window plus the indexer's
// 512 selected rows (ascending, random) out of ctx / 4 compressed rows. BM_attention_decode_mma_chunk
// is that layer as a prefill chunk's launch (or a decode step, at one row) sees it: `batch` query
// rows of one sequence (they share its pages) at a fixed split size; us_per_row picks the chunk's
// launch size (each launch's partials make a round trip through memory before the merge);
// BM_attention_decode_mma_chunk_q16 the same with q given as the F16 operand (attention_q16.hpp).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/attention_decode.cuh"
#include "ds4/kernels/attention_decode_mma.cuh"
#include "harness/fixtures/decode_args.hpp"

namespace {

using namespace ds4;
using ds4::bench::report;
using ds4::bench::rotation_count;
using ds4::bench::time_launches;
using ds4::bench::timing;

constexpr int H = 64, D = 512, n_rot = 64, n_swa = 128, page_rows = model::kv_page_rows;

enum class variant { exact, mma, mma_selected, mma_chunk, mma_chunk_q16 };

template <variant V>
void BM_attention(benchmark::State& state) {
    const int ctx = static_cast<int>(state.range(0)), batch = static_cast<int>(state.range(1));
    const model::attention_row_layout lay{D, n_rot};
    constexpr bool chunk = V == variant::mma_chunk || V == variant::mma_chunk_q16;
    const bool sel = V == variant::mma_selected || chunk;
    const bool shared_pages = chunk;  // one sequence's rows: one set of pages
    const int n_sel = 512;
    const int pos = ctx - 1, n_comp = sel ? ctx / 4 : ctx - n_swa;
    const int raw_stride = pos / page_rows + 1, comp_stride = (n_comp + page_rows - 1) / page_rows;
    // The selected rows: 512 distinct ascending indices per sequence (the same set for all); only
    // the pages they touch get memory.
    std::vector<std::int32_t> list(std::size_t(batch) * n_sel), nsel(static_cast<std::size_t>(batch), n_sel);
    std::vector<std::int32_t> comp_page_of(static_cast<std::size_t>(comp_stride), -1);
    int touched = comp_stride;
    if (sel) {
        std::mt19937_64 rng(5);
        std::vector<std::int32_t> all(static_cast<std::size_t>(n_comp));
        for (int i = 0; i < n_comp; ++i) all[std::size_t(i)] = i;
        std::shuffle(all.begin(), all.end(), rng);
        std::sort(all.begin(), all.begin() + n_sel);
        for (int s = 0; s < batch; ++s) std::copy(all.begin(), all.begin() + n_sel, list.begin() + std::ptrdiff_t(s) * n_sel);
        touched = 0;
        for (int i = 0; i < n_sel; ++i)
            if (comp_page_of[std::size_t(all[std::size_t(i)] / page_rows)] < 0) comp_page_of[std::size_t(all[std::size_t(i)] / page_rows)] = touched++;
    } else {
        for (int c = 0; c < comp_stride; ++c) comp_page_of[std::size_t(c)] = c;
    }
    const int raw_pages_per_seq = 3, comp_pages_per_seq = touched;
    const std::size_t seqs_with_pages = shared_pages ? 1 : std::size_t(batch);
    const std::size_t kv_bytes = seqs_with_pages * std::size_t(sel ? n_swa + n_sel : ctx) * std::size_t(lay.bytes());
    const int rot = rotation_count(kv_bytes);
    // Page contents: one random page image repeated (values do not change the work).
    const std::vector<std::uint8_t> page = fixtures::random_page_image(lay, 7);
    const auto raw_pool = fixtures::repeated_pages(page, std::size_t(rot) * seqs_with_pages * raw_pages_per_seq);
    const auto comp_pool = fixtures::repeated_pages(page, std::size_t(rot) * seqs_with_pages * comp_pages_per_seq);
    // One set of page tables per rotation.
    std::vector<std::int32_t> rt(std::size_t(rot) * batch * raw_stride, -1), ct(std::size_t(rot) * batch * comp_stride, -1);
    for (int r = 0; r < rot; ++r)
        for (int s = 0; s < batch; ++s) {
            const std::size_t seq = std::size_t(r) * batch + std::size_t(s);
            const std::size_t owner = shared_pages ? std::size_t(r) : seq;  // whose pages the table names
            for (int k = 0; k < raw_pages_per_seq; ++k) {
                const int c = pos / page_rows - k;
                if (c >= 0) rt[seq * raw_stride + std::size_t(c)] = std::int32_t(owner * raw_pages_per_seq + std::size_t(k));
            }
            for (int c = 0; c < comp_stride; ++c)
                if (comp_page_of[std::size_t(c)] >= 0)
                    ct[seq * comp_stride + std::size_t(c)] =
                        std::int32_t(owner * comp_pages_per_seq + std::size_t(comp_page_of[std::size_t(c)]));
        }
    device_buffer<std::int32_t> d_rt{std::span<const std::int32_t>(rt)}, d_ct{std::span<const std::int32_t>(ct)};
    std::vector<std::int32_t> tok0(static_cast<std::size_t>(batch)), ntok(static_cast<std::size_t>(batch), 1),
        tpos(static_cast<std::size_t>(batch), pos), tnc(static_cast<std::size_t>(batch), n_comp);
    for (int s = 0; s < batch; ++s) tok0[std::size_t(s)] = s;
    device_buffer<std::int32_t> d_t0{std::span<const std::int32_t>(tok0)}, d_nt{std::span<const std::int32_t>(ntok)},
        d_tp{std::span<const std::int32_t>(tpos)}, d_tn{std::span<const std::int32_t>(tnc)};
    std::mt19937_64 rng(11);
    const auto d_q = fixtures::to_device(fixtures::normal_vector(rng, std::size_t(batch) * H * D));
    const auto d_sinks = fixtures::to_device(std::vector<float>(std::size_t(H), 0.5f));
    device_buffer<float> d_out(d_q.size());
    device_buffer<std::int32_t> d_list{std::span<const std::int32_t>(list)}, d_nsel{std::span<const std::int32_t>(nsel)};
    const auto plan = kernels::attention_decode_plan::make({H, D, n_rot, n_swa}, {batch, 1, n_comp});
    // The tensor-core plan counts visible rows (with the list: at most n_sel), the exact one indices.
    const auto plan_mma = kernels::attention_decode_mma_plan::make({H, D, n_rot, n_swa}, {batch, 1, sel ? n_sel : n_comp},
                                                                   chunk ? int(state.range(2)) : 0);
    device_buffer<std::uint8_t> scratch(V == variant::exact ? plan.scratch_bytes() : plan_mma.scratch_bytes());
    // Page tables are per rotation (set in the launch).
    const fixtures::paged_view pages{raw_pool.data(), nullptr, raw_stride, comp_pool.data(), nullptr, comp_stride};
    kernels::attention_decode_args a = fixtures::decode_args(pages, d_q.data(), d_out.data(), d_sinks.data(), d_t0.data(),
                                                             d_nt.data(), d_tp.data(), d_tn.data(), ds4_rope_params(true, n_rot));
    // q as the F16 shared-memory operand (attention_q16.hpp), from the same q.
    device_buffer<std::uint16_t> d_q16;
    if constexpr (V == variant::mma_chunk_q16) {
        const std::vector<float> q = d_q.download();
        const std::size_t per_tok = std::size_t(kernels::q16_token_halves(D));
        std::vector<std::uint16_t> q16(std::size_t(batch) * per_tok, 0);
        for (int t = 0; t < batch; ++t)
            for (int h = 0; h < H; ++h)
                for (int i = 0; i < D; ++i)
                    q16[std::size_t(t) * per_tok + std::size_t(kernels::core_matrix_offset(h, i, D))] =
                        f32_to_f16(q[(std::size_t(t) * H + std::size_t(h)) * D + std::size_t(i)] * kernels::attention_q_scale_log2(D));
        d_q16 = device_buffer<std::uint16_t>{std::span<const std::uint16_t>(q16)};
        a.q16 = reinterpret_cast<const __half*>(d_q16.data());
    }
    if (sel) {
        a.comp_sel = d_list.data();
        a.comp_nsel = d_nsel.data();
        a.comp_sel_stride = n_sel;
    }
    auto launch = [&](int i, cudaStream_t stream) {
        kernels::attention_decode_args ai = a;
        const std::size_t r = std::size_t(i % rot) * std::size_t(batch);
        ai.raw_page_table = d_rt.data() + r * std::size_t(raw_stride);
        ai.comp_page_table = d_ct.data() + r * std::size_t(comp_stride);
        if constexpr (V == variant::exact) kernels::attention_decode(plan, ai, scratch.data(), stream);
        else kernels::attention_decode_mma(plan_mma, ai, scratch.data(), stream);
    };
    kernels::prepare_attention_decode_mma(current_device());  // both kernels' opt-ins, before the capture
    const timing t = time_launches(launch);
    const double bytes = double(kv_bytes) + 2.0 * double(batch) * H * D * 4;
    const double rows = sel ? double(n_swa + n_sel) : double(ctx);
    const double flops = 4.0 * double(batch) * rows * H * D;  // scores + AXPY, 2 flops per fma
    report(state, t, bytes, flops);
    state.counters["ctx"] = ctx;
    state.counters["batch"] = batch;
    state.counters["us_per_row"] = t.median_s * 1e6 / batch;
    state.counters["scratch_MB"] = double(V == variant::exact ? plan.scratch_bytes() : plan_mma.scratch_bytes()) * 1e-6;
    if constexpr (V != variant::exact) state.counters["split_rows"] = plan_mma.split_rows;
}

void BM_attention_decode(benchmark::State& state) { BM_attention<variant::exact>(state); }
void BM_attention_decode_mma(benchmark::State& state) { BM_attention<variant::mma>(state); }
void BM_attention_decode_mma_sel(benchmark::State& state) { BM_attention<variant::mma_selected>(state); }
void BM_attention_decode_mma_chunk(benchmark::State& state) { BM_attention<variant::mma_chunk>(state); }
void BM_attention_decode_mma_chunk_q16(benchmark::State& state) { BM_attention<variant::mma_chunk_q16>(state); }

// 2K, 32K, 256K and 1M rows; batch 16 up to 256K, 64 up to 32K (scratch partials grow as
// batch x rows / 64 x 128 KiB).
BENCHMARK(BM_attention_decode)
    ->Args({2048, 1})->Args({2048, 16})->Args({2048, 64})
    ->Args({32768, 1})->Args({32768, 16})->Args({32768, 64})
    ->Args({262144, 1})->Args({262144, 16})
    ->Args({1048576, 1})
    ->UseManualTime()->Iterations(1);
BENCHMARK(BM_attention_decode_mma)
    ->Args({2048, 1})->Args({2048, 16})->Args({2048, 64})
    ->Args({32768, 1})->Args({32768, 16})->Args({32768, 64})
    ->Args({262144, 1})->Args({262144, 16})
    ->Args({1048576, 1})
    ->UseManualTime()->Iterations(1);
BENCHMARK(BM_attention_decode_mma_sel)
    ->Args({32768, 1})->Args({32768, 16})->Args({32768, 64})
    ->Args({262144, 1})->Args({262144, 64})
    ->Args({1048576, 16})
    ->UseManualTime()->Iterations(1);
// Args: context, rows, split rows (the backend's fixed split; 256 today).
BENCHMARK(BM_attention_decode_mma_chunk)
    ->ArgsProduct({{4096}, {1, 16, 672, 2048}, {64, 128, 256}})
    ->ArgsProduct({{65536}, {1, 672}, {64, 128, 256}})
    ->UseManualTime()->Iterations(1);
// The same launches with q given as the kernel's F16 operand (the backend's default on sm_90a).
BENCHMARK(BM_attention_decode_mma_chunk_q16)
    ->ArgsProduct({{4096}, {1, 16, 2048}, {256}})
    ->ArgsProduct({{65536}, {1}, {256}})
    ->UseManualTime()->Iterations(1);

}  // namespace
