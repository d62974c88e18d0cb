// ds4-validate rows for kernels/attention_prefill.cuh: one sequence's chunk of tokens against an
// fp64 evaluation of docs/model.md §2.4 steps 9-10 on the same stored rows (the bounded contract:
// relative L2 and max |diff|), with the max difference to the sequential F32 reference
// (ref::attention_decode per token) reported. Tiny and flash shapes, ratio 4 and 128, chunks at
// position 0 and mid-context, NaN/Inf in stored rows and q, outputs poisoned (a token past the
// chunk must stay untouched), and per-token rows of several sequences (the CUDA backend's
// sub-batch) against per-sequence launches. Quick mode compares every 5th token (and the last)
// of the long flash chunks so the host side stays within seconds.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ds4/core/cuda_graph.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/attention_prefill.cuh"
#include "harness/fixtures/prefill_args.hpp"
#include "harness/validate/checks.hpp"
#include "reference/attention_decode.hpp"
#include "reference/parallel.hpp"

namespace ds4::validate {
namespace {

using model::attention_row_layout;
constexpr int page_rows = model::kv_page_rows;
constexpr double bound_rel_l2 = 3e-3, bound_abs = 3e-2;

struct prefill_case {
    std::string name;
    int n_head, head_dim, n_swa, ratio, p0, n_tok;
    bool specials = false;
    int top_k = 0;  // > 0: tokens past top_k compressed rows attend to a random selection of top_k
};

check_row prefill_case_row(std::mt19937_64& rng, const prefill_case& c, bool quick) {
    const int H = c.n_head, D = c.head_dim, n_rot = 64, T = c.n_tok;
    const attention_row_layout lay{D, n_rot};
    const int RB = lay.bytes();
    const rope_params rp = ds4_rope_params(c.ratio > 0, n_rot);
    const int last = c.p0 + T - 1;
    const int n_comp_max = c.ratio > 0 ? (last + 1) / c.ratio : 0;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    // Pages in scattered order; raw pages only for the chunk's window union (older ones are -1).
    const int raw_entries = last / page_rows + 1, comp_entries = std::max(1, (n_comp_max + page_rows - 1) / page_rows);
    std::vector<std::int32_t> rt(static_cast<std::size_t>(raw_entries), -1), ct(static_cast<std::size_t>(comp_entries), -1);
    const int raw_lo = std::max(0, c.p0 - c.n_swa + 1);
    int n_pages = 0;
    for (int e = raw_lo / page_rows; e < raw_entries; ++e) rt[std::size_t(e)] = n_pages++;
    for (auto& e : ct) e = n_pages++;
    std::vector<int> perm(static_cast<std::size_t>(n_pages));
    for (int i = 0; i < n_pages; ++i) perm[std::size_t(i)] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (auto& e : rt) if (e >= 0) e = perm[std::size_t(e)];
    for (auto& e : ct) e = perm[std::size_t(e)];
    std::vector<std::uint8_t> pool(std::size_t(n_pages) * page_rows * RB, 0);
    auto row_at = [&](std::int32_t page, int r) { return pool.data() + (std::size_t(page) * page_rows + std::size_t(r)) * RB; };
    std::vector<float> x(static_cast<std::size_t>(D));
    for (int p = raw_lo; p <= last; ++p) {
        for (auto& v : x) v = nd(rng);
        if (c.specials && p == last - 3) x[3] = std::numeric_limits<float>::quiet_NaN();
        model::encode_attention_row(lay, x.data(), row_at(rt[std::size_t(p / page_rows)], p % page_rows));
    }
    for (int ci = 0; ci < n_comp_max; ++ci) {
        for (auto& v : x) v = 0.5f * nd(rng);
        if (c.specials && ci == 2) x[std::size_t(D - 5)] = std::numeric_limits<float>::infinity();
        model::encode_attention_row(lay, x.data(), row_at(ct[std::size_t(ci / page_rows)], ci % page_rows));
    }
    std::vector<float> q(std::size_t(T) * H * D), sinks(static_cast<std::size_t>(H));
    for (auto& v : sinks) v = 2.0f * nd(rng);
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h) {
            const float sharp = h % 4 == 0 ? 6.0f : 1.0f;  // some heads much sharper than others
            for (int i = 0; i < D; ++i) q[(std::size_t(t) * H + std::size_t(h)) * D + std::size_t(i)] = sharp * nd(rng);
        }
    if (c.specials) q[std::size_t(D + 7)] = std::numeric_limits<float>::infinity();  // token 0, head 1

    device_buffer<float> d_q{std::span<const float>(q)}, d_sinks{std::span<const float>(sinks)};
    device_buffer<std::uint8_t> d_pool{std::span<const std::uint8_t>(pool)};
    device_buffer<std::int32_t> d_rt{std::span<const std::int32_t>(rt)}, d_ct{std::span<const std::int32_t>(ct)};
    const std::size_t live = std::size_t(T) * H * D, out_n = live + std::size_t(H) * D;  // one spare token
    std::vector<float> poison(out_n, std::bit_cast<float>(0x7fc0dead));
    device_buffer<float> d_out{std::span<const float>(poison)};
    const fixtures::paged_view pages{d_pool.data(), d_rt.data(), 0, d_pool.data(), d_ct.data(), 0};
    kernels::attention_prefill_args a = fixtures::prefill_args(pages, d_q.data(), d_out.data(), d_sinks.data(), c.p0, T, rp);
    // Per-token selections (ascending), as the indexer emits them; 0 = every row visible.
    const int sel_stride = std::max(1, c.top_k);
    std::vector<std::int32_t> sel(std::size_t(T) * sel_stride, 0), nsel(static_cast<std::size_t>(T), 0);
    if (c.top_k > 0)
        for (int t = 0; t < T; ++t) {
            const int nc = c.ratio > 0 ? (c.p0 + t + 1) / c.ratio : 0;
            if (nc <= c.top_k) continue;
            std::vector<std::int32_t> all(static_cast<std::size_t>(nc));
            for (int i = 0; i < nc; ++i) all[std::size_t(i)] = i;
            std::shuffle(all.begin(), all.end(), rng);
            std::sort(all.begin(), all.begin() + c.top_k);
            std::copy(all.begin(), all.begin() + c.top_k, sel.begin() + std::ptrdiff_t(t) * sel_stride);
            nsel[std::size_t(t)] = c.top_k;
        }
    device_buffer<std::int32_t> d_sel{std::span<const std::int32_t>(sel)}, d_nsel{std::span<const std::int32_t>(nsel)};
    if (c.top_k > 0) {
        a.comp_sel = d_sel.data();
        a.comp_nsel = d_nsel.data();
        a.comp_sel_stride = sel_stride;
    }
    kernels::attention_prefill({H, D, n_rot, c.n_swa, c.ratio}, a, nullptr);
    cuda_check(cudaDeviceSynchronize(), "attention_prefill");
    const std::vector<float> got = d_out.download();

    // Tokens compared: all, or a subsample of long flash chunks in quick mode.
    std::vector<int> toks;
    const int step = quick && H * D * std::int64_t(T) > 64 * 512 * 64 ? 5 : 1;
    for (int t = 0; t < T; t += step) toks.push_back(t);
    if (toks.back() != T - 1) toks.push_back(T - 1);
    const std::size_t n_cmp = toks.size() * std::size_t(H) * D;
    std::vector<float> got_c(n_cmp), want64(n_cmp), ref32(n_cmp);
    for (std::size_t k = 0; k < toks.size(); ++k) {
        const int t = toks[k], pos = c.p0 + t;
        const int n_raw = std::min(pos + 1, c.n_swa), n_comp = c.ratio > 0 ? (pos + 1) / c.ratio : 0;
        const int ns = nsel[std::size_t(t)], nc = ns > 0 ? ns : n_comp;
        std::vector<float> rows(std::size_t(n_raw + nc) * D);  // raw oldest -> newest, then compressed
        for (int i = 0; i < n_raw; ++i) {
            const int p = pos + 1 - n_raw + i;
            model::decode_attention_row(lay, row_at(rt[std::size_t(p / page_rows)], p % page_rows), rows.data() + std::size_t(i) * D);
        }
        for (int i = 0; i < nc; ++i) {
            const int ci = ns > 0 ? sel[std::size_t(t) * sel_stride + std::size_t(i)] : i;
            model::decode_attention_row(lay, row_at(ct[std::size_t(ci / page_rows)], ci % page_rows),
                                        rows.data() + std::size_t(n_raw + i) * D);
        }
        const float* qt = q.data() + std::size_t(t) * H * D;
        float* w32 = ref32.data() + k * std::size_t(H) * D;
        ref::attention_decode(qt, rows.data(), n_raw, rows.data() + std::size_t(n_raw) * D, nc, nullptr, sinks.data(), H, D,
                              n_rot, rp, std::uint32_t(pos), w32);
        std::copy(got.begin() + std::ptrdiff_t(std::size_t(t) * H * D), got.begin() + std::ptrdiff_t(std::size_t(t + 1) * H * D),
                  got_c.begin() + std::ptrdiff_t(k * std::size_t(H) * D));
        // fp64: same formula (max by strict >, starting at the sink), inverse RoPE with the same angles.
        const int n = n_raw + nc;
        ref::parallel_for(H, [&](std::int64_t h0, std::int64_t h1) {
            std::vector<double> sc(static_cast<std::size_t>(n)), o(static_cast<std::size_t>(D));
            for (std::int64_t h = h0; h < h1; ++h) {
                const float* qh = qt + h * D;
                double mx = sinks[std::size_t(h)];
                for (int r = 0; r < n; ++r) {
                    double s = 0;
                    for (int i = 0; i < D; ++i) s += double(qh[i]) * double(rows[std::size_t(r) * D + std::size_t(i)]);
                    sc[std::size_t(r)] = s / std::sqrt(double(D));
                    if (sc[std::size_t(r)] > mx) mx = sc[std::size_t(r)];
                }
                double den = std::exp(double(sinks[std::size_t(h)]) - mx);
                std::fill(o.begin(), o.end(), 0.0);
                for (int r = 0; r < n; ++r) {
                    const double w = std::exp(sc[std::size_t(r)] - mx);
                    den += w;
                    for (int i = 0; i < D; ++i) o[std::size_t(i)] += w * double(rows[std::size_t(r) * D + std::size_t(i)]);
                }
                float* dst = want64.data() + (k * std::size_t(H) + std::size_t(h)) * D;
                for (int i = 0; i < D; ++i) o[std::size_t(i)] /= den;
                for (int kp = 0; kp < n_rot / 2; ++kp) {
                    float sn, cs;
                    sincos_f32(rope_theta(rp, std::uint32_t(pos), kp), &sn, &cs);
                    const std::size_t i0 = std::size_t(D - n_rot + 2 * kp);
                    const double x0 = o[i0], x1 = o[i0 + 1];
                    o[i0] = x0 * double(cs) + x1 * double(sn);
                    o[i0 + 1] = -x0 * double(sn) + x1 * double(cs);
                }
                for (int i = 0; i < D; ++i) dst[i] = float(o[std::size_t(i)]);
            }
        });
    }
    // Bounded: relative L2 and max |diff| against fp64; NaN/Inf positions from compare().
    const bounded_comparison bc = compare_bounded(got_c, want64, bound_abs);
    const comparison& cmp = bc.cmp;
    const double rel_l2 = bc.rel_l2;
    const comparison vs32 = compare(got_c, ref32, 1e30, 0);
    std::size_t untouched = 0;
    for (std::size_t i = live; i < out_n; ++i) untouched += std::bit_cast<std::uint32_t>(got[i]) == 0x7fc0deadu;
    check_row r;
    r.kernel = "attention_prefill";
    r.shape = c.name + " h" + std::to_string(H) + " d" + std::to_string(D) + " swa" + std::to_string(c.n_swa) + " r" +
              std::to_string(c.ratio) + " p0 " + std::to_string(c.p0) + " x" + std::to_string(T) +
              (c.top_k > 0 ? " sel" + std::to_string(c.top_k) : "") + (step > 1 ? " (every " + std::to_string(step) + "th)" : "");
    r.contract = "bounded: relL2 <= 3e-3, |d| <= 3e-2 vs fp64";
    r.cmp = cmp;
    r.pass = passed(cmp) && rel_l2 <= bound_rel_l2 && untouched == out_n - live;
    r.note = "relL2 " + std::to_string(rel_l2) + ", vs F32 ref max|d| " + std::to_string(vs32.max_abs) + " (specials " +
             std::to_string(vs32.special_mismatches) + ")" + (untouched == out_n - live ? "" : ", WROTE PAST THE CHUNK");
    return r;
}

// Folds a bitwise comparison of the first `live` floats of got and want into total (finite
// inputs: any non-finite wanted value counts as a special mismatch); every float of got past
// them must still hold the poison pattern.
void add_live_and_poison(comparison& total, const std::vector<float>& got, const std::vector<float>& want, std::size_t live) {
    total.add(compare(std::span<const float>(got.data(), live), std::span<const float>(want.data(), live)));
    for (std::size_t i = 0; i < live; ++i) total.special_mismatches += !std::isfinite(want[i]);
    for (std::size_t i = live; i < got.size(); ++i) total.mismatches += std::bit_cast<std::uint32_t>(got[i]) != 0x7fc0deadu;
}

// Graph contract: one launch captured on its first call with the chunk {p0, n_tok} in device
// memory and a capacity of 40 tokens, replayed at other chunks (positions across the window, the
// compressor's ratio and page boundaries; 1 to 40 tokens); the live tokens of each replay must
// equal an uncaptured launch with p0 and n_tok as launch values, bitwise (same kernel, same
// order). head_dim 512 runs the wgmma loop on sm_90a, 128 the mma.sync one.
check_row graph_case(std::mt19937_64& rng, int D) {
    const int H = 16, n_rot = 64, n_swa = 128, ratio = 4, cap = 40;
    const int chunks[][2] = {{0, 17}, {25, 40}, {100, 3}, {127, 1}, {128, 2}, {2011, 37}, {2040, 40}, {0, 40}};
    const int max_pos = 2040 + cap, max_comp = (max_pos + 1) / ratio;
    const attention_row_layout lay{D, n_rot};
    const rope_params rp = ds4_rope_params(true, n_rot);
    const int raw_stride = max_pos / page_rows + 1, comp_stride = (max_comp + page_rows - 1) / page_rows;
    const fixtures::device_kv kv(fixtures::paged_kv::random(rng, lay, 1, raw_stride, comp_stride));
    auto d_q = fixtures::to_device(fixtures::normal_vector(rng, std::size_t(cap) * H * D));
    auto d_sinks = fixtures::to_device(fixtures::normal_vector(rng, std::size_t(H), 2.0f));
    device_buffer<float> d_out(std::size_t(cap) * H * D);
    device_buffer<std::int32_t> d_chunk(2);
    const kernels::attention_prefill_args a = fixtures::prefill_args(kv.view(), d_q.data(), d_out.data(), d_sinks.data(), 0, 0, rp);
    const kernels::attention_prefill_shape shape{H, D, n_rot, n_swa, ratio};
    const cuda_stream stream;
    kernels::attention_prefill_args captured = a;
    captured.n_tok = cap;
    captured.chunk = d_chunk.data();
    kernels::prepare_attention_prefill(current_device());
    const cuda_graph graph(stream, [&] { kernels::attention_prefill(shape, captured, stream); });
    const std::vector<float> poison(d_out.size(), std::bit_cast<float>(0x7fc0dead));
    comparison total;
    for (const auto& ch : chunks) {
        const std::vector<std::int32_t> chunk{ch[0], ch[1]};
        auto run = [&](bool replay) {
            cuda_check(cudaMemcpyAsync(d_chunk.data(), chunk.data(), 8, cudaMemcpyHostToDevice, stream), "chunk");
            cuda_check(cudaMemcpyAsync(d_out.data(), poison.data(), poison.size() * 4, cudaMemcpyHostToDevice, stream),
                       "poison");
            if (replay) {
                graph.launch(stream);
            } else {
                kernels::attention_prefill_args e = a;
                e.p0 = ch[0];
                e.n_tok = ch[1];
                kernels::attention_prefill(shape, e, stream);
            }
            stream.synchronize(replay ? "prefill graph replay" : "prefill uncaptured");
            return d_out.download();
        };
        const auto g = run(true), u = run(false);
        add_live_and_poison(total, g, u, std::size_t(ch[1]) * H * D);
    }
    return row_of("attention_prefill_graph",
                  "h16 d" + std::to_string(D) + " capacity 40, captured once, replayed at p0 0..2040 x 1..40",
                  "exact (replay vs uncaptured)", total, "chunk from device memory, bitwise");
}

// Per-token rows (args.tok_pos, the CUDA backend's sub-batch): rows of three sequences, each
// row with its position, its copy of its sequence's page tables and its indexer list, in one
// launch captured once with a capacity of 32 rows and the live count in device memory, replayed
// for two sub-batches (31 rows: a mid-context run, a single row and a run across the window; 7
// rows: one row at the end, a run from position 0). The live rows must equal per-sequence
// launches (p0, n_tok) bitwise (a token's result never depends on the tokens beside it), and the
// rows past the live count stay untouched.
check_row token_rows_case(std::mt19937_64& rng, int D) {
    const int H = 16, n_rot = 64, n_swa = 128, ratio = 4, top_k = 32, cap = 32, n_seq = 3;
    struct run { int seq, p0, n; };
    const std::vector<std::vector<run>> batches = {{{0, 2030, 10}, {1, 130, 1}, {2, 60, 20}}, {{2, 2039, 1}, {0, 0, 6}}};
    const int max_pos = 2040, max_comp = (max_pos + 1) / ratio;
    const attention_row_layout lay{D, n_rot};
    const rope_params rp = ds4_rope_params(true, n_rot);
    const int raw_stride = max_pos / page_rows + 1, comp_stride = max_comp / page_rows + 1;
    const fixtures::paged_kv host_kv = fixtures::paged_kv::random(rng, lay, n_seq, raw_stride, comp_stride);
    const fixtures::device_kv kv(host_kv);
    auto d_q = fixtures::to_device(fixtures::normal_vector(rng, std::size_t(cap) * H * D));
    auto d_sinks = fixtures::to_device(fixtures::normal_vector(rng, std::size_t(H), 2.0f));
    device_buffer<float> d_out(std::size_t(cap) * H * D), d_want(std::size_t(cap) * H * D);
    device_buffer<std::int32_t> d_pos(cap), d_live(1), d_sel(std::size_t(cap) * top_k), d_nsel(cap);
    device_buffer<std::int32_t> d_rt(std::size_t(cap) * raw_stride), d_ct(std::size_t(cap) * comp_stride);
    const kernels::attention_prefill_shape shape{H, D, n_rot, n_swa, ratio};
    const cuda_stream stream;
    kernels::attention_prefill_args rows = fixtures::prefill_args(kv.view(), d_q.data(), d_out.data(), d_sinks.data(), 0, cap, rp);
    rows.raw_page_table = d_rt.data();
    rows.comp_page_table = d_ct.data();
    rows.raw_table_stride = raw_stride;
    rows.comp_table_stride = comp_stride;
    rows.tok_pos = d_pos.data();
    rows.n_live = d_live.data();
    rows.comp_sel = d_sel.data();
    rows.comp_nsel = d_nsel.data();
    rows.comp_sel_stride = top_k;
    kernels::prepare_attention_prefill(current_device());
    const cuda_graph graph(stream, [&] { kernels::attention_prefill(shape, rows, stream); });
    const std::vector<float> poison(d_out.size(), std::bit_cast<float>(0x7fc0dead));
    comparison total;
    for (const auto& batch : batches) {
        std::vector<std::int32_t> pos(cap, 0), rt(std::size_t(cap) * raw_stride, -1), ct(std::size_t(cap) * comp_stride, -1);
        std::vector<std::int32_t> sel(std::size_t(cap) * top_k, 0), nsel(cap, 0);
        int live = 0;
        for (const run& r : batch)
            for (int i = 0; i < r.n; ++i, ++live) {
                pos[std::size_t(live)] = r.p0 + i;
                std::copy_n(host_kv.raw_table.begin() + std::ptrdiff_t(r.seq) * raw_stride, raw_stride,
                            rt.begin() + std::ptrdiff_t(live) * raw_stride);
                std::copy_n(host_kv.comp_table.begin() + std::ptrdiff_t(r.seq) * comp_stride, comp_stride,
                            ct.begin() + std::ptrdiff_t(live) * comp_stride);
                const int nc = (r.p0 + i + 1) / ratio;
                if (nc <= top_k) continue;  // count 0: every row
                std::vector<std::int32_t> all(static_cast<std::size_t>(nc));
                for (int k = 0; k < nc; ++k) all[std::size_t(k)] = k;
                std::shuffle(all.begin(), all.end(), rng);
                std::sort(all.begin(), all.begin() + top_k);
                std::copy_n(all.begin(), top_k, sel.begin() + std::ptrdiff_t(live) * top_k);
                nsel[std::size_t(live)] = top_k;
            }
        const std::int32_t n_live = live;
        auto up = [&](std::int32_t* dst, const std::int32_t* src, std::size_t n, const char* what) {
            cuda_check(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyHostToDevice, stream), what);
        };
        up(d_pos.data(), pos.data(), pos.size(), "positions");
        up(d_live.data(), &n_live, 1, "live count");
        up(d_rt.data(), rt.data(), rt.size(), "raw tables");
        up(d_ct.data(), ct.data(), ct.size(), "compressed tables");
        up(d_sel.data(), sel.data(), sel.size(), "selections");
        up(d_nsel.data(), nsel.data(), nsel.size(), "selection counts");
        cuda_check(cudaMemcpyAsync(d_out.data(), poison.data(), poison.size() * 4, cudaMemcpyHostToDevice, stream), "poison");
        graph.launch(stream);
        // The same rows as one launch per sequence, over the sequence's own tables.
        int row0 = 0;
        for (const run& r : batch) {
            kernels::attention_prefill_args e =
                fixtures::prefill_args(kv.view(), d_q.data() + std::size_t(row0) * H * D,
                                       d_want.data() + std::size_t(row0) * H * D, d_sinks.data(), r.p0, r.n, rp);
            e.raw_page_table = kv.rt.data() + std::size_t(r.seq) * raw_stride;
            e.comp_page_table = kv.ct.data() + std::size_t(r.seq) * comp_stride;
            e.comp_sel = d_sel.data() + std::size_t(row0) * top_k;
            e.comp_nsel = d_nsel.data() + row0;
            e.comp_sel_stride = top_k;
            kernels::attention_prefill(shape, e, stream);
            row0 += r.n;
        }
        stream.synchronize("prefill per-token rows");
        add_live_and_poison(total, d_out.download(), d_want.download(), std::size_t(live) * H * D);
    }
    return row_of("attention_prefill_rows",
                  "h16 d" + std::to_string(D) + " 3 sequences, capacity 32, 31 and 7 live rows, top_k 32 lists",
                  "exact (per-token rows vs per-sequence launches)", total, "captured once, replayed; rows past live untouched");
}

}  // namespace

std::vector<check_row> check_attention_prefill(std::uint64_t seed, bool quick) {
    std::mt19937_64 rng(seed ^ 0x9fe'f111'a77eULL);
    std::vector<prefill_case> cases;
    cases.push_back({"tiny", 8, 128, 16, 4, 0, 37});
    cases.push_back({"tiny", 8, 128, 16, 4, 100, 37});
    cases.push_back({"tiny specials", 8, 128, 16, 4, 100, 37, true});
    cases.push_back({"flash", 64, 512, 128, 4, 0, 64});
    cases.push_back({"flash", 64, 512, 128, 128, 2000, 64});
    cases.push_back({"flash", 64, 512, 128, 4, 2000, 257});
    cases.push_back({"flash specials", 64, 512, 128, 4, 2000, 64, true});
    cases.push_back({"flash indexed", 64, 512, 128, 4, 2040, 64, false, 512});
    cases.push_back({"tiny indexed", 8, 128, 16, 4, 150, 37, false, 20});
    if (!quick) {
        cases.push_back({"flash", 64, 512, 128, 4, 0, 257});
        cases.push_back({"flash", 64, 512, 128, 128, 0, 257});
        cases.push_back({"flash", 64, 512, 128, 4, 2000, 64});
        cases.push_back({"flash", 64, 512, 128, 128, 2000, 257});
        cases.push_back({"mid heads", 16, 512, 128, 4, 333, 97});
    }
    std::vector<check_row> rows;
    for (const auto& c : cases) rows.push_back(prefill_case_row(rng, c, quick));
    for (int d : {512, 128}) rows.push_back(graph_case(rng, d));
    for (int d : {512, 128}) rows.push_back(token_rows_case(rng, d));
    return rows;
}

}  // namespace ds4::validate
