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
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/gguf/reader.hpp"
#include "ds4/model/metadata.hpp"
#include "tests/support/gguf_exercise.hpp"

using namespace ds4;
using namespace ds4::gguf_exercise;
using gguf::value_type;

TEST_CASE("fuzz corpus: mutated tiny model files are accepted or rejected with ds4::error, nothing else") {
    const auto dir = std::filesystem::path(DS4_BINARY_DIR) / "gguf_fuzz_corpus_test_tmp";
    std::filesystem::create_directories(dir);
    const std::vector<std::vector<std::byte>> seeds{model_seed(dir / "custom.gguf", std::string(model::custom_preset)),
                                                    model_seed(dir / "tiny.gguf", "tiny"), model_seed(dir / "flash.gguf", ""),
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
