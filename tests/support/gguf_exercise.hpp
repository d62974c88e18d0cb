#pragma once
// The model-file path as a loader walks it, for the deterministic mutation test
// (tests/gguf_fuzz_corpus_test.cpp) and the coverage-guided fuzzer (fuzz/gguf_fuzzer.cpp): the
// reader, every value accessor, the tensor directory, dims_from_gguf, expected_dims, the validator
// against each shape and the tokenizer build. Also the small seed files both start from.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/gguf/reader.hpp"
#include "ds4/gguf/writer.hpp"
#include "ds4/model/metadata.hpp"
#include "ds4/model/shape.hpp"
#include "ds4/model/tensors.hpp"
#include "ds4/model/validate.hpp"
#include "harness/synth/generator.hpp"
#include "harness/synth/vocab.hpp"
#include "tests/support/gguf_raw_builder.hpp"
#include "text/tokenizer.hpp"

namespace ds4::gguf_exercise {

inline std::vector<std::byte> read_all(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(c.size());
    std::transform(c.begin(), c.end(), out.begin(), [](char x) { return static_cast<std::byte>(x); });
    return out;
}

// ds4-synth's keys and tokenizer for the tiny shape (`preset` as the declared preset: "tiny",
// "small", "flash" or custom) and the inventory's small tensors with the generator's data, so that
// mutations reach dims_from_gguf, the structural rules, the tensor checks and the tokenizer while
// the file stays a few tens of KB. limit_bytes > 0 leaves the file truncated as ds4-synth does.
inline std::vector<std::byte> model_seed(const std::filesystem::path& path, const std::string& preset,
                                         std::uint64_t limit_bytes = 0) {
    {
        model::model_dims d = model::dims_of<model::tiny_shape>();
        d.preset = preset;
        gguf::writer w(path);
        synth::detail::write_general_keys(w, d, "fuzz seed");
        synth::detail::write_tokenizer_keys(w, synth::build_vocab(d.n_vocab));
        std::vector<model::tensor_spec> small;
        for (const model::tensor_spec& t : model::model_inventory(d))
            if (t.n_bytes() <= 2048 && small.size() < 24) small.push_back(t);
        synth::write_options opt;
        opt.seed = 16;
        opt.threads = 1;
        opt.limit_bytes = limit_bytes;
        synth::detail::stream_tensors(w, small, d, opt, std::chrono::steady_clock::now());
    }
    std::vector<std::byte> bytes = read_all(path);
    std::filesystem::remove(path);
    return bytes;
}

// Every value type the reader knows, nested arrays included, and two tensors.
inline std::vector<std::byte> raw_seed() {
    using gguf::value_type;
    gguf::raw_builder b;
    b.header(2, 6);
    b.kv("k.u32", value_type::u32, std::uint32_t{7}).kv("k.i64", value_type::i64, std::int64_t{-3});
    b.kv("k.bool", value_type::boolean, std::uint8_t{1}).kv_string("k.s", "hello");
    b.str("k.strings").type(value_type::array).type(value_type::string).u64(3).str("a").str("").str("bc");
    b.str("k.nested").type(value_type::array).type(value_type::array).u64(2);
    b.type(value_type::u16).u64(2).put(std::uint16_t{1}).put(std::uint16_t{2});
    b.type(value_type::string).u64(1).str("x");
    b.tensor("a", {32, 2}, ggml_type::q8_0, 0).tensor("b", {4}, ggml_type::f32, 96);
    b.pad_to(32).zeros(128);
    return b.take();
}

// Reads everything a loader would: each value through its own accessor (and the conversions),
// array elements at both ends, nested elements, every tensor's first and last byte.
inline std::uint64_t touch(const gguf::file& f) {
    using gguf::value_type;
    std::uint64_t h = 0;
    for (const gguf::value& v : f.metadata()) {
        try {
            switch (v.type()) {
                case value_type::string: h += v.as_string().size(); break;
                case value_type::boolean: h += v.as_bool(); break;
                case value_type::f32: case value_type::f64: h += static_cast<std::uint64_t>(v.as_f64() != 0); break;
                case value_type::array: {
                    const std::uint64_t n = v.size();
                    for (std::uint64_t i : {std::uint64_t{0}, n / 2, n - 1}) {
                        if (n == 0) break;
                        switch (v.array_type()) {
                            case value_type::string: h += v.string_at(i).size(); break;
                            case value_type::array: h += v.element(i).size(); break;
                            case value_type::boolean: h += v.bool_at(i); break;
                            case value_type::f32: case value_type::f64: h += v.float_at(i) != 0; break;
                            default: h += static_cast<std::uint64_t>(v.int_at(i)); break;
                        }
                    }
                    if (v.array_type() == value_type::string) h += v.strings().size();
                    break;
                }
                default: h += v.as_u64(); break;
            }
        } catch (const ds4::error&) {
            ++h;  // a negative or too-wide integer: an error is the right answer
        }
    }
    for (const gguf::tensor_info& t : f.tensors())
        h += std::to_integer<unsigned>(t.data[0]) + std::to_integer<unsigned>(t.data[t.n_bytes - 1]);
    return h;
}

struct outcome {
    bool shape_read = false, validated = false, tokenized = false;
};

// True when the stage accepted the file, false when it answered with ds4::error; anything else
// propagates to the caller, which fails on it.
template <class F>
bool answers(F&& stage) {
    try {
        stage();
        return true;
    } catch (const ds4::error&) {
        return false;
    }
}

// One file through the whole path. A parse error (ds4::error) propagates: it is the answer for
// the file. After a successful parse every later stage runs whatever the one before said (a loader
// stops at the first error; going on reaches more code per file).
inline outcome run_one(std::vector<std::byte> bytes) {
    const gguf::file f = gguf::file::from_bytes(std::move(bytes), "fuzz.gguf");
    (void)touch(f);
    outcome o;
    o.shape_read = answers([&] { (void)model::dims_from_gguf(f); });
    // Each shape on its own, so an error against one does not hide the code of the others.
    for (const model::model_dims& d : {model::dims_of<model::tiny_shape>(), model::dims_of<model::small_shape>(),
                                       model::dims_of<model::flash_shape>()})
        o.validated |= answers([&] {
            (void)model::validate(f, d).to_string();
            (void)model::validate_mtp(f, d);
        });
    o.validated |= answers([&] { (void)model::validate_declared(f).to_string(); });
    // The tokenizer as a loader builds it from the two arrays, then one encode/decode.
    o.tokenized = answers([&] {
        const std::vector<std::string_view> t = f.at(model::tokens_key).strings(), m = f.at(model::merges_key).strings();
        const ref::tokenizer tk(std::vector<std::string>(t.begin(), t.end()), std::vector<std::string>(m.begin(), m.end()));
        (void)tk.decode(tk.encode("<\uff5cUser\uff5c>Hello, world 42!", true));
    });
    return o;
}

}  // namespace ds4::gguf_exercise
