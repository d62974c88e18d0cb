// Hostile model files (issue 16): files crafted to hurt the GGUF reader or the model validator
// must get a ds4::error naming the field, with time and memory bounded by the file's size. Each
// case is built here with the project's writer or raw builder; the limits are docs/gguf-limits.md.
//
// Checked std::vector::operator[] in this program: the first case is an out-of-bounds read that
// an unchecked build would let pass silently.
#define _GLIBCXX_ASSERTIONS 1

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
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
#include "tests/support/gguf_raw_builder.hpp"

// Counts what the program allocates while a scope is open: the structural check that parsing
// costs memory in proportion to the bytes, not to the key length times the element count or to
// a header's claims. Replacing the global operator new is the only way to see the reader's own
// allocations (std::string, std::vector) without instrumenting it.
namespace {
struct alloc_stats {
    bool on = false;
    std::uint64_t count = 0;
    std::uint64_t bytes = 0;
};
alloc_stats g_alloc;
}  // namespace

[[gnu::noinline]] void* operator new(std::size_t n) {
    if (g_alloc.on) {
        ++g_alloc.count;
        g_alloc.bytes += n;
    }
    if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
    throw std::bad_alloc();
}
// Not inlined: GCC would otherwise pair the inlined free with a new-expression and warn
// (-Wmismatched-new-delete), though replacement new allocates with malloc.
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

using namespace ds4;
using namespace ds4::model;
using gguf::raw_builder;
using gguf::value_type;

namespace {

struct counted {
    counted() { g_alloc = {true, 0, 0}; }
    ~counted() { g_alloc.on = false; }
    alloc_stats stop() {
        g_alloc.on = false;
        return g_alloc;
    }
};

constexpr std::uint64_t mib = 1 << 20;

std::filesystem::path temp_dir() {
    const auto dir = std::filesystem::path(DS4_BINARY_DIR) / "gguf_hostile_test_tmp";
    std::filesystem::create_directories(dir);
    return dir;
}

// The §5.2 keys of `d` (custom preset unless told otherwise), no tensors: enough for
// dims_from_gguf, expected_dims and the key half of the validator.
gguf::file keys_file(const model_dims& d, const std::string& name) {
    const auto path = temp_dir() / (name + ".gguf");
    {
        gguf::writer w(path);
        write_model_keys(w, d);
        w.begin_data();
        w.finish();
    }
    return gguf::file::open(path);
}

model_dims custom_tiny() {
    model_dims d = dims_of<tiny_shape>();
    d.preset = std::string(custom_preset);
    return d;
}

std::string message_of(const auto& call) {
    try {
        call();
    } catch (const ds4::error& e) {
        return e.what();
    }
    return "(no error)";
}

}  // namespace

TEST_CASE("hostile: a 1-layer custom file stops at block_count, never reads compress_ratios[3]") {
    for (int n_layer : {1, 3, 5}) {
        CAPTURE(n_layer);
        model_dims d = custom_tiny();
        d.n_layer = n_layer;
        d.compress_ratios.resize(static_cast<std::size_t>(n_layer));
        const gguf::file f = keys_file(d, "layers_" + std::to_string(n_layer));
        const std::string m = message_of([&] { (void)validate_declared(f); });
        CHECK(m.find("block_count " + std::to_string(n_layer) + " < 6") != std::string::npos);
        CHECK(m.find("compress_ratios") == std::string::npos);
        // The same straight on the run-time rules, which read the vector (checked here).
        model_dims read = dims_from_gguf(f);
        REQUIRE(read.compress_ratios.size() == static_cast<std::size_t>(n_layer));
        for (const std::string& v : rule_violations(read)) CHECK(v.find("compress_ratios") == std::string::npos);
    }
}

TEST_CASE("hostile: every declared dimension is bounded, and derived sizes are checked in 64 bits") {
    // embedding_length = 2^30 (4 x n_embd overflows int in hc_dim) names the key and the value.
    model_dims big = custom_tiny();
    big.n_embd = 1 << 30;
    const std::string m = message_of([&] { (void)dims_from_gguf(keys_file(big, "embd_2p30")); });
    CHECK(m.find("deepseek4.embedding_length") != std::string::npos);
    CHECK(m.find("1073741824") != std::string::npos);
    CHECK(m.find("outside") != std::string::npos);

    // Every integer key, one past its bound, is rejected naming that key. The writer stores u32,
    // so a bound of INT32_MAX would let 2^31..2^32-1 through as negative ints; each bound is far below.
    for (const int_key& k : int_keys()) {
        CAPTURE(k.key);
        REQUIRE(k.max <= (1 << 24));
        if (k.field == nullptr) continue;  // optional keys are compared, never read into a shape
        model_dims d = custom_tiny();
        d.*k.field = k.max + 1;
        // key_length and value_length share head_dim: the first key read with the field is named.
        std::string_view named = k.key;
        for (const int_key& first : int_keys())
            if (first.field == k.field) {
                named = first.key;
                break;
            }
        const std::string err = message_of([&] { (void)dims_from_gguf(keys_file(d, "over")); });
        CHECK(err.find(std::string(named)) != std::string::npos);
        CHECK(err.find(std::to_string(k.max + 1)) != std::string::npos);
    }
    // context_length and the ratio entries are bounded too (2^32 + 4 must not pass for 4).
    {
        const auto path = temp_dir() / "ratio_wrap.gguf";
        {
            gguf::writer w(path);
            write_model_keys(w, custom_tiny(), compress_ratios_key);
            w.add_array_u64(std::string(compress_ratios_key), {0, 0, 4, 16, (std::uint64_t{1} << 32) + 4, 16, 0});
            w.begin_data();
            w.finish();
        }
        const std::string err = message_of([&] { (void)dims_from_gguf(gguf::file::open(path)); });
        CAPTURE(err);
        CHECK(err.find("compress_ratios[4]' = 4294967300") != std::string::npos);
    }

    // At the bounds every derived size fits: worked by hand, 2^10 heads x 2^16 = 2^26.
    model_dims at = custom_tiny();
    at.n_head = 1 << 10, at.head_dim = 1 << 16, at.n_embd = 1 << 16, at.n_hc = 64;
    at.n_out_group = 1 << 10, at.n_lora_o = 1 << 16, at.n_indexer_head = 1 << 10, at.indexer_head_dim = 1 << 16;
    CHECK(at.q_dim() == 67108864);
    CHECK(at.group_in() == 65536);
    CHECK(at.lora_o_total() == 67108864);
    CHECK(at.hc_dim() == 4194304);
    CHECK(at.hc_mix() == 2 * 64 + 64 * 64);
    CHECK(at.indexer_q_dim() == 67108864);
    CHECK(at.compressor_width(4, 1 << 16) == 131072);

    // A shape built by hand past them is an error, never a wrapped int.
    model_dims h = custom_tiny();
    h.n_embd = 1 << 30;
    CHECK_THROWS_WITH_AS((void)h.hc_dim(), doctest::Contains("hc_dim"), ds4::error);
    h = custom_tiny();
    h.n_head = 1 << 20, h.head_dim = 1 << 16;
    CHECK_THROWS_WITH_AS((void)h.q_dim(), doctest::Contains("q_dim"), ds4::error);
    CHECK_THROWS_WITH_AS((void)h.group_in(), doctest::Contains("q_dim"), ds4::error);
    h = custom_tiny();
    h.n_out_group = 1 << 16, h.n_lora_o = 1 << 16;
    CHECK_THROWS_WITH_AS((void)h.lora_o_total(), doctest::Contains("lora_o_total"), ds4::error);
    h = custom_tiny();
    h.n_indexer_head = 1 << 20, h.indexer_head_dim = 1 << 16;
    CHECK_THROWS_WITH_AS((void)h.indexer_q_dim(), doctest::Contains("indexer_q_dim"), ds4::error);
    CHECK_THROWS_WITH_AS((void)h.compressor_width(4, 1 << 30), doctest::Contains("compressor_width"), ds4::error);
    h = custom_tiny();
    h.n_out_group = 0;
    CHECK_THROWS_WITH_AS((void)h.group_in(), doctest::Contains("output_group_count"), ds4::error);
    h = custom_tiny();
    h.n_hc = 1 << 20;
    CHECK_THROWS_WITH_AS((void)h.hc_mix(), doctest::Contains("hc_mix"), ds4::error);
}

TEST_CASE("hostile: float keys outside f32's range are errors, not undefined conversions") {
    auto with = [&](std::string_view key, auto add) {
        const auto path = temp_dir() / "float.gguf";
        {
            gguf::writer w(path);
            write_model_keys(w, custom_tiny(), key);
            add(w, std::string(key));
            w.begin_data();
            w.finish();
        }
        return message_of([&] { (void)dims_from_gguf(gguf::file::open(path)); });
    };
    const std::string huge = with("deepseek4.rope.freq_base", [](gguf::writer& w, std::string k) { w.add_f64(k, 1e300); });
    CHECK(huge.find("key 'deepseek4.rope.freq_base'") != std::string::npos);
    CHECK(huge.find("is not a finite f32") != std::string::npos);
    const std::string nan = with("deepseek4.attention.layer_norm_rms_epsilon", [](gguf::writer& w, std::string k) {
        w.add_f64(k, std::numeric_limits<double>::quiet_NaN());
    });
    CHECK(nan.find("layer_norm_rms_epsilon") != std::string::npos);
    const std::string clamp = with(swiglu_clamp_key, [](gguf::writer& w, std::string k) {
        w.add_array_f64(k, std::vector<double>(7, -1e40));
    });
    CHECK(clamp.find("swiglu_clamp_exp[0]' = ") != std::string::npos);
}

TEST_CASE("hostile: nested arrays under a long key parse in memory linear in the file") {
    // An array of n empty u8 arrays under a 60000-byte key. Naming each element "key[i]" while
    // parsing cost n x 60000 bytes (6 GB here); the names are now built only for an error.
    const std::string key(60000, 'k');
    auto build = [&](std::uint64_t n, std::uint64_t bad_at = UINT64_MAX) {
        raw_builder b;
        b.header(0, 1).str(key).type(value_type::array).type(value_type::array).u64(n);
        for (std::uint64_t i = 0; i < n; ++i) b.type(i == bad_at ? static_cast<value_type>(99) : value_type::u8).u64(0);
        return b.take();
    };
    auto parse_counted = [&](std::uint64_t n) {
        std::vector<std::byte> bytes = build(n);
        const std::uint64_t size = bytes.size();
        counted c;
        const gguf::file f = gguf::file::from_bytes(std::move(bytes), "nested.gguf");
        const alloc_stats s = c.stop();
        CHECK(f.at(key).size() == n);
        return std::pair{s, size};
    };
    const auto small_run = parse_counted(1000);
    const auto large_run = parse_counted(300000);  // 3.7 MB
    const alloc_stats small = small_run.first, large = large_run.first;
    const std::uint64_t large_size = large_run.second;
    CAPTURE(small.bytes);
    CAPTURE(large.bytes);
    // The number of allocations does not grow with the element count (one offsets vector), and
    // the bytes are the offsets (8 per element) plus the key twice (value and index): below the
    // file's own size.
    CHECK(large.count == small.count);
    CHECK(large.bytes <= large_size);
    CHECK(large.bytes - small.bytes <= 8 * (300000 - 1000) + 64);

    // An error deep in the array still names the element.
    const std::string m = message_of([&] { (void)gguf::file::from_bytes(build(200000, 123456), "nested.gguf"); });
    CHECK(m.find("element [123456]") != std::string::npos);
    CHECK(m.find("unknown array element type id 99") != std::string::npos);
    CHECK(m.size() < key.size() + 200);

    // The accessor names the element it returns (built on request, once).
    const gguf::file f = gguf::file::from_bytes(build(10), "nested.gguf");
    const gguf::value e = f.at(key).element(7);
    CHECK(e.size() == 0);
    CHECK(e.key() == key + "[7]");
}

TEST_CASE("hostile: header counts never reserve beyond what the bytes can hold") {
    // Counts above the caps, in a file that could otherwise hold them.
    {
        raw_builder b;
        b.header(0, gguf::max_kv_count + 1).zeros((gguf::max_kv_count + 1) * 13);
        CHECK_THROWS_WITH_AS((void)gguf::file::from_bytes(b.take(), "kv.gguf"),
                             doctest::Contains("key/value count 65537 exceeds the limit of 65536"), ds4::error);
    }
    {
        raw_builder b;
        b.header(gguf::max_tensor_count + 1, 0).zeros((gguf::max_tensor_count + 1) * 32);
        CHECK_THROWS_WITH_AS((void)gguf::file::from_bytes(b.take(), "t.gguf"),
                             doctest::Contains("tensor count 65537 exceeds the limit of 65536"), ds4::error);
    }
    // Lengths past their limits are rejected before the bytes are looked for.
    {
        raw_builder b;
        b.header(0, 1).u64(gguf::max_key_length + 1).zeros(64);
        CHECK_THROWS_WITH_AS((void)gguf::file::from_bytes(b.take(), "k.gguf"),
                             doctest::Contains("key of length 65536 exceeds the limit of 65535"), ds4::error);
    }
    {
        raw_builder b;
        b.header(0, 1).str("s").type(value_type::string).u64(gguf::max_string_length + 1);
        CHECK_THROWS_WITH_AS((void)gguf::file::from_bytes(b.take(), "s.gguf"),
                             doctest::Contains("string value of length 16777217 exceeds the limit"), ds4::error);
    }
    {
        raw_builder b;
        b.header(1, 0).u64(gguf::max_name_length + 1).zeros(64);
        CHECK_THROWS_WITH_AS((void)gguf::file::from_bytes(b.take(), "n.gguf"),
                             doctest::Contains("tensor name of length 65536 exceeds the limit"), ds4::error);
    }
    {
        raw_builder b;
        b.header(0, 1).str("a").type(value_type::array).type(value_type::u8).u64(gguf::max_array_length + 1);
        b.zeros(gguf::max_array_length + 1);
        CHECK_THROWS_WITH_AS((void)gguf::file::from_bytes(b.take(), "a.gguf"),
                             doctest::Contains("array of 16777217 u8 exceeds the limit"), ds4::error);
    }

    // A 4 GiB sparse file (no disk used) whose header claims what the size could hold: the
    // reader must answer with ds4::error and a few kilobytes, not reserve ~11x the file.
    const auto path = temp_dir() / "sparse.gguf";
    constexpr std::uint64_t size = std::uint64_t{4} << 30;
    auto sparse = [&](raw_builder& b) {
        {
            std::ofstream out(path, std::ios::binary | std::ios::trunc);
            out.write(reinterpret_cast<const char*>(b.bytes().data()), static_cast<std::streamsize>(b.size()));
        }
        const int fd = ::open(path.c_str(), O_WRONLY);
        REQUIRE(fd >= 0);
        REQUIRE(::ftruncate(fd, static_cast<off_t>(size)) == 0);
        ::close(fd);
    };
    auto open_counted = [&](const std::string& want) {
        counted c;
        CHECK_THROWS_WITH_AS((void)gguf::file::open(path), doctest::Contains(want.c_str()), ds4::error);
        const alloc_stats s = c.stop();
        CHECK(s.bytes < 64 * mib);
    };
    {
        raw_builder b;
        b.header(0, (size - 24) / 13);
        sparse(b);
        open_counted("key/value count 330382097 exceeds the limit");
    }
    {
        raw_builder b;
        b.header((size - 24) / 32, 0);
        sparse(b);
        open_counted("tensor count 134217727 exceeds the limit");
    }
    {
        // Counts under the caps: zeros read as the empty key (u8 0) twice.
        raw_builder b;
        b.header(gguf::max_tensor_count, gguf::max_kv_count);
        sparse(b);
        open_counted("duplicate key");
    }
    {
        // A string array as long as the zeros could hold: past the array limit.
        raw_builder b;
        b.header(0, 1).str("tokenizer.ggml.tokens").type(value_type::array).type(value_type::string);
        b.u64((size - b.size() - 8) / 8);
        sparse(b);
        open_counted("exceeds the limit of 16777216 elements");
    }
    std::filesystem::remove(path);
}

TEST_CASE("hostile: a 100,000-layer custom file is rejected at block_count in bounded memory") {
    model_dims d = custom_tiny();
    d.n_layer = 100000;
    d.compress_ratios.assign(100000, 16);
    const gguf::file f = keys_file(d, "layers_100k");
    counted c;
    const std::string m = message_of([&] { (void)validate_declared(f); });
    const alloc_stats s = c.stop();
    CHECK(m.find("deepseek4.block_count") != std::string::npos);
    CHECK(m.find("100000") != std::string::npos);
    CHECK(s.bytes < 64 * mib);
    // A hand-built shape is held to the same bound by the validator.
    CHECK_THROWS_WITH_AS((void)validate(f, d), doctest::Contains("block_count 100000"), ds4::error);
}

TEST_CASE("hostile: the validator records the first differences and counts the rest") {
    // The largest accepted custom shape with no tensors at all: every required tensor is missing.
    model_dims d = custom_tiny();
    d.n_layer = dims_limits::max_layers;
    d.compress_ratios.clear();
    for (int il = 0; il < d.n_layer; ++il) d.compress_ratios.push_back(ratio_rule(il, 2, 4, 16));
    const gguf::file f = keys_file(d, "layers_max");
    std::size_t required = 0;
    for (const tensor_spec& t : model_inventory(d)) required += t.required();
    // Two arrays the keys file lacks: the tokenizer's.
    const std::size_t want = required + 2;
    REQUIRE(want > validation_report::max_recorded);
    counted c;
    const validation_report r = validate_declared(f);
    const alloc_stats s = c.stop();
    CHECK(r.differences.size() == validation_report::max_recorded);
    CHECK(r.n_unrecorded == want - validation_report::max_recorded);
    CHECK(r.count() == want);
    CHECK_FALSE(r.ok());
    CHECK(s.bytes < 64 * mib);
    const std::string text = r.to_string();
    CHECK(text.find(std::to_string(want) + " difference(s)") != std::string::npos);
    CHECK(text.find("... and " + std::to_string(want - 40) + " more") != std::string::npos);
    std::filesystem::remove_all(temp_dir());
}
