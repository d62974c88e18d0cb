// ds4-validate rows for kernels/compressor.cuh and kernels/indexer.cuh against reference/compressor
// and reference/indexer (+ the engine's native row encoding), bitwise.
//   compressor: decode over runs of positions crossing several emissions, many sequences at
//   different positions (some idle on some steps) in one captured graph replayed with new device
//   inputs; ratio 4 (attention + indexer compressor in one launch), 128 and tiny's 16; prefill
//   chunks from a mid-window state. Emitted row bytes, untouched rows (poison), and state floats.
//   Verify runs: 1..4 consecutive rows of a sequence through one block (run_case), with frontier
//   saves between rows checked against the reference state each row started from.
//   At 2K/32K/256K context (full run): decode of 1 and 64 sequences straddling the power of two
//   (emitting and non-emitting steps), 2048-token prefill chunks from mid-window at 32K+ and
//   256K+; the frontier state comes from replaying one window, not the whole history.
//   indexer: prepared queries/weights, scores, mask and list at odd and real compressed-row
//   counts with duplicated keys (equal scores), a second sequence below the threshold, and the
//   selection alone on scores with massive ties; with and without the int8 scratch. Batches of
//   16/64 sequences (own pages, own lengths) at 2K/32K/256K context mix keys and query heads on
//   both sides of the int8 precondition (block spread > 3, exponents at and past the bounds,
//   zero blocks and rows, zero and tiny weights), checking the device's per-head path flags
//   against the CPU predicate as well as scores, mask and list.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ds4/core/cuda_graph.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/core/half.hpp"
#include "ds4/kernels/compressor.cuh"
#include "ds4/kernels/indexer.cuh"
#include "ds4/model/kv_layout.hpp"
#include "harness/validate/checks.hpp"
#include "reference/compressor.hpp"
#include "reference/indexer.hpp"
#include "reference/parallel.hpp"

namespace ds4::validate {
namespace {

using kernels::compressor_kind;
constexpr std::uint8_t poison = 0xa5;

int row_bytes_of(compressor_kind k, int hd) {
    return k == compressor_kind::attention ? model::attention_row_layout{hd, 64}.bytes()
                                           : model::indexer_row_layout{128}.bytes();
}

// Bytes plus decoded floats (for NaN positions) of two rows; adds to `c`.
void compare_row(comparison& c, compressor_kind k, int hd, const std::uint8_t* got, const std::uint8_t* want) {
    const int nb = row_bytes_of(k, hd);
    std::vector<float> g(hd), w(hd);
    if (k == compressor_kind::attention) {
        model::decode_attention_row({hd, 64}, got, g.data());
        model::decode_attention_row({hd, 64}, want, w.data());
    } else {
        model::decode_indexer_row({128}, got, g.data());
        model::decode_indexer_row({128}, want, w.data());
    }
    const comparison r = compare(g, w);
    c.max_abs = std::max(c.max_abs, r.max_abs);
    c.max_ulp = std::max(c.max_ulp, r.max_ulp);
    c.special_mismatches += r.special_mismatches;
    c.count += std::size_t(nb);
    for (int i = 0; i < nb; ++i) c.mismatches += got[i] != want[i];
}

void add(comparison& c, const comparison& r) {
    c.max_abs = std::max(c.max_abs, r.max_abs);
    c.max_ulp = std::max(c.max_ulp, r.max_ulp);
    c.mismatches += r.mismatches;
    c.special_mismatches += r.special_mismatches;
    c.count += r.count;
}

struct stream_cfg {
    compressor_kind kind;
    int ratio, hd;
};

// Host and device state of one compressor over n_seq sequences. Logical pages below first_page
// (history that a long case does not replay, see replay_from) all map to one trap page, which
// must stay poisoned: a 256K context then costs a few pages per sequence, not 65536 rows.
struct comp_stream {
    stream_cfg cfg;
    int width = 0, rows = 0, pages_per_seq = 0, row_bytes = 0, first_page = 0, trap_page = 0;
    std::vector<std::uint16_t> ape;
    std::vector<float> norm;
    std::vector<ref::compressor_state> st;
    std::vector<std::vector<std::vector<std::uint8_t>>> ref_rows;  // [seq][row - row0[seq]] bytes
    std::vector<int> row0;                                         // cache row of ref_rows[seq][0]
    std::vector<std::int32_t> table;
    device_buffer<std::uint16_t> d_ape;
    device_buffer<float> d_norm, d_kv, d_gate, d_skv, d_ssc;
    device_buffer<std::uint8_t> d_pool;
    device_buffer<std::int32_t> d_table;
};

// The first position the host replays to reach the state at pos. Every row of the state (the
// current window, and for ratio 4 the previous one) is rewritten by one full window of tokens,
// so from the start of the window before pos's the replay leaves the state a replay from 0 would
// (up to the random inputs). Short histories are replayed whole: cheap, and they keep the
// sequence-start state (scores still -1e30) covered.
std::uint32_t replay_from(std::uint32_t pos, int ratio) {
    constexpr std::uint32_t full_replay_below = 1024;
    const std::uint32_t r = std::uint32_t(ratio);
    return pos < full_replay_below ? 0 : (pos / r - 1) * r;
}

// row0[q]: the cache row of the first row the host replay of sequence q emits (replay_from / ratio).
void init_stream(comp_stream& s, std::mt19937_64& g, int n_seq, int max_rows, int proj_rows,
                 const std::vector<int>& row0) {
    std::normal_distribution<float> n01(0.0f, 1.0f);
    const auto& c = s.cfg;
    s.st.clear();
    for (int i = 0; i < n_seq; ++i) s.st.push_back(ref::make_compressor_state(c.ratio, c.hd));
    s.width = s.st[0].width();
    s.rows = s.st[0].rows();
    s.ape.resize(std::size_t(c.ratio) * s.width);
    for (auto& v : s.ape) v = f32_to_f16(0.5f * n01(g));
    s.norm.resize(c.hd);
    for (auto& v : s.norm) v = 1.0f + 0.2f * n01(g);
    s.ref_rows.assign(n_seq, {});
    s.row0 = row0;
    s.row_bytes = row_bytes_of(c.kind, c.hd);
    s.pages_per_seq = max_rows / model::kv_page_rows + 1;
    s.first_page = *std::min_element(row0.begin(), row0.end()) / model::kv_page_rows;
    const int live = s.pages_per_seq - s.first_page;
    s.trap_page = n_seq * live;
    s.d_ape = device_buffer<std::uint16_t>(std::span<const std::uint16_t>(s.ape));
    s.d_norm = device_buffer<float>(std::span<const float>(s.norm));
    s.d_kv = device_buffer<float>(std::size_t(proj_rows) * s.width);
    s.d_gate = device_buffer<float>(std::size_t(proj_rows) * s.width);
    s.d_skv = device_buffer<float>(std::size_t(n_seq) * s.rows * s.width);
    s.d_ssc = device_buffer<float>(std::size_t(n_seq) * s.rows * s.width);
    s.d_pool = device_buffer<std::uint8_t>(std::size_t(s.trap_page + 1) * model::kv_page_rows * s.row_bytes);
    s.d_pool.fill_bytes(poison);
    // Pages in reverse order, so that a kernel ignoring the table writes the wrong place.
    s.table.assign(std::size_t(n_seq) * s.pages_per_seq, s.trap_page);
    for (int q = 0; q < n_seq; ++q)
        for (int p = s.first_page; p < s.pages_per_seq; ++p)
            s.table[std::size_t(q) * s.pages_per_seq + p] = q * live + (s.pages_per_seq - 1 - p);
    s.d_table = device_buffer<std::int32_t>(std::span<const std::int32_t>(s.table));
}

void upload_state(comp_stream& s) {
    std::vector<float> kv, sc;
    for (const auto& st : s.st) {
        kv.insert(kv.end(), st.kv.begin(), st.kv.end());
        sc.insert(sc.end(), st.score.begin(), st.score.end());
    }
    s.d_skv.upload(kv);
    s.d_ssc.upload(sc);
}

kernels::compressor_stream device_stream(const comp_stream& s) {
    kernels::compressor_stream c;
    c.kind = s.cfg.kind;
    c.ratio = s.cfg.ratio;
    c.head_dim = s.cfg.hd;
    c.n_rot = 64;
    c.ape = s.d_ape.data();
    c.norm = s.d_norm.data();
    c.kv = s.d_kv.data();
    c.gate = s.d_gate.data();
    c.proj_stride = s.width;
    c.state_kv = s.d_skv.data();
    c.state_score = s.d_ssc.data();
    c.state_stride = std::size_t(s.rows) * s.width;
    c.out = {s.d_pool.data(), s.d_table.data(), s.pages_per_seq, s.row_bytes};
    c.rope = ds4_rope_params(true, 64);
    c.eps = 1e-6f;
    return c;
}

// One reference step of stream s for sequence q at pos: random projections (appended to kv/gate
// host buffers for the device), reference update, encoded row kept.
void ref_step(comp_stream& s, std::mt19937_64& g, int q, std::uint32_t pos, std::vector<float>& kv_h,
              std::vector<float>& gate_h) {
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> kv(s.width), gate(s.width), sc(s.width), out(s.cfg.hd);
    for (int j = 0; j < s.width; ++j) {
        kv[j] = n01(g);
        gate[j] = 2.0f * n01(g);
        sc[j] = gate[j] + f16_to_f32(s.ape[std::size_t(pos % std::uint32_t(s.cfg.ratio)) * s.width + j]);
    }
    kv_h.insert(kv_h.end(), kv.begin(), kv.end());
    gate_h.insert(gate_h.end(), gate.begin(), gate.end());
    const auto kind = s.cfg.kind == compressor_kind::attention ? ref::compressed_row_kind::attention
                                                               : ref::compressed_row_kind::indexer;
    if (ref::compressor_update(s.st[q], kv.data(), sc.data(), s.norm.data(), pos, ds4_rope_params(true, 64), 64, kind,
                               1e-6f, out.data())) {
        std::vector<std::uint8_t> b(s.row_bytes);
        if (kind == ref::compressed_row_kind::attention) model::encode_attention_row({s.cfg.hd, 64}, out.data(), b.data());
        else model::encode_indexer_row({128}, out.data(), b.data());
        s.ref_rows[q].push_back(std::move(b));
    }
}

// Compare cache rows [first[q], end) of every sequence, poison elsewhere (the trap page once).
comparison compare_cache_rows(comp_stream& s, int n_seq, const std::vector<int>& first) {
    comparison c;
    const auto pool = s.d_pool.download();
    auto page_at = [&](int page) { return pool.data() + std::size_t(page) * model::kv_page_rows * s.row_bytes; };
    for (int q = 0; q < n_seq; ++q) {
        auto at = [&](int row) {
            return page_at(s.table[std::size_t(q) * s.pages_per_seq + row / model::kv_page_rows]) +
                   std::size_t(row % model::kv_page_rows) * s.row_bytes;
        };
        const int end = s.row0[q] + int(s.ref_rows[q].size());
        for (int row = s.first_page * model::kv_page_rows; row < s.pages_per_seq * model::kv_page_rows; ++row) {
            if (row >= first[q] && row < end) {
                compare_row(c, s.cfg.kind, s.cfg.hd, at(row), s.ref_rows[q][row - s.row0[q]].data());
            } else {
                for (int i = 0; i < s.row_bytes; ++i) c.mismatches += at(row)[i] != poison;
            }
        }
    }
    for (int i = 0; i < model::kv_page_rows * s.row_bytes; ++i) c.mismatches += page_at(s.trap_page)[i] != poison;
    return c;
}

// compare_cache_rows, and the state.
comparison finish_compare(comp_stream& s, int n_seq, const std::vector<int>& first) {
    comparison c = compare_cache_rows(s, n_seq, first);
    const auto kv = s.d_skv.download(), sc = s.d_ssc.download();
    for (int q = 0; q < n_seq; ++q) {
        const std::size_t n = s.st[q].kv.size();
        add(c, compare(std::span<const float>(kv.data() + q * n, n), s.st[q].kv));
        add(c, compare(std::span<const float>(sc.data() + q * n, n), s.st[q].score));
    }
    return c;
}

std::string cfg_name(const std::vector<stream_cfg>& cfgs) {
    std::string n;
    for (const auto& c : cfgs)
        n += std::string(n.empty() ? "" : "+") + (c.kind == compressor_kind::attention ? "attn" : "idx") + " r" +
             std::to_string(c.ratio) + " hd" + std::to_string(c.hd);
    return n;
}

// Sequence q starts at p_base + (q * 37 + 5 * q * q) % (2 * r_max + 3): starts spread over two
// windows of the largest ratio, so that some steps emit and most do not.
check_row decode_case(std::uint64_t seed, const std::vector<stream_cfg>& cfgs, int n_seq, int steps,
                      std::uint32_t p_base = 0) {
    std::mt19937_64 g(seed);
    const int r_max = std::max_element(cfgs.begin(), cfgs.end(), [](auto& a, auto& b) { return a.ratio < b.ratio; })->ratio;
    std::vector<std::uint32_t> cur(n_seq);
    for (int q = 0; q < n_seq; ++q) cur[q] = p_base + std::uint32_t((q * 37 + 5 * q * q) % (2 * r_max + 3));
    const std::uint32_t lo = *std::min_element(cur.begin(), cur.end()), hi = *std::max_element(cur.begin(), cur.end());
    std::vector<comp_stream> ss(cfgs.size());
    const int max_pos = int(hi) + steps + 1;
    for (std::size_t i = 0; i < cfgs.size(); ++i) {
        ss[i].cfg = cfgs[i];
        std::vector<int> row0(n_seq);
        for (int q = 0; q < n_seq; ++q) row0[q] = int(replay_from(cur[q], cfgs[i].ratio)) / cfgs[i].ratio;
        init_stream(ss[i], g, n_seq, max_pos / cfgs[i].ratio + 1, n_seq, row0);
    }
    // Warm up on the host to each sequence's start position.
    std::vector<float> scratch_kv, scratch_gate;
    for (auto& s : ss)
        for (int q = 0; q < n_seq; ++q)
            for (std::uint32_t p = replay_from(cur[q], s.cfg.ratio); p < cur[q]; ++p)
                ref_step(s, g, q, p, scratch_kv, scratch_gate);
    std::vector<std::vector<int>> first(ss.size(), std::vector<int>(n_seq));
    for (std::size_t i = 0; i < ss.size(); ++i) {
        upload_state(ss[i]);
        for (int q = 0; q < n_seq; ++q) first[i][q] = ss[i].row0[q] + int(ss[i].ref_rows[q].size());
    }
    device_buffer<std::uint32_t> d_pos(n_seq);
    kernels::compressor_decode_launch a;
    a.n_streams = int(ss.size());
    for (std::size_t i = 0; i < ss.size(); ++i) a.s[i] = device_stream(ss[i]);
    a.pos = d_pos.data();
    a.n_seq = n_seq;
    const cuda_stream stream;
    const cuda_graph graph(stream, [&] { kernels::launch_compressor_decode(a, stream); });
    for (int t = 0; t < steps; ++t) {
        std::vector<std::uint32_t> pos(n_seq);
        for (int q = 0; q < n_seq; ++q) pos[q] = (t + q) % 5 == 4 ? kernels::compressor_idle : cur[q]++;
        for (auto& s : ss) {
            std::vector<float> kv_h, gate_h;
            for (int q = 0; q < n_seq; ++q) {
                if (pos[q] == kernels::compressor_idle) {
                    kv_h.insert(kv_h.end(), s.width, std::nanf(""));  // must not be read
                    gate_h.insert(gate_h.end(), s.width, std::nanf(""));
                } else {
                    ref_step(s, g, q, pos[q], kv_h, gate_h);
                }
            }
            s.d_kv.upload(kv_h);
            s.d_gate.upload(gate_h);
        }
        d_pos.upload(pos);
        graph.launch(stream);
        stream.synchronize("compressor decode");
    }
    const std::string at = p_base == 0 ? ""
                           : " pos " + std::to_string(lo) + (lo == hi ? "" : ".." + std::to_string(hi));
    check_row row{"compressor",
                  cfg_name(cfgs) + " decode seqs " + std::to_string(n_seq) + at + " steps " + std::to_string(steps),
                  "exact", {}, false, ""};
    int emitted = 0;
    for (std::size_t i = 0; i < ss.size(); ++i) {
        add(row.cmp, finish_compare(ss[i], n_seq, first[i]));
        for (int q = 0; q < n_seq; ++q) emitted += ss[i].row0[q] + int(ss[i].ref_rows[q].size()) - first[i][q];
    }
    row.pass = passed(row.cmp) && emitted > 0;
    row.note = std::to_string(emitted) + " rows emitted; graph replayed";
    return row;
}

// Verify rows: each step gives every sequence a run of 1..4 consecutive rows (or none), the runs
// laid out one after another in the launch's rows (idle rows after them), so one captured graph
// is replayed with runs that change length and place every step. State goes through row_state
// into per-sequence blocks shaped like the backend's (slot 0 live, then `ring` saved frontiers,
// each kv then score); rows ask for frontier saves (first rows sometimes too), which must hold
// the reference state that row started from, and slots never asked for must stay poisoned.
check_row run_case(std::uint64_t seed, const std::vector<stream_cfg>& cfgs, int n_seq, int steps) {
    constexpr int max_run = 4, ring = 4;
    std::mt19937_64 g(seed);
    const int r_max = std::max_element(cfgs.begin(), cfgs.end(), [](auto& a, auto& b) { return a.ratio < b.ratio; })->ratio;
    std::vector<std::uint32_t> cur(n_seq);
    for (int q = 0; q < n_seq; ++q) cur[q] = std::uint32_t((q * 37 + 5 * q * q) % (2 * r_max + 3));
    const int cap_rows = n_seq * max_run;
    const int max_pos = int(*std::max_element(cur.begin(), cur.end())) + steps * max_run + 1;
    std::vector<comp_stream> ss(cfgs.size());
    // Per-sequence state blocks: stream i at offset[i] floats, (1 + ring) x 2 x floats[i].
    std::vector<std::size_t> offset(cfgs.size()), floats(cfgs.size());
    std::size_t block = 0;
    for (std::size_t i = 0; i < cfgs.size(); ++i) {
        ss[i].cfg = cfgs[i];
        init_stream(ss[i], g, n_seq, max_pos / cfgs[i].ratio + 1, cap_rows, std::vector<int>(n_seq, 0));
        floats[i] = std::size_t(ss[i].rows) * ss[i].width;
        offset[i] = block;
        block += (1 + ring) * 2 * floats[i];
    }
    // Warm up on the host to each sequence's start position (short histories: replayed whole).
    std::vector<float> scratch_kv, scratch_gate;
    std::vector<std::vector<int>> first(ss.size(), std::vector<int>(n_seq));
    for (std::size_t i = 0; i < ss.size(); ++i)
        for (int q = 0; q < n_seq; ++q) {
            for (std::uint32_t p = 0; p < cur[q]; ++p) ref_step(ss[i], g, q, p, scratch_kv, scratch_gate);
            first[i][q] = int(ss[i].ref_rows[q].size());
        }
    std::vector<float> h_blocks(std::size_t(n_seq) * block);
    std::memset(h_blocks.data(), poison, h_blocks.size() * sizeof(float));
    for (std::size_t i = 0; i < ss.size(); ++i)
        for (int q = 0; q < n_seq; ++q) {
            float* live = h_blocks.data() + std::size_t(q) * block + offset[i];
            std::copy(ss[i].st[q].kv.begin(), ss[i].st[q].kv.end(), live);
            std::copy(ss[i].st[q].score.begin(), ss[i].st[q].score.end(), live + floats[i]);
        }
    device_buffer<float> d_blocks{std::span<const float>(h_blocks)};
    // The state each saved slot must hold: [stream][seq][slot] -> kv then score (empty: never saved).
    std::vector<std::vector<std::vector<std::vector<float>>>> want_slot(
        ss.size(), std::vector<std::vector<std::vector<float>>>(n_seq, std::vector<std::vector<float>>(1 + ring)));
    device_buffer<std::uint32_t> d_pos(cap_rows);
    device_buffer<std::int32_t> d_run_rows(cap_rows), d_save_slot(cap_rows);
    device_buffer<float*> d_row_state(cap_rows);
    std::vector<device_buffer<std::int32_t>> d_row_table;
    kernels::compressor_decode_launch a;
    a.n_streams = int(ss.size());
    for (std::size_t i = 0; i < ss.size(); ++i) {
        d_row_table.emplace_back(std::size_t(cap_rows) * ss[i].pages_per_seq);
        kernels::compressor_stream c = device_stream(ss[i]);
        c.state_kv = c.state_score = nullptr;
        c.state_stride = 0;
        c.row_state = d_row_state.data();
        c.row_kv_offset = offset[i];
        c.row_score_offset = offset[i] + floats[i];
        c.out.table = d_row_table.back().data();
        a.s[i] = c;
    }
    a.pos = d_pos.data();
    a.n_seq = cap_rows;
    a.run_rows = d_run_rows.data();
    a.save_slot = d_save_slot.data();
    const cuda_stream stream;
    const cuda_graph graph(stream, [&] { kernels::launch_compressor_decode(a, stream); });
    int saves = 0, multi = 0;
    for (int t = 0; t < steps; ++t) {
        std::vector<std::uint32_t> pos(cap_rows, kernels::compressor_idle);
        std::vector<std::int32_t> run_rows(cap_rows, 0), save_slot(cap_rows, -1), seq_of(cap_rows, -1);
        std::vector<float*> row_state(cap_rows, nullptr);
        int r = 0;
        for (int q = 0; q < n_seq; ++q) {
            if ((t + q) % 5 == 4) continue;  // no rows this step
            const int k = 1 + (t * 3 + q * 5) % max_run;
            multi += k > 1;
            run_rows[r] = k;
            for (int j = 0; j < k; ++j, ++r) {
                pos[r] = cur[q]++;
                seq_of[r] = q;
                row_state[r] = d_blocks.data() + std::size_t(q) * block;
                // Later rows save unless their position is a multiple of 3; a first row every 7th.
                if (j > 0 ? pos[r] % 3 != 0 : pos[r] % 7 == 0) save_slot[r] = 1 + int(pos[r] % ring);
            }
        }
        for (std::size_t i = 0; i < ss.size(); ++i) {
            comp_stream& s = ss[i];
            std::vector<float> kv_h, gate_h;
            std::vector<std::int32_t> table(std::size_t(cap_rows) * s.pages_per_seq, s.trap_page);
            for (int row = 0; row < cap_rows; ++row) {
                const int q = seq_of[row];
                if (q < 0) {
                    kv_h.insert(kv_h.end(), s.width, std::nanf(""));  // must not be read
                    gate_h.insert(gate_h.end(), s.width, std::nanf(""));
                    continue;
                }
                std::copy_n(s.table.begin() + std::ptrdiff_t(q) * s.pages_per_seq, s.pages_per_seq,
                            table.begin() + std::ptrdiff_t(row) * s.pages_per_seq);
                if (save_slot[row] >= 0) {
                    std::vector<float>& w = want_slot[i][q][std::size_t(save_slot[row])];
                    w = s.st[q].kv;
                    w.insert(w.end(), s.st[q].score.begin(), s.st[q].score.end());
                    saves += i == 0;
                }
                ref_step(s, g, q, pos[row], kv_h, gate_h);
            }
            s.d_kv.upload(kv_h);
            s.d_gate.upload(gate_h);
            d_row_table[i].upload(table);
        }
        d_pos.upload(pos);
        d_run_rows.upload(run_rows);
        d_save_slot.upload(save_slot);
        d_row_state.upload(row_state);
        graph.launch(stream);
        stream.synchronize("compressor decode runs");
    }
    check_row row{"compressor", cfg_name(cfgs) + " verify runs seqs " + std::to_string(n_seq) + " steps " +
                                    std::to_string(steps),
                  "exact", {}, false, ""};
    const auto blocks = d_blocks.download();
    int emitted = 0;
    for (std::size_t i = 0; i < ss.size(); ++i) {
        add(row.cmp, compare_cache_rows(ss[i], n_seq, first[i]));
        for (int q = 0; q < n_seq; ++q) {
            emitted += int(ss[i].ref_rows[q].size()) - first[i][q];
            const float* base = blocks.data() + std::size_t(q) * block + offset[i];
            add(row.cmp, compare(std::span<const float>(base, floats[i]), ss[i].st[q].kv));
            add(row.cmp, compare(std::span<const float>(base + floats[i], floats[i]), ss[i].st[q].score));
            for (int slot = 1; slot <= ring; ++slot) {
                const float* at = base + std::size_t(slot) * 2 * floats[i];
                const std::vector<float>& w = want_slot[i][q][std::size_t(slot)];
                if (!w.empty()) {
                    add(row.cmp, compare(std::span<const float>(at, 2 * floats[i]), w));
                } else {
                    const auto* b = reinterpret_cast<const std::uint8_t*>(at);
                    for (std::size_t k = 0; k < 2 * floats[i] * sizeof(float); ++k) row.cmp.mismatches += b[k] != poison;
                }
            }
        }
    }
    row.pass = passed(row.cmp) && emitted > 0 && saves > 0 && multi > 0;
    row.note = std::to_string(emitted) + " rows emitted, " + std::to_string(saves) + " frontier saves, " +
               std::to_string(multi) + " runs of 2..4 rows; graph replayed";
    return row;
}

check_row prefill_case(std::uint64_t seed, const std::vector<stream_cfg>& cfgs, std::uint32_t p0, int n_tokens) {
    std::mt19937_64 g(seed);
    std::vector<comp_stream> ss(cfgs.size());
    for (std::size_t i = 0; i < cfgs.size(); ++i) {
        ss[i].cfg = cfgs[i];
        const std::vector<int> row0{int(replay_from(p0, cfgs[i].ratio)) / cfgs[i].ratio};
        init_stream(ss[i], g, 1, int(p0 + n_tokens) / cfgs[i].ratio + 1, n_tokens, row0);
    }
    std::vector<float> scratch_kv, scratch_gate;
    std::vector<std::vector<int>> first(ss.size(), std::vector<int>(1));
    for (std::size_t i = 0; i < ss.size(); ++i) {
        for (std::uint32_t p = replay_from(p0, cfgs[i].ratio); p < p0; ++p)
            ref_step(ss[i], g, 0, p, scratch_kv, scratch_gate);
        upload_state(ss[i]);
        first[i][0] = ss[i].row0[0] + int(ss[i].ref_rows[0].size());
        std::vector<float> kv_h, gate_h;
        for (int t = 0; t < n_tokens; ++t) ref_step(ss[i], g, 0, p0 + std::uint32_t(t), kv_h, gate_h);
        ss[i].d_kv.upload(kv_h);
        ss[i].d_gate.upload(gate_h);
    }
    const std::vector<std::uint32_t> pos0{p0};
    device_buffer<std::uint32_t> d_pos0{std::span<const std::uint32_t>(pos0)};
    kernels::compressor_prefill_launch a;
    a.n_streams = int(ss.size());
    for (std::size_t i = 0; i < ss.size(); ++i) a.s[i] = device_stream(ss[i]);
    a.pos0 = d_pos0.data();
    a.seq = 0;
    a.n_tokens = n_tokens;
    kernels::launch_compressor_prefill(a, nullptr);
    cuda_check(cudaDeviceSynchronize(), "compressor prefill");
    check_row row{"compressor", cfg_name(cfgs) + " prefill p0 " + std::to_string(p0) + " n " + std::to_string(n_tokens),
                  "exact", {}, false, ""};
    for (std::size_t i = 0; i < ss.size(); ++i) add(row.cmp, finish_compare(ss[i], 1, first[i]));
    row.pass = passed(row.cmp);
    return row;
}

}  // namespace

std::vector<check_row> check_compressor(std::uint64_t seed, bool quick) {
    const stream_cfg a4{compressor_kind::attention, 4, 512}, i4{compressor_kind::indexer, 4, 128},
        a128{compressor_kind::attention, 128, 512}, t4{compressor_kind::attention, 4, 128},
        t16{compressor_kind::attention, 16, 128};
    std::vector<check_row> rows;
    rows.push_back(decode_case(seed + 1, {t4, i4}, 3, quick ? 21 : 45));
    rows.push_back(decode_case(seed + 2, {t16}, 4, quick ? 40 : 90));
    rows.push_back(decode_case(seed + 3, {a4, i4}, 5, quick ? 23 : 61));
    rows.push_back(decode_case(seed + 4, {a128}, 3, quick ? 140 : 300));
    rows.push_back(run_case(seed + 13, {t4, i4}, 3, quick ? 12 : 30));
    rows.push_back(run_case(seed + 14, {t16}, 4, quick ? 12 : 30));
    rows.push_back(run_case(seed + 15, {a4, i4}, 3, quick ? 10 : 24));
    // Ratio 128: enough steps (~2.5 rows each) that both sequences cross their first emission.
    rows.push_back(run_case(seed + 16, {a128}, 2, quick ? 70 : 140));
    rows.push_back(prefill_case(seed + 5, {t4, i4}, 6, 23));
    rows.push_back(prefill_case(seed + 6, {t16}, 21, 37));
    rows.push_back(prefill_case(seed + 7, {a4, i4}, 0, 13));
    if (!quick) rows.push_back(prefill_case(seed + 8, {a128}, 77, 301));
    // The issue's contexts. Decode of 1 sequence from 3 tokens before 2K/32K/256K (non-emitting
    // steps, the emission at ctx - 1, the next window) and of 64 around them; 2048-token chunks
    // starting mid-window past 32K and 256K. Quick keeps the 256K single-sequence decode.
    const std::vector<stream_cfg> r4{a4, i4}, r128{a128};
    for (const std::uint32_t ctx : {2048u, 32768u, 262144u}) {
        if (quick && ctx != 262144u) continue;
        for (const auto* cfgs : {&r4, &r128}) {
            const int r = cfgs->front().ratio;
            rows.push_back(decode_case(seed + ctx + r, *cfgs, 1, r == 4 ? 12 : 8, ctx - 3));
            if (!quick) rows.push_back(decode_case(seed + ctx + r + 1, *cfgs, 64, 9, ctx - std::uint32_t(r) - 1));
        }
    }
    if (!quick) {
        rows.push_back(prefill_case(seed + 9, r4, 32768 + 66, 2048));
        rows.push_back(prefill_case(seed + 10, r128, 32768 + 66, 2048));
        rows.push_back(prefill_case(seed + 11, r4, 262144 + 70, 2048));
        rows.push_back(prefill_case(seed + 12, r128, 262144 + 70, 2048));
    }
    return rows;
}

namespace {

struct indexer_dev {
    device_buffer<std::uint32_t> pos;
    device_buffer<std::int32_t> n_comp, table, selected, n_selected;
    device_buffer<float> q_raw, w_raw, q, w, scores, w_int8;
    device_buffer<std::uint8_t> pool, mask, head_int8;
    device_buffer<std::int8_t> q_int8;
    device_buffer<unsigned> hist, sel_state, block_counts;

    // The per-step inputs a replayed graph reads from device memory.
    void set_inputs(const std::vector<float>& q_in, const std::vector<float>& w_in, const std::vector<std::int32_t>& n,
                    const std::vector<std::uint32_t>& p) {
        q_raw.upload(q_in);
        w_raw.upload(w_in);
        n_comp.upload(n);
        pos.upload(p);
    }
};

kernels::indexer_launch make_indexer(indexer_dev& d, int n_head, int top_k, int n_seq, int cap, int pages_per_seq,
                                     bool int8 = true) {
    d.pos = device_buffer<std::uint32_t>(n_seq);
    d.n_comp = device_buffer<std::int32_t>(n_seq);
    d.q_raw = device_buffer<float>(std::size_t(n_seq) * n_head * 128);
    d.w_raw = device_buffer<float>(std::size_t(n_seq) * n_head);
    d.q = device_buffer<float>(std::size_t(n_seq) * n_head * 128);
    d.w = device_buffer<float>(std::size_t(n_seq) * n_head);
    d.scores = device_buffer<float>(std::size_t(n_seq) * cap);
    d.pool = device_buffer<std::uint8_t>(std::size_t(n_seq) * pages_per_seq * model::kv_page_rows * 80);
    d.mask = device_buffer<std::uint8_t>(std::size_t(n_seq) * cap);
    d.selected = device_buffer<std::int32_t>(std::size_t(n_seq) * top_k);
    d.n_selected = device_buffer<std::int32_t>(n_seq);
    d.hist = device_buffer<unsigned>(std::size_t(n_seq) * 4 * 256);
    d.hist.fill_bytes(0);
    d.sel_state = device_buffer<unsigned>(std::size_t(n_seq) * 10);
    d.block_counts = device_buffer<unsigned>(std::size_t(n_seq) * kernels::indexer_select_blocks(cap) * 2);
    std::vector<std::int32_t> table(std::size_t(n_seq) * pages_per_seq);
    for (int q = 0; q < n_seq; ++q)
        for (int p = 0; p < pages_per_seq; ++p)
            table[std::size_t(q) * pages_per_seq + p] = q * pages_per_seq + (pages_per_seq - 1 - p);
    d.table = device_buffer<std::int32_t>(std::span<const std::int32_t>(table));
    kernels::indexer_launch a;
    a.n_head = n_head;
    a.top_k = top_k;
    a.n_seq = n_seq;
    a.n_comp_capacity = cap;
    a.pos = d.pos.data();
    a.n_comp = d.n_comp.data();
    a.q_raw = d.q_raw.data();
    a.q_stride = n_head * 128;
    a.w_raw = d.w_raw.data();
    a.w_stride = n_head;
    a.w_scale = 1.0f / std::sqrt(float(128 * n_head));
    a.rope = ds4_rope_params(true, 64);
    a.q = d.q.data();
    a.w = d.w.data();
    a.keys = {d.pool.data(), d.table.data(), pages_per_seq, 80};
    a.scores = d.scores.data();
    a.hist = d.hist.data();
    a.sel_state = d.sel_state.data();
    a.block_counts = d.block_counts.data();
    a.mask = d.mask.data();
    a.selected = d.selected.data();
    a.n_selected = d.n_selected.data();
    if (int8) {
        d.q_int8 = device_buffer<std::int8_t>(std::size_t(n_seq) * kernels::indexer_max_heads * 128);
        d.w_int8 = device_buffer<float>(std::size_t(n_seq) * kernels::indexer_max_heads);
        d.head_int8 = device_buffer<std::uint8_t>(std::size_t(n_seq) * kernels::indexer_max_heads);
        d.head_int8.fill_bytes(0xa5);
        a.q_int8 = d.q_int8.data();
        a.w_int8 = d.w_int8.data();
        a.head_int8 = d.head_int8.data();
    }
    return a;
}

// Selection outputs of one sequence vs ref::indexer_top_k; returns mismatches.
std::size_t compare_selection(const std::vector<float>& scores, int n, int top_k, const std::uint8_t* mask,
                              const std::int32_t* list, std::int32_t n_selected) {
    std::vector<int> want = ref::indexer_top_k(scores.data(), n, top_k);
    std::sort(want.begin(), want.end());
    std::size_t bad = n_selected != top_k;
    for (int i = 0; i < top_k; ++i) bad += list[i] != want[i];
    std::vector<std::uint8_t> m(n, 0);
    for (int c : want) m[c] = 1;
    for (int c = 0; c < n; ++c) bad += mask[c] != m[c];
    return bad;
}

// launch_indexer(a) captured in a graph on its own stream, replayed once after decoy() uploaded
// other inputs (the histograms must come back to zero, nothing may leak between steps) and once
// after real() uploaded the case's inputs.
template <class Decoy, class Real>
void replay_indexer_graph(const kernels::indexer_launch& a, Decoy&& decoy, Real&& real, const char* what) {
    const cuda_stream stream;
    const cuda_graph graph(stream, [&] { kernels::launch_indexer(a, stream); });
    decoy();
    graph.launch(stream);
    stream.synchronize(what);
    real();
    graph.launch(stream);
    stream.synchronize(what);
}

check_row indexer_case(std::uint64_t seed, int n_head, int top_k, int n_comp, bool int8 = true) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    const int n_seq = 3, cap = n_comp + 37, pages = cap / model::kv_page_rows + 1;
    indexer_dev d;
    kernels::indexer_launch a = make_indexer(d, n_head, top_k, n_seq, cap, pages, int8);
    // Sequence 0 active; 1 below the threshold (n_comp = top_k); 2 idle.
    const std::vector<std::int32_t> nc{n_comp, top_k, n_comp};
    const std::vector<std::uint32_t> pos{std::uint32_t(4 * n_comp + 2), std::uint32_t(4 * top_k + 1), kernels::compressor_idle};
    std::vector<std::uint8_t> pool(d.pool.size(), poison);
    std::vector<float> x(128), key_f(std::size_t(n_comp) * 128);
    const model::indexer_row_layout l{128};
    auto row_at = [&](int q, int c) {
        const int page = q * pages + (pages - 1 - c / model::kv_page_rows);
        return pool.data() + (std::size_t(page) * model::kv_page_rows + c % model::kv_page_rows) * 80;
    };
    for (int c = 0; c < n_comp; ++c) {
        if (c % 5 == 4 && c > 3) {
            std::memcpy(row_at(0, c), row_at(0, 3), 80);  // duplicated keys: equal scores
        } else {
            for (auto& v : x) v = n01(g);
            ref::indexer_qat(x.data());
            for (auto& v : x) v = f16_round(v);
            model::encode_indexer_row(l, x.data(), row_at(0, c));
        }
        model::decode_indexer_row(l, row_at(0, c), key_f.data() + std::size_t(c) * 128);
        std::memcpy(row_at(1, c % (top_k)), row_at(0, c), 80);
    }
    std::vector<float> q_raw(std::size_t(n_seq) * n_head * 128), w_raw(std::size_t(n_seq) * n_head);
    for (auto& v : q_raw) v = 0.5f * n01(g);
    for (auto& v : w_raw) v = n01(g);
    // Reference (sequence 0): indexer_queries / _head_weights minus the matvec.
    std::vector<float> q(q_raw.begin(), q_raw.begin() + n_head * 128), w(n_head), scores(n_comp);
    for (int h = 0; h < n_head; ++h) {
        rope_tail_inplace(q.data() + h * 128 + 64, 64, a.rope, pos[0], false);
        ref::indexer_qat(q.data() + h * 128);
    }
    const float scale = 1.0f / std::sqrt(float(128 * n_head));
    for (int h = 0; h < n_head; ++h) w[h] = w_raw[h] * scale;
    ref::indexer_scores(q.data(), w.data(), n_head, key_f.data(), n_comp, scores.data());

    d.pool.upload(pool);
    d.mask.fill_bytes(poison);
    d.scores.fill_bytes(0xff);
    d.selected.fill_bytes(0xff);
    d.n_selected.fill_bytes(0xff);
    replay_indexer_graph(
        a,
        [&] {
            std::vector<float> dq(q_raw.size()), dw(w_raw.size());
            for (auto& v : dq) v = n01(g);
            for (auto& v : dw) v = n01(g);
            d.set_inputs(dq, dw, {n_comp - 1, n_comp, top_k + 1}, {7, 9, 11});
        },
        [&] {
            d.set_inputs(q_raw, w_raw, nc, pos);
            d.mask.fill_bytes(poison);
        },
        "indexer");

    check_row row{"indexer", "heads " + std::to_string(n_head) + " top " + std::to_string(top_k) + " n_comp " +
                                 std::to_string(n_comp),
                  "exact", {}, false, ""};
    const auto gq = d.q.download(), gw = d.w.download(), gs = d.scores.download();
    add(row.cmp, compare(std::span<const float>(gq.data(), q.size()), q));
    add(row.cmp, compare(std::span<const float>(gw.data(), w.size()), w));
    add(row.cmp, compare(std::span<const float>(gs.data(), scores.size()), scores));
    const auto gm = d.mask.download();
    const auto gl = d.selected.download();
    const auto gn = d.n_selected.download();
    row.cmp.mismatches += compare_selection(scores, n_comp, top_k, gm.data(), gl.data(), gn[0]);
    // Inactive sequences: n_selected = 0 and the mask untouched.
    row.cmp.mismatches += (gn[1] != 0) + (gn[2] != 0);
    for (int s = 1; s < n_seq; ++s)
        for (int c = 0; c < cap; ++c) row.cmp.mismatches += gm[std::size_t(s) * cap + c] != poison;
    const auto hist = d.hist.download();
    for (unsigned v : hist) row.cmp.mismatches += v != 0;
    row.pass = passed(row.cmp);
    row.note = std::string("dup keys every 5th; graph replay after decoy; ") + (int8 ? "int8 scratch" : "scalar only");
    return row;
}

// A stored key row of a batch case: random codes under block exponents around 2^-4 (the
// compressor's range); at fixed residues of the row index, the int8 precondition's edges.
void make_batch_key(std::mt19937_64& g, int c, std::uint8_t* row) {
    for (int i = 0; i < 64; i += 8) {
        const std::uint64_t r = g();
        for (int k = 0; k < 8; ++k) row[i + k] = std::uint8_t(r >> (8 * k));
    }
    for (int i = 64; i < 80; ++i) row[i] = 0;
    const int base = -6 + int(g() % 5);
    int e[4];
    for (int b = 0; b < 4; ++b) e[b] = base + int(g() % 2);
    const int k = c % 53, hb = int(g() % 4);
    if (k == 7) e[hb] += 4 + int(g() % 3);                            // spread > 3: fallback
    if (k == 13) for (int b = 0; b < 4; ++b) e[b] = -23 + (b + c) % 4;  // lowest exponents, exact
    if (k == 17) {                                                     // one block at -24: fallback
        for (int b = 0; b < 4; ++b) e[b] = -22;
        e[hb] = -24;
    }
    if (k == 29 || k == 31) {  // zero blocks (+0/-0 codes), arbitrary exponents; 31: all zero
        for (int b = 0; b < 4; ++b)
            if (k == 31 || b == hb || (g() & 1)) {
                for (int i = 16 * b; i < 16 * b + 16; ++i) row[i] &= 0x88u;
                e[b] = k == 31 ? -126 : int(g() % 256) - 128;
            }
    }
    // Rarely (the scores they produce dominate the top-k): the highest exponents, 13 exact and 14
    // (codes kept at magnitude <= 1.5 so that F16 stays finite) a fallback.
    if (c % 997 == 19) for (int b = 0; b < 4; ++b) e[b] = 10 + (b + c) % 4;
    if (c % 997 == 23) {
        for (int b = 0; b < 4; ++b) e[b] = 12;
        e[hb] = 14;
        for (int i = 16 * hb; i < 16 * hb + 16; ++i) row[i] &= 0xbbu;
    }
    for (int b = 0; b < 4; ++b) row[64 + b] = static_cast<std::uint8_t>(model::kv_exponent_byte(e[b]));
}

// Whether the prepare kernel should find head h of a sequence inside the int8 precondition.
bool head_int8_expected(const float* q_raw_h, float w, const rope_params& rp, std::uint32_t pos) {
    std::vector<float> x(q_raw_h, q_raw_h + 128);
    rope_tail_inplace(x.data() + 64, 64, rp, pos, false);
    ref::hadamard128(x.data());
    int e[4];
    unsigned nz = 0;
    for (int b = 0; b < 4; ++b) {
        e[b] = e2m1_block_scale_exp(x.data() + 32 * b, 32);
        for (int i = 32 * b; i < 32 * b + 32; ++i)
            if (e2m1_encode_scaled(x[i], exp2i(-e[b])) & 7u) nz |= 1u << b;
    }
    return kernels::indexer_query_int8_of(e, nz, w).exact;
}

// A batch of n_seq sequences, each with its own pages and length (n_comp down to n_comp - 3 step),
// keys from make_batch_key with duplicates (equal scores) every 11th row; queries normal except
// for three kinds of sequence: s % 8 == 1 a head whose post-Hadamard blocks differ by 2^8 and
// s % 8 == 3 a weight of 1e-38 (both: the sequence falls back to the scalar kernel); s % 8 == 5 a
// head with two zero blocks, an all-zero head and a zero weight (still int8). Captured once and
// replayed, first on decoy inputs where every sequence takes the int8 path.
check_row indexer_batch_case(std::uint64_t seed, int n_head, int top_k, int n_comp, int n_seq, const std::string& ctx) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    const int cap = n_comp, pages = cap / model::kv_page_rows + 1;
    const int step = std::min(19, (n_comp - top_k - 1) / 3);
    indexer_dev d;
    kernels::indexer_launch a = make_indexer(d, n_head, top_k, n_seq, cap, pages);
    std::vector<std::int32_t> nc(n_seq);
    std::vector<std::uint32_t> pos(n_seq);
    for (int q = 0; q < n_seq; ++q) {
        nc[q] = n_comp - (q % 4) * step;
        pos[q] = std::uint32_t(4 * nc[q] + q % 4);
    }
    std::vector<std::uint8_t> pool(d.pool.size(), poison);
    auto row_at = [&](int q, int c) {
        const int page = q * pages + (pages - 1 - c / model::kv_page_rows);
        return pool.data() + (std::size_t(page) * model::kv_page_rows + c % model::kv_page_rows) * 80;
    };
    for (int q = 0; q < n_seq; ++q)
        for (int c = 0; c < nc[q]; ++c) {
            if (c % 11 == 10) std::memcpy(row_at(q, c), row_at(q, c - 7), 80);
            else make_batch_key(g, c + 7 * q, row_at(q, c));
        }
    const std::size_t qn = std::size_t(n_head) * 128;
    std::vector<float> q_raw(std::size_t(n_seq) * qn), w_raw(std::size_t(n_seq) * n_head);
    std::vector<float> dq(q_raw.size()), dw(w_raw.size());
    for (auto& v : q_raw) v = 0.5f * n01(g);
    for (auto& v : w_raw) v = n01(g);
    for (auto& v : dq) v = 0.5f * n01(g);
    for (auto& v : dw) v = n01(g);
    for (int q = 0; q < n_seq; ++q) {
        float* qs = q_raw.data() + std::size_t(q) * qn;
        if (q % 8 == 1) {  // post-Hadamard block 0 x 256: undo RoPE and the (involutory) Hadamard
            float* x = qs + std::size_t(q % n_head) * 128;
            for (int i = 0; i < 32; ++i) x[i] *= 256.0f;
            ref::hadamard128(x);
            rope_tail_inplace(x + 64, 64, a.rope, pos[q], true);
        }
        if (q % 8 == 3) w_raw[std::size_t(q) * n_head + (2 % n_head)] = 1e-38f;
        if (q % 8 == 5) {
            float* z = qs + std::size_t(1 % n_head) * 128;  // e_0 + e_32: blocks 1 and 3 are exactly zero
            for (int i = 0; i < 128; ++i) z[i] = i == 0 || i == 32 ? 3.0f : 0.0f;
            if (n_head > 4) std::fill(qs + 4 * 128, qs + 5 * 128, 0.0f);
            w_raw[std::size_t(q) * n_head + (6 % n_head)] = 0.0f;
        }
    }

    // Reference, one sequence per task.
    const float scale = 1.0f / std::sqrt(float(128 * n_head));
    std::vector<std::vector<float>> want(n_seq);
    std::vector<std::uint8_t> want_flags(std::size_t(n_seq) * n_head);
    std::vector<std::size_t> fast_keys(n_seq), key_fallback(n_seq);
    ref::parallel_for(n_seq, [&](std::int64_t b, std::int64_t e) {
        std::vector<float> keys, q(qn), w(n_head);
        for (std::int64_t s = b; s < e; ++s) {
            const float* qs = q_raw.data() + std::size_t(s) * qn;
            bool seq_int8 = true;
            for (int h = 0; h < n_head; ++h) {
                w[h] = w_raw[std::size_t(s) * n_head + h] * scale;
                std::copy(qs + h * 128, qs + h * 128 + 128, q.begin() + h * 128);
                rope_tail_inplace(q.data() + h * 128 + 64, 64, a.rope, pos[s], false);
                ref::indexer_qat(q.data() + h * 128);
                const bool f = head_int8_expected(qs + h * 128, w[h], a.rope, pos[s]);
                want_flags[std::size_t(s) * n_head + h] = f;
                seq_int8 = seq_int8 && f;
            }
            keys.resize(std::size_t(nc[s]) * 128);
            for (int c = 0; c < nc[s]; ++c) {
                const std::uint8_t* row = row_at(int(s), c);
                model::decode_indexer_row({128}, row, keys.data() + std::size_t(c) * 128);
                const bool k8 = kernels::indexer_key_int8_of(kernels::indexer_row_exponents(row),
                                                             kernels::indexer_row_nonzero_blocks(row)).exact;
                if (seq_int8) (k8 ? fast_keys : key_fallback)[s]++;
            }
            want[s].resize(nc[s]);
            ref::indexer_scores(q.data(), w.data(), n_head, keys.data(), nc[s], want[s].data());
        }
    });

    d.pool.upload(pool);
    d.mask.fill_bytes(poison);
    d.scores.fill_bytes(0xff);
    replay_indexer_graph(
        a,
        [&] {  // normal queries everywhere (all int8), other lengths and positions
            std::vector<std::int32_t> dn(n_seq);
            std::vector<std::uint32_t> dp(n_seq);
            for (int q = 0; q < n_seq; ++q) {
                dn[q] = nc[q] - 1 - q % 3;
                dp[q] = 5u + std::uint32_t(q);
            }
            d.set_inputs(dq, dw, dn, dp);
        },
        [&] {
            d.set_inputs(q_raw, w_raw, nc, pos);
            d.mask.fill_bytes(poison);
        },
        "indexer batch");

    const auto gs = d.scores.download();
    const auto gm = d.mask.download();
    const auto gl = d.selected.download();
    const auto gn = d.n_selected.download();
    const auto gf = d.head_int8.download();
    check_row row{"indexer", ctx + " batch " + std::to_string(n_seq) + ", heads " + std::to_string(n_head) +
                                 " top " + std::to_string(top_k) + " n_comp " + std::to_string(n_comp - 3 * step) +
                                 ".." + std::to_string(n_comp),
                  "exact", {}, false, ""};
    std::size_t flag_bad = 0, fast = 0, fallback = 0, slow_seqs = 0;
    for (int q = 0; q < n_seq; ++q) {
        add(row.cmp, compare(std::span<const float>(gs.data() + std::size_t(q) * cap, nc[q]), want[q]));
        row.cmp.mismatches += compare_selection(want[q], nc[q], top_k, gm.data() + std::size_t(q) * cap,
                                                gl.data() + std::size_t(q) * top_k, gn[q]);
        bool seq_int8 = true;
        for (int h = 0; h < n_head; ++h) {
            flag_bad += gf[std::size_t(q) * kernels::indexer_max_heads + h] != want_flags[std::size_t(q) * n_head + h];
            seq_int8 = seq_int8 && want_flags[std::size_t(q) * n_head + h];
        }
        slow_seqs += !seq_int8;
        fast += fast_keys[q];
        fallback += key_fallback[q];
    }
    row.cmp.mismatches += flag_bad;
    const auto hist = d.hist.download();
    for (unsigned v : hist) row.cmp.mismatches += v != 0;
    // Every path must have been taken: int8 keys, fallback keys inside int8 sequences, scalar sequences.
    row.pass = passed(row.cmp) && fast > 0 && fallback > 0 && slow_seqs > 0 && slow_seqs < std::size_t(n_seq);
    row.note = "int8 keys " + std::to_string(fast) + ", fallback keys " + std::to_string(fallback) + ", scalar seqs " +
               std::to_string(slow_seqs) + (flag_bad ? ", PATH FLAGS WRONG " + std::to_string(flag_bad) : "");
    return row;
}

// The selection alone on scores with few distinct values (ties straddle the threshold).
check_row select_case(std::uint64_t seed, int top_k, int n_comp, int distinct) {
    std::mt19937_64 g(seed);
    const int cap = n_comp + 5;
    indexer_dev d;
    kernels::indexer_launch a = make_indexer(d, 1, top_k, 1, cap, 1);
    std::vector<float> scores(cap, 0.0f);
    for (int c = 0; c < n_comp; ++c) {
        const int v = int(g() % unsigned(distinct)) - distinct / 3;
        scores[c] = v == 0 ? (g() & 1 ? -0.0f : 0.0f) : float(v) * 0.37f;
    }
    d.scores.upload(scores);
    const std::vector<std::int32_t> nc{n_comp};
    const std::vector<std::uint32_t> pos{std::uint32_t(n_comp * 4)};
    d.n_comp.upload(nc);
    d.pos.upload(pos);
    d.mask.fill_bytes(poison);
    kernels::launch_indexer_select(a, nullptr);
    cuda_check(cudaDeviceSynchronize(), "indexer select");
    check_row row{"indexer_select", "top " + std::to_string(top_k) + " of " + std::to_string(n_comp) + ", " +
                                        std::to_string(distinct) + " distinct",
                  "exact", {}, false, ""};
    scores.resize(n_comp);
    const auto gm = d.mask.download();
    const auto gl = d.selected.download();
    const auto gn = d.n_selected.download();
    row.cmp.count = std::size_t(n_comp);
    row.cmp.mismatches = compare_selection(scores, n_comp, top_k, gm.data(), gl.data(), gn[0]);
    row.pass = passed(row.cmp);
    return row;
}

}  // namespace

std::vector<check_row> check_indexer(std::uint64_t seed, bool quick) {
    std::vector<check_row> rows;
    rows.push_back(indexer_case(seed + 11, 4, 8, 97));
    rows.push_back(indexer_case(seed + 12, 64, 512, 513));
    rows.push_back(indexer_case(seed + 13, 64, 512, 2051));
    rows.push_back(indexer_case(seed + 21, 64, 512, 2051, false));
    rows.push_back(indexer_batch_case(seed + 22, 4, 8, 97, 16, "odd"));
    rows.push_back(indexer_batch_case(seed + 23, 64, 512, 700, 16, "odd"));
    rows.push_back(indexer_batch_case(seed + 24, 64, 512, 2051, 6, "8K ctx"));
    rows.push_back(select_case(seed + 14, 512, 2051, 5));
    rows.push_back(select_case(seed + 15, 512, 4099, 3000));
    rows.push_back(select_case(seed + 16, 8, 9, 2));
    // One select block (capacity <= 1024): one CTA of 256 threads, keys in registers.
    rows.push_back(select_case(seed + 31, 512, 1019, 4));
    rows.push_back(select_case(seed + 32, 300, 1000, 997));
    rows.push_back(select_case(seed + 33, 1, 700, 2));
    // Past one select block the six launches, at decode capacities of ~80K tokens of context.
    rows.push_back(select_case(seed + 34, 512, 20475, 3));
    rows.push_back(select_case(seed + 35, 512, 20600, 9));
    if (!quick) {
        rows.push_back(indexer_case(seed + 17, 64, 512, 2048));
        rows.push_back(indexer_case(seed + 18, 64, 512, 32768));
        rows.push_back(indexer_case(seed + 19, 64, 512, 262144));
        rows.push_back(indexer_case(seed + 25, 64, 512, 32768, false));
        rows.push_back(indexer_batch_case(seed + 26, 64, 512, 515, 64, "2K ctx"));
        rows.push_back(indexer_batch_case(seed + 27, 64, 512, 8192, 16, "32K ctx"));
        rows.push_back(indexer_batch_case(seed + 28, 64, 512, 8192, 64, "32K ctx"));
        rows.push_back(indexer_batch_case(seed + 29, 64, 512, 65536, 16, "256K ctx"));
        rows.push_back(indexer_batch_case(seed + 30, 64, 512, 65536, 64, "256K ctx"));
        rows.push_back(select_case(seed + 20, 512, 262147, 7));
    }
    return rows;
}

}  // namespace ds4::validate
