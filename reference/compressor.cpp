#include "reference/compressor.hpp"

#include <algorithm>
#include <string>

#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/math.hpp"
#include "reference/indexer.hpp"
#include "reference/kv_store.hpp"
#include "reference/matvec.hpp"
#include "reference/norm_rope.hpp"

namespace ds4::ref {
namespace {
constexpr float neg_inf = -1e30f;  // DS4_NEG_INF: initial score, never a real logit
}

compressor_state make_compressor_state(int ratio, int head_dim) {
    require(ratio > 0 && head_dim > 0, "compressor: ratio " + std::to_string(ratio) + ", head_dim " +
                                           std::to_string(head_dim));
    compressor_state st;
    st.ratio = ratio;
    st.head_dim = head_dim;
    st.kv.assign(std::size_t(st.rows()) * st.width(), 0.0f);
    st.score.assign(st.kv.size(), neg_inf);
    return st;
}

void compressor_project(const compressor_weights& w, const float* xn, int n_embd, int width, int ratio,
                        std::uint32_t pos, float* kvp, float* sc) {
    matvec_f16(w.wkv, xn, n_embd, width, kvp);
    matvec_f16(w.wgate, xn, n_embd, width, sc);
    const std::uint16_t* ape = w.ape + std::size_t(pos % std::uint32_t(ratio)) * width;
    for (int j = 0; j < width; ++j) sc[j] += f16_to_f32(ape[j]);
}

void compressor_pool(const compressor_state& st, float* pooled) {
    const int r = st.ratio, hd = st.head_dim, w = st.width();
    const float* S = st.score.data();
    const float* V = st.kv.data();
    for (int j = 0; j < hd; ++j) {
        float mx = neg_inf;
        if (r == 4) {
            for (int i = 0; i < 4; ++i) {
                mx = std::max(mx, S[i * w + j]);
                mx = std::max(mx, S[(4 + i) * w + hd + j]);
            }
        } else {
            for (int i = 0; i < r; ++i) mx = std::max(mx, S[std::int64_t(i) * w + j]);
        }
        if (mx <= neg_inf * 0.5f) {
            pooled[j] = 0.0f;
            continue;
        }
        float denom = 0.0f, sum = 0.0f;
        if (r == 4) {
            for (int i = 0; i < 4; ++i) {
                const float wp = exp_f32(S[i * w + j] - mx);
                const float wc = exp_f32(S[(4 + i) * w + hd + j] - mx);
                denom += wp + wc;
                sum += wp * V[i * w + j];
                sum += wc * V[(4 + i) * w + hd + j];
            }
        } else {
            for (int i = 0; i < r; ++i) {
                const float wi = exp_f32(S[std::int64_t(i) * w + j] - mx);
                denom += wi;
                sum += wi * V[std::int64_t(i) * w + j];
            }
        }
        pooled[j] = denom > 0.0f ? sum / denom : 0.0f;
    }
}

bool compressor_update(compressor_state& st, const float* kvp, const float* sc, const float* norm,
                       std::uint32_t pos, const rope_params& rp, int n_rot, compressed_row_kind kind,
                       float rms_eps, float* out_row) {
    const std::uint32_t r = std::uint32_t(st.ratio);
    const int w = st.width(), hd = st.head_dim;
    const std::uint32_t row = r == 4 ? 4 + pos % 4 : pos % r;
    std::copy(kvp, kvp + w, st.kv.begin() + std::int64_t(row) * w);
    std::copy(sc, sc + w, st.score.begin() + std::int64_t(row) * w);
    if ((pos + 1) % r != 0) return false;

    std::vector<float> pooled(hd);
    compressor_pool(st, pooled.data());
    rms_norm(pooled.data(), norm, hd, rms_eps, out_row);
    // The row's position is the first token of its window (ratio-4 rows also pool the previous
    // window's first halves, but are placed at 4c all the same).
    rope_tail_inplace(out_row + hd - n_rot, n_rot, rp, pos + 1 - r, false);
    if (kind == compressed_row_kind::attention) {
        kv_row_as_stored(out_row, hd, n_rot);
    } else {
        require(hd == indexer_head_dim, "compressor: indexer rows must be 128 wide, got " + std::to_string(hd));
        indexer_qat(out_row);
        for (int i = 0; i < hd; ++i) out_row[i] = f16_round(out_row[i]);
    }
    if (r == 4) {  // the current window becomes the previous one; rows 4..7 are overwritten later
        std::copy(st.kv.begin() + 4 * w, st.kv.begin() + 8 * w, st.kv.begin());
        std::copy(st.score.begin() + 4 * w, st.score.begin() + 8 * w, st.score.begin());
    }
    return true;
}

bool compressor_step(compressor_state& st, const compressor_weights& w, const float* xn, int n_embd,
                     std::uint32_t pos, const rope_params& rp, int n_rot, compressed_row_kind kind,
                     float rms_eps, float* out_row) {
    std::vector<float> kvp(st.width()), sc(st.width());
    compressor_project(w, xn, n_embd, st.width(), st.ratio, pos, kvp.data(), sc.data());
    return compressor_update(st, kvp.data(), sc.data(), w.norm, pos, rp, n_rot, kind, rms_eps, out_row);
}

}  // namespace ds4::ref
