// Indexer decode step (prepare + scores + top-512 select) at flash shape (64 heads) for one
// sequence at 2K, 32K and 256K context: n_comp = ctx / 4 (2K uses 2K + 4 tokens so that
// n_comp = 513 > top_k and the indexer runs). Bytes = the E2M1 key rows read (80 B each); the
// key pools are rotated so they come from HBM. Target: >= 70% of the read ceiling at 256K.
#include <random>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/indexer.cuh"

namespace {

using namespace ds4;

void BM_indexer_decode(benchmark::State& state) {
    const int ctx = int(state.range(0));
    const int n_comp = ctx == 2048 ? 513 : ctx / 4;
    const int n_head = 64, top_k = 512, row_bytes = 80;
    const int pages = n_comp / model::kv_page_rows + 1;
    const std::size_t pool_bytes = std::size_t(pages) * model::kv_page_rows * row_bytes;
    const int rot = bench::rotation_count(pool_bytes);
    std::mt19937_64 g(1);
    std::vector<std::uint8_t> pool(pool_bytes);
    for (auto& b : pool) b = std::uint8_t(g());
    for (std::size_t r = 0; r < pool.size() / row_bytes; ++r)
        for (int e = 0; e < 4; ++e) pool[r * row_bytes + 64 + e] = std::uint8_t(-3 - int(g() % 3));
    std::vector<device_buffer<std::uint8_t>> pools;
    for (int i = 0; i < rot; ++i) pools.emplace_back(std::span<const std::uint8_t>(pool));
    std::vector<std::int32_t> table(pages);
    for (int p = 0; p < pages; ++p) table[p] = p;
    std::vector<float> qr(n_head * 128), wr(n_head);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (auto& v : qr) v = n01(g);
    for (auto& v : wr) v = n01(g);
    const std::vector<std::uint32_t> pos{std::uint32_t(4 * n_comp + 1)};
    const std::vector<std::int32_t> nc{n_comp};
    device_buffer<std::int32_t> d_table{std::span<const std::int32_t>(table)}, d_nc{std::span<const std::int32_t>(nc)};
    device_buffer<std::uint32_t> d_pos{std::span<const std::uint32_t>(pos)};
    device_buffer<float> d_qr{std::span<const float>(qr)}, d_wr{std::span<const float>(wr)}, d_q(qr.size()), d_w(wr.size()),
        d_scores(n_comp);
    device_buffer<unsigned> d_hist(4 * 256), d_state(10), d_bc(2 * kernels::indexer_select_blocks(n_comp));
    d_hist.fill_bytes(0);
    device_buffer<std::uint8_t> d_mask(n_comp);
    device_buffer<std::int32_t> d_sel(top_k), d_nsel(1);
    kernels::indexer_launch a;
    a.n_head = n_head;
    a.top_k = top_k;
    a.n_seq = 1;
    a.n_comp_capacity = n_comp;
    a.pos = d_pos.data();
    a.n_comp = d_nc.data();
    a.q_raw = d_qr.data();
    a.q_stride = n_head * 128;
    a.w_raw = d_wr.data();
    a.w_stride = n_head;
    a.w_scale = 1.0f / std::sqrt(float(128 * n_head));
    a.rope = ds4_rope_params(true, 64);
    a.q = d_q.data();
    a.w = d_w.data();
    a.scores = d_scores.data();
    a.hist = d_hist.data();
    a.sel_state = d_state.data();
    a.block_counts = d_bc.data();
    a.mask = d_mask.data();
    a.selected = d_sel.data();
    a.n_selected = d_nsel.data();
    auto launch = [&](int i, cudaStream_t s) {
        kernels::indexer_launch b = a;
        b.keys = {pools[std::size_t(i % rot)].data(), d_table.data(), pages, row_bytes};
        kernels::launch_indexer(b, s);
    };
    const bench::timing t = bench::time_launches(launch);
    bench::report(state, t, double(n_comp) * row_bytes, 2.0 * n_comp * n_head * 128);
    state.counters["n_comp"] = n_comp;
}

}  // namespace

BENCHMARK(BM_indexer_decode)->Arg(2048)->Arg(32768)->Arg(262144)->UseManualTime()->Iterations(1);
