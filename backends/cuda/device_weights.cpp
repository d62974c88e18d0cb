#include "backends/cuda/device_weights.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/error.hpp"
#include "ds4/format/tiled.hpp"
#include "reference/cpu_ops.hpp"

namespace ds4::cuda_backend {
namespace {

constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
constexpr std::uint64_t arena_align = 256;

enum class repack { none, q8_0, iq2_xxs_experts, q2_k_experts };

// One tensor of the file and where its repacked bytes go in the arena: [offset, offset + bytes),
// the second part (tiled scales) at offset + scale_offset.
struct job {
    const gguf::tensor_info* t = nullptr;
    repack kind = repack::none;
    int rows = 0, in = 0, experts = 1;
    std::uint64_t offset = 0, bytes = 0, scale_offset = 0;
};

std::uint64_t repacked_bytes(job& j) {
    switch (j.kind) {
        case repack::none: return j.t->n_bytes;
        case repack::q8_0: {
            const auto L = q8_0_tiled_layout::make(j.rows, j.in);
            j.scale_offset = align_up(L.quant_bytes(), 16);
            return j.scale_offset + L.scale_count() * 2;
        }
        case repack::iq2_xxs_experts: {
            const auto L = iq2_xxs_tiled_layout::make(j.rows, j.in);
            j.scale_offset = align_up(L.quant_bytes() * std::uint64_t(j.experts), 16);
            return j.scale_offset + L.scale_count() * 2 * std::uint64_t(j.experts);
        }
        case repack::q2_k_experts: {
            const auto L = q2_k_tiled_layout::make(j.rows, j.in);
            j.scale_offset = align_up(L.quant_bytes() * std::uint64_t(j.experts), 16);
            return j.scale_offset + L.dd_count() * 4 * std::uint64_t(j.experts);
        }
    }
    return 0;
}

// Repacks job j's tensor into `out` (repacked_bytes(j) bytes).
void repack_into(const job& j, std::uint8_t* out) {
    const auto* src = reinterpret_cast<const std::uint8_t*>(j.t->data);
    switch (j.kind) {
        case repack::none: std::memcpy(out, src, j.t->n_bytes); return;
        case repack::q8_0: {
            const auto L = q8_0_tiled_layout::make(j.rows, j.in);
            repack_q8_0(L, reinterpret_cast<const q8_0_block*>(src), out,
                        reinterpret_cast<std::uint16_t*>(out + j.scale_offset));
            return;
        }
        case repack::iq2_xxs_experts: {
            const auto L = iq2_xxs_tiled_layout::make(j.rows, j.in);
            const std::size_t blocks = std::size_t(j.rows) * L.nb;
            for (int e = 0; e < j.experts; ++e)
                repack_iq2_xxs(L, reinterpret_cast<const iq2_xxs_block*>(src) + std::size_t(e) * blocks,
                               out + std::size_t(e) * L.quant_bytes(),
                               reinterpret_cast<std::uint16_t*>(out + j.scale_offset) + std::size_t(e) * L.scale_count());
            return;
        }
        case repack::q2_k_experts: {
            const auto L = q2_k_tiled_layout::make(j.rows, j.in);
            const std::size_t blocks = std::size_t(j.rows) * L.nb;
            for (int e = 0; e < j.experts; ++e)
                repack_q2_k(L, reinterpret_cast<const q2_k_block*>(src) + std::size_t(e) * blocks,
                            out + std::size_t(e) * L.quant_bytes(),
                            reinterpret_cast<std::uint32_t*>(out + j.scale_offset) + std::size_t(e) * L.dd_count());
            return;
        }
    }
}

class progress_line {
public:
    explicit progress_line(std::uint64_t total) : total_(total), on_(isatty(2) == 1), t0_(clock::now()) {}
    void update(std::uint64_t done, bool last = false) {
        if (!on_) return;
        const double s = std::chrono::duration<double>(clock::now() - t0_).count();
        const double gb = double(done) / 1e9;
        const int width = 30, fill = total_ ? int(double(width) * double(done) / double(total_)) : width;
        std::string bar(std::size_t(fill), '#');
        bar.resize(std::size_t(width), '.');
        std::fprintf(stderr, "\rloading weights [%s] %.2f / %.2f GB  %.2f GB/s%s", bar.c_str(), gb, double(total_) / 1e9,
                     s > 0 ? gb / s : 0.0, last ? "\n" : "");
        std::fflush(stderr);
    }

private:
    using clock = std::chrono::steady_clock;
    std::uint64_t total_;
    bool on_;
    clock::time_point t0_;
};

}  // namespace

device_weights::device_weights(gguf::file& file, const model::model_dims& d, std::uint64_t reserve_bytes) {
    // The reference binding checks every name against the inventory and gives each layer's RoPE.
    const ref::model_weights host = ref::bind_model_weights(file, d);
    std::vector<job> jobs;
    // Each bind records a job and a setter that turns the arena base into the bound pointer.
    std::vector<std::function<void(std::uint8_t*)>> binds;
    std::uint64_t total = 0, largest = 0;
    auto add = [&](const std::string& name, repack kind, int rows, int in, int experts, bool optional = false) -> int {
        const gguf::tensor_info* t = file.find_tensor(name);
        if (t == nullptr) {
            require(optional, "cuda backend: tensor '" + name + "' is missing");
            return -1;
        }
        job j{t, kind, rows, in, experts};
        j.bytes = repacked_bytes(j);
        j.offset = total;
        total = align_up(total + j.bytes, arena_align);
        largest = std::max(largest, j.bytes);
        jobs.push_back(j);
        return int(jobs.size()) - 1;
    };
    auto type_of = [&](const std::string& name) {
        const gguf::tensor_info* t = file.find_tensor(name);
        require(t != nullptr, "cuda backend: tensor '" + name + "' is missing");
        return t->type;
    };
    auto need = [&](const std::string& name, ggml_type want) {
        const ggml_type got = type_of(name);
        require(got == want, "cuda backend: tensor '" + name + "' is " + std::string(type_name(got)) +
                                 "; the CUDA kernels read " + std::string(type_name(want)));
    };
    // Binders: raw tensors and Q8_0 matrices.
    auto raw = [&](const std::string& name, auto& ptr, bool optional = false) {
        const int k = add(name, repack::none, 0, 0, 1, optional);
        if (k < 0) return;
        binds.push_back([&ptr, k, &jobs](std::uint8_t* base) {
            ptr = reinterpret_cast<std::remove_reference_t<decltype(ptr)>>(base + jobs[std::size_t(k)].offset);
        });
    };
    auto f16 = [&](const std::string& name, const std::uint16_t*& ptr) {
        need(name, ggml_type::f16);
        raw(name, ptr);
    };
    auto q8_into = [&](const std::string& name, const std::uint8_t*& quants, const std::uint16_t*& scales, int rows,
                       int in) {
        need(name, ggml_type::q8_0);
        const int k = add(name, repack::q8_0, rows, in, 1);
        binds.push_back([&quants, &scales, k, &jobs](std::uint8_t* base) {
            const job& j = jobs[std::size_t(k)];
            quants = base + j.offset;
            scales = reinterpret_cast<const std::uint16_t*>(base + j.offset + j.scale_offset);
        });
    };
    auto q8 = [&](const std::string& name, q8_matrix& m, int rows, int in) {
        m.rows = rows;
        m.in = in;
        q8_into(name, m.quants, m.scales, rows, in);
    };
    auto hc = [&](const std::string& p, hc_mix& h) {
        f16(p + "_fn.weight", h.fn);
        raw(p + "_scale.weight", h.scale);
        raw(p + "_base.weight", h.base);
    };

    f16("token_embd.weight", w_.token_embd);
    hc("output_hc", w_.head.hc);
    raw("output_norm.weight", w_.head.norm);
    q8("output.weight", w_.head.output, d.n_vocab, d.n_embd);
    w_.layers.resize(std::size_t(d.n_layer));
    for (int il = 0; il < d.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        layer_weights& w = w_.layers[std::size_t(il)];
        w.rope = host.layers[std::size_t(il)].rope;
        hc(p + "hc_attn", w.hc_attn);
        hc(p + "hc_ffn", w.hc_ffn);
        raw(p + "attn_norm.weight", w.attn_norm);
        q8(p + "attn_q_a.weight", w.q_a, d.n_lora_q, d.n_embd);
        raw(p + "attn_q_a_norm.weight", w.q_a_norm);
        q8(p + "attn_q_b.weight", w.q_b, d.q_dim(), d.n_lora_q);
        q8(p + "attn_kv.weight", w.kv, d.head_dim, d.n_embd);
        raw(p + "attn_kv_a_norm.weight", w.kv_norm);
        raw(p + "attn_sinks.weight", w.sinks);
        // The groups of out_a are consecutive n_lora_o-row blocks of one matrix; n_lora_o % 32 == 0
        // keeps each group on whole tiles, so group g starts at tile g * n_lora_o / 32.
        q8(p + "attn_output_a.weight", w.out_a, d.n_out_group * d.n_lora_o, d.group_in());
        q8(p + "attn_output_b.weight", w.out_b, d.n_embd, d.lora_o_total());
        raw(p + "ffn_norm.weight", w.ffn_norm);
        const int r = d.ratio_of(il);
        auto comp = [&](const std::string& c, compressor_mats& m) {
            f16(p + c + "_kv.weight", m.wkv);
            f16(p + c + "_gate.weight", m.wgate);
            f16(p + c + "_ape.weight", m.ape);
            raw(p + c + "_norm.weight", m.norm);
        };
        if (r != 0) comp("attn_compressor", w.attn_comp);
        if (r == 4) {
            comp("indexer_compressor", w.idx_comp);
            f16(p + "indexer.attn_q_b.weight", w.idx_q_b);
            f16(p + "indexer.proj.weight", w.idx_proj);
        }
        kernels::moe_weights& m = w.moe;
        f16(p + "ffn_gate_inp.weight", m.router);
        if (d.is_hash_layer(il))
            raw(p + "ffn_gate_tid2eid.weight", m.tid2eid);
        else
            raw(p + "exp_probs_b.bias", m.bias, true);
        need(p + "ffn_gate_exps.weight", ggml_type::iq2_xxs);
        need(p + "ffn_up_exps.weight", ggml_type::iq2_xxs);
        need(p + "ffn_down_exps.weight", ggml_type::q2_k);
        const int gk = add(p + "ffn_gate_exps.weight", repack::iq2_xxs_experts, d.n_ff_exp, d.n_embd, d.n_expert);
        const int uk = add(p + "ffn_up_exps.weight", repack::iq2_xxs_experts, d.n_ff_exp, d.n_embd, d.n_expert);
        const int dk = add(p + "ffn_down_exps.weight", repack::q2_k_experts, d.n_embd, d.n_ff_exp, d.n_expert);
        binds.push_back([&m, gk, uk, dk, &jobs](std::uint8_t* base) {
            const job &g = jobs[std::size_t(gk)], &u = jobs[std::size_t(uk)], &dn = jobs[std::size_t(dk)];
            m.gate_q = base + g.offset;
            m.gate_d = reinterpret_cast<const std::uint16_t*>(base + g.offset + g.scale_offset);
            m.up_q = base + u.offset;
            m.up_d = reinterpret_cast<const std::uint16_t*>(base + u.offset + u.scale_offset);
            m.down_q = base + dn.offset;
            m.down_dd = reinterpret_cast<const std::uint32_t*>(base + dn.offset + dn.scale_offset);
        });
        q8_into(p + "ffn_gate_shexp.weight", m.sh_gate_q, m.sh_gate_d, d.n_ff_exp, d.n_embd);
        q8_into(p + "ffn_up_shexp.weight", m.sh_up_q, m.sh_up_d, d.n_ff_exp, d.n_embd);
        q8_into(p + "ffn_down_shexp.weight", m.sh_down_q, m.sh_down_d, d.n_embd, d.n_ff_exp);
        m.clamp = d.swiglu_clamp_exp;
        m.weight_scale = d.expert_weights_scale;
    }
    bytes_ = total;

    // Fits, or says by how much it does not, before allocating anything.
    std::size_t free_b = 0, total_b = 0;
    cuda_check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    require(std::uint64_t(free_b) >= total + reserve_bytes,
            "cuda backend: the device has " + std::to_string(free_b) + " bytes free of " + std::to_string(total_b) +
                "; the weights need " + std::to_string(total) + " bytes plus " + std::to_string(reserve_bytes) +
                " for KV and workspaces");
    cuda_check(cudaMalloc(&arena_, total), "cudaMalloc weight arena");
    auto* base = static_cast<std::uint8_t*>(arena_);
    for (auto& b : binds) b(base);

    // Two pinned staging buffers: tensor k is repacked into buffer k % 2 while buffer (k+1) % 2
    // is still being copied; an event per buffer says when it may be refilled.
    cudaStream_t stream = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    void* staging[2] = {nullptr, nullptr};
    cudaEvent_t done[2] = {nullptr, nullptr};
    try {
        for (int k = 0; k < 2; ++k) {
            cuda_check(cudaMallocHost(&staging[k], std::max<std::uint64_t>(largest, 1)), "cudaMallocHost staging");
            cuda_check(cudaEventCreateWithFlags(&done[k], cudaEventDisableTiming), "cudaEventCreate");
            cuda_check(cudaEventRecord(done[k], stream), "cudaEventRecord");
        }
        progress_line bar(total);
        std::uint64_t copied = 0;
        const gguf::tensor_info* pending[2] = {nullptr, nullptr};
        for (std::size_t i = 0; i < jobs.size(); ++i) {
            const int k = int(i % 2);
            cuda_check(cudaEventSynchronize(done[k]), "staging buffer wait");
            if (pending[k] != nullptr) file.release(*pending[k]);
            const job& j = jobs[i];
            repack_into(j, static_cast<std::uint8_t*>(staging[k]));
            cuda_check(cudaMemcpyAsync(base + j.offset, staging[k], j.bytes, cudaMemcpyHostToDevice, stream),
                       "weight upload");
            cuda_check(cudaEventRecord(done[k], stream), "cudaEventRecord");
            pending[k] = j.t;
            copied += j.bytes;
            bar.update(copied);
        }
        cuda_check(cudaStreamSynchronize(stream), "weight upload");
        for (const gguf::tensor_info* t : pending)
            if (t != nullptr) file.release(*t);
        bar.update(copied, true);
    } catch (...) {
        for (int k = 0; k < 2; ++k) {
            if (staging[k]) cudaFreeHost(staging[k]);
            if (done[k]) cudaEventDestroy(done[k]);
        }
        cudaStreamDestroy(stream);
        cudaFree(arena_);
        throw;
    }
    for (int k = 0; k < 2; ++k) {
        cudaFreeHost(staging[k]);
        cudaEventDestroy(done[k]);
    }
    cudaStreamDestroy(stream);
}

device_weights::~device_weights() {
    if (arena_) cudaFree(arena_);
}

}  // namespace ds4::cuda_backend
