// Token embedding at flash shape (129280 x 4096 F16 table, 4 HC streams).
//
// BM_embedding (arg: rows): one launch for `rows` tokens. Bytes = per row, the F16 table row read
// (8 KiB) and the 4 x 4096 F32 streams written (64 KiB). Token ids are random per rotation, so the
// table rows come from HBM; outputs rotate through enough copies to leave the L2.
#include <cstdint>
#include <random>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/embedding.cuh"
#include "ds4/model/shape.hpp"

namespace {

using namespace ds4;
using S = model::flash_shape;

void BM_embedding(benchmark::State& state) {
    const int rows = int(state.range(0));
    const std::size_t out_bytes = std::size_t(rows) * S::n_hc * S::n_embd * 4;
    const int rot = bench::rotation_count(out_bytes);
    std::vector<std::uint16_t> table(std::size_t(S::n_vocab) * S::n_embd);
    std::mt19937_64 g(7);
    for (auto& v : table) v = f32_to_f16(float(int(g() % 2001) - 1000) * 1e-4f);
    device_buffer<std::uint16_t> d_table{std::span<const std::uint16_t>(table)};
    std::vector<device_buffer<std::int32_t>> tokens;
    std::vector<device_buffer<float>> X;
    for (int i = 0; i < rot; ++i) {
        std::vector<std::int32_t> t(rows);
        for (auto& v : t) v = std::int32_t(g() % S::n_vocab);
        tokens.emplace_back(std::span<const std::int32_t>(t));
        X.emplace_back(std::size_t(rows) * S::n_hc * S::n_embd);
    }
    auto launch = [&](int i, cudaStream_t s) {
        const kernels::embedding_launch a{d_table.data(), tokens[i % rot].data(), X[i % rot].data(), S::n_vocab, S::n_embd,
                                          S::n_hc, nullptr};
        kernels::launch_embedding(a, rows, s);
    };
    const double bytes = double(rows) * (S::n_embd * 2.0 + S::n_hc * S::n_embd * 4.0);
    bench::report(state, bench::time_launches(launch), bytes, 0);
}

}  // namespace

BENCHMARK(BM_embedding)->Arg(1)->Arg(16)->Arg(256)->UseManualTime()->Iterations(1);
