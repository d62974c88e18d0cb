#pragma once
// How ds4-synth fills each tensor: random but sane values (docs/README.md decision 9), generated chunk by
// chunk straight in the storage format. Quantised blocks are not quantised from floats: every
// random bit pattern of qs is a valid Q8_0 / Q2_K / Q4_K / IQ2_XXS block, so a chunk is filled
// with random bytes and only the block scales are patched, with a scale chosen so the decoded
// weights have the target RMS. That is what makes ~81 GiB take about a minute.
//
// Targets: projections (Q8_0, F16, F32 matrices, experts) RMS 0.02; norms 1 +- 0.1; HC scales
// in [0.05, 0.15]; HC bases and attention sinks small and centred; router bias +-0.01; the hash
// table six distinct expert ids per token.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/types.hpp"
#include "ds4/model/tensors.hpp"
#include "harness/synth/rng.hpp"

namespace ds4::synth {

inline constexpr float projection_rms = 0.02f;

enum class fill_kind {
    projection,  // zero-mean, RMS `rms`, in the tensor's storage type
    uniform,     // F32 uniform in [lo, hi): norms, HC scales and bases, sinks, biases
    hash_table,  // I32 rows of n_expert_used distinct ids in [0, n_expert)
};

struct fill_rule {
    fill_kind kind = fill_kind::projection;
    float lo = 0, hi = 0;  // uniform
};

inline bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The rule for a tensor, by its base name. Small HC scales keep the sigmoid/Sinkhorn inputs in
// their sensitive range (the HC mix of a unit-RMS state has RMS ~0.02*sqrt(16384) ~ 2.6).
inline fill_rule rule_for(const model::tensor_spec& t) {
    const std::string_view b = t.base;
    if (b == "ffn_gate_tid2eid.weight") return {fill_kind::hash_table};
    if (ends_with(b, "norm.weight")) return {fill_kind::uniform, 0.9f, 1.1f};
    if (ends_with(b, "_scale.weight")) return {fill_kind::uniform, 0.05f, 0.15f};
    if (ends_with(b, "_base.weight")) return {fill_kind::uniform, -0.1f, 0.1f};
    if (b == "attn_sinks.weight") return {fill_kind::uniform, -0.5f, 0.5f};
    if (b == "exp_probs_b.bias") return {fill_kind::uniform, -0.01f, 0.01f};
    return {fill_kind::projection};
}

// Gains that drive a synthetic model into the saturating paths of the math (off by default;
// end-to-end tests use them so that a wrong limit changes the logits):
//   routed_gain, shared_gain scale the RMS of the FFN gate/up projections of the routed and of
//                the shared experts: with unit-RMS inputs their outputs have RMS 0.02 *
//                sqrt(n_embd) * gain, so a gain of ~50 on tiny puts about half of the SwiGLU
//                inputs beyond the clamp of 10 (two knobs, so a test can saturate one path);
//   kv_norm_gain scales the attention KV norms (attn_kv_a_norm, attn_compressor_norm): a gain of
//                1e-5 puts every 64-value FP8 block under the 1e-4 amax floor.
//   residual_gain scales the RMS of the sublayer output projections (attn_output_b,
//                ffn_down_exps, ffn_down_shexp): each sublayer adds gain times its usual output
//                to the residual stream, so with a small gain the layers are near-identity and
//                a perturbation at layer 0 is not amplified by the layers after it
//                (docs/numerics.md; calibrated_residual_gain below).
struct saturation {
    float routed_gain = 1.0f;
    float shared_gain = 1.0f;
    float kv_norm_gain = 1.0f;
    float residual_gain = 1.0f;
};

// The gain of ds4-synth --gain-calibrated and the amplification it was calibrated to. On the
// tiny model (seed 7, 48-token prefills) a perturbation of relative L2 e of every attention
// output moves each row's logits by at most amplification * e in relative L2: <= 10 at e = 1e-3,
// <= 5 at e = 3e-3, the tensor-core attention's per-call bound (measured 7.0-8.2 and 2.7-3.2;
// the default model: 106-131 and 37-38). docs/numerics.md gives the measurement;
// tests/synth_calibration_test.cpp checks both with the reference backend.
inline constexpr float calibrated_residual_gain = 0.01f;
inline constexpr double calibrated_amplification = 10.0;          // at e = 1e-3
inline constexpr double calibrated_amplification_at_3e_3 = 5.0;  // at e = 3e-3

inline bool is_residual_projection(std::string_view base) {
    return base == "attn_output_b.weight" || base == "ffn_down_exps.weight" || base == "ffn_down_shexp.weight";
}

inline float gate_up_gain(std::string_view base, const saturation& s) {
    if (base == "ffn_gate_exps.weight" || base == "ffn_up_exps.weight") return s.routed_gain;
    if (base == "ffn_gate_shexp.weight" || base == "ffn_up_shexp.weight") return s.shared_gain;
    return 1.0f;
}
inline bool is_kv_norm(std::string_view base) {
    return base == "attn_kv_a_norm.weight" || base == "attn_compressor_norm.weight";
}

// A tensor's generation plan: the unit is the smallest independently generated piece (a block,
// an element, a hash-table row); a chunk is a fixed number of units, so chunk boundaries (and
// hence the bytes) do not depend on the thread count.
struct tensor_plan {
    const model::tensor_spec* spec = nullptr;
    fill_rule rule;
    std::uint64_t key = 0;
    std::uint64_t unit_bytes = 0;
    std::uint64_t n_units = 0;
    std::uint64_t units_per_chunk = 0;
    std::uint16_t f16_scale = 0;             // quantised types: the block scale d as F16
    std::shared_ptr<const std::vector<std::uint16_t>> f16_table;  // F16 projections
    int n_expert = 0, n_expert_used = 0;     // hash table

    std::uint64_t n_chunks() const { return (n_units + units_per_chunk - 1) / units_per_chunk; }
    std::uint64_t chunk_units(std::uint64_t c) const {
        return std::min(units_per_chunk, n_units - c * units_per_chunk);
    }
};

// 16 MiB chunks: at that size the GGUF writer hands a chunk straight to write(2) without a copy.
inline constexpr std::uint64_t chunk_bytes = std::uint64_t{16} << 20;

// Random-bit scale factors. With q uniform on its code range, the decoded RMS of a block with
// scale d is d times these constants (derived in the comments; checked by tests/synth_test.cpp
// against the format headers' dequantize).
//   Q8_0: qs uniform on [-128, 127]: E[q^2] = 5461.5.
//   Q2_K: w = d*sc*q - dmin*m with sc, m uniform 0..15 and q 0..3; dmin = 1.5 d centres it;
//         E[w^2]/d^2 = 77.5*3.5 - 2*1.5*7.5*1.5*7.5 + 2.25*77.5 = 192.5.
//   Q4_K: sc, m uniform 0..63 and q 0..15; dmin = 7.5 d centres it;
//         E[w^2]/d^2 = 1333.5*77.5 - 2*7.5*31.5*7.5*31.5 + 56.25*1333.5 = 66727.5.
inline constexpr double q8_0_unit_rms = 73.90196208;  // sqrt(5461.5)
inline constexpr double q2_k_unit_rms = 13.87443693;  // sqrt(192.5)
inline constexpr double q4_k_unit_rms = 258.3166659;  // sqrt(66727.5)
inline constexpr float q2_k_min_ratio = 1.5f, q4_k_min_ratio = 7.5f;

// Uniform on [-a, a) with a = rms*sqrt(3), as 65536 F16 values indexed by 16 random bits: four
// weights per random word, no float conversion in the hot loop.
inline std::vector<std::uint16_t> make_f16_table(float rms) {
    std::vector<std::uint16_t> t(65536);
    const double a = rms * std::sqrt(3.0);
    for (int i = 0; i < 65536; ++i) t[i] = f32_to_f16(static_cast<float>(a * ((i + 0.5) / 32768.0 - 1.0)));
    return t;
}

class planner {
public:
    explicit planner(std::uint64_t seed, saturation sat = {}) : seed_(seed), sat_(sat) {}

    tensor_plan plan(const model::tensor_spec& t, const model::model_dims& d) {
        tensor_plan p;
        p.spec = &t;
        p.rule = rule_for(t);
        if (is_kv_norm(t.base)) p.rule.lo *= sat_.kv_norm_gain, p.rule.hi *= sat_.kv_norm_gain;
        p.key = tensor_key(seed_, t.name);
        const auto geometry = geometry_of(static_cast<std::uint32_t>(t.type));
        require(geometry.has_value(), "ds4-synth: tensor " + t.name + " has an unknown type");
        p.unit_bytes = geometry->block_bytes;
        p.n_units = t.n_elements() / geometry->block_elems;
        if (p.rule.kind == fill_kind::hash_table) {
            require(t.type == ggml_type::i32 && t.dims.size() == 2, "ds4-synth: " + t.name + " must be I32 [k, n_vocab]");
            p.unit_bytes = 4 * t.dims[0];
            p.n_units = t.dims[1];
            p.n_expert = d.n_expert, p.n_expert_used = static_cast<int>(t.dims[0]);
        } else if (p.rule.kind == fill_kind::uniform) {
            require(t.type == ggml_type::f32, "ds4-synth: " + t.name + " must be F32");
        } else {
            set_projection_scale(p, t);
        }
        p.units_per_chunk = std::max<std::uint64_t>(1, chunk_bytes / p.unit_bytes);
        return p;
    }

private:
    void set_projection_scale(tensor_plan& p, const model::tensor_spec& t) {
        const double rms =
            projection_rms * gate_up_gain(t.base, sat_) * (is_residual_projection(t.base) ? sat_.residual_gain : 1.0f);
        switch (t.type) {
            case ggml_type::q8_0: p.f16_scale = f32_to_f16(static_cast<float>(rms / q8_0_unit_rms)); break;
            case ggml_type::q2_k: p.f16_scale = f32_to_f16(static_cast<float>(rms / q2_k_unit_rms)); break;
            case ggml_type::q4_k: p.f16_scale = f32_to_f16(static_cast<float>(rms / q4_k_unit_rms)); break;
            case ggml_type::iq2_xxs:
                p.f16_scale = f32_to_f16(static_cast<float>(rms / iq2_xxs_random_rms(1.0f)));
                break;
            case ggml_type::f16: p.f16_table = table(static_cast<float>(rms)); break;
            case ggml_type::f32: break;
            default: fail("ds4-synth: no generator for tensor " + t.name + " of type " + std::string(type_name(t.type)));
        }
    }

    // Tables are shared between tensors of the same RMS (all of them, today).
    std::shared_ptr<const std::vector<std::uint16_t>> table(float rms) {
        auto& slot = tables_[rms];
        if (!slot) slot = std::make_shared<const std::vector<std::uint16_t>>(make_f16_table(rms));
        return slot;
    }

    std::uint64_t seed_;
    saturation sat_;
    std::map<float, std::shared_ptr<const std::vector<std::uint16_t>>> tables_;
};

namespace detail {

inline void fill_random(rng& r, std::byte* out, std::size_t n) {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const std::uint64_t v = r.next();
        std::memcpy(out + i, &v, 8);
    }
    if (i < n) {
        const std::uint64_t v = r.next();
        std::memcpy(out + i, &v, n - i);
    }
}

inline void put_u16(std::byte* p, std::uint16_t v) { std::memcpy(p, &v, 2); }

// Blocks of `unit` bytes: random bytes, then each block's F16 scale(s) at the given offsets.
// Done in groups that fit in L1/L2 so the patch pass does not go back to memory.
inline void fill_blocks(rng& r, std::byte* out, std::uint64_t n_blocks, std::uint64_t unit, std::size_t d_at,
                        std::uint16_t d, std::ptrdiff_t dmin_at, std::uint16_t dmin) {
    const std::uint64_t group = std::max<std::uint64_t>(1, (std::uint64_t{32} << 10) / unit);
    for (std::uint64_t b0 = 0; b0 < n_blocks; b0 += group) {
        const std::uint64_t nb = std::min(group, n_blocks - b0);
        std::byte* base = out + b0 * unit;
        fill_random(r, base, static_cast<std::size_t>(nb * unit));
        for (std::uint64_t b = 0; b < nb; ++b) {
            put_u16(base + b * unit + d_at, d);
            if (dmin_at >= 0) put_u16(base + b * unit + dmin_at, dmin);
        }
    }
}

// Q8_0 varies its block scale by +-25% (16 steps picked by the random bits the scale field
// held), the way real blocks' amax varies; the mean square of the multipliers is folded in.
inline void fill_q8_0(rng& r, std::byte* out, std::uint64_t n_blocks, std::uint16_t d_f16) {
    std::uint16_t scales[16];
    double m2 = 0;
    for (int k = 0; k < 16; ++k) m2 += std::pow(0.75 + 0.5 * k / 15.0, 2) / 16.0;
    for (int k = 0; k < 16; ++k)
        scales[k] = f32_to_f16(static_cast<float>(f16_to_f32(d_f16) * (0.75 + 0.5 * k / 15.0) / std::sqrt(m2)));
    const std::uint64_t group = 1024;
    for (std::uint64_t b0 = 0; b0 < n_blocks; b0 += group) {
        const std::uint64_t nb = std::min(group, n_blocks - b0);
        std::byte* base = out + b0 * 34;
        fill_random(r, base, static_cast<std::size_t>(nb * 34));
        for (std::uint64_t b = 0; b < nb; ++b) {
            std::uint16_t bits;
            std::memcpy(&bits, base + b * 34, 2);
            put_u16(base + b * 34, scales[bits & 15]);
        }
    }
}

inline void fill_f16(rng& r, std::byte* out, std::uint64_t n, const std::vector<std::uint16_t>& table) {
    std::uint64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const std::uint64_t v = r.next();
        const std::uint16_t h[4] = {table[v & 0xffff], table[(v >> 16) & 0xffff], table[(v >> 32) & 0xffff],
                                    table[v >> 48]};
        std::memcpy(out + 2 * i, h, 8);
    }
    for (; i < n; ++i) put_u16(out + 2 * i, table[r.next() & 0xffff]);
}

inline void fill_f32_uniform(rng& r, std::byte* out, std::uint64_t n, float lo, float hi) {
    for (std::uint64_t i = 0; i < n; ++i) {
        const float v = r.uniform(lo, hi);
        std::memcpy(out + 4 * i, &v, 4);
    }
}

// One row per token: n_used distinct experts by rejection (n_used <= 6 draws from >= 6).
inline void fill_hash_rows(rng& r, std::byte* out, std::uint64_t rows, int n_used, int n_expert) {
    std::vector<std::int32_t> row(static_cast<std::size_t>(n_used));
    for (std::uint64_t t = 0; t < rows; ++t) {
        for (int s = 0; s < n_used; ++s) {
            std::int32_t e;
            bool fresh;
            do {
                e = static_cast<std::int32_t>(r.below(static_cast<std::uint32_t>(n_expert)));
                fresh = true;
                for (int k = 0; k < s; ++k) fresh = fresh && row[static_cast<std::size_t>(k)] != e;
            } while (!fresh);
            row[static_cast<std::size_t>(s)] = e;
        }
        std::memcpy(out + t * static_cast<std::uint64_t>(n_used) * 4, row.data(), row.size() * 4);
    }
}

}  // namespace detail

// Generates chunk `c` of the tensor into `out` (at least chunk_units(c)*unit_bytes bytes) and
// returns the byte count. Pure function of (plan, c): safe to call from any thread.
inline std::uint64_t generate_chunk(const tensor_plan& p, std::uint64_t c, std::byte* out) {
    rng r = rng::for_chunk(p.key, c);
    const std::uint64_t n = p.chunk_units(c);
    switch (p.rule.kind) {
        case fill_kind::hash_table: detail::fill_hash_rows(r, out, n, p.n_expert_used, p.n_expert); break;
        case fill_kind::uniform: detail::fill_f32_uniform(r, out, n, p.rule.lo, p.rule.hi); break;
        case fill_kind::projection:
            switch (p.spec->type) {
                case ggml_type::q8_0: detail::fill_q8_0(r, out, n, p.f16_scale); break;
                case ggml_type::iq2_xxs: detail::fill_blocks(r, out, n, 66, 0, p.f16_scale, -1, 0); break;
                case ggml_type::q2_k:
                    detail::fill_blocks(r, out, n, 84, 80, p.f16_scale, 82,
                                        f32_to_f16(f16_to_f32(p.f16_scale) * q2_k_min_ratio));
                    break;
                case ggml_type::q4_k:
                    detail::fill_blocks(r, out, n, 144, 0, p.f16_scale, 2,
                                        f32_to_f16(f16_to_f32(p.f16_scale) * q4_k_min_ratio));
                    break;
                case ggml_type::f16: detail::fill_f16(r, out, n, *p.f16_table); break;
                case ggml_type::f32: {
                    const float a = projection_rms * std::sqrt(3.0f);
                    detail::fill_f32_uniform(r, out, n, -a, a);
                    break;
                }
                default: fail("ds4-synth: no generator for " + p.spec->name);
            }
            break;
    }
    return n * p.unit_bytes;
}

}  // namespace ds4::synth
