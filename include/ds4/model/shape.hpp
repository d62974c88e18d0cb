#pragma once
// The model's shape, twice: as compile-time policy types (flash_shape and the reduced shapes the
// tests run) and as the run-time model_dims a loader reads from a GGUF (docs/model.md §1, §5.2).
//
// Reduced shapes keep every structural rule of DeepSeek-V4-Flash so that a bug which only shows
// at a layer kind, a window boundary or the indexer threshold shows at tiny size too:
//   * layers 0,1 are window-only; from layer 2 on, even layers compress by exactly 4 (the
//     overlapping 8-candidate pooling is specific to 4) and use the indexer, odd layers compress
//     by the "long" ratio (128 in flash, smaller in tiny so tests cross it quickly);
//   * layers 0..2 are hash-routed; 4 hyper-connection streams; one MTP block;
//   * head_dim = nope + 64 with nope a multiple of 64 (FP8 blocks of 64, RoPE on the last 64);
//     the indexer head is 128 wide (Hadamard-128) with RoPE on its last 64;
//   * n_embd and n_ff_exp are multiples of 256 (IQ2_XXS / Q2_K / Q4_K / Q8_K blocks), every
//     Q8_0 row length a multiple of 32.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ds4/core/error.hpp"

namespace ds4::model {

// The largest shape a file may declare, in one place (docs/gguf-limits.md repeats them). Each is
// far above flash (the number after "flash") and small enough that every derived size of
// model_dims (q_dim, hc_dim, ...) is at most 2^26, so int arithmetic on widths cannot overflow;
// the derived sizes are still computed in 64 bits and checked, for shapes built by hand.
struct dims_limits {
    static constexpr int max_layers = 256;              // block_count, hash_layer_count: flash 43
    static constexpr int max_width = 1 << 16;           // embedding, ranks, key lengths, rope, FFN: flash <= 4096
    static constexpr int max_heads = 1 << 10;           // head counts, output groups: flash 64
    static constexpr int max_experts = 1 << 12;         // expert counts: flash 256
    static constexpr int max_vocab = 1 << 22;           // vocab_size: flash 129280
    static constexpr int max_context = 1 << 24;         // context, window, top_k, original context: flash 2^20
    static constexpr int max_hc = 64;                   // hyper-connection streams: flash 4
    static constexpr int max_iterations = 1 << 10;      // Sinkhorn iterations: flash 20
    static constexpr int max_compress_ratio = 1 << 16;  // one compress_ratios entry: flash 128
    // Products of two bounded numbers stay below this, which leaves int headroom for offsets.
    static constexpr std::int64_t max_derived = std::int64_t{1} << 26;
};

// The numbers every shape shares. ds4.c hard-codes them; the GGUF must repeat them (§5.2).
struct common_shape {
    static constexpr int n_head_kv = 1;
    static constexpr int n_expert_shared = 1;
    static constexpr int n_window_layers = 2;  // layers 0,1 see only the raw window
    static constexpr int short_ratio = 4;      // even layers >= 2
    static constexpr int n_hc_sinkhorn_iter = 20;
    static constexpr float rms_eps = 1e-6f;
    static constexpr float hc_eps = 1e-6f;
    static constexpr float expert_weights_scale = 1.5f;
    static constexpr bool expert_weights_norm = true;
    static constexpr float swiglu_clamp_exp = 10.0f;
    static constexpr float rope_freq_base = 10000.0f;
    static constexpr float compress_rope_freq_base = 160000.0f;
    static constexpr float rope_scale_factor = 16.0f;
    static constexpr float yarn_beta_fast = 32.0f;
    static constexpr float yarn_beta_slow = 1.0f;
    static constexpr int rope_orig_ctx = 65536;
};

// DeepSeek-V4-Flash as shipped (docs/model.md §1).
struct flash_shape : common_shape {
    static constexpr std::string_view name = "flash";
    static constexpr int n_layer = 43, n_embd = 4096, n_vocab = 129280;
    static constexpr int n_head = 64, head_dim = 512, n_rot = 64;
    static constexpr int n_out_group = 8, n_lora_q = 1024, n_lora_o = 1024;
    static constexpr int n_expert = 256, n_expert_used = 6, n_ff_exp = 2048, n_hash_layer = 3;
    static constexpr int n_swa = 128;
    static constexpr int n_indexer_head = 64, indexer_head_dim = 128, indexer_top_k = 512;
    static constexpr int n_hc = 4;
    static constexpr int long_ratio = 128;
    static constexpr int context_length = 1048576;
};

// About 1 GB. Keeps flash's per-head geometry (head_dim 512, 8 heads per output group, indexer
// head 128, long ratio 128) so the kernels' compile-time head shapes are the real ones, with
// fewer heads, experts and layers. 8 layers hold every kind twice past the hash layers.
struct small_shape : common_shape {
    static constexpr std::string_view name = "small";
    static constexpr int n_layer = 8, n_embd = 2048, n_vocab = 16384;
    static constexpr int n_head = 16, head_dim = 512, n_rot = 64;
    static constexpr int n_out_group = 2, n_lora_q = 512, n_lora_o = 512;
    static constexpr int n_expert = 64, n_expert_used = 6, n_ff_exp = 1024, n_hash_layer = 3;
    static constexpr int n_swa = 64;
    static constexpr int n_indexer_head = 16, indexer_head_dim = 128, indexer_top_k = 64;
    static constexpr int n_hc = 4;
    static constexpr int long_ratio = 128;
    static constexpr int context_length = 65536;
};

// A few MB: 6 layers = window, window, ratio-4 (hash), long, ratio-4, long. The window (16) and
// indexer top_k (8) are small so a test of ~100 tokens crosses both; head_dim 128 = 64 + 64 is
// the smallest head with one FP8 block and the RoPE tail; the long ratio shrinks to 16.
struct tiny_shape : common_shape {
    static constexpr std::string_view name = "tiny";
    static constexpr int n_layer = 6, n_embd = 256, n_vocab = 1536;
    static constexpr int n_head = 8, head_dim = 128, n_rot = 64;
    static constexpr int n_out_group = 2, n_lora_q = 128, n_lora_o = 128;
    static constexpr int n_expert = 16, n_expert_used = 6, n_ff_exp = 256, n_hash_layer = 3;
    static constexpr int n_swa = 16;
    static constexpr int n_indexer_head = 4, indexer_head_dim = 128, indexer_top_k = 8;
    static constexpr int n_hc = 4;
    static constexpr int long_ratio = 16;
    static constexpr int context_length = 4096;
};

// The layer rule of ds4.c:411 with the long ratio as a parameter.
constexpr int ratio_rule(int il, int n_window_layers, int short_ratio, int long_ratio) {
    if (il < n_window_layers) return 0;
    return il % 2 == 0 ? short_ratio : long_ratio;
}

template <class S>
constexpr int ratio_of(int il) {
    return ratio_rule(il, S::n_window_layers, S::short_ratio, S::long_ratio);
}

// Every precondition the kernels and the block formats rely on, checked once per shape.
template <class S>
constexpr bool shape_is_valid() {
    static_assert(S::n_layer >= 6, "every layer kind past the hash layers needs 6 layers");
    static_assert(S::n_hash_layer == 3 && S::n_window_layers == 2);
    static_assert(S::n_embd % 256 == 0 && S::n_ff_exp % 256 == 0, "256-element quant blocks");
    static_assert(S::n_lora_q % 32 == 0 && S::n_lora_o % 32 == 0, "Q8_0 rows");
    static_assert(S::n_rot == 64 && S::head_dim > S::n_rot && (S::head_dim - S::n_rot) % 64 == 0,
                  "nope part in whole FP8 blocks of 64, RoPE on the last 64");
    static_assert(S::indexer_head_dim == 128, "Hadamard-128");
    static_assert(S::n_head % S::n_out_group == 0 && (S::n_head / S::n_out_group * S::head_dim) % 32 == 0);
    static_assert(S::n_expert >= S::n_expert_used && S::n_expert_used == 6);
    static_assert(S::n_hc == 4, "the HC mix (24) and Sinkhorn code are written for 4 streams");
    static_assert(S::short_ratio == 4 && S::long_ratio > S::short_ratio && S::long_ratio % 4 == 0);
    static_assert(S::n_vocab % 32 == 0 && S::n_vocab >= 512, "bytes + merges + specials fit");
    static_assert(S::indexer_top_k > 0 && S::n_swa > 0);
    return true;
}
static_assert(shape_is_valid<flash_shape>() && shape_is_valid<small_shape>() && shape_is_valid<tiny_shape>());

// The run-time shape: what a GGUF declares, or a policy's numbers. Fields are named like the
// policy constants; the derived sizes below are what the tensor inventory uses.
struct model_dims {
    std::string preset;  // "flash", "small", "tiny" or "" when read from a file without a preset key
    int n_layer = 0, n_embd = 0, n_vocab = 0;
    int n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
    int n_out_group = 0, n_lora_q = 0, n_lora_o = 0;
    int n_expert = 0, n_expert_used = 0, n_expert_shared = 0, n_ff_exp = 0, n_hash_layer = 0;
    int n_swa = 0;
    int n_indexer_head = 0, indexer_head_dim = 0, indexer_top_k = 0;
    int n_hc = 0, n_hc_sinkhorn_iter = 0;
    int context_length = 0;
    // One entry per layer (the file may carry more, e.g. a trailing 0 for the MTP block).
    std::vector<int> compress_ratios;
    float swiglu_clamp_exp = 0, rms_eps = 0, hc_eps = 0;
    float expert_weights_scale = 0;
    bool expert_weights_norm = false;
    float rope_freq_base = 0, compress_rope_freq_base = 0, rope_scale_factor = 0;
    float yarn_beta_fast = 0, yarn_beta_slow = 0;
    int rope_orig_ctx = 0;

    int ratio_of(int il) const { return compress_ratios.at(static_cast<std::size_t>(il)); }
    // Derived sizes multiply in 64 bits and are checked: a file's shape is bounded by dims_limits
    // before it gets here, but a model_dims built by hand is not, and an int product that
    // overflows is undefined behaviour, not an error.
    static int checked_size(std::int64_t v, const char* what) {
        if (v < 0 || v > dims_limits::max_derived)
            fail(std::string("model shape: ") + what + " = " + std::to_string(v) + " is outside 0.." +
                 std::to_string(dims_limits::max_derived));
        return static_cast<int>(v);
    }
    bool is_hash_layer(int il) const { return il < n_hash_layer; }
    bool has_indexer(int il) const { return ratio_of(il) == 4; }
    bool is_compressed(int il) const { return ratio_of(il) != 0; }

    int n_nope() const { return head_dim - n_rot; }
    int q_dim() const {  // attn_q_b output
        return checked_size(std::int64_t{n_head} * head_dim, "q_dim (head_count x key_length)");
    }
    int group_in() const {  // attn_output_a input
        if (n_out_group <= 0) fail("model shape: output_group_count " + std::to_string(n_out_group) + " is not positive");
        return q_dim() / n_out_group;
    }
    int lora_o_total() const {  // attn_output_a output
        return checked_size(std::int64_t{n_out_group} * n_lora_o, "lora_o_total (output_group_count x output_lora_rank)");
    }
    int hc_dim() const {  // flattened HC state
        return checked_size(std::int64_t{n_hc} * n_embd, "hc_dim (hyper_connection.count x embedding_length)");
    }
    int hc_mix() const {  // pre + post + comb = 24
        return checked_size(2 * std::int64_t{n_hc} + std::int64_t{n_hc} * n_hc, "hc_mix (2 n_hc + n_hc^2)");
    }
    int indexer_q_dim() const {
        return checked_size(std::int64_t{n_indexer_head} * indexer_head_dim,
                            "indexer_q_dim (indexer.head_count x indexer.key_length)");
    }
    // Compressor width: the ratio-4 compressor projects two overlapping halves (coff = 2).
    int compressor_width(int ratio, int hd) const {
        return checked_size((ratio == 4 ? 2 : 1) * std::int64_t{hd}, "compressor_width");
    }

    friend bool operator==(const model_dims&, const model_dims&) = default;
};

template <class S>
model_dims dims_of() {
    static_assert(shape_is_valid<S>());
    model_dims d;
    d.preset = std::string(S::name);
    d.n_layer = S::n_layer, d.n_embd = S::n_embd, d.n_vocab = S::n_vocab;
    d.n_head = S::n_head, d.n_head_kv = S::n_head_kv, d.head_dim = S::head_dim, d.n_rot = S::n_rot;
    d.n_out_group = S::n_out_group, d.n_lora_q = S::n_lora_q, d.n_lora_o = S::n_lora_o;
    d.n_expert = S::n_expert, d.n_expert_used = S::n_expert_used;
    d.n_expert_shared = S::n_expert_shared, d.n_ff_exp = S::n_ff_exp, d.n_hash_layer = S::n_hash_layer;
    d.n_swa = S::n_swa;
    d.n_indexer_head = S::n_indexer_head, d.indexer_head_dim = S::indexer_head_dim;
    d.indexer_top_k = S::indexer_top_k;
    d.n_hc = S::n_hc, d.n_hc_sinkhorn_iter = S::n_hc_sinkhorn_iter;
    d.context_length = S::context_length;
    for (int il = 0; il < S::n_layer; ++il) d.compress_ratios.push_back(ratio_of<S>(il));
    d.swiglu_clamp_exp = S::swiglu_clamp_exp, d.rms_eps = S::rms_eps, d.hc_eps = S::hc_eps;
    d.expert_weights_scale = S::expert_weights_scale, d.expert_weights_norm = S::expert_weights_norm;
    d.rope_freq_base = S::rope_freq_base, d.compress_rope_freq_base = S::compress_rope_freq_base;
    d.rope_scale_factor = S::rope_scale_factor;
    d.yarn_beta_fast = S::yarn_beta_fast, d.yarn_beta_slow = S::yarn_beta_slow;
    d.rope_orig_ctx = S::rope_orig_ctx;
    return d;
}

// The presets by name; an unknown name returns false and leaves `out` alone.
inline bool dims_of_preset(std::string_view name, model_dims& out) {
    if (name == flash_shape::name) out = dims_of<flash_shape>();
    else if (name == small_shape::name) out = dims_of<small_shape>();
    else if (name == tiny_shape::name) out = dims_of<tiny_shape>();
    else return false;
    return true;
}

// The structural rules of a run-time shape (the same ones shape_is_valid asserts), as messages.
// A file that declares a shape of its own is only trusted once this list is empty.
inline std::vector<std::string> rule_violations(const model_dims& d) {
    std::vector<std::string> out;
    auto check = [&](bool ok, const std::string& what) {
        if (!ok) out.push_back(what);
    };
    check(d.n_layer >= 6, "block_count " + std::to_string(d.n_layer) + " < 6");
    check(d.n_hash_layer == 3, "hash_layer_count must be 3");
    check(d.n_embd > 0 && d.n_embd % 256 == 0, "embedding_length must be a multiple of 256");
    check(d.n_ff_exp > 0 && d.n_ff_exp % 256 == 0, "expert_feed_forward_length must be a multiple of 256");
    check(d.n_lora_q > 0 && d.n_lora_q % 32 == 0, "q_lora_rank must be a multiple of 32");
    check(d.n_lora_o > 0 && d.n_lora_o % 32 == 0, "output_lora_rank must be a multiple of 32");
    check(d.n_rot == 64, "rope.dimension_count must be 64");
    check(d.head_dim > 64 && (d.head_dim - 64) % 64 == 0, "key_length must be 64 + a multiple of 64");
    check(d.indexer_head_dim == 128, "indexer.key_length must be 128");
    check(d.n_head_kv == 1 && d.n_expert_shared == 1, "head_count_kv and expert_shared_count must be 1");
    check(d.n_out_group > 0 && d.n_head % d.n_out_group == 0, "head_count must divide into output groups");
    check(d.n_expert_used == 6 && d.n_expert >= 6, "6 routed experts of at least 6");
    check(d.n_hc == 4, "hyper_connection.count must be 4");
    check(d.n_vocab >= 512 && d.n_vocab % 32 == 0, "vocab_size must be >= 512 and a multiple of 32");
    check(d.n_swa > 0 && d.indexer_top_k > 0 && d.n_indexer_head > 0, "window, top_k and indexer heads > 0");
    // The per-layer checks below index compress_ratios up to layer 3 and n_layer, so a layer count
    // already found wrong stops here (a 1-layer file would otherwise read past a 1-entry array).
    if (d.n_layer < 6 || d.n_layer > dims_limits::max_layers) {
        check(d.n_layer <= dims_limits::max_layers, "block_count " + std::to_string(d.n_layer) + " > " +
                                                        std::to_string(dims_limits::max_layers));
        return out;
    }
    if (d.compress_ratios.size() < static_cast<std::size_t>(d.n_layer)) {
        out.push_back("compress_ratios has fewer entries than block_count");
        return out;
    }
    // The long ratio is whatever layer 3 declares; every other layer must follow the rule with it.
    const int long_ratio = d.compress_ratios[3];
    check(long_ratio > 4 && long_ratio % 4 == 0, "compress_ratios[3] must be a multiple of 4 above 4");
    // One message per wrong layer would be up to max_layers lines; the first few say what is wrong.
    constexpr int max_layer_messages = 8;
    int wrong = 0;
    for (int il = 0; il < d.n_layer; ++il) {
        const int want = ratio_rule(il, 2, 4, long_ratio);
        if (d.ratio_of(il) == want) continue;
        if (++wrong <= max_layer_messages)
            out.push_back("compress_ratios[" + std::to_string(il) + "] = " + std::to_string(d.ratio_of(il)) +
                          ", the layer rule says " + std::to_string(want));
    }
    if (wrong > max_layer_messages)
        out.push_back("... and " + std::to_string(wrong - max_layer_messages) + " more compress_ratios entries");
    return out;
}

}  // namespace ds4::model
