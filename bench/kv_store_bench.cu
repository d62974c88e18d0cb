// kernels/kv_store.cuh: one decode step's KV store (RoPE + E4M3 encode + F16 tail into pages)
// for 1, 16 and 64 sequences at the flash row shape (head_dim 512, 592-byte native rows), and a
// 2048-row chunk of one sequence (the prefill shape). Bytes counted: the F32 kv rows, positions
// and slots read, the native rows written. Inputs rotate over several sets of page pools.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/kv_store.cuh"

namespace ds4::bench {
namespace {

void run(benchmark::State& state, int n_seq, int rows_per_seq) {
    const model::attention_row_layout lay{512, 64};
    const int rows = n_seq * rows_per_seq;
    const int pages_per_seq = (rows_per_seq + model::kv_page_rows - 1) / model::kv_page_rows + 1;
    std::mt19937 g(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> kv(std::size_t(rows) * lay.head_dim);
    for (auto& v : kv) v = nd(g);
    std::vector<std::int32_t> pos(rows), seq(rows), table(std::size_t(n_seq) * pages_per_seq);
    for (int s = 0; s < n_seq; ++s)
        for (int j = 0; j < rows_per_seq; ++j) {
            // Decode rows sit at scattered positions in the first page; chunk rows are consecutive.
            pos[std::size_t(s) * rows_per_seq + j] = rows_per_seq == 1 ? int(g() % model::kv_page_rows) : j;
            seq[std::size_t(s) * rows_per_seq + j] = s;
        }
    for (std::size_t i = 0; i < table.size(); ++i) table[i] = std::int32_t(i);
    const std::size_t pool_bytes = table.size() * model::kv_page_rows * std::size_t(lay.bytes());
    const int sets = rotation_count(pool_bytes + kv.size() * 4);
    std::vector<device_buffer<float>> d_kv;
    std::vector<device_buffer<std::uint8_t>> d_pool;
    for (int i = 0; i < sets; ++i) {
        d_kv.emplace_back(std::span<const float>(kv));
        d_pool.emplace_back(pool_bytes);
    }
    device_buffer<std::int32_t> d_pos{std::span<const std::int32_t>(pos)}, d_seq{std::span<const std::int32_t>(seq)},
        d_table{std::span<const std::int32_t>(table)};
    const rope_params rp = ds4_rope_params(true);
    const auto t = time_launches([&](int i, cudaStream_t st) {
        const int k = i % sets;
        const kernels::kv_store_launch a{d_kv[k].data(), d_pos.data(), d_seq.data(), nullptr, d_table.data(),
                                         d_pool[k].data(), pages_per_seq, lay, rp};
        kernels::kv_store(a, rows, st);
    });
    const double bytes = double(rows) * (lay.head_dim * 4.0 + 8.0 + lay.bytes());
    report(state, t, bytes, 0);
    state.counters["rows"] = rows;
}

void BM_kv_store_decode(benchmark::State& state) { run(state, int(state.range(0)), 1); }
void BM_kv_store_chunk(benchmark::State& state) { run(state, 1, int(state.range(0))); }
BENCHMARK(BM_kv_store_decode)->Arg(1)->Arg(16)->Arg(64)->UseManualTime()->Iterations(1);
BENCHMARK(BM_kv_store_chunk)->Arg(2048)->UseManualTime()->Iterations(1);

}  // namespace
}  // namespace ds4::bench
