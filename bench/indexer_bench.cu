// Indexer decode step at flash shape (64 heads, top-512) for 1, 16 and 64 sequences at 2K, 32K and
// 256K context: n_comp = ctx / 4 per sequence (2K uses 2K + 4 tokens so that n_comp = 513 > top_k
// and the indexer runs), every sequence on its own pages of the key pool.
//   BM_indexer_decode  prepare + scores + top-512 select (the whole launch_indexer)
//   BM_indexer_scores  the score kernels alone (queries prepared once), int8 tensor cores with
//                      the scalar kernel beside them, or the scalar kernel only (second arg < 0
//                      in the sequence count: -n = n sequences without the int8 scratch)
//   BM_indexer_select  the top-512 selection alone over scores computed once: one CTA a sequence
//                      with the keys in registers up to 1,024 rows (2K), six launches past it;
//                      bytes = the scores read (n_seq * n_comp * 4), no ops
// Bytes = the E2M1 key rows read (80 B each, n_seq * n_comp * 80); ops = 2 * n_seq * n_comp *
// n_head * 128 (reported as TFLOP/s; int8 TOP/s on the tensor-core path). The key pools are rotated
// so they come from HBM. Target: >= 70% of the read ceiling at 256K (scores, 64 sequences).
#include <cmath>
#include <random>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "bench/l2_flush.cuh"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/indexer.cuh"

namespace {

using namespace ds4;

struct indexer_setup {
    int n_seq = 0, n_comp = 0, pages = 0, rot = 0;
    static constexpr int n_head = 64, top_k = 512, row_bytes = 80;
    std::vector<device_buffer<std::uint8_t>> pools;
    device_buffer<std::int32_t> table, nc, sel, nsel;
    device_buffer<std::uint32_t> pos;
    device_buffer<float> qr, wr, q, w, scores, w8;
    device_buffer<unsigned> hist, state, bc;
    device_buffer<std::uint8_t> mask, flags;
    device_buffer<std::int8_t> q8;
    kernels::indexer_launch a;

    indexer_setup(int ctx, int seqs, bool int8) : n_seq(seqs) {
        n_comp = ctx == 2048 ? 513 : ctx / 4;
        pages = n_comp / model::kv_page_rows + 1;
        const std::size_t pool_bytes = std::size_t(n_seq) * pages * model::kv_page_rows * row_bytes;
        rot = bench::rotation_count(pool_bytes);
        std::mt19937_64 g(1);
        std::vector<std::uint8_t> pool(pool_bytes);
        for (std::size_t i = 0; i < pool.size(); i += 8) {
            const std::uint64_t r = g();
            for (std::size_t k = 0; k < 8 && i + k < pool.size(); ++k) pool[i + k] = std::uint8_t(r >> (8 * k));
        }
        // Block exponents 2^-3..2^-5, as the compressor's keys: every key on the int8 path.
        for (std::size_t r = 0; r < pool.size() / row_bytes; ++r)
            for (int e = 0; e < 4; ++e) pool[r * row_bytes + 64 + e] = std::uint8_t(-3 - int(g() % 3));
        for (int i = 0; i < rot; ++i) pools.emplace_back(std::span<const std::uint8_t>(pool));
        std::vector<std::int32_t> tab(std::size_t(n_seq) * pages);
        for (std::size_t p = 0; p < tab.size(); ++p) tab[p] = std::int32_t(p);  // sequence s: pages s*pages..
        std::vector<float> q_raw(std::size_t(n_seq) * n_head * 128), w_raw(std::size_t(n_seq) * n_head);
        std::normal_distribution<float> n01(0.0f, 1.0f);
        for (auto& v : q_raw) v = n01(g);
        for (auto& v : w_raw) v = n01(g);
        const std::vector<std::uint32_t> p(n_seq, std::uint32_t(4 * n_comp + 1));
        const std::vector<std::int32_t> n(n_seq, n_comp);
        table = device_buffer<std::int32_t>(std::span<const std::int32_t>(tab));
        nc = device_buffer<std::int32_t>(std::span<const std::int32_t>(n));
        pos = device_buffer<std::uint32_t>(std::span<const std::uint32_t>(p));
        qr = device_buffer<float>(std::span<const float>(q_raw));
        wr = device_buffer<float>(std::span<const float>(w_raw));
        q = device_buffer<float>(q_raw.size());
        w = device_buffer<float>(w_raw.size());
        scores = device_buffer<float>(std::size_t(n_seq) * n_comp);
        hist = device_buffer<unsigned>(std::size_t(n_seq) * 4 * 256);
        hist.fill_bytes(0);
        state = device_buffer<unsigned>(std::size_t(n_seq) * 10);
        bc = device_buffer<unsigned>(std::size_t(n_seq) * 2 * kernels::indexer_select_blocks(n_comp));
        mask = device_buffer<std::uint8_t>(std::size_t(n_seq) * n_comp);
        sel = device_buffer<std::int32_t>(std::size_t(n_seq) * top_k);
        nsel = device_buffer<std::int32_t>(n_seq);
        a.n_head = n_head;
        a.top_k = top_k;
        a.n_seq = n_seq;
        a.n_comp_capacity = n_comp;
        a.pos = pos.data();
        a.n_comp = nc.data();
        a.q_raw = qr.data();
        a.q_stride = n_head * 128;
        a.w_raw = wr.data();
        a.w_stride = n_head;
        a.w_scale = 1.0f / std::sqrt(float(128 * n_head));
        a.rope = ds4_rope_params(true, 64);
        a.q = q.data();
        a.w = w.data();
        a.keys = {pools[0].data(), table.data(), pages, row_bytes};
        a.scores = scores.data();
        a.hist = hist.data();
        a.sel_state = state.data();
        a.block_counts = bc.data();
        a.mask = mask.data();
        a.selected = sel.data();
        a.n_selected = nsel.data();
        if (int8) {
            q8 = device_buffer<std::int8_t>(std::size_t(n_seq) * kernels::indexer_max_heads * 128);
            w8 = device_buffer<float>(std::size_t(n_seq) * kernels::indexer_max_heads);
            flags = device_buffer<std::uint8_t>(std::size_t(n_seq) * kernels::indexer_max_heads);
            a.q_int8 = q8.data();
            a.w_int8 = w8.data();
            a.head_int8 = flags.data();
        }
    }

    kernels::indexer_launch at(int i) const {
        kernels::indexer_launch b = a;
        b.keys.pool = pools[std::size_t(i % rot)].data();
        return b;
    }

    double bytes() const { return double(n_seq) * n_comp * row_bytes; }
    double ops() const { return 2.0 * n_seq * n_comp * n_head * 128; }
};

void indexer_decode(benchmark::State& state, bool cold) {
    indexer_setup s(int(state.range(0)), int(state.range(1)), true);
    bench::cold_launches flush(cold);
    const bench::timing t = bench::time_launches([&](int i, cudaStream_t st) {
        flush.before(st);
        kernels::launch_indexer(s.at(i), st);
    });
    bench::report(state, t, s.bytes(), s.ops());
    state.counters["n_comp"] = s.n_comp;
    state.counters["n_seq"] = s.n_seq;
}

void BM_indexer_decode(benchmark::State& state) { indexer_decode(state, false); }
// Each step after bench/l2_flush.cuh's read (subtract BM_l2_flush): code and inputs cold.
void BM_indexer_decode_cold(benchmark::State& state) { indexer_decode(state, true); }

void BM_indexer_scores(benchmark::State& state) {
    const int seqs = int(state.range(1));
    indexer_setup s(int(state.range(0)), seqs < 0 ? -seqs : seqs, seqs > 0);
    kernels::launch_indexer(s.a, nullptr);  // prepared queries (and int8 operands, path flags)
    cuda_check(cudaDeviceSynchronize(), "indexer prepare");
    const bench::timing t =
        bench::time_launches([&](int i, cudaStream_t st) { kernels::launch_indexer_scores(s.at(i), st); });
    bench::report(state, t, s.bytes(), s.ops());
    state.counters["n_comp"] = s.n_comp;
    state.counters["n_seq"] = s.n_seq;
    state.counters["int8"] = seqs > 0;
}

void BM_indexer_select(benchmark::State& state) {
    indexer_setup s(int(state.range(0)), int(state.range(1)), true);
    kernels::launch_indexer(s.a, nullptr);  // the scores the selection reads
    cuda_check(cudaDeviceSynchronize(), "indexer scores");
    const bench::timing t =
        bench::time_launches([&](int i, cudaStream_t st) { kernels::launch_indexer_select(s.at(i), st); });
    bench::report(state, t, double(s.n_seq) * s.n_comp * sizeof(float), 0);
    state.counters["n_comp"] = s.n_comp;
    state.counters["n_seq"] = s.n_seq;
}

}  // namespace

// 1024: n_comp 256 <= top_k, no sequence active: every kernel exits at once, the launch cost a
// decode step below 2K tokens pays per ratio-4 layer (one select launch instead of six since the
// single-CTA select). 2048 (n_comp 513) and 2048 x 64 select on that path too.
BENCHMARK(BM_indexer_decode)
    ->Args({1024, 1})
    ->Args({2048, 1})
    ->Args({32768, 1})
    ->Args({262144, 1})
    ->Args({2048, 64})
    ->Args({32768, 16})
    ->Args({32768, 64})
    ->Args({262144, 16})
    ->Args({262144, 64})
    ->UseManualTime()
    ->Iterations(1);
BENCHMARK(BM_indexer_decode_cold)->Args({2048, 1})->Args({32768, 1})->UseManualTime()->Iterations(1);
BENCHMARK(ds4::bench::BM_l2_flush)->UseManualTime()->Iterations(1);
BENCHMARK(BM_indexer_scores)
    ->Args({32768, 1})
    ->Args({262144, 1})
    ->Args({32768, 16})
    ->Args({32768, 64})
    ->Args({262144, 16})
    ->Args({262144, 64})
    ->Args({262144, -1})
    ->Args({32768, -16})
    ->UseManualTime()
    ->Iterations(1);
BENCHMARK(BM_indexer_select)
    ->Args({2048, 1})
    ->Args({2048, 16})
    ->Args({32768, 1})
    ->Args({65536, 1})
    ->Args({32768, 16})
    ->UseManualTime()
    ->Iterations(1);
