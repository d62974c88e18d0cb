#include "reference/engine.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q8_0.hpp"
#include "ds4/model/kv_layout.hpp"
#include "ds4/model/metadata.hpp"
#include "ds4/model/tensors.hpp"
#include "ds4/model/validate.hpp"
#include "reference/attention_decode.hpp"
#include "reference/compressor.hpp"
#include "reference/hyper_connection.hpp"
#include "reference/indexer.hpp"
#include "reference/matvec.hpp"
#include "reference/moe.hpp"
#include "reference/norm_rope.hpp"

namespace ds4::ref {
namespace {

using model::attention_row_layout;
using model::indexer_row_layout;
using model::kv_page_pool;
using model::kv_page_table;

// Every weight of one block, bound once by name; nullptr for tensors the layer kind lacks.
struct layer_weights {
    const std::uint16_t* hc_attn_fn = nullptr;
    const float* hc_attn_scale = nullptr;
    const float* hc_attn_base = nullptr;
    const float* attn_norm = nullptr;
    const q8_0_block* q_a = nullptr;
    const float* q_a_norm = nullptr;
    const q8_0_block* q_b = nullptr;
    const q8_0_block* kv = nullptr;
    const float* kv_norm = nullptr;
    const float* sinks = nullptr;
    const q8_0_block* out_a = nullptr;
    const q8_0_block* out_b = nullptr;
    compressor_weights attn_comp{};
    compressor_weights idx_comp{};
    const std::uint16_t* idx_q_b = nullptr;
    const std::uint16_t* idx_proj = nullptr;
    const std::uint16_t* hc_ffn_fn = nullptr;
    const float* hc_ffn_scale = nullptr;
    const float* hc_ffn_base = nullptr;
    const float* ffn_norm = nullptr;
    const std::uint16_t* gate_inp = nullptr;
    const float* probs_bias = nullptr;  // optional (treated as 0)
    const iq2_xxs_block* gate_exps = nullptr;
    const iq2_xxs_block* up_exps = nullptr;
    const q2_k_block* down_exps = nullptr;
    const q8_0_block* sh_gate = nullptr;
    const q8_0_block* sh_up = nullptr;
    const q8_0_block* sh_down = nullptr;
    const std::int32_t* tid2eid = nullptr;
    rope_params rope{};
};

// One layer of one sequence: the paged rows and the compressors' frontiers (F32, as §3.1).
struct layer_kv {
    kv_page_table raw, comp, idx;
    compressor_state attn_state, idx_state;
    std::int64_t n_comp = 0;
};

struct sequence {
    std::int32_t length = 0;
    std::vector<layer_kv> layers;
};

// FNV-1a 64: every step is a bijection of the running state, so any single changed byte changes
// the checksum (a corrupted blob cannot pass by luck of a one-byte flip).
std::uint64_t fnv1a(const std::byte* p, std::size_t n) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (std::size_t i = 0; i < n; ++i) {
        h ^= std::uint64_t(p[i]);
        h *= 0x100000001b3ull;
    }
    return h;
}

constexpr char snapshot_magic[8] = {'D', 'S', '4', 'S', 'E', 'Q', 'K', 'V'};
constexpr std::uint32_t snapshot_version = 1;
constexpr std::size_t snapshot_header_bytes = 8 + 4 + 4 + 8 + 8;

class blob_writer {
public:
    template <class T>
    void put(T v) {
        bytes(&v, sizeof v);
    }
    void bytes(const void* p, std::size_t n) {
        const auto* b = static_cast<const std::byte*>(p);
        out.insert(out.end(), b, b + n);
    }
    std::vector<std::byte> out;
};

class blob_reader {
public:
    explicit blob_reader(std::span<const std::byte> b) : b_(b) {}
    template <class T>
    T get(std::string_view what) {
        T v;
        bytes(&v, sizeof v, what);
        return v;
    }
    void bytes(void* p, std::size_t n, std::string_view what) {
        require(n <= b_.size() - at_, "snapshot: truncated while reading " + std::string(what) + " at payload byte " +
                                          std::to_string(at_));
        std::memcpy(p, b_.data() + at_, n);
        at_ += n;
    }
    bool done() const { return at_ == b_.size(); }

private:
    std::span<const std::byte> b_;
    std::size_t at_ = 0;
};

}  // namespace

struct cpu_engine::impl {
    gguf::file file;
    model::model_dims d;
    std::vector<layer_weights> layers;
    const std::uint16_t* token_embd = nullptr;
    const std::uint16_t* output_hc_fn = nullptr;
    const float* output_hc_scale = nullptr;
    const float* output_hc_base = nullptr;
    const float* output_norm = nullptr;
    const q8_0_block* output = nullptr;

    attention_row_layout attn_row;
    indexer_row_layout idx_row;
    // Pools before sequences: page tables release into them when sequences are destroyed.
    kv_page_pool attn_pool;
    kv_page_pool idx_pool;
    std::map<sequence_id, std::unique_ptr<sequence>> seqs;
    sequence_id next_id = 0;

    // Per-token scratch, reused across steps (the reference is single-caller).
    std::vector<float> X, Y, x_in, xn, qr, qn, q, kv, o, low, attn_out, comp_row, idx_row_f;
    std::vector<float> raw_f, comp_f, idx_keys, probs, moe, shared, e;
    std::vector<std::uint8_t> row_bytes;

    explicit impl(gguf::file f)
        : file(std::move(f)),
          d(bind_dims()),
          attn_row{d.head_dim, d.n_rot},
          idx_row{d.indexer_head_dim},
          attn_pool(attn_row.bytes()),
          idx_pool(idx_row.bytes()) {
        bind_weights();
        const auto n = [](int v) { return std::size_t(v); };
        X.resize(n(d.hc_dim())), Y.resize(n(d.hc_dim()));
        x_in.resize(n(d.n_embd)), xn.resize(n(d.n_embd)), attn_out.resize(n(d.n_embd));
        qr.resize(n(d.n_lora_q)), qn.resize(n(d.n_lora_q));
        q.resize(n(d.q_dim())), o.resize(n(d.q_dim())), low.resize(n(d.lora_o_total()));
        kv.resize(n(d.head_dim)), comp_row.resize(n(d.head_dim)), idx_row_f.resize(n(d.indexer_head_dim));
        raw_f.resize(n(d.n_swa) * n(d.head_dim));
        probs.resize(n(d.n_expert)), moe.resize(n(d.n_embd)), shared.resize(n(d.n_embd)), e.resize(n(d.n_embd));
        row_bytes.resize(n(attn_row.bytes()));
    }

    model::model_dims bind_dims() {
        const model::model_dims want = model::expected_dims(file);
        model::require_valid(file, want);
        return want;
    }

    // Binds through the inventory, so every name the engine reads is one the validator checked.
    void bind_weights() {
        std::unordered_map<std::string, const gguf::tensor_info*> by_name;
        for (const model::tensor_spec& t : model::model_inventory(d)) by_name[t.name] = file.find_tensor(t.name);
        auto raw = [&](const std::string& name, ggml_type type, bool optional = false) -> const void* {
            const auto it = by_name.find(name);
            require(it != by_name.end(), "cpu_engine: '" + name + "' is not in the model inventory");
            const gguf::tensor_info* t = it->second;
            if (t == nullptr) {
                require(optional, "cpu_engine: tensor '" + name + "' is missing");
                return nullptr;
            }
            // The validator accepts Q2_K and Q4_K routed experts too; the reference's MoE is the
            // q2 model's (IQ2_XXS gate/up, Q2_K down), so anything else is refused by name.
            require(t->type == type, "cpu_engine: tensor '" + name + "' is " + std::string(type_name(t->type)) +
                                         "; the CPU reference supports only " + std::string(type_name(type)));
            return t->data;
        };
        auto f32 = [&](const std::string& n, bool opt = false) { return static_cast<const float*>(raw(n, ggml_type::f32, opt)); };
        auto f16 = [&](const std::string& n) { return static_cast<const std::uint16_t*>(raw(n, ggml_type::f16)); };
        auto q8 = [&](const std::string& n) { return static_cast<const q8_0_block*>(raw(n, ggml_type::q8_0)); };

        token_embd = f16("token_embd.weight");
        output_hc_fn = f16("output_hc_fn.weight");
        output_hc_scale = f32("output_hc_scale.weight");
        output_hc_base = f32("output_hc_base.weight");
        output_norm = f32("output_norm.weight");
        output = q8("output.weight");
        for (int il = 0; il < d.n_layer; ++il) {
            const std::string p = "blk." + std::to_string(il) + ".";
            layer_weights w;
            w.hc_attn_fn = f16(p + "hc_attn_fn.weight");
            w.hc_attn_scale = f32(p + "hc_attn_scale.weight");
            w.hc_attn_base = f32(p + "hc_attn_base.weight");
            w.attn_norm = f32(p + "attn_norm.weight");
            w.q_a = q8(p + "attn_q_a.weight");
            w.q_a_norm = f32(p + "attn_q_a_norm.weight");
            w.q_b = q8(p + "attn_q_b.weight");
            w.kv = q8(p + "attn_kv.weight");
            w.kv_norm = f32(p + "attn_kv_a_norm.weight");
            w.sinks = f32(p + "attn_sinks.weight");
            w.out_a = q8(p + "attn_output_a.weight");
            w.out_b = q8(p + "attn_output_b.weight");
            const int r = d.ratio_of(il);
            if (r != 0) {
                w.attn_comp = {f16(p + "attn_compressor_kv.weight"), f16(p + "attn_compressor_gate.weight"),
                               f16(p + "attn_compressor_ape.weight"), f32(p + "attn_compressor_norm.weight")};
            }
            if (r == 4) {
                w.idx_comp = {f16(p + "indexer_compressor_kv.weight"), f16(p + "indexer_compressor_gate.weight"),
                              f16(p + "indexer_compressor_ape.weight"), f32(p + "indexer_compressor_norm.weight")};
                w.idx_q_b = f16(p + "indexer.attn_q_b.weight");
                w.idx_proj = f16(p + "indexer.proj.weight");
            }
            w.hc_ffn_fn = f16(p + "hc_ffn_fn.weight");
            w.hc_ffn_scale = f32(p + "hc_ffn_scale.weight");
            w.hc_ffn_base = f32(p + "hc_ffn_base.weight");
            w.ffn_norm = f32(p + "ffn_norm.weight");
            w.gate_inp = f16(p + "ffn_gate_inp.weight");
            // §10: whether the shipped file carries exp_probs_b.bias on hash layers is open; it is
            // never read there, so it is not bound there.
            if (d.is_hash_layer(il))
                w.tid2eid = static_cast<const std::int32_t*>(raw(p + "ffn_gate_tid2eid.weight", ggml_type::i32));
            else
                w.probs_bias = f32(p + "exp_probs_b.bias", true);
            w.gate_exps = static_cast<const iq2_xxs_block*>(raw(p + "ffn_gate_exps.weight", ggml_type::iq2_xxs));
            w.up_exps = static_cast<const iq2_xxs_block*>(raw(p + "ffn_up_exps.weight", ggml_type::iq2_xxs));
            w.down_exps = static_cast<const q2_k_block*>(raw(p + "ffn_down_exps.weight", ggml_type::q2_k));
            w.sh_gate = q8(p + "ffn_gate_shexp.weight");
            w.sh_up = q8(p + "ffn_up_shexp.weight");
            w.sh_down = q8(p + "ffn_down_shexp.weight");
            // §2.4 step 4: compressed layers use base 160000 with YaRN, window-only layers 10000.
            w.rope = r != 0 ? make_rope_params(d.compress_rope_freq_base, 1.0f / d.rope_scale_factor, true, d.n_rot,
                                               d.rope_orig_ctx, d.yarn_beta_fast, d.yarn_beta_slow)
                            : make_rope_params(d.rope_freq_base, 1.0f, false, d.n_rot, d.rope_orig_ctx,
                                               d.yarn_beta_fast, d.yarn_beta_slow);
            layers.push_back(w);
        }
    }

    std::unique_ptr<sequence> new_sequence() {
        auto s = std::make_unique<sequence>();
        for (int il = 0; il < d.n_layer; ++il) {
            layer_kv k;
            k.raw = kv_page_table(attn_pool);
            const int r = d.ratio_of(il);
            if (r != 0) {
                k.comp = kv_page_table(attn_pool);
                k.attn_state = make_compressor_state(r, d.head_dim);
            }
            if (r == 4) {
                k.idx = kv_page_table(idx_pool);
                k.idx_state = make_compressor_state(4, d.indexer_head_dim);
            }
            s->layers.push_back(std::move(k));
        }
        return s;
    }

    sequence& get(sequence_id id, std::string_view who) {
        const auto it = seqs.find(id);
        require(it != seqs.end(), std::string(who) + ": no sequence " + std::to_string(id));
        return *it->second;
    }

    // The attention sublayer of §2.4 (steps 1-12) for one token of one sequence; X is updated.
    void attention(const layer_weights& w, layer_kv& k, int il, std::int32_t pos) {
        const int E = d.n_embd, hd = d.head_dim, r = d.ratio_of(il);
        const float eps = d.rms_eps;
        const hc_split split = hc_pre(X.data(), w.hc_attn_fn, w.hc_attn_scale, w.hc_attn_base, E, d.n_hc,
                                      d.n_hc_sinkhorn_iter, eps, d.hc_eps, x_in.data());
        rms_norm(x_in.data(), w.attn_norm, E, eps, xn.data());
        matvec_q8_0(w.q_a, xn.data(), E, d.n_lora_q, qr.data());
        rms_norm(qr.data(), w.q_a_norm, d.n_lora_q, eps, qn.data());
        matvec_q8_0(w.q_b, qn.data(), d.n_lora_q, d.q_dim(), q.data());
        head_rms_norm(q.data(), d.n_head, hd, eps);
        matvec_q8_0(w.kv, xn.data(), E, hd, kv.data());
        rms_norm(kv.data(), w.kv_norm, hd, eps, kv.data());
        const auto upos = std::uint32_t(pos);
        rope_tail(q.data(), d.n_head, hd, d.n_rot, w.rope, upos, false);
        rope_tail(kv.data(), 1, hd, d.n_rot, w.rope, upos, false);
        // Steps 5-6: the E4M3 + F16 encode is the reference's kv_row_as_stored (kv_layout's contract).
        model::encode_attention_row(attn_row, kv.data(), k.raw.row_for_write(pos));

        // Step 7: compressors run before attention, so the token can see a row that includes it.
        // They hand out rows already in stored form; re-encoding those is exact (kv_layout_test).
        const bool attn_emit = r != 0 && compressor_step(k.attn_state, w.attn_comp, xn.data(), E, upos, w.rope, d.n_rot,
                                                         compressed_row_kind::attention, eps, comp_row.data());
        const bool idx_emit = r == 4 && compressor_step(k.idx_state, w.idx_comp, xn.data(), E, upos, w.rope, d.n_rot,
                                                        compressed_row_kind::indexer, eps, idx_row_f.data());
        // Both ratio-4 compressors emit on the same tokens, so row c of either cache is window c.
        require(r != 4 || attn_emit == idx_emit, "cpu_engine: indexer compressor out of step");
        if (attn_emit) model::encode_attention_row(attn_row, comp_row.data(), k.comp.row_for_write(k.n_comp));
        if (idx_emit) model::encode_indexer_row(idx_row, idx_row_f.data(), k.idx.row_for_write(k.n_comp));
        if (attn_emit) ++k.n_comp;

        // Step 8: the indexer masks compressed rows only once there are more than top_k.
        const int n_comp = int(k.n_comp);
        std::vector<std::uint8_t> mask;
        if (r == 4 && n_comp > d.indexer_top_k) {
            idx_keys.resize(std::size_t(n_comp) * std::size_t(d.indexer_head_dim));
            for (int c = 0; c < n_comp; ++c)
                model::decode_indexer_row(idx_row, k.idx.row(c), idx_keys.data() + std::size_t(c) * std::size_t(d.indexer_head_dim));
            mask = indexer_mask(w.idx_q_b, w.idx_proj, qn.data(), xn.data(), idx_keys.data(), n_comp, d.n_lora_q, E,
                                d.n_indexer_head, d.indexer_top_k, upos, w.rope);
        }

        // Step 9: raw window oldest -> newest, then the visible compressed rows ascending. Only
        // visible rows are decoded; passing them compacted with no mask is the same row sequence
        // sink_attention builds from a mask, so the same bits.
        const int n_raw = std::min(pos + 1, d.n_swa);
        for (int i = 0; i < n_raw; ++i)
            model::decode_attention_row(attn_row, k.raw.row(pos + 1 - n_raw + i), raw_f.data() + std::size_t(i) * std::size_t(hd));
        int n_vis = 0;
        comp_f.resize(std::size_t(n_comp) * std::size_t(hd));
        for (int c = 0; c < n_comp; ++c)
            if (mask.empty() || mask[std::size_t(c)])
                model::decode_attention_row(attn_row, k.comp.row(c), comp_f.data() + std::size_t(n_vis++) * std::size_t(hd));
        attention_decode(q.data(), raw_f.data(), n_raw, comp_f.data(), n_vis, nullptr, w.sinks, d.n_head, hd, d.n_rot,
                         w.rope, upos, o.data());

        // Step 11: group g's heads are one contiguous input; its n_lora_o rows of out_a follow.
        const int gin = d.group_in(), blocks_per_row = gin / q8_0_block_size;
        for (int g = 0; g < d.n_out_group; ++g)
            matvec_q8_0(w.out_a + std::size_t(g) * std::size_t(d.n_lora_o) * std::size_t(blocks_per_row),
                        o.data() + std::size_t(g) * std::size_t(gin), gin, d.n_lora_o,
                        low.data() + std::size_t(g) * std::size_t(d.n_lora_o));
        matvec_q8_0(w.out_b, low.data(), d.lora_o_total(), E, attn_out.data());
        hc_post(attn_out.data(), X.data(), split, E, d.n_hc, Y.data());
        X.swap(Y);
    }

    // The MoE sublayer of §2.7.
    void ffn(const layer_weights& w, int il, std::int32_t token) {
        const int E = d.n_embd;
        const hc_split split = hc_pre(X.data(), w.hc_ffn_fn, w.hc_ffn_scale, w.hc_ffn_base, E, d.n_hc,
                                      d.n_hc_sinkhorn_iter, d.rms_eps, d.hc_eps, x_in.data());
        rms_norm(x_in.data(), w.ffn_norm, E, d.rms_eps, xn.data());
        router_probs(w.gate_inp, xn.data(), E, d.n_expert, probs.data());
        const moe_route route =
            d.is_hash_layer(il)
                ? route_hash(probs.data(), w.tid2eid + std::size_t(token) * std::size_t(d.n_expert_used), d.n_expert_used,
                             d.expert_weights_scale)
                : route_top_k(probs.data(), w.probs_bias, d.n_expert, d.n_expert_used, d.expert_weights_scale);
        moe_routed(w.gate_exps, w.up_exps, w.down_exps, route, xn.data(), E, d.n_ff_exp, d.swiglu_clamp_exp, moe.data());
        shared_expert(w.sh_gate, w.sh_up, w.sh_down, xn.data(), E, d.n_ff_exp, d.swiglu_clamp_exp, shared.data());
        for (int i = 0; i < E; ++i) moe[std::size_t(i)] += shared[std::size_t(i)];  // F = moe + shared
        hc_post(moe.data(), X.data(), split, E, d.n_hc, Y.data());
        X.swap(Y);
    }

    // One token through the whole model (§9). logits / hc may be nullptr.
    void step(sequence& s, std::int32_t pos, std::int32_t token, float* logits, float* hc) {
        const int E = d.n_embd;
        const std::uint16_t* emb = token_embd + std::size_t(token) * std::size_t(E);
        for (int h = 0; h < d.n_hc; ++h)
            for (int i = 0; i < E; ++i) X[std::size_t(h) * std::size_t(E) + std::size_t(i)] = f16_to_f32(emb[i]);
        for (int il = 0; il < d.n_layer; ++il) {
            layer_kv& k = s.layers[std::size_t(il)];
            attention(layers[std::size_t(il)], k, il, pos);
            ffn(layers[std::size_t(il)], il, token);
            // Rows that left the window give their pages back; a snapshot keeps the last n_swa.
            k.raw.drop_before(std::int64_t(pos) + 1 - d.n_swa);
        }
        // ds4.c resets unused compressor state rows after a CPU prefill (§2.5); that changes no
        // output, and prefill here is the decode path, so the frontiers stay as the steps left them.
        s.length = pos + 1;
        if (hc) std::copy(X.begin(), X.end(), hc);
        if (logits) {
            output_hc_mix(X.data(), output_hc_fn, output_hc_scale, output_hc_base, E, d.n_hc, d.rms_eps, d.hc_eps,
                          e.data());
            rms_norm(e.data(), output_norm, E, d.rms_eps, e.data());
            matvec_q8_0(output, e.data(), E, d.n_vocab, logits);
        }
    }

    // The shape a snapshot must match: a blob of another model cannot be restored silently.
    void put_shape(blob_writer& w) const {
        for (int v : {d.n_layer, d.head_dim, d.n_rot, d.n_swa, d.indexer_head_dim, attn_row.bytes(), idx_row.bytes(),
                      d.n_embd, d.n_vocab})
            w.put(std::int32_t(v));
        for (int il = 0; il < d.n_layer; ++il) w.put(std::int32_t(d.ratio_of(il)));
    }

    std::vector<std::byte> snapshot(const sequence& s) const {
        blob_writer w;
        put_shape(w);
        w.put(s.length);
        const std::size_t ab = std::size_t(attn_row.bytes()), ib = std::size_t(idx_row.bytes());
        for (int il = 0; il < d.n_layer; ++il) {
            const layer_kv& k = s.layers[std::size_t(il)];
            const std::int32_t n_raw = std::min(s.length, d.n_swa);
            for (std::int32_t i = s.length - n_raw; i < s.length; ++i) w.bytes(k.raw.row(i), ab);
            const int r = d.ratio_of(il);
            if (r == 0) continue;
            w.put(k.n_comp);
            for (std::int64_t c = 0; c < k.n_comp; ++c) w.bytes(k.comp.row(c), ab);
            w.bytes(k.attn_state.kv.data(), k.attn_state.kv.size() * sizeof(float));
            w.bytes(k.attn_state.score.data(), k.attn_state.score.size() * sizeof(float));
            if (r != 4) continue;
            for (std::int64_t c = 0; c < k.n_comp; ++c) w.bytes(k.idx.row(c), ib);
            w.bytes(k.idx_state.kv.data(), k.idx_state.kv.size() * sizeof(float));
            w.bytes(k.idx_state.score.data(), k.idx_state.score.size() * sizeof(float));
        }
        blob_writer out;
        out.bytes(snapshot_magic, sizeof snapshot_magic);
        out.put(snapshot_version);
        out.put(std::uint32_t(0));  // reserved
        out.put(std::uint64_t(w.out.size()));
        out.put(fnv1a(w.out.data(), w.out.size()));
        out.bytes(w.out.data(), w.out.size());
        return std::move(out.out);
    }

    std::unique_ptr<sequence> parse_snapshot(std::span<const std::byte> blob) {
        require(blob.size() >= snapshot_header_bytes,
                "snapshot: " + std::to_string(blob.size()) + " bytes, shorter than the header");
        blob_reader h(blob.first(snapshot_header_bytes));
        char magic[8];
        h.bytes(magic, 8, "magic");
        require(std::memcmp(magic, snapshot_magic, 8) == 0, "snapshot: bad magic (not a ds4 sequence snapshot)");
        const auto version = h.get<std::uint32_t>("version");
        require(version == snapshot_version, "snapshot: format version " + std::to_string(version) +
                                                 ", this build reads version " + std::to_string(snapshot_version));
        h.get<std::uint32_t>("reserved");
        const auto payload_bytes = h.get<std::uint64_t>("payload size");
        const auto checksum = h.get<std::uint64_t>("checksum");
        const std::span<const std::byte> payload = blob.subspan(snapshot_header_bytes);
        require(payload.size() == payload_bytes, "snapshot: payload is " + std::to_string(payload.size()) +
                                                     " bytes, the header says " + std::to_string(payload_bytes));
        require(fnv1a(payload.data(), payload.size()) == checksum, "snapshot: checksum mismatch (corrupted blob)");

        blob_reader rd(payload);
        blob_writer want;
        put_shape(want);
        std::vector<std::byte> shape(want.out.size());
        rd.bytes(shape.data(), shape.size(), "shape");
        require(shape == want.out, "snapshot: taken from a model of another shape");
        auto s = new_sequence();
        s->length = rd.get<std::int32_t>("length");
        require(s->length >= 0, "snapshot: negative length");
        const std::size_t ab = std::size_t(attn_row.bytes()), ib = std::size_t(idx_row.bytes());
        for (int il = 0; il < d.n_layer; ++il) {
            layer_kv& k = s->layers[std::size_t(il)];
            const std::int32_t n_raw = std::min(s->length, d.n_swa);
            for (std::int32_t i = s->length - n_raw; i < s->length; ++i) rd.bytes(k.raw.row_for_write(i), ab, "raw row");
            const int r = d.ratio_of(il);
            if (r == 0) continue;
            k.n_comp = rd.get<std::int64_t>("compressed row count");
            require(k.n_comp == (std::int64_t(s->length)) / r,
                    "snapshot: layer " + std::to_string(il) + " has " + std::to_string(k.n_comp) +
                        " compressed rows for length " + std::to_string(s->length));
            for (std::int64_t c = 0; c < k.n_comp; ++c) rd.bytes(k.comp.row_for_write(c), ab, "compressed row");
            rd.bytes(k.attn_state.kv.data(), k.attn_state.kv.size() * sizeof(float), "compressor state");
            rd.bytes(k.attn_state.score.data(), k.attn_state.score.size() * sizeof(float), "compressor state");
            if (r != 4) continue;
            for (std::int64_t c = 0; c < k.n_comp; ++c) rd.bytes(k.idx.row_for_write(c), ib, "indexer row");
            rd.bytes(k.idx_state.kv.data(), k.idx_state.kv.size() * sizeof(float), "indexer compressor state");
            rd.bytes(k.idx_state.score.data(), k.idx_state.score.size() * sizeof(float), "indexer compressor state");
        }
        require(rd.done(), "snapshot: trailing bytes after the last layer");
        return s;
    }
};

std::unique_ptr<cpu_engine> cpu_engine::load(const std::filesystem::path& path) {
    return std::make_unique<cpu_engine>(gguf::file::open(path));
}

cpu_engine::cpu_engine(gguf::file file) : impl_(std::make_unique<impl>(std::move(file))) {}
cpu_engine::~cpu_engine() = default;

const gguf::file& cpu_engine::file() const { return impl_->file; }
const model::model_dims& cpu_engine::dims() const { return impl_->d; }

sequence_id cpu_engine::create_sequence() {
    const sequence_id id = impl_->next_id++;
    impl_->seqs.emplace(id, impl_->new_sequence());
    return id;
}

sequence_id cpu_engine::fork_sequence(sequence_id source) {
    const sequence& src = impl_->get(source, "fork_sequence");
    auto s = std::make_unique<sequence>();
    s->length = src.length;
    for (const layer_kv& k : src.layers) {
        layer_kv c;
        c.raw = k.raw.share();
        c.comp = k.comp.share();
        c.idx = k.idx.share();
        c.attn_state = k.attn_state;
        c.idx_state = k.idx_state;
        c.n_comp = k.n_comp;
        s->layers.push_back(std::move(c));
    }
    const sequence_id id = impl_->next_id++;
    impl_->seqs.emplace(id, std::move(s));
    return id;
}

void cpu_engine::free_sequence(sequence_id seq) {
    require(impl_->seqs.erase(seq) == 1, "free_sequence: no sequence " + std::to_string(seq));
}

std::int32_t cpu_engine::sequence_length(sequence_id seq) const {
    const auto it = impl_->seqs.find(seq);
    require(it != impl_->seqs.end(), "sequence_length: no sequence " + std::to_string(seq));
    return it->second->length;
}

forward_result cpu_engine::forward(std::span<const forward_row> rows, const forward_options& options) {
    impl& m = *impl_;
    // Group the rows by sequence (first-appearance order) and check everything before any state
    // changes, so a bad call leaves every sequence as it was.
    std::vector<sequence_id> order;
    std::map<sequence_id, std::vector<std::size_t>> by_seq;
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const forward_row& r = rows[i];
        m.get(r.seq, "forward: row " + std::to_string(i));
        require(r.token >= 0 && r.token < m.d.n_vocab, "forward: row " + std::to_string(i) + " of sequence " +
                                                           std::to_string(r.seq) + ": token " + std::to_string(r.token) +
                                                           " is outside the vocabulary of " + std::to_string(m.d.n_vocab));
        auto& v = by_seq[r.seq];
        if (v.empty()) order.push_back(r.seq);
        v.push_back(i);
    }
    for (auto& [seq, idx] : by_seq) {
        std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return rows[a].pos < rows[b].pos; });
        const std::int32_t len = m.seqs.at(seq)->length;
        for (std::size_t k = 0; k < idx.size(); ++k) {
            if (rows[idx[k]].pos == len + std::int32_t(k)) continue;
            std::string got;
            for (std::size_t j = 0; j < idx.size() && j < 16; ++j) got += (j ? ", " : "") + std::to_string(rows[idx[j]].pos);
            if (idx.size() > 16) got += ", ...";
            fail("forward: sequence " + std::to_string(seq) + " has length " + std::to_string(len) +
                 "; its rows in this call have positions " + got + ", which must be " + std::to_string(len) + ", " +
                 std::to_string(len + 1) + ", ... without gaps or repeats");
        }
        require(std::int64_t(len) + std::int64_t(idx.size()) <= std::int64_t(m.d.context_length) || m.d.context_length == 0,
                "forward: sequence " + std::to_string(seq) + " would exceed the context length " +
                    std::to_string(m.d.context_length));
    }

    forward_result res;
    res.n_vocab = m.d.n_vocab;
    res.hc_dim = m.d.hc_dim();
    std::vector<std::size_t> slot(rows.size(), SIZE_MAX);
    for (std::size_t i = 0; i < rows.size(); ++i)
        if (rows[i].wants_logits) {
            slot[i] = res.rows.size();
            res.rows.push_back(i);
        }
    res.logits.resize(res.rows.size() * std::size_t(res.n_vocab));
    if (options.want_hc_state) res.hc_state.resize(res.rows.size() * std::size_t(res.hc_dim));

    for (sequence_id seq : order) {
        sequence& s = *m.seqs.at(seq);
        for (std::size_t i : by_seq[seq]) {
            const std::size_t k = slot[i];
            float* logits = k == SIZE_MAX ? nullptr : res.logits.data() + k * std::size_t(res.n_vocab);
            float* hc = k == SIZE_MAX || !options.want_hc_state ? nullptr : res.hc_state.data() + k * std::size_t(res.hc_dim);
            m.step(s, rows[i].pos, rows[i].token, logits, hc);
        }
    }
    return res;
}

std::vector<std::byte> cpu_engine::snapshot(sequence_id seq) const {
    const auto it = impl_->seqs.find(seq);
    require(it != impl_->seqs.end(), "snapshot: no sequence " + std::to_string(seq));
    return impl_->snapshot(*it->second);
}

void cpu_engine::restore(sequence_id seq, std::span<const std::byte> blob) {
    impl_->get(seq, "restore");
    // Parsed into a fresh sequence first: a bad blob throws before the live state is touched.
    std::unique_ptr<sequence> s = impl_->parse_snapshot(blob);
    impl_->seqs[seq] = std::move(s);
}

std::size_t cpu_engine::attention_pages_in_use() const { return impl_->attn_pool.pages_in_use(); }
std::size_t cpu_engine::indexer_pages_in_use() const { return impl_->idx_pool.pages_in_use(); }

}  // namespace ds4::ref
