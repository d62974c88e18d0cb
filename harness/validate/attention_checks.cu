// ds4-validate rows for kernels/kv_store.cuh and kernels/attention_decode.cuh: stored row bytes
// against the host encoder (edge values and random rows), flash decode against the split-order
// replay (exact) with the difference to sink_attention reported, for 1 and many sequences of odd
// lengths, 1 and 5 verify rows, with and without indexer masks, poisoned outputs, NaN/Inf rows,
// and a decode step captured as a CUDA graph at position 0 and replayed at later positions.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ds4/core/cuda_graph.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/attention_decode.cuh"
#include "ds4/kernels/attention_decode_mma.cuh"
#include "ds4/kernels/kv_store.cuh"
#include "harness/fixtures/decode_args.hpp"
#include "harness/validate/checks.hpp"
#include "reference/attention_decode.hpp"
#include "reference/attention_split.hpp"
#include "reference/norm_rope.hpp"

namespace ds4::validate {
namespace {

using kernels::attention_decode_args;
using kernels::attention_decode_capacity;
using kernels::attention_decode_plan;
using kernels::attention_decode_shape;
using model::attention_row_layout;
constexpr int page_rows = model::kv_page_rows;

using fixtures::device_kv;
using fixtures::host_pool;
using fixtures::to_device;

const float qnan = std::numeric_limits<float>::quiet_NaN();
const float inf = std::numeric_limits<float>::infinity();

// Byte comparison as a check row (count = bytes, mismatches = differing bytes).
comparison compare_bytes(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want) {
    comparison c;
    c.count = want.size();
    for (std::size_t i = 0; i < want.size(); ++i) c.mismatches += got[i] != want[i];
    return c;
}

// Pool bytes where a NaN code counts as equal to any NaN code: E4M3 codes 0x7f/0xff in the nope
// dims, F16 NaNs of either sign and any payload in the RoPE tail. A NaN made by arithmetic (the
// folded norm's (x*scale)*w of a row holding a NaN) has the platform's sign: x86 keeps an
// operand's, the GPU returns a positive canonical NaN. Exponents and padding compare as bytes.
comparison compare_kv_pool_nan_free(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want,
                                    const attention_row_layout& lay) {
    comparison c;
    c.count = want.size();
    const std::size_t rb = std::size_t(lay.bytes());
    for (std::size_t r = 0; r + rb <= want.size(); r += rb) {
        for (std::size_t i = 0; i < rb;) {
            const std::uint8_t* g = got.data() + r + i;
            const std::uint8_t* w = want.data() + r + i;
            if (i < std::size_t(lay.n_nope())) {
                const bool nan_pair = (g[0] & 0x7fu) == 0x7fu && (w[0] & 0x7fu) == 0x7fu;
                c.mismatches += !nan_pair && g[0] != w[0];
                i += 1;
            } else if (i < std::size_t(lay.exponent_offset())) {
                const unsigned hg = g[0] | (g[1] << 8), hw = w[0] | (w[1] << 8);
                const auto is_nan = [](unsigned h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; };
                c.mismatches += !(is_nan(hg) && is_nan(hw)) && hg != hw ? 2 : 0;
                i += 2;
            } else {
                c.mismatches += g[0] != w[0];
                i += 1;
            }
        }
    }
    return c;
}

// ---- kv_store ----

// fold_norm: the launch also applies the kv RMSNorm (kv_path's kv_norm folded into the store);
// the reference runs ref::rms_norm first.
check_row kv_store_case(std::mt19937_64& rng, int head_dim, bool compressed_layer, bool fold_norm = false) {
    const int n_rot = 64, nope = head_dim - n_rot;
    const attention_row_layout lay{head_dim, n_rot};
    const rope_params rp = ds4_rope_params(compressed_layer, n_rot);
    const int n_seq = 3, stride = 40;  // positions < 40 * 64
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> posd(0, stride * page_rows - 1);
    // Rows: edge rows first, then random rows at random scales, one idle row.
    std::vector<std::vector<float>> rows;
    {
        std::vector<float> r(static_cast<std::size_t>(head_dim), 0.0f);
        const float edge[] = {448.0f, -448.0f, 1.0625f, 1.1875f, -1.0625f, 0x1p-6f, 0x1p-9f, 0x1p-10f, 3 * 0x1p-10f,
                              -0x1p-10f, 0.0f, -0.0f, qnan, 0x1.ep-8f, 240.0f, 232.0f, 248.0f, 0x1.1p-6f, 13.0f, 17.0f};
        for (int i = 0; i < 64; ++i) r[std::size_t(i)] = i < 20 ? edge[i] : float(i) * 0.25f - 8.0f;
        for (int b = 1; b < nope / 64; ++b) {
            float* x = r.data() + b * 64;
            for (int i = 0; i < 64; ++i) x[i] = nd(rng);
            if (b == 1) for (int i = 0; i < 64; ++i) x[i] = (i % 2 ? -0.0f : 0.0f);           // all zero: floor
            if (b == 2) x[5] = inf;                                                       // Inf block
            if (b == 3) x[9] = 448.0f * (1.0f + 0x1p-23f);                                // just above 2^0 * 448
            if (b == 4) for (int i = 0; i < 64; ++i) x[i] *= 1e-30f;                      // below the floor
            if (b == 5) for (int i = 0; i < 64; ++i) x[i] = float((i % 17) - 8) * 28.0f + 14.0f;  // ties after scaling
            if (b == 6) x[0] = -qnan;
        }
        const float tail[] = {70000.0f, -70000.0f, 1e-7f, -1e-7f, 0.0f, -0.0f, qnan, inf, 65504.0f, 6e-8f};
        for (int i = 0; i < n_rot; ++i) r[std::size_t(nope + i)] = i < 10 ? tail[i] : nd(rng) * 3.0f;
        rows.push_back(r);
        for (int i = 0; i < nope; ++i) r[std::size_t(i)] = -r[std::size_t(i)];
        rows.push_back(r);
    }
    for (int n = 0; n < 34; ++n) {
        std::vector<float> r(static_cast<std::size_t>(head_dim));
        for (int b = 0; b < head_dim / 64; ++b) {
            const float sc = std::ldexp(1.0f, int(rng() % 40) - 20);
            for (int i = 0; i < 64; ++i) r[std::size_t(b * 64 + i)] = nd(rng) * sc;
        }
        rows.push_back(r);
    }
    const int n_rows = int(rows.size()) + 1;
    std::vector<float> kv(std::size_t(n_rows) * head_dim, 0.0f);
    std::vector<std::int32_t> pos(static_cast<std::size_t>(n_rows)), seq(static_cast<std::size_t>(n_rows));
    std::vector<std::vector<int>> used(n_seq);
    for (int i = 0; i + 1 < n_rows; ++i) {
        std::copy(rows[std::size_t(i)].begin(), rows[std::size_t(i)].end(), kv.begin() + std::ptrdiff_t(i) * head_dim);
        seq[std::size_t(i)] = i % n_seq;
        int p;
        do p = i == 0 ? 0 : posd(rng);
        while (std::find(used[std::size_t(i % n_seq)].begin(), used[std::size_t(i % n_seq)].end(), p) !=
               used[std::size_t(i % n_seq)].end());
        used[std::size_t(i % n_seq)].push_back(p);
        pos[std::size_t(i)] = p;
    }
    seq.back() = -1;  // idle row
    pos.back() = 5;
    std::vector<std::int32_t> table(std::size_t(n_seq) * stride);
    for (std::size_t i = 0; i < table.size(); ++i) table[i] = std::int32_t((i * 7 + 3) % table.size());  // scattered pages
    const std::size_t pool_bytes = table.size() * page_rows * std::size_t(lay.bytes());
    std::vector<std::uint8_t> want(pool_bytes, 0xab);
    std::vector<float> norm_w(static_cast<std::size_t>(head_dim));
    for (auto& v : norm_w) v = 0.5f + float(rng() % 1024) / 1024.0f;
    for (int i = 0; i + 1 < n_rows; ++i) {
        std::vector<float> x(kv.begin() + std::ptrdiff_t(i) * head_dim, kv.begin() + std::ptrdiff_t(i + 1) * head_dim);
        if (fold_norm) ref::rms_norm(x.data(), norm_w.data(), head_dim, 1e-6f, x.data());
        ref::rope_tail(x.data(), 1, head_dim, n_rot, rp, std::uint32_t(pos[std::size_t(i)]), false);
        const std::int32_t page = table[std::size_t(seq[std::size_t(i)]) * stride + std::size_t(pos[std::size_t(i)] / page_rows)];
        model::encode_attention_row(lay, x.data(),
                                    want.data() + (std::size_t(page) * page_rows + std::size_t(pos[std::size_t(i)] % page_rows)) *
                                                      std::size_t(lay.bytes()));
    }
    auto d_kv = to_device(kv);
    auto d_pos = to_device(pos);
    auto d_seq = to_device(seq);
    auto d_table = to_device(table);
    device_buffer<std::uint8_t> d_pool(pool_bytes);
    cuda_check(cudaMemset(d_pool.data(), 0xab, pool_bytes), "poison pool");
    device_buffer<std::int32_t> d_n(1);
    d_n.upload(std::vector<std::int32_t>{n_rows});
    kernels::kv_store_launch a{d_kv.data(), d_pos.data(), d_seq.data(), d_n.data(), d_table.data(), d_pool.data(),
                               stride, lay, rp};
    auto d_norm_w = to_device(norm_w);
    if (fold_norm) {  // as the backend launches it: the norm folded, the index read before the PDL wait
        a.norm_weight = d_norm_w.data();
        a.norm_eps = 1e-6f;
        a.early_index = true;
    }
    kernels::kv_store(a, n_rows + 3, nullptr);  // capacity beyond the live rows
    cuda_check(cudaDeviceSynchronize(), "kv_store");
    check_row row;
    row.kernel = "kv_store";
    row.shape = "head_dim " + std::to_string(head_dim) + (compressed_layer ? " yarn" : " base") +
                (fold_norm ? " + kv_norm, early index" : "") + ", " + std::to_string(n_rows) + " rows (edge + random + idle)";
    row.contract = "exact";
    const std::vector<std::uint8_t> got = d_pool.download();
    // With the fold, NaN codes compare as NaN whatever their sign (compare_kv_pool_nan_free says why);
    // without it a NaN input keeps its sign through the encode, and every byte must agree.
    row.cmp = fold_norm ? compare_kv_pool_nan_free(got, want, lay) : compare_bytes(got, want);
    row.pass = passed(row.cmp);
    row.note = "bytes vs host encode_attention_row";
    if (fold_norm) {
        row.note += ", NaN codes of either sign";
        if (row.pass) row.note += " (" + std::to_string(compare_bytes(got, want).mismatches) + " NaN bytes differ in sign)";
    }
    if (!row.pass) row.note += "; " + std::to_string(row.cmp.mismatches) + " bytes differ";
    return row;
}

// ---- attention ----

struct attn_case {
    std::string name;
    int n_head, head_dim, n_swa;
    std::vector<int> lens;  // context length of each sequence's first query row (0 = idle slot)
    int n_q;                // query rows per sequence
    int ratio;              // compressed rows seen by a token at pos: (pos + 1) / ratio
    bool mask;              // indexer mask (about 512 visible) when a token sees more than 512 rows
    bool specials = false;  // NaN/Inf in a few stored rows
    int split_rows = 0;     // tensor-core kernel's split size (0: the plan's choice)
};

std::vector<check_row> attention_case(std::mt19937_64& rng, const attn_case& c) {
    const int H = c.n_head, D = c.head_dim, n_rot = 64, n_seq = int(c.lens.size());
    const attention_row_layout lay{D, n_rot};
    const rope_params rp = ds4_rope_params(true, n_rot);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int max_pos = 0, max_comp = 1;
    for (int L : c.lens) max_pos = std::max(max_pos, L + c.n_q - 1);
    max_comp = std::max(1, (max_pos + 1) / c.ratio);
    const int raw_stride = max_pos / page_rows + 1, comp_stride = (max_comp + page_rows - 1) / page_rows;
    host_pool rawp{lay, {}}, compp{lay, {}};
    std::vector<std::int32_t> raw_table(std::size_t(n_seq) * raw_stride, -1), comp_table(std::size_t(n_seq) * comp_stride, -1);
    std::vector<std::int32_t> seq_tok0(static_cast<std::size_t>(n_seq)), seq_ntok(static_cast<std::size_t>(n_seq)), tok_pos, tok_ncomp;
    std::vector<float> row(static_cast<std::size_t>(D));
    for (int s = 0; s < n_seq; ++s) {
        seq_tok0[std::size_t(s)] = std::int32_t(tok_pos.size());
        const int L = c.lens[std::size_t(s)];
        seq_ntok[std::size_t(s)] = L > 0 ? c.n_q : 0;
        if (L <= 0) continue;
        const int p0 = L - 1, plast = p0 + c.n_q - 1;
        for (int j = 0; j < c.n_q; ++j) {
            tok_pos.push_back(p0 + j);
            tok_ncomp.push_back((p0 + j + 1) / c.ratio);
        }
        // Raw rows of the window union only (older pages stay -1, as after drop_before).
        for (int p = std::max(0, p0 - c.n_swa + 1); p <= plast; ++p) {
            std::int32_t& pg = raw_table[std::size_t(s) * raw_stride + std::size_t(p / page_rows)];
            if (pg < 0) pg = rawp.alloc();
            fixtures::fill_normal(rng, row);
            if (c.specials && p == plast - 1) row[3] = qnan;
            model::encode_attention_row(lay, row.data(), rawp.row(pg, p % page_rows));
        }
        for (int ci = 0; ci < (plast + 1) / c.ratio; ++ci) {
            std::int32_t& pg = comp_table[std::size_t(s) * comp_stride + std::size_t(ci / page_rows)];
            if (pg < 0) pg = compp.alloc();
            fixtures::fill_normal(rng, row);
            for (auto& v : row) v *= 0.5f;
            if (c.specials && ci == 2) row[std::size_t(D - 5)] = inf;
            model::encode_attention_row(lay, row.data(), compp.row(pg, ci % page_rows));
        }
    }
    if (rawp.bytes.empty()) rawp.alloc();
    if (compp.bytes.empty()) compp.alloc();
    const int n_tok = int(tok_pos.size());
    std::vector<float> q(std::size_t(std::max(1, n_tok)) * H * D), sinks(static_cast<std::size_t>(H));
    for (int h = 0; h < H; ++h) sinks[std::size_t(h)] = nd(rng) * 2.0f;
    for (int t = 0; t < n_tok; ++t)
        for (int h = 0; h < H; ++h) {
            // Unit-RMS heads (the per-head norm), some sharper than others.
            const float sharp = (h % 4 == 0) ? 6.0f : 1.0f;
            for (int i = 0; i < D; ++i) q[(std::size_t(t) * H + std::size_t(h)) * D + std::size_t(i)] = nd(rng) * sharp;
        }
    if (c.specials && n_tok > 0) q[std::size_t(D + 7)] = inf;  // token 0, head 1
    const int mask_stride = max_comp;
    std::vector<std::uint8_t> mask;
    bool any_mask = false;
    if (c.mask) {
        mask.assign(std::size_t(std::max(1, n_tok)) * mask_stride, 1);
        for (int t = 0; t < n_tok; ++t) {
            const int nc = tok_ncomp[std::size_t(t)];
            if (nc <= 512) continue;
            any_mask = true;
            std::uniform_int_distribution<int> ud(0, nc - 1);
            for (int i = 0; i < nc; ++i) mask[std::size_t(t) * mask_stride + std::size_t(i)] = ud(rng) < 512;
        }
    }
    // Device.
    auto d_q = to_device(q);
    auto d_sinks = to_device(sinks);
    const device_kv kv(rawp, raw_table, raw_stride, compp, comp_table, comp_stride);
    auto d_t0 = to_device(seq_tok0);
    auto d_nt = to_device(seq_ntok);
    std::vector<std::int32_t> tp = tok_pos, tn = tok_ncomp;
    if (tp.empty()) tp.push_back(0), tn.push_back(0);
    auto d_tp = to_device(tp);
    auto d_tn = to_device(tn);
    device_buffer<std::uint8_t> d_mask;
    if (any_mask) d_mask = to_device(mask);
    const std::size_t out_n = std::size_t(n_seq) * c.n_q * H * D;  // room for every slot's rows
    device_buffer<float> d_out(out_n);
    std::vector<float> poison(out_n);
    for (auto& v : poison) v = std::bit_cast<float>(0x7fc0dead);
    d_out.upload(poison);
    const auto plan = attention_decode_plan::make({H, D, n_rot, c.n_swa}, {n_seq, c.n_q, max_comp});
    device_buffer<std::uint8_t> scratch(plan.scratch_bytes());
    cuda_check(cudaMemset(scratch.data(), 0x7f, plan.scratch_bytes()), "poison scratch");
    attention_decode_args a =
        fixtures::decode_args(kv.view(), d_q.data(), d_out.data(), d_sinks.data(), d_t0.data(), d_nt.data(), d_tp.data(),
                              d_tn.data(), rp);
    a.comp_mask = any_mask ? d_mask.data() : nullptr;
    a.comp_mask_stride = mask_stride;
    kernels::attention_decode(plan, a, scratch.data(), nullptr);
    cuda_check(cudaDeviceSynchronize(), "attention_decode");
    const std::vector<float> got = d_out.download();

    // Host: decode the stored rows, replay the split order and run the sequential reference.
    std::vector<float> want(std::size_t(n_tok) * H * D), ref(std::size_t(n_tok) * H * D);
    int n_rows_max = 0;  // most rows one query attends to
    for (int s = 0; s < n_seq; ++s) {
        for (int j = 0; j < seq_ntok[std::size_t(s)]; ++j) {
            const int t = seq_tok0[std::size_t(s)] + j, pos = tok_pos[std::size_t(t)], nc = tok_ncomp[std::size_t(t)];
            const int n_raw = std::min(pos + 1, c.n_swa);
            n_rows_max = std::max(n_rows_max, n_raw + nc);
            std::vector<float> rawf(std::size_t(n_raw) * D), compf(std::size_t(std::max(1, nc)) * D);
            for (int i = 0; i < n_raw; ++i) {
                const int p = pos + 1 - n_raw + i;
                model::decode_attention_row(lay, rawp.row(raw_table[std::size_t(s) * raw_stride + std::size_t(p / page_rows)], p % page_rows),
                                            rawf.data() + std::size_t(i) * D);
            }
            for (int ci = 0; ci < nc; ++ci)
                model::decode_attention_row(lay, compp.row(comp_table[std::size_t(s) * comp_stride + std::size_t(ci / page_rows)], ci % page_rows),
                                            compf.data() + std::size_t(ci) * D);
            const std::uint8_t* m = any_mask && nc > 512 ? mask.data() + std::size_t(t) * mask_stride : nullptr;
            const float* qt = q.data() + std::size_t(t) * H * D;
            ref::attention_decode_split(qt, rawf.data(), n_raw, compf.data(), nc, m, sinks.data(), H, D, n_rot, rp,
                                        std::uint32_t(pos), want.data() + std::size_t(t) * H * D);
            ref::attention_decode(qt, rawf.data(), n_raw, compf.data(), nc, m, sinks.data(), H, D, n_rot, rp,
                                  std::uint32_t(pos), ref.data() + std::size_t(t) * H * D);
        }
    }
    // Outputs are indexed by token; idle slots own no tokens, so the region past n_tok must stay poisoned.
    const std::size_t live = std::size_t(n_tok) * H * D;
    check_row r;
    r.kernel = "attention_decode";
    std::string lens;
    for (std::size_t i = 0; i < c.lens.size() && i < 4; ++i) lens += (i ? "," : "") + std::to_string(c.lens[i]);
    if (c.lens.size() > 4) lens += ",..";
    r.shape = c.name + " h" + std::to_string(H) + " d" + std::to_string(D) + " seq " + std::to_string(n_seq) + " [" + lens +
              "] q" + std::to_string(c.n_q);
    r.contract = "exact";
    r.cmp = compare(std::span<const float>(got.data(), live), want);
    const comparison vs_ref = compare(std::span<const float>(got.data(), live), ref);
    double ref_max = 0;
    for (float v : ref)
        if (std::isfinite(v)) ref_max = std::max(ref_max, double(std::fabs(v)));
    std::size_t untouched = 0;
    for (std::size_t i = live; i < out_n; ++i) untouched += std::bit_cast<std::uint32_t>(got[i]) == 0x7fc0deadu;
    // The sequential F32 reference itself drifts with the number of rows it sums (a relative
    // n * 2^-24 bound); the exact contract is against the split replay above.
    const double drift = std::max(1e-4, double(n_rows_max) * 0x1p-24);
    const bool ref_ok = vs_ref.special_mismatches == 0 && vs_ref.max_abs <= drift * std::max(1.0, ref_max);
    r.pass = passed(r.cmp) && ref_ok && untouched == out_n - live;
    r.note = "vs sink_attention: max|d| " + std::to_string(vs_ref.max_abs) + ", " + std::to_string(vs_ref.max_ulp) +
             " ulp" + (any_mask ? ", masked" : "") + (untouched == out_n - live ? "" : ", WROTE IDLE ROWS");

    // The tensor-core kernel on the same rows, the mask given as the indexer's ascending list;
    // bounded against the sequential F32 reference.
    std::vector<check_row> rows{r};
    {
        std::vector<std::int32_t> sel(std::size_t(std::max(1, n_tok)) * mask_stride, 0), nsel(std::size_t(std::max(1, n_tok)), 0);
        if (any_mask)
            for (int t = 0; t < n_tok; ++t) {
                if (tok_ncomp[std::size_t(t)] <= 512) continue;
                int n = 0;
                for (int i = 0; i < tok_ncomp[std::size_t(t)]; ++i)
                    if (mask[std::size_t(t) * mask_stride + std::size_t(i)]) sel[std::size_t(t) * mask_stride + std::size_t(n++)] = i;
                nsel[std::size_t(t)] = n;
            }
        auto d_sel = to_device(sel);
        auto d_nsel = to_device(nsel);
        d_out.upload(poison);
        const auto plan_mma = kernels::attention_decode_mma_plan::make({H, D, n_rot, c.n_swa}, {n_seq, c.n_q, max_comp}, c.split_rows);
        device_buffer<std::uint8_t> scratch_mma(plan_mma.scratch_bytes());
        cuda_check(cudaMemset(scratch_mma.data(), 0x7f, plan_mma.scratch_bytes()), "poison scratch");
        attention_decode_args am = a;
        am.comp_mask = nullptr;
        am.comp_sel = any_mask ? d_sel.data() : nullptr;
        am.comp_nsel = any_mask ? d_nsel.data() : nullptr;
        am.comp_sel_stride = mask_stride;
        kernels::attention_decode_mma(plan_mma, am, scratch_mma.data(), nullptr);
        cuda_check(cudaDeviceSynchronize(), "attention_decode_mma");
        const std::vector<float> gm = d_out.download();
        const std::span<const float> gl(gm.data(), live);
        const bounded_comparison bc = compare_bounded(gl, ref, 3e-2);
        const comparison& cm = bc.cmp;
        const double rel_l2 = bc.rel_l2;
        std::size_t untouched_m = 0;
        for (std::size_t i = live; i < out_n; ++i) untouched_m += std::bit_cast<std::uint32_t>(gm[i]) == 0x7fc0deadu;
        check_row rm;
        rm.kernel = "attention_decode_mma";
        rm.shape = r.shape + " split " + std::to_string(plan_mma.split_rows);
        rm.contract = "bounded: relL2 <= 3e-3, |d| <= 3e-2 vs F32 ref";
        rm.cmp = cm;
        rm.pass = passed(cm) && rel_l2 <= 3e-3 && untouched_m == out_n - live;
        rm.note = "relL2 " + std::to_string(rel_l2) + (any_mask ? ", selected list" : "") +
                  (untouched_m == out_n - live ? "" : ", WROTE IDLE ROWS");
        rows.push_back(rm);
        // The sm_90a kernel again, q given as its F16 shared-memory operand (attention_q16.hpp,
        // formed here on the host): bitwise the launch above, which converted q itself.
        if (D == 512 && H <= kernels::q16_rows && kernels::wgmma_detail::available_on(current_device())) {
            const std::size_t per_tok = std::size_t(kernels::q16_token_halves(D));
            std::vector<std::uint16_t> q16(std::size_t(std::max(1, n_tok)) * per_tok, 0);
            const float scale = kernels::attention_q_scale_log2(D);
            for (int t = 0; t < n_tok; ++t)
                for (int h = 0; h < H; ++h)
                    for (int i = 0; i < D; ++i)
                        q16[std::size_t(t) * per_tok + std::size_t(kernels::core_matrix_offset(h, i, D))] =
                            f32_to_f16(q[(std::size_t(t) * H + std::size_t(h)) * D + std::size_t(i)] * scale);
            auto d_q16 = to_device(q16);
            d_out.upload(poison);
            cuda_check(cudaMemset(scratch_mma.data(), 0x7f, plan_mma.scratch_bytes()), "poison scratch");
            am.q16 = reinterpret_cast<const __half*>(d_q16.data());
            kernels::attention_decode_mma(plan_mma, am, scratch_mma.data(), nullptr);
            cuda_check(cudaDeviceSynchronize(), "attention_decode_mma q16");
            const std::vector<float> g16 = d_out.download();
            check_row rq;
            rq.kernel = "attention_decode_mma";
            rq.shape = rm.shape + " q16";
            rq.contract = "bitwise the launch converting q";
            rq.cmp = compare(std::span<const float>(g16.data(), out_n), std::span<const float>(gm.data(), out_n));
            rq.pass = passed(rq.cmp);
            rq.note = "q as the F16 operand";
            rows.push_back(rq);
        }
    }
    return rows;
}

// ---- every E4M3 code at every block exponent: the tensor-core kernels' fast row decode ----

__global__ void row_decode_kernel(const std::uint8_t* rows, int n_rows, std::uint16_t* out) {
    const model::attention_row_layout lay{512, 64};
    const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n_rows * 64) return;
    const int r = i / 64, d = 8 * (i % 64);
    const uint4 w = kernels::mma_detail::decode_row8_f16(rows + std::size_t(r) * lay.bytes(), lay, d);
    const std::uint32_t v[4] = {w.x, w.y, w.z, w.w};
    for (int e = 0; e < 4; ++e) {
        out[std::size_t(r) * 512 + std::size_t(d + 2 * e)] = static_cast<std::uint16_t>(v[e] & 0xffffu);
        out[std::size_t(r) * 512 + std::size_t(d + 2 * e + 1)] = static_cast<std::uint16_t>(v[e] >> 16);
    }
}

check_row row_decode_case() {
    const attention_row_layout lay{512, 64};
    // Row e + 128 has every block exponent e; its 448 codes run through all 256 codes (and 192 again).
    const int n_rows = 256;
    std::vector<std::uint8_t> rows(std::size_t(n_rows) * lay.bytes(), 0);
    for (int r = 0; r < n_rows; ++r) {
        std::uint8_t* row = rows.data() + std::size_t(r) * lay.bytes();
        for (int i = 0; i < lay.n_nope(); ++i) row[i] = static_cast<std::uint8_t>((i + r) & 0xff);
        for (int i = 0; i < lay.n_rot; ++i) {
            const std::uint16_t h = static_cast<std::uint16_t>(0x3c00 + 37 * i + r);
            row[lay.rope_offset() + 2 * i] = static_cast<std::uint8_t>(h & 0xff);
            row[lay.rope_offset() + 2 * i + 1] = static_cast<std::uint8_t>(h >> 8);
        }
        for (int b = 0; b < lay.n_blocks(); ++b) row[lay.exponent_offset() + b] = static_cast<std::uint8_t>(r - 128);
    }
    auto d_rows = to_device(rows);
    device_buffer<std::uint16_t> d_out(std::size_t(n_rows) * 512);
    row_decode_kernel<<<n_rows * 64 / 128, 128>>>(d_rows.data(), n_rows, d_out.data());
    cuda_check(cudaDeviceSynchronize(), "row_decode_kernel");
    const auto got = d_out.download();
    comparison cmp;
    std::vector<float> want(512);
    for (int r = 0; r < n_rows; ++r) {
        model::decode_attention_row(lay, rows.data() + std::size_t(r) * lay.bytes(), want.data());
        for (int i = 0; i < 512; ++i) {
            ++cmp.count;
            const std::uint16_t w = f32_to_f16(want[std::size_t(i)]), g = got[std::size_t(r) * 512 + std::size_t(i)];
            const bool wn = std::isnan(want[std::size_t(i)]), gn = (g & 0x7c00u) == 0x7c00u && (g & 0x3ffu) != 0;
            if (wn || gn) cmp.special_mismatches += wn != gn;
            else cmp.mismatches += w != g;
        }
    }
    return row_of("attention_row_decode", "256 E4M3 codes x exponents -128..127, F16 tail", "exact", cmp,
                  "tensor-core F16 decode vs decode_attention_row");
}

// ---- graph: one decode/verify step (store + attention) captured on its first call, replayed ----

// Capacity 2 sequences x 4 query rows; every replay changes the positions (the spec's list, which
// crosses the window, the compressor emissions and the page boundaries), the live rows per
// sequence (1..4) and which sequence is idle, all through device memory; the live outputs of each
// replay must equal an uncaptured step's, bitwise.
check_row graph_case(std::mt19937_64& rng, bool mma) {
    const int H = 64, D = 512, n_rot = 64, n_swa = 128, n_seq = 2, max_q = 4, ratio = 4, cap = n_seq * max_q;
    const int positions[] = {0, 25, 49, 127, 128, 129, 2047, 2048, 2051};
    const int max_pos = 2051 + 7 + max_q, max_comp = (max_pos + 1) / ratio;
    const attention_row_layout lay{D, n_rot};
    const rope_params rp = ds4_rope_params(true, n_rot);
    const int raw_stride = max_pos / page_rows + 1, comp_stride = (max_comp + page_rows - 1) / page_rows;
    const auto host_kv = fixtures::paged_kv::random(rng, lay, n_seq, raw_stride, comp_stride);
    const device_kv kv(host_kv);
    auto d_q = to_device(fixtures::normal_vector(rng, std::size_t(cap) * H * D));
    auto d_kv = to_device(fixtures::normal_vector(rng, std::size_t(cap) * D));
    auto d_sinks = to_device(fixtures::normal_vector(rng, std::size_t(H)));
    // Token slots: sequence s owns slots s * max_q .. s * max_q + max_q - 1.
    auto d_t0 = to_device(std::vector<std::int32_t>{0, max_q});
    device_buffer<std::int32_t> d_nt(n_seq), d_seq(cap), d_tp(cap), d_tn(cap);
    const cuda_stream stream;
    // Inputs change on the step's own stream (a non-blocking stream does not wait for cudaMemcpy's
    // pageable DMA), and the host waits before the vectors go out of scope.
    auto to_dev = [&](device_buffer<std::int32_t>& dst, const std::vector<std::int32_t>& src) {
        cuda_check(cudaMemcpyAsync(dst.data(), src.data(), src.size() * 4, cudaMemcpyHostToDevice, stream), "H2D");
        stream.synchronize("H2D");
    };
    // Step i: sequence 0 at p with n0 rows, sequence 1 at p + 7 with n1 rows (0: idle).
    std::vector<std::int32_t> nt(n_seq);
    auto set_step = [&](int p, int n0, int n1) {
        nt = {n0, n1};
        std::vector<std::int32_t> seq(cap, -1), tp(cap, 0), tn(cap, 0);
        for (int s = 0; s < n_seq; ++s)
            for (int j = 0; j < nt[std::size_t(s)]; ++j) {
                const int t = s * max_q + j, pos = p + 7 * s + j;
                seq[std::size_t(t)] = s;
                tp[std::size_t(t)] = pos;
                tn[std::size_t(t)] = (pos + 1) / ratio;
            }
        to_dev(d_nt, nt);
        to_dev(d_seq, seq);
        to_dev(d_tp, tp);
        to_dev(d_tn, tn);
    };
    const auto plan = attention_decode_plan::make({H, D, n_rot, n_swa}, {n_seq, max_q, max_comp});
    const auto plan_mma = kernels::attention_decode_mma_plan::make({H, D, n_rot, n_swa}, {n_seq, max_q, max_comp});
    device_buffer<std::uint8_t> scratch(std::max(plan.scratch_bytes(), plan_mma.scratch_bytes()));
    device_buffer<float> d_out(std::size_t(cap) * H * D);
    const attention_decode_args a =
        fixtures::decode_args(kv.view(), d_q.data(), d_out.data(), d_sinks.data(), d_t0.data(), d_nt.data(), d_tp.data(),
                              d_tn.data(), rp);
    // Idle token slots carry sequence -1: kv_store covers the capacity and skips them.
    kernels::kv_store_launch st{d_kv.data(), d_tp.data(), d_seq.data(), nullptr, kv.rt.data(), kv.rawp.data(),
                                raw_stride, lay, rp};
    auto step = [&] {
        kernels::kv_store(st, cap, stream);
        if (mma) kernels::attention_decode_mma(plan_mma, a, scratch.data(), stream);
        else kernels::attention_decode(plan, a, scratch.data(), stream);
    };
    cuda_check(cudaDeviceSynchronize(), "uploads");  // pageable cudaMemcpy may still be in flight
    set_step(0, 1, 1);
    // Captured on the first call: the device is prepared, no launch has run before the capture.
    kernels::prepare_attention_decode_mma(current_device());
    const cuda_graph graph(stream, step);
    const std::vector<float> poison(std::size_t(cap) * H * D, qnan);
    auto run = [&](bool replay) {
        cuda_check(cudaMemcpyAsync(d_out.data(), poison.data(), poison.size() * 4, cudaMemcpyHostToDevice, stream),
                   "poison");
        if (replay) graph.launch(stream);
        else step();
        stream.synchronize(replay ? "graph replay" : "uncaptured step");
        const auto all = d_out.download();
        std::vector<float> live;  // the live rows only: idle slots stay poisoned either way
        for (int s = 0; s < n_seq; ++s)
            live.insert(live.end(), all.begin() + std::ptrdiff_t(s) * max_q * H * D,
                        all.begin() + (std::ptrdiff_t(s) * max_q + nt[std::size_t(s)]) * H * D);
        return live;
    };
    comparison total;
    int i = 0;
    for (int p : positions) {
        const int n0 = 1 + i % max_q, n1 = i % 3 == 2 ? 0 : 1 + (i + 2) % max_q;
        ++i;
        set_step(p, n0, n1);
        const auto g = run(true), u = run(false);
        total.add(compare(g, u));
        for (float v : u) total.special_mismatches += !std::isfinite(v);  // finite inputs: any NaN/Inf fails
    }
    return row_of(mma ? "attention_graph_mma" : "attention_graph",
                  "store+attn, 2 seqs x 4 rows captured at 0, replayed at 25..2051 with 0..4 rows", "exact", total,
                  "graph replay vs uncaptured, bitwise");
}

}  // namespace

std::vector<check_row> check_attention(std::uint64_t seed, bool quick) {
    std::mt19937_64 rng(seed ^ 0xa77e'47'10'4dec0deULL);
    std::vector<check_row> rows;
    for (int hd : {512, 128})
        for (bool y : {false, true})
            for (bool norm : {false, true}) rows.push_back(kv_store_case(rng, hd, y, norm));
    std::vector<attn_case> cases;
    cases.push_back({"tiny", 8, 128, 16, {1, 54, 97}, 1, 4, true});
    cases.push_back({"tiny verify", 8, 128, 16, {1, 54, 97, 0}, 5, 4, true});
    cases.push_back({"flash", 64, 512, 128, {54}, 1, 4, false});
    cases.push_back({"flash verify", 64, 512, 128, {127, 0, 130}, 5, 4, false});
    cases.push_back({"flash specials", 64, 512, 128, {97}, 1, 4, false, true});
    cases.push_back({"mid", 16, 512, 64, {2051, 3, 190}, 5, 4, true});
    cases.push_back({"mid split 64", 16, 512, 64, {2051, 3, 190}, 5, 4, true, false, 64});
    cases.push_back({"tiny split 64", 8, 128, 16, {1, 300, 97}, 2, 4, false, false, 64});
    cases.push_back({"flash split 64", 64, 512, 128, {127, 0, 130, 2051}, 5, 4, true, false, 64});
    if (!quick) {
        cases.push_back({"ctx 2K", 64, 512, 128, {2051}, 1, 4, false});
        cases.push_back({"ctx 2K verify", 64, 512, 128, {2051}, 5, 4, true});
        cases.push_back({"ctx 32K", 64, 512, 128, {32769}, 1, 4, false});
        cases.push_back({"ctx 32K masked", 64, 512, 128, {32769}, 5, 4, true});
        cases.push_back({"ctx 256K", 64, 512, 128, {262145}, 1, 4, false});
        cases.push_back({"ctx 256K r128", 64, 512, 128, {262145}, 5, 128, false});
        std::vector<int> lens{54, 97, 2051, 1, 129, 255, 4097, 33, 32769, 511, 1025, 7, 16385, 63, 65, 2047};
        cases.push_back({"batch 16", 64, 512, 128, lens, 1, 4, true});
        cases.push_back({"batch 16 verify", 64, 512, 128, lens, 5, 4, true});
    }
    for (const auto& c : cases)
        for (auto& r : attention_case(rng, c)) rows.push_back(r);
    rows.push_back(graph_case(rng, false));
    rows.push_back(graph_case(rng, true));
    rows.push_back(row_decode_case());
    return rows;
}

}  // namespace ds4::validate
