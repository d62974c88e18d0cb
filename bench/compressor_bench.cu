// Compressor decode step for 1 and 64 sequences at flash shape: a ratio-4 layer (attention
// hd 512 + indexer hd 128 compressors in one launch) and a ratio-128 layer, on the emitting
// position (the worst step: pooling, RMSNorm, RoPE, encode). Bytes = projections and ape read,
// state written and read for the pool (ratio 4: 8 rows; ratio 128: 128 rows of kv + score) and
// the row written. States rotate so they come from HBM.
#include <random>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/compressor.cuh"

namespace {

using namespace ds4;

struct stream_bufs {
    std::vector<device_buffer<float>> skv, ssc;
    device_buffer<float> kv, gate, norm;
    device_buffer<std::uint16_t> ape;
    device_buffer<std::uint8_t> pool;
    device_buffer<std::int32_t> table;
    kernels::compressor_stream s;
    double bytes = 0;
};

void make(stream_bufs& b, kernels::compressor_kind kind, int ratio, int hd, int n_seq, int rot) {
    kernels::compressor_stream& s = b.s;
    s.kind = kind;
    s.ratio = ratio;
    s.head_dim = hd;
    const int w = s.width(), rows = s.rows();
    const std::size_t st = std::size_t(rows) * w;
    std::vector<float> init(st * n_seq, 0.5f);
    for (int i = 0; i < rot; ++i) {
        b.skv.emplace_back(std::span<const float>(init));
        b.ssc.emplace_back(std::span<const float>(init));
    }
    std::vector<float> proj(std::size_t(n_seq) * w, 0.25f), norm(hd, 1.0f);
    b.kv = device_buffer<float>(std::span<const float>(proj));
    b.gate = device_buffer<float>(std::span<const float>(proj));
    b.norm = device_buffer<float>(std::span<const float>(norm));
    std::vector<std::uint16_t> ape(std::size_t(ratio) * w, f32_to_f16(0.1f));
    b.ape = device_buffer<std::uint16_t>(std::span<const std::uint16_t>(ape));
    const int row_bytes = kind == kernels::compressor_kind::attention ? model::attention_row_layout{hd, 64}.bytes()
                                                                      : model::indexer_row_layout{128}.bytes();
    b.pool = device_buffer<std::uint8_t>(std::size_t(n_seq) * model::kv_page_rows * row_bytes);
    std::vector<std::int32_t> table(n_seq);
    for (int q = 0; q < n_seq; ++q) table[q] = q;
    b.table = device_buffer<std::int32_t>(std::span<const std::int32_t>(table));
    s.ape = b.ape.data();
    s.norm = b.norm.data();
    s.kv = b.kv.data();
    s.gate = b.gate.data();
    s.proj_stride = w;
    s.state_stride = st;
    s.out = {b.pool.data(), b.table.data(), 1, row_bytes};
    s.rope = ds4_rope_params(true, 64);
    // Projections + ape row read, new state row written, pooled rows read, shift (ratio 4), row out.
    const double pool_rows = ratio == 4 ? 8 : ratio;
    b.bytes = n_seq * (2.0 * w * 4 + w * 2 + 2.0 * w * 4 + pool_rows * 2 * hd * 4 +
                       (ratio == 4 ? 2.0 * 4 * 2 * w * 4 : 0.0) + row_bytes);
}

void BM_compressor_decode(benchmark::State& state) {
    const int n_seq = int(state.range(0)), ratio = int(state.range(1));
    const std::size_t st_bytes = std::size_t(n_seq) * (ratio == 4 ? 8 * 1024 : 128 * 512) * 8;
    const int rot = bench::rotation_count(st_bytes);
    std::vector<stream_bufs> bufs(ratio == 4 ? 2 : 1);
    make(bufs[0], kernels::compressor_kind::attention, ratio, 512, n_seq, rot);
    if (ratio == 4) make(bufs[1], kernels::compressor_kind::indexer, 4, 128, n_seq, rot);
    // Emitting position for every sequence: pos = 64*ratio - 1 (row 63, inside page 0).
    const std::vector<std::uint32_t> pos(n_seq, std::uint32_t(64 * ratio - 1));
    device_buffer<std::uint32_t> d_pos{std::span<const std::uint32_t>(pos)};
    double bytes = 0;
    for (auto& b : bufs) bytes += b.bytes;
    auto launch = [&](int i, cudaStream_t s) {
        kernels::compressor_decode_launch a;
        a.n_streams = int(bufs.size());
        for (std::size_t k = 0; k < bufs.size(); ++k) {
            a.s[k] = bufs[k].s;
            a.s[k].state_kv = bufs[k].skv[std::size_t(i % rot)].data();
            a.s[k].state_score = bufs[k].ssc[std::size_t(i % rot)].data();
        }
        a.pos = d_pos.data();
        a.n_seq = n_seq;
        kernels::launch_compressor_decode(a, s);
    };
    const bench::timing t = bench::time_launches(launch);
    bench::report(state, t, bytes, 0);
}

}  // namespace

BENCHMARK(BM_compressor_decode)->Args({1, 4})->Args({64, 4})->Args({1, 128})->Args({64, 128})->UseManualTime()->Iterations(1);
