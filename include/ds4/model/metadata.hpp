#pragma once
// The GGUF metadata keys of docs/model.md §5.2, in one table that the reader (dims_from_gguf), the
// validator and ds4-synth's writer all walk, so the three can never disagree on a key name.
//
// Reduced shapes carry their numbers in the same keys as flash. A synthetic file also names its
// preset in `ds4.synth.preset`; a file without that key (every shipped file) is a flash file
// and is checked against the flash constants, whatever its keys claim.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/gguf/reader.hpp"
#include "ds4/gguf/writer.hpp"
#include "ds4/model/shape.hpp"

namespace ds4::model {

inline constexpr std::string_view preset_key = "ds4.synth.preset";
// A preset name for synthetic files whose shape is their own: the keys are the contract,
// checked against the structural rules (rule_violations) instead of a preset's constants.
inline constexpr std::string_view custom_preset = "custom";

inline constexpr std::string_view compress_ratios_key = "deepseek4.attention.compress_ratios";
inline constexpr std::string_view swiglu_clamp_key = "deepseek4.swiglu_clamp_exp";
inline constexpr std::string_view tokens_key = "tokenizer.ggml.tokens";
inline constexpr std::string_view merges_key = "tokenizer.ggml.merges";

// The member pointers go through an alias: nvcc's host pass rewrites a plain `T model_dims::*f`
// declarator as `T (model_dims::*f)`, which g++ -Wall rejects (-Wparentheses) in a .cu file.
template <class T>
using dims_field = T model_dims::*;

struct int_key {
    std::string_view key;
    dims_field<int> field;  // nullptr: the required value is always 0 (optional keys)
    bool optional;
    int max;                // the largest value a file may declare (dims_limits)
};
struct float_key {
    std::string_view key;
    dims_field<float> field;
};

// Integer keys, validated exactly. value_length reuses head_dim: K and V are one vector.
inline const std::vector<int_key>& int_keys() {
    static const std::vector<int_key> keys{
        {"deepseek4.block_count", &model_dims::n_layer, false, dims_limits::max_layers},
        {"deepseek4.embedding_length", &model_dims::n_embd, false, dims_limits::max_width},
        {"deepseek4.vocab_size", &model_dims::n_vocab, false, dims_limits::max_vocab},
        {"deepseek4.attention.head_count", &model_dims::n_head, false, dims_limits::max_heads},
        {"deepseek4.attention.head_count_kv", &model_dims::n_head_kv, false, dims_limits::max_heads},
        {"deepseek4.attention.key_length", &model_dims::head_dim, false, dims_limits::max_width},
        {"deepseek4.attention.value_length", &model_dims::head_dim, false, dims_limits::max_width},
        {"deepseek4.rope.dimension_count", &model_dims::n_rot, false, dims_limits::max_width},
        {"deepseek4.attention.q_lora_rank", &model_dims::n_lora_q, false, dims_limits::max_width},
        {"deepseek4.attention.output_lora_rank", &model_dims::n_lora_o, false, dims_limits::max_width},
        {"deepseek4.attention.output_group_count", &model_dims::n_out_group, false, dims_limits::max_heads},
        {"deepseek4.expert_count", &model_dims::n_expert, false, dims_limits::max_experts},
        {"deepseek4.expert_used_count", &model_dims::n_expert_used, false, dims_limits::max_experts},
        {"deepseek4.expert_shared_count", &model_dims::n_expert_shared, false, dims_limits::max_experts},
        {"deepseek4.expert_feed_forward_length", &model_dims::n_ff_exp, false, dims_limits::max_width},
        {"deepseek4.hash_layer_count", &model_dims::n_hash_layer, false, dims_limits::max_layers},
        {"deepseek4.expert_group_count", nullptr, true, dims_limits::max_experts},
        {"deepseek4.expert_group_used_count", nullptr, true, dims_limits::max_experts},
        {"deepseek4.attention.sliding_window", &model_dims::n_swa, false, dims_limits::max_context},
        {"deepseek4.attention.indexer.head_count", &model_dims::n_indexer_head, false, dims_limits::max_heads},
        {"deepseek4.attention.indexer.key_length", &model_dims::indexer_head_dim, false, dims_limits::max_width},
        {"deepseek4.attention.indexer.top_k", &model_dims::indexer_top_k, false, dims_limits::max_context},
        {"deepseek4.hyper_connection.count", &model_dims::n_hc, false, dims_limits::max_hc},
        {"deepseek4.hyper_connection.sinkhorn_iterations", &model_dims::n_hc_sinkhorn_iter, false, dims_limits::max_iterations},
        {"deepseek4.rope.scaling.original_context_length", &model_dims::rope_orig_ctx, false, dims_limits::max_context},
    };
    return keys;
}

// Float keys, compared with a relative tolerance of 1e-6 (ds4.c:2543).
inline const std::vector<float_key>& float_keys() {
    static const std::vector<float_key> keys{
        {"deepseek4.hyper_connection.epsilon", &model_dims::hc_eps},
        {"deepseek4.rope.freq_base", &model_dims::rope_freq_base},
        {"deepseek4.rope.scaling.factor", &model_dims::rope_scale_factor},
        {"deepseek4.rope.scaling.yarn_beta_fast", &model_dims::yarn_beta_fast},
        {"deepseek4.rope.scaling.yarn_beta_slow", &model_dims::yarn_beta_slow},
        {"deepseek4.attention.compress_rope_freq_base", &model_dims::compress_rope_freq_base},
        {"deepseek4.expert_weights_scale", &model_dims::expert_weights_scale},
        {"deepseek4.attention.layer_norm_rms_epsilon", &model_dims::rms_eps},
    };
    return keys;
}

inline constexpr std::string_view expert_weights_norm_key = "deepseek4.expert_weights_norm";
inline constexpr std::string_view context_length_key = "deepseek4.context_length";  // printed, not validated

inline bool floats_match(double a, double b) {
    return std::fabs(a - b) <= 1e-6 * std::fmax(std::fabs(a), std::fabs(b));
}

inline bool is_integer_value(gguf::value_type t) {
    using gguf::value_type;
    switch (t) {
        case value_type::u8: case value_type::i8: case value_type::u16: case value_type::i16:
        case value_type::u32: case value_type::i32: case value_type::u64: case value_type::i64:
            return true;
        default:
            return false;
    }
}
inline bool is_float_value(gguf::value_type t) {
    return t == gguf::value_type::f32 || t == gguf::value_type::f64;
}

// An integer key as an int in 0..max (dims_limits), or an error naming the key and the bound.
inline int bounded_int(const gguf::file& f, std::string_view key, const gguf::value& v, int max) {
    const std::int64_t x = v.as_i64();
    require(x >= 0 && x <= max, f.path() + ": key '" + std::string(key) + "' = " + std::to_string(x) +
                                    " is outside the accepted range 0.." + std::to_string(max));
    return static_cast<int>(x);
}

// A float key's value as a float. A double outside float's range (or NaN) has no float value: the
// conversion would be undefined behaviour, so it is an error naming the key.
inline float finite_f32(const gguf::file& f, std::string_view key, double x) {
    require(std::isfinite(x) && std::fabs(x) <= std::numeric_limits<float>::max(),
            f.path() + ": key '" + std::string(key) + "' = " + std::to_string(x) + " is not a finite f32");
    return static_cast<float>(x);
}

// Reads the shape a file declares. Every §5.2 key must be present with a usable type; the error
// names the file and the key. Nothing is compared to a preset here: that is validate's job.
inline model_dims dims_from_gguf(const gguf::file& f) {
    model_dims d;
    auto context = [&](std::string_view key) { return f.path() + ": key '" + std::string(key) + "'"; };
    if (const gguf::value* p = f.find(preset_key)) d.preset = std::string(p->as_string());
    for (const int_key& k : int_keys()) {
        if (k.field == nullptr) continue;
        // Sizes feed int arithmetic and allocations downstream (the tensor inventory has one
        // entry set per layer); a hostile value must stop here, before anything is sized by it.
        d.*k.field = bounded_int(f, k.key, f.at(k.key), k.max);
    }
    for (const float_key& k : float_keys()) d.*k.field = finite_f32(f, k.key, f.at(k.key).as_f64());
    d.expert_weights_norm = f.at(expert_weights_norm_key).as_bool();
    if (const gguf::value* v = f.find(context_length_key))
        d.context_length = bounded_int(f, context_length_key, *v, dims_limits::max_context);

    const gguf::value& ratios = f.at(compress_ratios_key);
    require(ratios.type() == gguf::value_type::array && is_integer_value(ratios.array_type()),
            context(compress_ratios_key) + " must be an integer array");
    require(ratios.size() >= static_cast<std::uint64_t>(d.n_layer),
            context(compress_ratios_key) + " has " + std::to_string(ratios.size()) + " entries, fewer than block_count " +
                std::to_string(d.n_layer));
    for (int il = 0; il < d.n_layer; ++il) {
        // Checked before the narrowing, so 2^32 + 4 cannot pass for 4.
        const std::int64_t r = ratios.int_at(static_cast<std::uint64_t>(il));
        require(r >= 0 && r <= dims_limits::max_compress_ratio,
                f.path() + ": key '" + std::string(compress_ratios_key) + "[" + std::to_string(il) + "]' = " +
                    std::to_string(r) +
                    " is outside 0.." + std::to_string(dims_limits::max_compress_ratio));
        d.compress_ratios.push_back(static_cast<int>(r));
    }

    // One clamp for the whole model: ds4 requires every layer's entry to be the same constant.
    const gguf::value& clamp = f.at(swiglu_clamp_key);
    require(clamp.type() == gguf::value_type::array && is_float_value(clamp.array_type()),
            context(swiglu_clamp_key) + " must be an f32 or f64 array");
    require(clamp.size() >= static_cast<std::uint64_t>(d.n_layer) && d.n_layer > 0,
            context(swiglu_clamp_key) + " has " + std::to_string(clamp.size()) + " entries, fewer than block_count " +
                std::to_string(d.n_layer));
    d.swiglu_clamp_exp = finite_f32(f, std::string(swiglu_clamp_key) + "[0]", clamp.float_at(0));
    for (int il = 1; il < d.n_layer; ++il)
        require(floats_match(clamp.float_at(static_cast<std::uint64_t>(il)), d.swiglu_clamp_exp),
                context(swiglu_clamp_key) + "[" + std::to_string(il) + "] differs from entry 0");
    return d;
}

// The shape a file must be validated against (docs/README.md decision 10): flash for every file without a
// preset key, the preset's constants for tiny/small/flash, and the file's own keys (once they
// pass the structural rules) for "custom". Anything else names the key.
// Keying the reduced presets on a name rather than on the numbers means a flash file with one
// wrong key is still checked against flash (and the wrong key reported), not taken for a new
// shape.
inline model_dims expected_dims(const gguf::file& f) {
    const gguf::value* p = f.find(preset_key);
    if (p == nullptr) return dims_of<flash_shape>();
    const std::string name(p->as_string());
    model_dims d;
    if (dims_of_preset(name, d)) return d;
    require(name == custom_preset, f.path() + ": key '" + std::string(preset_key) + "' names unknown preset '" + name + "'");
    d = dims_from_gguf(f);
    const std::vector<std::string> broken = rule_violations(d);
    if (!broken.empty()) {
        std::string msg = f.path() + ": custom shape breaks the model's structural rules:";
        for (const std::string& b : broken) msg += "\n  " + b;
        fail(msg);
    }
    return d;
}

// Writes every §5.2 key for `d` (u32 integers, f32 floats, as the shipped file does). The arrays
// get one entry per layer plus a trailing one for the MTP block (ratio 0), like the HF config.
// `omit` skips one key: tests use it to build a file that lacks exactly that key.
inline void write_model_keys(gguf::writer& w, const model_dims& d, std::string_view omit = {}) {
    auto want = [&](std::string_view key) { return key != omit; };
    if (!d.preset.empty() && want(preset_key)) w.add_string(std::string(preset_key), d.preset);
    for (const int_key& k : int_keys())
        if (want(k.key)) w.add_u32(std::string(k.key), k.field ? static_cast<std::uint32_t>(d.*k.field) : 0u);
    if (want(context_length_key)) w.add_u32(std::string(context_length_key), static_cast<std::uint32_t>(d.context_length));
    for (const float_key& k : float_keys())
        if (want(k.key)) w.add_f32(std::string(k.key), d.*k.field);
    if (want(expert_weights_norm_key)) w.add_bool(std::string(expert_weights_norm_key), d.expert_weights_norm);
    if (want(compress_ratios_key)) {
        std::vector<std::uint32_t> ratios(d.compress_ratios.begin(), d.compress_ratios.end());
        ratios.push_back(0);
        w.add_array_u32(std::string(compress_ratios_key), std::move(ratios));
    }
    if (want(swiglu_clamp_key))
        w.add_array_f32(std::string(swiglu_clamp_key),
                        std::vector<float>(static_cast<std::size_t>(d.n_layer) + 1, d.swiglu_clamp_exp));
}

}  // namespace ds4::model
