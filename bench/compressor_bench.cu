// Compressor benchmarks at flash shape, for a ratio-4 layer (attention hd 512 + indexer hd 128
// compressors in one launch) and a ratio-128 layer (attention hd 512).
//
// BM_compressor_decode (args: sequences, ratio): one step of 1 and 64 sequences on the emitting
// position (the worst step: pooling, RMSNorm, RoPE, encode). Bytes = projections and ape read,
// state written and read for the pool (ratio 4: 8 rows; ratio 128: 128 rows of kv + score) and
// the row written. States rotate so they come from HBM. A third argument of 1 runs each launch
// after BM_l2_flush's 256 MB read (its time to subtract): the emission with its code and state
// cold, as in a decode step, where the weight streams between two emissions of a layer leave L2
// holding neither (the H100's graph timeline had main's emission at ~14 us, the warm bench ~8.6).
//
// BM_compressor_decode_runs (args: rows k, ratio): one sequence's run of k rows (a decode row and
// k - 1 verify rows) through the run form, the last row emitting, every row after the first
// saving the frontier it starts from (what a verify step asks of a layer). Bytes = per row the
// projections and ape read and the new state row written, per save the frontier read and written
// (kv + score), the pool's rows read and the row written. The state and its k saved copies (at
// most 2.6 MB at ratio 128) are not rotated: they come from L2, as in a step, where the launch
// before wrote them.
//
// BM_compressor_prefill (args: chunk tokens T, ratio, p0): one chunk of T tokens of one sequence
// at positions p0 .. p0+T-1 (both kernels of launch_compressor_prefill). p0 = 0 starts a prompt;
// p0 = 32768 + 66 continues one with a frontier state carried in, inside an open window of both
// ratios (p0 % 4 = 2, p0 % 128 = 66), so the first windows pool rows read from that state: at a
// window-aligned p0 such as 32768 a ratio-128 layer reads no state at all. Bytes per stream, each
// counted once: kv + gate projections of the T tokens (F32) and ape (F16) + norm (F32) read; the
// pre-chunk state rows the first windows pool read (kv + score: ratio r, the p0 % r open rows of
// hd; ratio 4, the last completed window's 4 rows of hd plus the p0 % 4 open rows of both
// halves); the whole frontier written (rows x width, kv + score); and the rows emitted written
// (native encoding: 592 B attention, 80 B indexer). FLOPs are not counted: per emitted row the
// work is a pool, a serial RMSNorm and an encode, far below any compute ceiling. Projections,
// states and output pages rotate (the projections of a 4096-token ratio-4 chunk are 40 MiB, under
// the 60 MB L2); ape and norm, at most 128 KiB per stream, do not.
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "bench/l2_flush.cuh"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/compressor.cuh"

namespace {

using namespace ds4;

int native_row_bytes(kernels::compressor_kind kind, int hd) {
    return kind == kernels::compressor_kind::attention ? model::attention_row_layout{hd, 64}.bytes()
                                                       : model::indexer_row_layout{128}.bytes();
}

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
    const int row_bytes = native_row_bytes(kind, hd);
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
    const bool cold = state.range(2) != 0;
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
    bench::cold_launches flusher(cold);
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
        flusher.before(s);
        kernels::launch_compressor_decode(a, s);
    };
    const bench::timing t = bench::time_launches(launch);
    bench::report(state, t, bytes, 0);
}

void BM_compressor_decode_runs(benchmark::State& state) {
    const int k = int(state.range(0)), ratio = int(state.range(1));
    std::vector<stream_bufs> bufs(ratio == 4 ? 2 : 1);
    make(bufs[0], kernels::compressor_kind::attention, ratio, 512, k, 1);
    if (ratio == 4) make(bufs[1], kernels::compressor_kind::indexer, 4, 128, k, 1);
    // One block per sequence as the backend lays it out: per stream (1 + k) slots of kv + score.
    std::size_t block = 0;
    std::vector<std::size_t> at(bufs.size());
    for (std::size_t i = 0; i < bufs.size(); ++i) {
        at[i] = block;
        block += std::size_t(1 + k) * 2 * std::size_t(bufs[i].s.rows()) * bufs[i].s.width();
    }
    device_buffer<float> blocks{std::span<const float>(std::vector<float>(block, 0.5f))};
    const std::vector<float*> row_state(std::size_t(k), blocks.data());
    device_buffer<float*> d_row_state{std::span<float* const>(row_state)};
    // Positions ending on an emission; the run's first row starts it, the others save into slots 1..k-1.
    std::vector<std::uint32_t> pos(std::size_t(k), 0u);
    std::vector<std::int32_t> run_rows(std::size_t(k), 0), save_slot(std::size_t(k), -1);
    for (int t = 0; t < k; ++t) {
        pos[std::size_t(t)] = std::uint32_t(64 * ratio - k + t);
        if (t > 0) save_slot[std::size_t(t)] = t;
    }
    run_rows[0] = k;
    device_buffer<std::uint32_t> d_pos{std::span<const std::uint32_t>(pos)};
    device_buffer<std::int32_t> d_run{std::span<const std::int32_t>(run_rows)}, d_save{std::span<const std::int32_t>(save_slot)};
    double bytes = 0;
    kernels::compressor_decode_launch a;
    a.n_streams = int(bufs.size());
    for (std::size_t i = 0; i < bufs.size(); ++i) {
        kernels::compressor_stream c = bufs[i].s;
        const std::size_t floats = std::size_t(c.rows()) * c.width();
        c.state_kv = c.state_score = nullptr;
        c.state_stride = 0;
        c.row_state = d_row_state.data();
        c.row_kv_offset = at[i];
        c.row_score_offset = at[i] + floats;
        a.s[i] = c;
        const int w = c.width(), hd = c.head_dim;
        const double pool_rows = ratio == 4 ? 8 : ratio;
        bytes += k * (2.0 * w * 4 + w * 2 + 2.0 * w * 4) + (k - 1) * 2.0 * (2.0 * floats * 4) + pool_rows * 2 * hd * 4 +
                 native_row_bytes(c.kind, hd);
    }
    a.pos = d_pos.data();
    a.n_seq = k;
    a.run_rows = d_run.data();
    a.save_slot = d_save.data();
    auto launch = [&](int, cudaStream_t s) { kernels::launch_compressor_decode(a, s); };
    const bench::timing t = bench::time_launches(launch);
    bench::report(state, t, bytes, 0);
}

// One stream of a prefill chunk: `rot` copies of everything a launch writes or streams.
struct prefill_bufs {
    std::vector<device_buffer<float>> kv, gate, skv, ssc;
    std::vector<device_buffer<std::uint8_t>> pool;
    device_buffer<float> norm;
    device_buffer<std::uint16_t> ape;
    device_buffer<std::int32_t> table;
    kernels::compressor_stream s;
    double bytes = 0;
    std::int64_t rows_emitted = 0;
};

std::vector<float> normal_values(std::mt19937_64& rng, std::size_t n, float mean, float sd) {
    std::normal_distribution<float> nd(mean, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
}

// The bytes of one stream over one chunk (see the header comment).
double prefill_bytes(const kernels::compressor_stream& s, std::int64_t p0, int n_tokens, int row_bytes,
                     std::int64_t rows_emitted) {
    const double w = s.width(), hd = s.head_dim, r = s.ratio;
    const double proj = 2.0 * n_tokens * w * 4;
    const double weights = r * w * 2 + hd * 4;
    const double state_values = s.ratio == 4 ? (p0 >= 4 ? 4 * hd : 0.0) + double(p0 % 4) * w : double(p0 % s.ratio) * hd;
    const double state_read = 2.0 * state_values * 4;
    const double state_written = 2.0 * s.rows() * w * 4;
    return proj + weights + state_read + state_written + double(rows_emitted) * row_bytes;
}

void make_prefill(prefill_bufs& b, std::mt19937_64& rng, kernels::compressor_kind kind, int ratio, int hd,
                  std::int64_t p0, int n_tokens, int rot) {
    kernels::compressor_stream& s = b.s;
    s.kind = kind;
    s.ratio = ratio;
    s.head_dim = hd;
    const int w = s.width();
    const std::size_t st = std::size_t(s.rows()) * w;
    // Random non-zero inputs (values do not change the work, zeros might): one host image per
    // array, uploaded to every rotation copy.
    const std::vector<float> kv = normal_values(rng, std::size_t(n_tokens) * w, 0.0f, 1.0f);
    const std::vector<float> gate = normal_values(rng, std::size_t(n_tokens) * w, 0.0f, 1.0f);
    const std::vector<float> skv = normal_values(rng, st, 0.0f, 1.0f), ssc = normal_values(rng, st, 0.0f, 1.0f);
    const std::vector<float> norm = normal_values(rng, std::size_t(hd), 1.0f, 0.1f);
    const std::vector<float> ape_f = normal_values(rng, std::size_t(ratio) * w, 0.0f, 0.1f);
    std::vector<std::uint16_t> ape(ape_f.size());
    std::transform(ape_f.begin(), ape_f.end(), ape.begin(), [](float x) { return f32_to_f16(x); });
    b.norm = device_buffer<float>(std::span<const float>(norm));
    b.ape = device_buffer<std::uint16_t>(std::span<const std::uint16_t>(ape));
    // Rows p0/r .. (p0+T)/r - 1 are emitted; the pool holds only their pages, and the table's
    // entries for earlier pages are never read.
    const std::int64_t first_row = p0 / ratio, end_row = (p0 + n_tokens) / ratio;
    const int first_page = int(first_row / model::kv_page_rows);
    const int n_entries = int((std::max(end_row, first_row + 1) - 1) / model::kv_page_rows) + 1;
    const int n_pages = n_entries - first_page;
    std::vector<std::int32_t> table(std::size_t(n_entries), -1);
    for (int i = first_page; i < n_entries; ++i) table[std::size_t(i)] = i - first_page;
    b.table = device_buffer<std::int32_t>(std::span<const std::int32_t>(table));
    const int row_bytes = native_row_bytes(kind, hd);
    for (int i = 0; i < rot; ++i) {
        b.kv.emplace_back(std::span<const float>(kv));
        b.gate.emplace_back(std::span<const float>(gate));
        b.skv.emplace_back(std::span<const float>(skv));
        b.ssc.emplace_back(std::span<const float>(ssc));
        b.pool.emplace_back(std::size_t(n_pages) * model::kv_page_rows * row_bytes);
    }
    s.ape = b.ape.data();
    s.norm = b.norm.data();
    s.proj_stride = w;
    s.state_stride = st;
    s.out = {nullptr, b.table.data(), n_entries, row_bytes};
    s.rope = ds4_rope_params(true, 64);
    b.rows_emitted = end_row - first_row;
    b.bytes = prefill_bytes(s, p0, n_tokens, row_bytes, b.rows_emitted);
}

// Bytes of one stream's rotation copy that matter for L2: projections and state (the pages
// written are under 1 MB).
std::size_t prefill_copy_bytes(int ratio, int hd, int n_tokens) {
    const std::size_t w = std::size_t(ratio == 4 ? 2 : 1) * hd, rows = std::size_t(ratio == 4 ? 2 : 1) * ratio;
    return (std::size_t(n_tokens) + rows) * w * 8;
}

void BM_compressor_prefill(benchmark::State& state) {
    const int n_tokens = int(state.range(0)), ratio = int(state.range(1));
    const std::int64_t p0 = state.range(2);
    const int rot = bench::rotation_count(prefill_copy_bytes(ratio, 512, n_tokens) +
                                          (ratio == 4 ? prefill_copy_bytes(4, 128, n_tokens) : 0));
    std::mt19937_64 rng(0x5eed + std::uint64_t(ratio));
    std::vector<prefill_bufs> bufs(ratio == 4 ? 2 : 1);
    make_prefill(bufs[0], rng, kernels::compressor_kind::attention, ratio, 512, p0, n_tokens, rot);
    if (ratio == 4) make_prefill(bufs[1], rng, kernels::compressor_kind::indexer, 4, 128, p0, n_tokens, rot);
    const std::vector<std::uint32_t> pos0{std::uint32_t(p0)};
    device_buffer<std::uint32_t> d_pos0{std::span<const std::uint32_t>(pos0)};
    double bytes = 0, rows = 0;
    for (auto& b : bufs) {
        bytes += b.bytes;
        rows += double(b.rows_emitted);
    }
    auto launch = [&](int i, cudaStream_t s) {
        const std::size_t c = std::size_t(i % rot);
        kernels::compressor_prefill_launch a;
        a.n_streams = int(bufs.size());
        for (std::size_t k = 0; k < bufs.size(); ++k) {
            a.s[k] = bufs[k].s;
            a.s[k].kv = bufs[k].kv[c].data();
            a.s[k].gate = bufs[k].gate[c].data();
            a.s[k].state_kv = bufs[k].skv[c].data();
            a.s[k].state_score = bufs[k].ssc[c].data();
            a.s[k].out.pool = bufs[k].pool[c].data();
        }
        a.pos0 = d_pos0.data();
        a.seq = 0;
        a.n_tokens = n_tokens;
        kernels::launch_compressor_prefill(a, s);
    };
    const bench::timing t = bench::time_launches(launch);
    bench::report(state, t, bytes, 0);
    state.counters["tokens"] = n_tokens;
    state.counters["p0"] = double(p0);
    state.counters["rows"] = rows;
    state.counters["rot"] = rot;
}

}  // namespace

// Args: sequences, ratio, cold (1: each launch after BM_l2_flush's read: subtract its time).
BENCHMARK(BM_compressor_decode)->Args({1, 4, 0})->Args({64, 4, 0})->Args({1, 128, 0})->Args({64, 128, 0})
    ->Args({1, 4, 1})->UseManualTime()->Iterations(1);
BENCHMARK(ds4::bench::BM_l2_flush)->UseManualTime()->Iterations(1);
BENCHMARK(BM_compressor_decode_runs)->Args({1, 4})->Args({4, 4})->Args({1, 128})->Args({4, 128})->UseManualTime()->Iterations(1);
// Args: chunk tokens, ratio, p0 (0: start of a prompt; 32768 + 66: inside an open window of both
// ratios, so the frontier state carried in is read).
BENCHMARK(BM_compressor_prefill)
    ->Args({2048, 4, 0})->Args({4096, 4, 0})->Args({2048, 4, 32768 + 66})->Args({4096, 4, 32768 + 66})
    ->Args({2048, 128, 0})->Args({4096, 128, 0})->Args({2048, 128, 32768 + 66})->Args({4096, 128, 32768 + 66})
    ->UseManualTime()->Iterations(1);
