// A bounded, deterministic fuzz pass over the model-file path (issue 16): small valid files are
// mutated the way a coverage-guided fuzzer's first mutators do (bit flips, boundary integers in
// count and length fields, cuts, deleted and repeated ranges), and each result goes through the
// reader, every value accessor, dims_from_gguf, expected_dims, the validator and the tokenizer build. Every outcome
// must be success or a ds4::error: a crash, a sanitizer report or any other exception fails.
// Fixed seed and count, so a failure reproduces by its iteration number.
#define _GLIBCXX_ASSERTIONS 1

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/gguf/reader.hpp"
#include "ds4/gguf/writer.hpp"
#include "ds4/model/metadata.hpp"
#include "ds4/model/shape.hpp"
#include "ds4/model/tensors.hpp"
#include "ds4/model/validate.hpp"
#include "harness/synth/vocab.hpp"
#include "tests/support/gguf_raw_builder.hpp"
#include "text/tokenizer.hpp"

using namespace ds4;
using namespace ds4::model;
using gguf::value_type;

namespace {

std::vector<std::byte> read_all(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(c.size());
    std::transform(c.begin(), c.end(), out.begin(), [](char x) { return static_cast<std::byte>(x); });
    return out;
}

// A tiny shape's keys (under `preset`), ds4-synth's vocabulary and the inventory's small tensors,
// so that mutations reach dims_from_gguf, the structural rules, the tensor checks and the tokenizer.
std::vector<std::byte> model_seed(const std::filesystem::path& dir, const std::string& preset,
                                  const synth::synth_vocab& vocab) {
    const auto path = dir / ("seed_" + (preset.empty() ? std::string("flash") : preset) + ".gguf");
    {
        model_dims d = dims_of<tiny_shape>();
        d.preset = preset;
        gguf::writer w(path);
        w.add_string("general.architecture", "deepseek4");
        write_model_keys(w, d);
        w.add_array(std::string(tokens_key), vocab.tokens);
        w.add_array(std::string(merges_key), vocab.merges);
        std::vector<tensor_spec> small;
        for (const tensor_spec& t : model_inventory(d))
            if (t.n_bytes() <= 2048 && small.size() < 24) small.push_back(t);
        for (const tensor_spec& t : small) w.add_tensor(t.name, t.type, t.dims);
        w.begin_data();
        for (const tensor_spec& t : small) {
            const std::vector<std::byte> zeros(static_cast<std::size_t>(t.n_bytes()));
            w.write(zeros);
        }
        w.finish();
    }
    return read_all(path);
}

// Every value type the reader knows, nested arrays included, and two tensors.
std::vector<std::byte> raw_seed() {
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
std::uint64_t touch(const gguf::file& f) {
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
// propagates to the test, which fails on it.
template <class F>
bool answers(F&& stage) {
    try {
        stage();
        return true;
    } catch (const ds4::error&) {
        return false;
    }
}

// One mutated file through the whole path. A parse error is the answer for the file; after a
// successful parse every later stage runs whatever the one before said (a loader stops at the
// first error; going on reaches more code per file).
outcome run_one(std::vector<std::byte> bytes) {
    const gguf::file f = gguf::file::from_bytes(std::move(bytes), "fuzz.gguf");
    (void)touch(f);
    outcome o;
    o.shape_read = answers([&] { (void)dims_from_gguf(f); });
    o.validated = answers([&] {
        (void)validate(f, dims_of<tiny_shape>());
        (void)validate_mtp(f, dims_of<tiny_shape>());
        (void)validate_declared(f).to_string();
    });
    // The tokenizer as a loader builds it from the two arrays, then one encode/decode.
    o.tokenized = answers([&] {
        const std::vector<std::string_view> t = f.at(tokens_key).strings(), m = f.at(merges_key).strings();
        const ref::tokenizer tk(std::vector<std::string>(t.begin(), t.end()), std::vector<std::string>(m.begin(), m.end()));
        (void)tk.decode(tk.encode("<\uff5cUser\uff5c>Hello, world 42!", true));
    });
    return o;
}

}  // namespace

TEST_CASE("fuzz corpus: mutated tiny model files are accepted or rejected with ds4::error, nothing else") {
    const auto dir = std::filesystem::path(DS4_BINARY_DIR) / "gguf_fuzz_corpus_test_tmp";
    std::filesystem::create_directories(dir);
    const synth::synth_vocab vocab = synth::build_vocab(tiny_shape::n_vocab);
    const std::vector<std::vector<std::byte>> seeds{model_seed(dir, std::string(custom_preset), vocab),
                                                    model_seed(dir, "tiny", vocab), model_seed(dir, "", vocab),
                                                    raw_seed()};
    std::filesystem::remove_all(dir);
    // The seeds themselves are valid files; custom and tiny also match their shapes' keys.
    // Where each seed's value fields and array counts are, for mutations that hit a field
    // exactly (as a structure-aware fuzzer would): key length + key + type id, then the value.
    std::vector<std::uint64_t> header_end;
    struct field {
        std::uint64_t at, width;
    };
    std::vector<std::vector<field>> fields;
    for (const auto& s : seeds) {
        const gguf::file f = gguf::file::from_bytes(s, "seed.gguf");
        header_end.push_back(f.data_offset());
        std::vector<field> at;
        for (const gguf::value& v : f.metadata()) {
            const std::uint64_t payload = v.file_offset() + 8 + v.key().size() + 4;
            if (v.type() == value_type::array) at.push_back({payload + 4, 8});  // the element count
            else if (v.type() == value_type::string) at.push_back({payload, 8});  // the length
            else at.push_back({payload, gguf::fixed_size_of(v.type())});
        }
        fields.push_back(std::move(at));
    }

    // Boundary values of the fields a hostile file controls: counts, lengths, dims, type ids.
    const std::vector<std::uint64_t> boundary{0, 1, 5, 6, 255, 256, 65535, 65536, 100000, (1u << 24) + 1,
                                              1u << 30, 0x7fffffffu, 0x80000000u, 0xffffffffu,
                                              (std::uint64_t{1} << 32) + 4, std::uint64_t{1} << 62,
                                              std::uint64_t{1} << 63, ~std::uint64_t{0}};
    std::mt19937_64 rng(16);
    constexpr int rounds = 6000;
    int rejected = 0, parsed = 0, shape_read = 0, validated = 0, tokenized = 0;
    for (int round = 0; round < rounds; ++round) {
        const std::size_t which = static_cast<std::size_t>(round) % seeds.size();
        std::vector<std::byte> m = seeds[which];
        const int n_mut = 1 + static_cast<int>(rng() % 3);
        for (int k = 0; k < n_mut && !m.empty(); ++k) {
            // Mostly inside the header and directory, where every byte is structure.
            const std::uint64_t span = (rng() % 8 != 0) ? std::min<std::uint64_t>(header_end[which], m.size()) : m.size();
            std::size_t at = static_cast<std::size_t>(rng() % span);
            std::size_t width = (rng() % 2) ? 4 : 8;
            const std::uint64_t op = rng() % 10;
            if (op >= 7) {  // a boundary value in a whole field, at its own width
                const field& fd = fields[which][rng() % fields[which].size()];
                at = static_cast<std::size_t>(fd.at);
                width = static_cast<std::size_t>(fd.width);
            }
            if (at >= m.size()) continue;
            switch (op >= 7 ? 2 : op) {
                case 0: m[at] ^= static_cast<std::byte>(1u << (rng() % 8)); break;
                case 1: m[at] = static_cast<std::byte>(rng()); break;
                case 2: case 3: {
                    const std::uint64_t v = boundary[rng() % boundary.size()];
                    for (std::size_t b = 0; b < width && at + b < m.size(); ++b)
                        m[at + b] = static_cast<std::byte>(v >> (8 * b));
                    break;
                }
                case 4: m.resize(at); break;
                case 5: m.erase(m.begin() + static_cast<std::ptrdiff_t>(at),
                                m.begin() + static_cast<std::ptrdiff_t>(std::min(m.size(), at + 1 + rng() % 16)));
                    break;
                default: {
                    const std::size_t len = std::min(m.size() - at, static_cast<std::size_t>(1 + rng() % 32));
                    const std::vector<std::byte> copy(m.begin() + static_cast<std::ptrdiff_t>(at),
                                                      m.begin() + static_cast<std::ptrdiff_t>(at + len));
                    m.insert(m.begin() + static_cast<std::ptrdiff_t>(at), copy.begin(), copy.end());
                    break;
                }
            }
        }
        try {
            const outcome o = run_one(std::move(m));
            ++parsed;
            shape_read += o.shape_read;
            validated += o.validated;
            tokenized += o.tokenized;
        } catch (const ds4::error&) {
            ++rejected;
        } catch (const std::exception& e) {
            FAIL("round " << round << " (seed " << which << "): " << typeid(e).name() << ": " << e.what());
        } catch (...) {
            FAIL("round " << round << " (seed " << which << "): a non-std exception");
        }
    }
    MESSAGE(parsed << " parsed (of which " << shape_read << " through dims_from_gguf, " << validated
                   << " through the validator, " << tokenized << " through the tokenizer), " << rejected
                   << " rejected by the reader");
    // The mutations must exercise both sides, or the pass proves nothing.
    CHECK(parsed > rounds / 20);
    CHECK(rejected > rounds / 20);
    CHECK(shape_read > 0);
    CHECK(validated > 0);
    CHECK(tokenized > 0);
}
