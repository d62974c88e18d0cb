#pragma once
// A small routed-MoE problem for the moe_gemm tests (the CPU emulation and the GPU stage checks):
// random IQ2_XXS gate/up and Q2_K down experts (GGUF blocks and their tiled copies), activations
// with one 400 outlier per row (the clamps bite), routes over `ne` experts with a repeated expert
// on every third row (as hash layers can), and Q8_K rows as the moe_gemm workspace lays them out.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q8_k.hpp"
#include "ds4/format/tiled.hpp"

namespace ds4::test {

inline constexpr int moe_problem_slots = 6;

struct problem {
    int n_embd, n_ff, ne, rows;
    std::vector<iq2_xxs_block> gate, upw;
    std::vector<q2_k_block> down;
    iq2_xxs_tiled_layout GL;
    q2_k_tiled_layout DL;
    std::vector<std::uint8_t> gq, uq, dq;
    std::vector<std::uint16_t> gd, ud;
    std::vector<std::uint32_t> ddd;
    std::vector<float> x, w;
    std::vector<std::int32_t> sel;
};

// The tiled copies (gq, gd, uq, ud, dq, ddd) of the problem's GGUF expert blocks.
inline void tile_experts(problem& p) {
    const int ne = p.ne, nb_in = p.n_embd / 256, nb_ff = p.n_ff / 256;
    p.gq.resize(p.GL.quant_bytes() * ne);
    p.uq.resize(p.gq.size());
    p.dq.resize(p.DL.quant_bytes() * ne);
    p.gd.resize(p.GL.scale_count() * ne);
    p.ud.resize(p.gd.size());
    p.ddd.resize(p.DL.dd_count() * ne);
    for (int e = 0; e < ne; ++e) {
        repack_iq2_xxs(p.GL, p.gate.data() + std::size_t(e) * p.n_ff * nb_in, p.gq.data() + e * p.GL.quant_bytes(),
                       p.gd.data() + e * p.GL.scale_count());
        repack_iq2_xxs(p.GL, p.upw.data() + std::size_t(e) * p.n_ff * nb_in, p.uq.data() + e * p.GL.quant_bytes(),
                       p.ud.data() + e * p.GL.scale_count());
        repack_q2_k(p.DL, p.down.data() + std::size_t(e) * p.n_embd * nb_ff, p.dq.data() + e * p.DL.quant_bytes(),
                    p.ddd.data() + e * p.DL.dd_count());
    }
}

// ne >= 6: every row names six distinct experts.
inline problem make_problem(std::mt19937_64& g, int n_embd, int n_ff, int ne, int rows) {
    if (ne < moe_problem_slots) throw std::invalid_argument("make_problem: ne must be at least 6 (distinct experts a row)");
    problem p{n_embd, n_ff, ne, rows, {}, {}, {}, iq2_xxs_tiled_layout::make(n_ff, n_embd),
              q2_k_tiled_layout::make(n_embd, n_ff), {}, {}, {}, {}, {}, {}, {}, {}, {}};
    const int nb_in = n_embd / 256, nb_ff = n_ff / 256;
    p.gate.resize(std::size_t(ne) * n_ff * nb_in);
    p.upw.resize(p.gate.size());
    std::uint64_t state = g();
    const float d = 0.02f / float(iq2_xxs_random_rms(1.0f));
    fill_random_iq2_xxs(state, p.gate.data(), p.gate.size(), d);
    fill_random_iq2_xxs(state, p.upw.data(), p.upw.size(), d);
    p.down.resize(std::size_t(ne) * n_embd * nb_ff);
    std::uniform_real_distribution<float> dd(1e-3f, 3e-3f);
    for (auto& b : p.down) {
        for (auto& s : b.scales) s = std::uint8_t(g());
        for (auto& q : b.qs) q = std::uint8_t(g());
        b.d = f32_to_f16(dd(g));
        b.dmin = f32_to_f16(dd(g));
    }
    tile_experts(p);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    p.x.resize(std::size_t(rows) * n_embd);
    for (auto& v : p.x) v = n01(g);
    for (int r = 0; r < rows; ++r) p.x[std::size_t(r) * n_embd + g() % n_embd] = 400.0f;
    p.sel.resize(std::size_t(rows) * moe_problem_slots);
    p.w.resize(p.sel.size());
    std::uniform_real_distribution<float> wd(0.05f, 0.6f);
    std::vector<int> ids(ne);
    for (int r = 0; r < rows; ++r) {
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), g);
        for (int k = 0; k < moe_problem_slots; ++k) {
            p.sel[std::size_t(r) * moe_problem_slots + k] = ids[std::size_t(k)];
            p.w[std::size_t(r) * moe_problem_slots + k] = wd(g);
        }
        if (r % 3 == 0) p.sel[std::size_t(r) * moe_problem_slots + 1] = p.sel[std::size_t(r) * moe_problem_slots];
    }
    return p;
}

// The pairs (row * 6 + slot) grouped by expert in pair order, as the kernels' sort leaves them up
// to the order inside a group (which never changes a bit): expert e's pairs are
// sorted[offsets[e] .. offsets[e + 1]).
struct pair_groups {
    std::vector<int> offsets, sorted;
};
inline pair_groups group_pairs(const problem& P) {
    pair_groups g{std::vector<int>(std::size_t(P.ne) + 1, 0), {}};
    const int n_pairs = P.rows * moe_problem_slots;
    for (int e = 0; e < P.ne; ++e) {
        g.offsets[std::size_t(e)] = int(g.sorted.size());
        for (int p = 0; p < n_pairs; ++p)
            if (P.sel[std::size_t(p)] == e) g.sorted.push_back(p);
    }
    g.offsets[std::size_t(P.ne)] = int(g.sorted.size());
    return g;
}

// The layer's output from each pair's expert output ys ([rows * 6][n]): the six slots in order
// from 0, each addition rounded (reference/moe's slot loop).
inline std::vector<float> slot_sum(const std::vector<float>& ys, int rows, int n) {
    std::vector<float> out(std::size_t(rows) * n);
    for (int r = 0; r < rows; ++r)
        for (int o = 0; o < n; ++o) {
            float acc = 0.0f;
            for (int s = 0; s < moe_problem_slots; ++s) acc = add_rn(acc, ys[std::size_t(r * moe_problem_slots + s) * n + o]);
            out[std::size_t(r) * n + o] = acc;
        }
    return out;
}

// Q8_K rows as the workspace holds them: quants [row][n], d [row][n / 256], bsums [row][n / 16].
struct q8k_rows {
    std::vector<std::int8_t> q;
    std::vector<float> d;
    std::vector<std::int16_t> bsums;
};

inline q8k_rows quantize_rows(const std::vector<float>& x, int rows, int n) {
    q8k_rows o{std::vector<std::int8_t>(std::size_t(rows) * n), std::vector<float>(std::size_t(rows) * (n / 256)),
               std::vector<std::int16_t>(std::size_t(rows) * (n / 16))};
    std::vector<q8_k_block> blk(n / 256);
    for (int r = 0; r < rows; ++r) {
        quantize_q8_k(x.data() + std::size_t(r) * n, blk.data(), n);
        for (int b = 0; b < n / 256; ++b) {
            std::memcpy(o.q.data() + std::size_t(r) * n + b * 256, blk[b].qs, 256);
            o.d[std::size_t(r) * (n / 256) + b] = blk[b].d;
            std::memcpy(o.bsums.data() + std::size_t(r) * (n / 16) + b * 16, blk[b].bsums, 32);
        }
    }
    return o;
}

}  // namespace ds4::test
