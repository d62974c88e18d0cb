// GGUF reader and writer: a round trip over every value type, several tensor types and
// alignments; a corpus of malformed files, one per failure kind, each rejected with a message
// naming the file, the key or tensor and the kind of failure; every truncation of a small valid
// file; random byte flips in the header; writer misuse.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ds4/gguf/reader.hpp"
#include "ds4/gguf/writer.hpp"
#include "tests/support/gguf_raw_builder.hpp"

namespace {

using namespace ds4::gguf;
using ds4::ggml_type;

std::filesystem::path temp_path(const std::string& name) {
    return std::filesystem::temp_directory_path() / ("ds4_gguf_test_" + std::to_string(::getpid()) + "_" + name);
}

std::vector<std::byte> read_all(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(chars.size());
    std::memcpy(out.data(), chars.data(), chars.size());
    return out;
}

std::mt19937_64 seeded_rng() {
    const std::uint64_t seed = std::random_device{}();
    MESSAGE("seed " << seed);
    return std::mt19937_64(seed);
}

std::vector<std::byte> random_bytes(std::mt19937_64& rng, std::uint64_t n) {
    std::vector<std::byte> out(n);
    for (auto& b : out) b = static_cast<std::byte>(rng());
    return out;
}

// The reader's message must name the file, carry a byte offset, and contain every expected piece.
void expect_rejected(const std::string& kind, std::vector<std::byte> bytes, std::vector<std::string> pieces) {
    CAPTURE(kind);
    try {
        (void)file::from_bytes(std::move(bytes), "bad.gguf");
        FAIL("accepted a malformed file: " << kind);
    } catch (const ds4::error& e) {
        const std::string msg = e.what();
        CAPTURE(msg);
        CHECK(msg.rfind("bad.gguf: ", 0) == 0);
        CHECK(msg.find(" at byte ") != std::string::npos);
        for (const std::string& piece : pieces) CHECK_MESSAGE(msg.find(piece) != std::string::npos, piece);
    }
}

struct tensor_spec {
    std::string name;
    ggml_type type;
    std::vector<std::uint64_t> dims;
    std::uint64_t n_bytes;  // worked out by hand from the GGML block sizes
};

// Byte sizes from the published block layouts: Q8_0 34 B / 32, Q2_K 84 B / 256, IQ2_XXS 66 B / 256.
const std::vector<tensor_spec> round_trip_tensors = {
    {"token_embd.weight", ggml_type::f16, {64, 3}, 64 * 3 * 2},
    {"blk.0.attn_q_a.weight", ggml_type::q8_0, {64, 5}, 2 * 34 * 5},
    {"blk.0.ffn_down_exps.weight", ggml_type::q2_k, {256, 3}, 84 * 3},
    {"blk.0.ffn_gate_exps.weight", ggml_type::iq2_xxs, {512, 1, 2}, 2 * 66 * 2},
    {"output_norm.weight", ggml_type::f32, {7}, 28},
    {"blk.0.indices", ggml_type::i32, {3, 2, 2, 2}, 3 * 8 * 4},
    {"blk.0.attn_sinks", ggml_type::bf16, {5}, 10},
};

// Writes every value type and the tensors above; returns the tensor bytes in order.
std::vector<std::vector<std::byte>> write_sample(const std::filesystem::path& out, std::uint32_t alignment,
                                                 std::mt19937_64& rng) {
    writer w(out);
    if (alignment != 32) w.set_alignment(alignment);
    w.add_u8("t.u8", 200);
    w.add_i8("t.i8", -100);
    w.add_u16("t.u16", 60000);
    w.add_i16("t.i16", -30000);
    w.add_u32("t.u32", 4000000000u);
    w.add_i32("t.i32", -2000000000);
    w.add_u64("t.u64", (std::uint64_t{1} << 63) + 5);
    w.add_i64("t.i64", std::numeric_limits<std::int64_t>::min());
    w.add_f32("t.f32", 1e-6f);
    w.add_f64("t.f64", 3.141592653589793);
    w.add_bool("t.true", true);
    w.add_bool("t.false", false);
    w.add_string("t.string", "joyai-llm \xc3\xa9");
    w.add_string("t.empty", "");
    w.add_array("t.strings", {"a", "", "b c", std::string(1000, 'x')});
    w.add_array("t.no_strings", {});
    w.add_array_u8("t.a_u8", {0, 1, 255});
    w.add_array_i8("t.a_i8", {-128, 0, 127});
    w.add_array_u16("t.a_u16", {65535, 3});
    w.add_array_i16("t.a_i16", {-32768, 32767});
    w.add_array_u32("t.a_u32", {0, 0, 4, 128, 4});
    w.add_array_i32("t.a_i32", {-1, 2, -3});
    w.add_array_u64("t.a_u64", {std::uint64_t{1} << 40});
    w.add_array_i64("t.a_i64", {-(std::int64_t{1} << 40), 7});
    w.add_array_f32("t.a_f32", {10.0f, -0.5f});
    w.add_array_f64("t.a_f64", {1e-300, 2.5});
    w.add_array_bool("t.a_bool", {true, false, true});
    for (const auto& t : round_trip_tensors) w.add_tensor(t.name, t.type, t.dims);
    w.begin_data();
    std::vector<std::vector<std::byte>> data;
    for (const auto& t : round_trip_tensors) {
        data.push_back(random_bytes(rng, t.n_bytes));
        // Random chunk sizes, including empty ones, so chunking cannot matter.
        std::span<const std::byte> rest(data.back());
        while (!rest.empty()) {
            const std::size_t n = std::min<std::size_t>(rest.size(), rng() % 70);
            w.write(rest.first(n));
            rest = rest.subspan(n);
        }
    }
    const std::uint64_t before_finish = w.bytes_written();
    w.finish();
    CHECK(before_finish == std::filesystem::file_size(out));
    return data;
}

void check_sample(const file& f, std::uint32_t alignment, const std::vector<std::vector<std::byte>>& data) {
    CHECK(f.version() == 3);
    CHECK(f.alignment() == alignment);
    CHECK(f.data_offset() % alignment == 0);
    CHECK(f.at("t.u8").type() == value_type::u8);
    CHECK(f.at("t.u8").as_u64() == 200);
    CHECK(f.at("t.i8").as_i64() == -100);
    CHECK(f.at("t.u16").as_u64() == 60000);
    CHECK(f.at("t.i16").as_i64() == -30000);
    CHECK(f.at("t.u32").as_u64() == 4000000000u);
    CHECK(f.at("t.u32").as_i64() == 4000000000);
    CHECK(f.at("t.i32").as_i64() == -2000000000);
    CHECK(f.at("t.u64").as_u64() == (std::uint64_t{1} << 63) + 5);
    CHECK(f.at("t.i64").as_i64() == std::numeric_limits<std::int64_t>::min());
    CHECK(f.at("t.f32").type() == value_type::f32);
    CHECK(f.at("t.f32").as_f64() == static_cast<double>(1e-6f));
    CHECK(f.at("t.f64").as_f64() == 3.141592653589793);
    CHECK(f.at("t.true").as_bool());
    CHECK(!f.at("t.false").as_bool());
    CHECK(f.at("t.string").as_string() == "joyai-llm \xc3\xa9");
    CHECK(f.at("t.empty").as_string().empty());
    const value& strings = f.at("t.strings");
    CHECK(strings.array_type() == value_type::string);
    REQUIRE(strings.size() == 4);
    CHECK(strings.string_at(2) == "b c");
    CHECK(strings.string_at(3) == std::string(1000, 'x'));
    CHECK(strings.strings() == std::vector<std::string_view>{"a", "", "b c", std::string_view(strings.string_at(3))});
    CHECK(f.at("t.no_strings").size() == 0);
    CHECK(f.at("t.no_strings").strings().empty());
    CHECK(f.at("t.a_u8").int_at(2) == 255);
    CHECK(f.at("t.a_i8").int_at(0) == -128);
    CHECK(f.at("t.a_u16").int_at(0) == 65535);
    CHECK(f.at("t.a_i16").int_at(1) == 32767);
    const value& ratios = f.at("t.a_u32");
    CHECK(ratios.array_type() == value_type::u32);
    REQUIRE(ratios.size() == 5);
    CHECK(ratios.int_at(3) == 128);
    CHECK(f.at("t.a_i32").int_at(2) == -3);
    CHECK(f.at("t.a_u64").int_at(0) == std::int64_t{1} << 40);
    CHECK(f.at("t.a_i64").int_at(0) == -(std::int64_t{1} << 40));
    CHECK(f.at("t.a_f32").float_at(0) == 10.0);
    CHECK(f.at("t.a_f32").float_at(1) == -0.5);
    CHECK(f.at("t.a_f64").float_at(0) == 1e-300);
    CHECK(f.at("t.a_i32").float_at(1) == 2.0);
    CHECK(f.at("t.a_bool").bool_at(0));
    CHECK(!f.at("t.a_bool").bool_at(1));
    // 27 keys were added, plus general.alignment when it is not the default.
    CHECK(f.metadata().size() == 27 + (alignment != 32 ? 1 : 0));
    CHECK(f.find("t.missing") == nullptr);

    REQUIRE(f.tensors().size() == round_trip_tensors.size());
    std::uint64_t prev_end = f.data_offset();
    for (std::size_t i = 0; i < round_trip_tensors.size(); ++i) {
        const tensor_spec& spec = round_trip_tensors[i];
        const tensor_info& t = f.tensor(spec.name);
        CAPTURE(spec.name);
        CHECK(&t == &f.tensors()[i]);
        CHECK(t.type == spec.type);
        CHECK(t.dims == spec.dims);
        CHECK(t.n_bytes == spec.n_bytes);
        CHECK(t.file_offset == f.data_offset() + t.offset);
        CHECK(t.offset % alignment == 0);
        CHECK(t.file_offset >= prev_end);
        prev_end = t.file_offset + t.n_bytes;
        REQUIRE(data[i].size() == t.n_bytes);
        CHECK(std::memcmp(t.data, data[i].data(), t.n_bytes) == 0);
    }
    CHECK(f.size() % alignment == 0);
}

// A small valid file built with the writer, for the truncation and flip tests.
std::vector<std::byte> small_valid_file(std::mt19937_64& rng) {
    const auto path = temp_path("small.gguf");
    {
        writer w(path);
        w.add_string("general.architecture", "deepseek4");
        w.add_u32("deepseek4.block_count", 43);
        w.add_f32("deepseek4.rope.freq_base", 10000.0f);
        w.add_bool("deepseek4.expert_weights_norm", true);
        w.add_array("tokenizer.ggml.tokens", {"<s>", "a", "bc"});
        w.add_array_i32("deepseek4.attention.compress_ratios", {0, 0, 4, 128});
        w.add_tensor("a.weight", ggml_type::q8_0, {32, 2});
        w.add_tensor("b.weight", ggml_type::f32, {3});
        w.begin_data();
        w.write(random_bytes(rng, 68));
        w.write(random_bytes(rng, 12));
        w.finish();
    }
    auto bytes = read_all(path);
    std::filesystem::remove(path);
    return bytes;
}

// Touches everything an accepted file exposes, so a flipped length that slipped through
// validation would show up as an out-of-bounds read under the sanitizers.
void touch_everything(const file& f) {
    for (const value& v : f.metadata()) {
        try {
            if (v.type() == value_type::string) (void)v.as_string();
            if (v.type() == value_type::array) {
                if (v.array_type() == value_type::string) (void)v.strings();
                for (std::uint64_t i = 0; i < v.size() && i < 16; ++i) {
                    if (is_integer_type(v.array_type())) (void)v.int_at(i);
                    if (v.array_type() == value_type::f32) (void)v.float_at(i);
                }
            } else if (v.type() != value_type::string) {
                (void)v.as_f64();
            }
        } catch (const ds4::error&) {
            // An accessor may legitimately refuse (a u64 above INT64_MAX read as i64).
        }
    }
    std::uint64_t sum = 0;
    for (const tensor_info& t : f.tensors())
        for (std::uint64_t i = 0; i < t.n_bytes; ++i) sum += std::to_integer<unsigned>(t.data[i]);
    (void)sum;
}

}  // namespace

TEST_CASE("gguf: writer and reader round trip every value type and tensor types at several alignments") {
    auto rng = seeded_rng();
    for (std::uint32_t alignment : {32u, 1u, 64u, 4096u}) {
        CAPTURE(alignment);
        const auto path = temp_path("round_trip_" + std::to_string(alignment) + ".gguf");
        const auto data = write_sample(path, alignment, rng);
        {
            const file mapped = file::open(path);
            CHECK(mapped.path() == path.string());
            check_sample(mapped, alignment, data);
            // A moved-from file leaves the views valid in the new owner.
            file moved = file::open(path);
            file target = std::move(moved);
            check_sample(target, alignment, data);
            // After release the pages come back from the file unchanged.
            const tensor_info& t = target.tensor("blk.0.ffn_down_exps.weight");
            target.release(t);
            CHECK(std::memcmp(t.data, data[2].data(), t.n_bytes) == 0);
        }
        const file in_memory = file::from_bytes(read_all(path), "memory.gguf");
        check_sample(in_memory, alignment, data);
        in_memory.release(in_memory.tensors()[0]);  // no-op without a mapping
        std::filesystem::remove(path);
    }
}

TEST_CASE("gguf: nested arrays are read up to the depth limit") {
    raw_builder b;
    b.header(0, 1).str("nested").type(value_type::array).type(value_type::array).u64(2);
    b.type(value_type::u32).u64(2).u32(7).u32(8);
    b.type(value_type::string).u64(1).str("deep");
    const file f = file::from_bytes(b.take(), "nested.gguf");
    const value& v = f.at("nested");
    CHECK(v.array_type() == value_type::array);
    REQUIRE(v.size() == 2);
    CHECK(v.element(0).int_at(1) == 8);
    CHECK(v.element(1).string_at(0) == "deep");
    CHECK(v.element(1).key() == "nested[1]");
    CHECK_THROWS_AS((void)v.element(2), ds4::error);
}

TEST_CASE("gguf: value accessors name the key and the actual type") {
    raw_builder b;
    b.header(0, 4).kv("k.u32", value_type::u32, std::uint32_t{5}).kv("k.neg", value_type::i32, std::int32_t{-5});
    b.kv("k.big", value_type::u64, std::uint64_t{1} << 63).kv_string("k.s", "x");
    const file f = file::from_bytes(b.take(), "acc.gguf");
    CHECK_THROWS_WITH_AS((void)f.at("k.u32").as_string(), "acc.gguf: key 'k.u32' at byte 24: is u32, not a string",
                         ds4::error);
    CHECK_THROWS_WITH_AS((void)f.at("k.neg").as_u64(), doctest::Contains("negative"), ds4::error);
    CHECK_THROWS_WITH_AS((void)f.at("k.big").as_i64(), doctest::Contains("does not fit an i64"), ds4::error);
    CHECK_THROWS_WITH_AS((void)f.at("k.s").as_bool(), doctest::Contains("is string, not a bool"), ds4::error);
    CHECK_THROWS_WITH_AS((void)f.at("k.s").size(), doctest::Contains("not an array"), ds4::error);
    CHECK_THROWS_WITH_AS((void)f.at("k.missing"), "acc.gguf: missing key 'k.missing'", ds4::error);
    CHECK_THROWS_WITH_AS((void)f.tensor("t.missing"), "acc.gguf: missing tensor 't.missing'", ds4::error);
    CHECK(f.at("k.neg").as_f64() == -5.0);

    raw_builder a;
    a.header(0, 1).str("arr").type(value_type::array).type(value_type::f32).u64(2).put(1.0f).put(2.0f);
    const file g = file::from_bytes(a.take(), "acc.gguf");
    CHECK_THROWS_WITH_AS((void)g.at("arr").int_at(0), doctest::Contains("array of 2 f32, not an array of integers"),
                         ds4::error);
    CHECK_THROWS_WITH_AS((void)g.at("arr").float_at(2), doctest::Contains("index 2 is out of range (size 2)"),
                         ds4::error);
    CHECK_THROWS_WITH_AS((void)g.at("arr").string_at(0), doctest::Contains("not an array of strings"), ds4::error);
}

TEST_CASE("gguf: malformed corpus, one file per failure kind") {
    int cases = 0;
    auto reject = [&](const std::string& kind, raw_builder& b, std::vector<std::string> pieces) {
        ++cases;
        expect_rejected(kind, b.take(), std::move(pieces));
    };
    // One valid tensor layout reused below: a Q8_0 [32, 2] tensor is 68 bytes.
    auto with_tensor_header = [](raw_builder& b, std::uint64_t n_tensors) { b.header(n_tensors, 0); };

    { raw_builder b; b.u32(file_magic).u32(3).u32(0); reject("truncated header", b, {"header", "truncated", "tensor count"}); }
    { raw_builder b; b.u32(0x46554746).u32(3).u64(0).u64(0); reject("bad magic", b, {"header at byte 0", "bad magic", "GGUF"}); }
    { raw_builder b; b.header(0, 0, 2); reject("bad version", b, {"header at byte 4", "version 2"}); }
    { raw_builder b; b.header(0, 1).str("general.name").type(value_type::string).u64(100).u32(0);
      reject("string past end", b, {"key 'general.name' at byte 48", "length 100", "runs past the end"}); }
    { raw_builder b; b.header(0, 1).u64(1000).zeros(20);
      reject("key past end", b, {"key #0 at byte 24", "runs past the end"}); }
    { raw_builder b; b.header(0, 1).kv("k", value_type::u32, std::uint16_t{1});
      reject("scalar past end", b, {"key 'k'", "u32 value runs past the end"}); }
    { raw_builder b; b.header(0, 1).str("arr").type(value_type::array).type(value_type::u32).u64(1000).u32(1);
      reject("array past end", b, {"key 'arr'", "array of 1000 u32 runs past the end"}); }
    { raw_builder b; b.header(0, 1).str("arr").type(value_type::array).type(value_type::u64).u64(std::uint64_t{1} << 62);
      b.u64(0); reject("array count overflow", b, {"key 'arr'", "runs past the end"}); }
    { raw_builder b; b.header(0, 1).str("tokenizer.ggml.tokens").type(value_type::array).type(value_type::string).u64(2);
      b.str("a").u64(50).u32(0);
      reject("string element past end", b, {"key 'tokenizer.ggml.tokens'", "string element 1", "runs past the end"}); }
    { raw_builder b; b.header(0, std::uint64_t{1} << 62).zeros(64); reject("kv count overflow", b, {"key/value count", "count overflow"}); }
    { raw_builder b; b.header(std::uint64_t{1} << 60, 0).zeros(64); reject("tensor count overflow", b, {"tensor count", "count overflow"}); }
    { raw_builder b; b.header(0, 1).str("k").u32(13).u32(0); reject("unknown value type", b, {"key 'k'", "unknown value type id 13"}); }
    { raw_builder b; b.header(0, 1).str("k").type(value_type::array).u32(77).u64(0);
      reject("unknown array element type", b, {"key 'k'", "unknown array element type id 77"}); }
    { raw_builder b; b.header(0, 1).str("k").type(value_type::array).type(value_type::array).u64(1);
      b.type(value_type::array).u64(1).type(value_type::array).u64(1).type(value_type::u8).u64(0);
      reject("nesting too deep", b, {"key 'k'", "nested deeper than 3"}); }
    { raw_builder b; b.header(0, 1).kv("k", value_type::boolean, std::uint8_t{2}); reject("bad bool", b, {"key 'k'", "must be 0 or 1"}); }
    { raw_builder b; b.header(0, 2).kv("dup", value_type::u32, 1u).kv("dup", value_type::u32, 2u);
      reject("duplicate key", b, {"key 'dup' at byte 43", "duplicate key", "first at byte 24"}); }
    { raw_builder b; b.header(0, 1).kv("general.alignment", value_type::u32, 48u);
      reject("alignment not a power of two", b, {"key 'general.alignment'", "48", "power of two"}); }
    { raw_builder b; b.header(0, 1).kv("general.alignment", value_type::u32, 0u);
      reject("alignment zero", b, {"key 'general.alignment'", "power of two"}); }
    { raw_builder b; b.header(0, 1).kv("general.alignment", value_type::u64, std::uint64_t{32});
      reject("alignment not u32", b, {"key 'general.alignment'", "must be a u32", "u64"}); }
    { raw_builder b; with_tensor_header(b, 1); b.tensor("t.name", {32, 2}, ggml_type::q8_0, 0).u32(0);
      b.patch<std::uint64_t>(24, 500); reject("tensor name past end", b, {"tensor #0 at byte 24", "runs past the end"}); }
    { raw_builder b; with_tensor_header(b, 1); b.tensor("blk.0.attn_q_a.weight", {32, 2}, ggml_type::q8_0, 0);
      b.pad_to(32).zeros(60);
      reject("tensor data past end", b, {"tensor 'blk.0.attn_q_a.weight' at byte 24", "data [96, 164)",
                                          "runs past the end of the file (156 bytes)"}); }
    { raw_builder b; with_tensor_header(b, 1); b.tensor("t", {32, 2}, ggml_type::q8_0, std::uint64_t{1} << 63 | 32);
      b.pad_to(32).zeros(96);
      reject("tensor offset outside the data section", b, {"tensor 't'", "runs past the end of the file"}); }
    { raw_builder b; with_tensor_header(b, 1); b.tensor("t", {32, 2}, ggml_type::q8_0, 0xFFFFFFFFFFFFFFE0ull);
      b.pad_to(32).zeros(96); reject("tensor offset overflow", b, {"tensor 't'", "overflow", "runs past the end"}); }
    { raw_builder b; with_tensor_header(b, 1); b.tensor("t", {32, 2}, ggml_type::q8_0, 16).pad_to(32).zeros(96);
      reject("tensor offset not aligned", b, {"tensor 't' at byte 24", "data offset 16 is not aligned to 32"}); }
    { raw_builder b; with_tensor_header(b, 2);
      b.tensor("first", {32, 2}, ggml_type::q8_0, 0).tensor("second", {32, 1}, ggml_type::q8_0, 64);
      b.pad_to(32).zeros(160);
      reject("overlapping tensors", b, {"tensor 'second'", "overlaps tensor 'first'"}); }
    { raw_builder b; with_tensor_header(b, 2);
      b.tensor("same", {32, 1}, ggml_type::q8_0, 0).tensor("same", {32, 1}, ggml_type::q8_0, 64);
      b.pad_to(32).zeros(160); reject("duplicate tensor", b, {"tensor 'same'", "duplicate tensor name"}); }
    { raw_builder b; with_tensor_header(b, 1); b.tensor("t", {32}, 99u, 0).pad_to(32).zeros(128);
      reject("unknown tensor type", b, {"tensor 't'", "unknown tensor type id 99"}); }
    { raw_builder b; with_tensor_header(b, 1); b.tensor("t", {32}, 4u, 0).pad_to(32).zeros(128);
      reject("removed tensor type id", b, {"tensor 't'", "unknown tensor type id 4"}); }
    { raw_builder b; with_tensor_header(b, 1); b.tensor("t", {}, ggml_type::f32, 0).pad_to(32).zeros(128);
      reject("n_dims 0", b, {"tensor 't'", "n_dims = 0"}); }
    { raw_builder b; with_tensor_header(b, 1); b.tensor("t", {1, 1, 1, 1, 1}, ggml_type::f32, 0).pad_to(32).zeros(128);
      reject("n_dims 5", b, {"tensor 't'", "n_dims = 5"}); }
    { raw_builder b; with_tensor_header(b, 1); b.tensor("t", {4, 0}, ggml_type::f32, 0).pad_to(32).zeros(128);
      reject("zero dim", b, {"tensor 't'", "dimension 1 is zero"}); }
    { raw_builder b; with_tensor_header(b, 1);
      b.tensor("t", {std::uint64_t{1} << 32, std::uint64_t{1} << 32}, ggml_type::f32, 0).pad_to(32).zeros(128);
      reject("element count overflow", b, {"tensor 't'", "element count overflows 64 bits"}); }
    { raw_builder b; with_tensor_header(b, 1);
      b.tensor("t", {std::uint64_t{1} << 31, std::uint64_t{1} << 31}, ggml_type::f32, 0).pad_to(32).zeros(128);
      reject("byte size overflow", b, {"tensor 't'", "byte size overflows 64 bits"}); }
    { raw_builder b; with_tensor_header(b, 1); b.tensor("blk.0.ffn_down_exps.weight", {100, 2}, ggml_type::q2_k, 0);
      b.pad_to(32).zeros(1024);
      reject("ne0 not a multiple of the block", b, {"tensor 'blk.0.ffn_down_exps.weight'", "ne0 = 100",
                                                     "not a multiple of the block size 256 of Q2_K"}); }
    { raw_builder b; with_tensor_header(b, 1); b.tensor("t", {32, 2}, ggml_type::q8_0, 0);
      b.patch<std::uint32_t>(b.size() - 12, 0xFFFF);  // overwrite the type with an out-of-range id
      b.pad_to(32).zeros(96); reject("type id far out of range", b, {"tensor 't'", "unknown tensor type id 65535"}); }
    MESSAGE(cases << " malformed files rejected");
    CHECK(cases == 35);
}

TEST_CASE("gguf: every truncation of a valid file is rejected cleanly") {
    auto rng = seeded_rng();
    const auto bytes = small_valid_file(rng);
    const file whole = file::from_bytes(bytes, "small.gguf");
    touch_everything(whole);
    // The writer pads the end to the alignment; prefixes that still hold every tensor are valid.
    std::uint64_t needed = 0;
    for (const tensor_info& t : whole.tensors()) needed = std::max(needed, t.file_offset + t.n_bytes);
    for (std::uint64_t n = 0; n < bytes.size(); ++n) {
        CAPTURE(n);
        std::vector<std::byte> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
        if (n < needed) {
            CHECK_THROWS_AS((void)file::from_bytes(std::move(prefix), "cut.gguf"), ds4::error);
        } else {
            CHECK_NOTHROW((void)file::from_bytes(std::move(prefix), "cut.gguf"));
        }
    }
}

TEST_CASE("gguf: random byte flips in the header region never crash") {
    auto rng = seeded_rng();
    const auto bytes = small_valid_file(rng);
    const std::uint64_t header_bytes = file::from_bytes(bytes, "x").data_offset();
    int accepted = 0, rejected = 0;
    for (int round = 0; round < 20000; ++round) {
        auto mutated = bytes;
        const int flips = 1 + static_cast<int>(rng() % 4);
        for (int k = 0; k < flips; ++k) {
            const std::uint64_t at = rng() % header_bytes;
            // Half the time a single bit, half the time a whole random byte (lengths jump far).
            mutated[at] = (rng() & 1) ? mutated[at] ^ static_cast<std::byte>(1u << (rng() % 8))
                                      : static_cast<std::byte>(rng());
        }
        try {
            const file f = file::from_bytes(std::move(mutated), "flip.gguf");
            touch_everything(f);
            ++accepted;
        } catch (const ds4::error&) {
            ++rejected;
        }
    }
    MESSAGE(accepted << " accepted, " << rejected << " rejected");
    CHECK(rejected > 0);
}

TEST_CASE("gguf: open reports missing and non-GGUF files") {
    CHECK_THROWS_WITH_AS((void)file::open("/nonexistent/x.gguf"), doctest::Contains("/nonexistent/x.gguf: cannot open"),
                         ds4::error);
    const auto empty = temp_path("empty.gguf");
    { std::ofstream(empty.string()); }
    CHECK_THROWS_WITH_AS((void)file::open(empty), doctest::Contains("truncated"), ds4::error);
    std::filesystem::remove(empty);
}

TEST_CASE("gguf: writer misuse is an error") {
    const auto path = temp_path("misuse.gguf");
    std::vector<std::byte> chunk(100);
    {
        writer w(path);
        w.add_u32("k", 1);
        CHECK_THROWS_WITH_AS(w.add_u32("k", 2), doctest::Contains("key 'k': duplicate key"), ds4::error);
        CHECK_THROWS_WITH_AS(w.add_u64("general.alignment", 64), doctest::Contains("must be a u32"), ds4::error);
        CHECK_THROWS_AS(w.set_alignment(3), ds4::error);
        CHECK_THROWS_AS(w.set_alignment(0), ds4::error);
        CHECK_THROWS_WITH_AS(w.add_tensor("q", ggml_type::q2_k, {100}), doctest::Contains("not a multiple of the block"),
                             ds4::error);
        CHECK_THROWS_WITH_AS(w.add_tensor("z", ggml_type::f32, {4, 0}), doctest::Contains("dimension 1 is zero"),
                             ds4::error);
        CHECK_THROWS_WITH_AS(w.write(chunk), doctest::Contains("write before begin_data"), ds4::error);
        CHECK_THROWS_WITH_AS(w.finish(), doctest::Contains("finish before begin_data"), ds4::error);
        w.add_tensor("a", ggml_type::f32, {10});
        w.add_tensor("b", ggml_type::f32, {10});
        CHECK_THROWS_WITH_AS(w.add_tensor("a", ggml_type::f32, {2}), doctest::Contains("duplicate tensor"), ds4::error);
        w.begin_data();
        CHECK_THROWS_WITH_AS(w.add_u32("late", 1), doctest::Contains("after begin_data"), ds4::error);
        CHECK_THROWS_WITH_AS(w.add_tensor("late", ggml_type::f32, {1}), doctest::Contains("after begin_data"), ds4::error);
        CHECK_THROWS_WITH_AS(w.write(std::span(chunk).first(41)), doctest::Contains("tensor 'a': too many bytes"),
                             ds4::error);
        w.write(std::span(chunk).first(40));
        w.write(std::span(chunk).first(30));
        CHECK_THROWS_WITH_AS(w.finish(), doctest::Contains("tensor 'b': too few bytes: got 30 of 40"), ds4::error);
        w.write(std::span(chunk).first(10));
        CHECK_THROWS_WITH_AS(w.write(std::span(chunk).first(1)), doctest::Contains("too many bytes"), ds4::error);
        w.finish();
        CHECK_THROWS_AS(w.finish(), ds4::error);
    }
    const file f = file::open(path);
    CHECK(f.tensors().size() == 2);
    CHECK(f.at("k").as_u64() == 1);
    std::filesystem::remove(path);
}

TEST_CASE("gguf: alignment key written by set_alignment or given explicitly") {
    const auto path = temp_path("align.gguf");
    {
        writer w(path);
        w.add_u32("general.alignment", 256);
        CHECK_THROWS_AS(w.set_alignment(64), ds4::error);
        w.add_tensor("t", ggml_type::f32, {3});
        w.add_tensor("u", ggml_type::f32, {3});
        w.begin_data();
        CHECK(w.data_offset() % 256 == 0);
        std::vector<std::byte> twelve(12);
        w.write(twelve);
        w.write(twelve);
        w.finish();
    }
    const file f = file::open(path);
    CHECK(f.alignment() == 256);
    CHECK(f.metadata().size() == 1);
    CHECK(f.tensor("u").offset == 256);
    std::filesystem::remove(path);
}

TEST_CASE("gguf: writer streams into /dev/null") {
    // ~1 GiB in 4 MiB chunks (the buffered path) reports the writer's own overhead.
    constexpr std::uint64_t tensor_elems = std::uint64_t{64} << 20;  // 256 MiB of f32 each
    writer w("/dev/null");
    for (const char* name : {"t0", "t1", "t2", "t3"}) w.add_tensor(name, ggml_type::f32, {tensor_elems});
    w.begin_data();
    std::vector<std::byte> chunk(std::size_t{4} << 20, std::byte{0x5a});
    const auto t0 = std::chrono::steady_clock::now();
    for (std::uint64_t done = 0; done < 4 * tensor_elems * 4; done += chunk.size()) w.write(chunk);
    w.finish();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(w.bytes_written() == w.data_offset() + 4 * tensor_elems * 4);
    MESSAGE("writer to /dev/null: " << (static_cast<double>(4 * tensor_elems * 4) / s / 1e9) << " GB/s");
}
