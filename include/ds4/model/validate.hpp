#pragma once
// Checks a GGUF against a shape (docs/model.md §5.1-5.3, docs/README.md decision 10): every §5.2 key, the
// compress-ratio and SwiGLU-clamp arrays, the tokenizer arrays, and every tensor of the
// inventory (presence, type, ndim, each dim, gate/up type agreement). Unlike ds4.c, which exits
// at the first problem, it finds every difference, so a wrong conversion is diagnosed in one
// run (the report keeps the first validation_report::max_recorded and counts the rest, so a
// hostile file cannot make it large). Extra tensors and keys are ignored, as ds4 ignores them.
#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/gguf/reader.hpp"
#include "ds4/model/metadata.hpp"
#include "ds4/model/shape.hpp"
#include "ds4/model/tensors.hpp"

namespace ds4::model {

enum class difference_kind {
    missing_tensor,
    tensor_type,
    tensor_dims,
    tensor_type_pair,  // gate/up experts of different types
    missing_key,
    key_type,
    key_value,
};

struct difference {
    difference_kind kind;
    std::string subject;  // the tensor name or key (with [i] for an array entry)
    std::string expected;
    std::string found;

    std::string message() const {
        const bool tensor = kind == difference_kind::missing_tensor || kind == difference_kind::tensor_type ||
                            kind == difference_kind::tensor_dims || kind == difference_kind::tensor_type_pair;
        std::string m = (tensor ? "tensor '" : "key '") + subject + "': ";
        switch (kind) {
            case difference_kind::missing_tensor: return m + "missing (expected " + expected + ")";
            case difference_kind::missing_key: return m + "missing (expected " + expected + ")";
            case difference_kind::tensor_type: return m + "type " + found + ", expected " + expected;
            case difference_kind::tensor_dims: return m + "dims " + found + ", expected " + expected;
            case difference_kind::tensor_type_pair: return m + "type " + found + ", must equal " + expected;
            case difference_kind::key_type: return m + "is " + found + ", expected " + expected;
            case difference_kind::key_value: return m + found + ", expected " + expected;
        }
        return m;
    }
};

struct validation_report {
    // The first max_recorded differences are kept; the rest are only counted. A wholly wrong file
    // has one difference per inventory entry (layers x ~35), so memory stays bounded whatever the
    // shape, and the first few hundred say what is wrong.
    static constexpr std::size_t max_recorded = 1000;

    std::string file;        // the file's path or label
    std::string shape;       // the preset it was checked against
    std::vector<difference> differences;
    std::size_t n_unrecorded = 0;  // differences found beyond max_recorded

    bool ok() const { return differences.empty() && n_unrecorded == 0; }
    std::size_t count() const { return differences.size() + n_unrecorded; }
    // One line per difference, capped so a wholly wrong file does not flood a terminal.
    std::string to_string(std::size_t max_lines = 40) const {
        if (ok()) return file + ": matches the " + shape + " shape";
        std::string s = file + ": " + std::to_string(count()) + " difference(s) from the " + shape + " shape";
        for (std::size_t i = 0; i < differences.size() && i < max_lines; ++i) s += "\n  " + differences[i].message();
        if (count() > max_lines)
            s += "\n  ... and " + std::to_string(count() - std::min(max_lines, differences.size())) + " more";
        return s;
    }
};

namespace detail {

inline std::string dims_text(const std::vector<std::uint64_t>& dims) {
    std::string s = "[";
    for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
}

inline std::string types_text(const std::vector<ggml_type>& types) {
    std::string s;
    for (std::size_t i = 0; i < types.size(); ++i) s += (i ? " or " : "") + std::string(type_name(types[i]));
    return s;
}

inline std::string value_type_text(const gguf::value& v) {
    std::string s(gguf::value_type_name(v.type()));
    if (v.type() == gguf::value_type::array) s += " of " + std::string(gguf::value_type_name(v.array_type()));
    return s;
}

inline std::string float_text(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

// The inventory has ~35 entries per layer; a shape built by hand is held to the same layer
// bound as a file's (dims_limits), so the work and the report stay bounded.
inline void require_layer_count(const model_dims& d) {
    require(d.n_layer >= 0 && d.n_layer <= dims_limits::max_layers,
            "model shape: block_count " + std::to_string(d.n_layer) + " is outside 0.." +
                std::to_string(dims_limits::max_layers));
}

class checker {
public:
    explicit checker(const gguf::file& f, validation_report& r) : f_(f), r_(r) {}

    void tensors(const std::vector<tensor_spec>& inventory) {
        for (const tensor_spec& t : inventory) tensor(t);
    }

    // Type, dims and the gate/up pairing are checked independently, so a tensor converted with
    // the wrong type and the wrong shape reports both (ds4.c stops at the first).
    void tensor(const tensor_spec& t) {
        const gguf::tensor_info* info = f_.find_tensor(t.name);
        if (info == nullptr) {
            if (t.required())
                add(difference_kind::missing_tensor, t.name,
                    std::string(type_name(t.type)) + " " + dims_text(t.dims) + ", present " +
                        std::string(presence_name(t.when)),
                    "");
            return;
        }
        if (!t.accepts(info->type))
            add(difference_kind::tensor_type, t.name, types_text(t.accepted), std::string(type_name(info->type)));
        if (info->dims != t.dims)
            add(difference_kind::tensor_dims, t.name, dims_text(t.dims), dims_text(info->dims));
        // The pair rule compares the two files' actual types: any routed type is fine as long as
        // gate and up agree, because one fused kernel reads both.
        if (!t.same_type_as.empty())
            if (const gguf::tensor_info* other = f_.find_tensor(t.same_type_as); other && other->type != info->type)
                add(difference_kind::tensor_type_pair, t.name,
                    "'" + t.same_type_as + "' (" + std::string(type_name(other->type)) + ")",
                    std::string(type_name(info->type)));
    }

    // The value is the contract, not the stored width: converters write integers as u32 or i32
    // and floats as f32 or f64, and ds4 reads them all through width-agnostic getters.
    void keys(const model_dims& d) {
        for (const int_key& k : int_keys()) integer(k.key, k.field ? d.*k.field : 0, k.optional);
        for (const float_key& k : float_keys()) real(k.key, d.*k.field);
        if (const gguf::value* v = present(expert_weights_norm_key, d.expert_weights_norm ? "true" : "false")) {
            if (v->type() != gguf::value_type::boolean)
                add(difference_kind::key_type, std::string(expert_weights_norm_key), "bool", value_type_text(*v));
            else if (v->as_bool() != d.expert_weights_norm)
                add(difference_kind::key_value, std::string(expert_weights_norm_key),
                    d.expert_weights_norm ? "true" : "false", v->as_bool() ? "true" : "false");
        }
        ratio_array(d);
        clamp_array(d);
        // Every row of token_embd/output needs a vocabulary string; the merge count is free.
        string_array(tokens_key, static_cast<std::uint64_t>(d.n_vocab));
        string_array(merges_key, 0);
    }

private:
    void add(difference_kind k, std::string subject, std::string expected, std::string found) {
        if (r_.differences.size() >= validation_report::max_recorded) {
            ++r_.n_unrecorded;
            return;
        }
        r_.differences.push_back({k, std::move(subject), std::move(expected), std::move(found)});
    }

    // The key, or nullptr after recording it missing (unless optional: expert_group_count and
    // expert_group_used_count may be absent, and must be 0 when present).
    const gguf::value* present(std::string_view key, const std::string& expected, bool optional = false) {
        const gguf::value* v = f_.find(key);
        if (v == nullptr && !optional) add(difference_kind::missing_key, std::string(key), expected, "");
        return v;
    }

    void integer(std::string_view key, int want, bool optional) {
        const gguf::value* v = present(key, std::to_string(want), optional);
        if (v == nullptr) return;
        if (!is_integer_value(v->type()))
            add(difference_kind::key_type, std::string(key), "an integer", value_type_text(*v));
        else if (v->as_i64() != want)
            add(difference_kind::key_value, std::string(key), std::to_string(want), std::to_string(v->as_i64()));
    }

    void real(std::string_view key, float want) {
        const gguf::value* v = present(key, float_text(want));
        if (v == nullptr) return;
        if (!is_float_value(v->type()))
            add(difference_kind::key_type, std::string(key), "f32 or f64", value_type_text(*v));
        else if (!floats_match(v->as_f64(), want))
            add(difference_kind::key_value, std::string(key), float_text(want), float_text(v->as_f64()));
    }

    // An array key: present, an array of the right element kind, at least n_layer entries. Only
    // the first n_layer entries are compared: the HF config appends one for the MTP block.
    const gguf::value* layer_array(std::string_view key, const model_dims& d, bool integers) {
        const gguf::value* v = present(key, "an array of >= " + std::to_string(d.n_layer) + " entries");
        if (v == nullptr) return nullptr;
        const bool kind_ok = v->type() == gguf::value_type::array &&
                             (integers ? is_integer_value(v->array_type()) : is_float_value(v->array_type()));
        if (!kind_ok) {
            add(difference_kind::key_type, std::string(key), integers ? "array of u32 or i32" : "array of f32 or f64",
                value_type_text(*v));
            return nullptr;
        }
        if (v->size() < static_cast<std::uint64_t>(d.n_layer)) {
            add(difference_kind::key_value, std::string(key), ">= " + std::to_string(d.n_layer) + " entries",
                std::to_string(v->size()) + " entries");
            return nullptr;
        }
        return v;
    }

    void ratio_array(const model_dims& d) {
        const gguf::value* v = layer_array(compress_ratios_key, d, true);
        if (v == nullptr) return;
        for (int il = 0; il < d.n_layer; ++il) {
            const std::int64_t got = v->int_at(static_cast<std::uint64_t>(il));
            if (got != d.ratio_of(il))
                add(difference_kind::key_value, std::string(compress_ratios_key) + "[" + std::to_string(il) + "]",
                    std::to_string(d.ratio_of(il)), std::to_string(got));
        }
    }

    void clamp_array(const model_dims& d) {
        const gguf::value* v = layer_array(swiglu_clamp_key, d, false);
        if (v == nullptr) return;
        for (int il = 0; il < d.n_layer; ++il) {
            const double got = v->float_at(static_cast<std::uint64_t>(il));
            if (!floats_match(got, d.swiglu_clamp_exp))
                add(difference_kind::key_value, std::string(swiglu_clamp_key) + "[" + std::to_string(il) + "]",
                    float_text(d.swiglu_clamp_exp), float_text(got));
        }
    }

    // A string array; `n` > 0 also fixes its length (the vocabulary must cover every token id).
    void string_array(std::string_view key, std::uint64_t n) {
        const gguf::value* v = present(key, "a string array");
        if (v == nullptr) return;
        if (v->type() != gguf::value_type::array || v->array_type() != gguf::value_type::string)
            add(difference_kind::key_type, std::string(key), "array of string", value_type_text(*v));
        else if (n != 0 && v->size() != n)
            add(difference_kind::key_value, std::string(key), std::to_string(n) + " entries",
                std::to_string(v->size()) + " entries");
    }

    const gguf::file& f_;
    validation_report& r_;
};

}  // namespace detail

// The base model file against `expected`: keys, arrays, tokenizer arrays, every tensor.
// Keys come first in the report, then tensors in file-inventory order, so the output reads
// like the file.
inline validation_report validate(const gguf::file& f, const model_dims& expected) {
    detail::require_layer_count(expected);
    validation_report r{f.path(), expected.preset.empty() ? "declared" : expected.preset, {}, 0};
    detail::checker c(f, r);
    c.keys(expected);
    c.tensors(model_inventory(expected));
    return r;
}

// The MTP file (§4). ds4 checks only its tensors (ds4.c:2428), against the base model's shape:
// the drafter shares the embedding and output head, so its widths must be the base model's.
inline validation_report validate_mtp(const gguf::file& f, const model_dims& base) {
    detail::require_layer_count(base);
    validation_report r{f.path(), (base.preset.empty() ? "declared" : base.preset) + " MTP", {}, 0};
    detail::checker(f, r).tensors(mtp_inventory(base));
    return r;
}

// The loader's entry point: the file against the shape it declares (expected_dims), which is
// the flash shape for every shipped file.
inline validation_report validate_declared(const gguf::file& f) { return validate(f, expected_dims(f)); }

// Throwing variants: the ds4::error lists every difference, each naming its tensor or key.
inline void require_valid(const validation_report& r) {
    if (!r.ok()) fail(r.to_string());
}
inline void require_valid(const gguf::file& f, const model_dims& expected) { require_valid(validate(f, expected)); }
inline void require_valid_mtp(const gguf::file& f, const model_dims& base) { require_valid(validate_mtp(f, base)); }

}  // namespace ds4::model
