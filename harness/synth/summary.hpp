#pragma once
// The one-screen description of a DS4 GGUF that `ds4-synth` prints after writing a file and
// `ds4-synth --summary FILE` prints for any file: what it declares, what it holds, and whether
// it matches the shape it declares (the validator's report, differences listed).
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include "ds4/gguf/reader.hpp"
#include "ds4/model/validate.hpp"

namespace ds4::synth {

inline bool is_mtp_file(const gguf::file& f) { return f.find_tensor("mtp.0.e_proj.weight") != nullptr; }

// Validates `f` against its declared shape: the base model via validate_declared, an MTP file
// via validate_mtp against the shape its keys declare (flash when it has none).
inline model::validation_report validate_file(const gguf::file& f) {
    const model::model_dims d = model::expected_dims(f);
    return is_mtp_file(f) ? model::validate_mtp(f, d) : model::validate(f, d);
}

inline std::string text_key(const gguf::file& f, std::string_view key) {
    const gguf::value* v = f.find(key);
    if (v == nullptr) return "(absent)";
    if (v->type() == gguf::value_type::string) return std::string(v->as_string());
    if (model::is_integer_value(v->type())) return std::to_string(v->as_i64());
    return "(" + std::string(gguf::value_type_name(v->type())) + ")";
}

inline void print_summary(std::FILE* out, const gguf::file& f, const model::validation_report& report) {
    const model::model_dims d = model::expected_dims(f);
    std::map<std::string, std::pair<std::size_t, std::uint64_t>> by_type;  // name -> (tensors, bytes)
    std::uint64_t data = 0;
    for (const gguf::tensor_info& t : f.tensors()) {
        auto& e = by_type[std::string(type_name(t.type))];
        ++e.first;
        e.second += t.n_bytes;
        data += t.n_bytes;
    }
    std::fprintf(out, "file        %s\n", f.path().c_str());
    std::fprintf(out, "kind        %s, preset %s (checked against %s)\n", is_mtp_file(f) ? "MTP" : "base model",
                 text_key(f, model::preset_key).c_str(), d.preset.empty() ? "its own keys" : d.preset.c_str());
    std::fprintf(out, "name        %s [%s]\n", text_key(f, "general.name").c_str(),
                 text_key(f, "general.architecture").c_str());
    std::fprintf(out, "shape       %d layers, n_embd %d, vocab %d, %d heads x %d, %d experts (%d used), ff %d\n",
                 d.n_layer, d.n_embd, d.n_vocab, d.n_head, d.head_dim, d.n_expert, d.n_expert_used, d.n_ff_exp);
    std::fprintf(out, "tensors     %zu, data %.3f GB (%.3f GiB), file %.3f GB, alignment %llu\n", f.tensors().size(),
                 data / 1e9, data / 1073741824.0, f.size() / 1e9, static_cast<unsigned long long>(f.alignment()));
    for (const auto& [name, e] : by_type)
        std::fprintf(out, "  %-8s  %5zu tensors  %10.3f GB\n", name.c_str(), e.first, e.second / 1e9);
    if (const gguf::value* tokens = f.find(model::tokens_key)) {
        const gguf::value* merges = f.find(model::merges_key);
        std::fprintf(out, "tokenizer   %s/%s, %llu tokens, %llu merges, bos %s, eos %s\n",
                     text_key(f, "tokenizer.ggml.model").c_str(), text_key(f, "tokenizer.ggml.pre").c_str(),
                     static_cast<unsigned long long>(tokens->size()),
                     static_cast<unsigned long long>(merges ? merges->size() : 0),
                     text_key(f, "tokenizer.ggml.bos_token_id").c_str(), text_key(f, "tokenizer.ggml.eos_token_id").c_str());
    }
    std::fprintf(out, "validation  %s\n", report.to_string(20).c_str());
}

}  // namespace ds4::synth
