// ds4-synth (harness/synth/): synthesise -> read -> validate at tiny and small, reproducibility,
// the tokenizer arrays, the hash-routing table and the weight statistics.
//
// The weight checks decode through the format headers' own dequantize (include/ds4/format/),
// not through the generator's arithmetic, so a wrong scale constant in the generator shows up
// as an RMS outside the band.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q4_k.hpp"
#include "ds4/format/q8_0.hpp"
#include "ds4/gguf/reader.hpp"
#include "ds4/model/validate.hpp"
#include "harness/synth/generator.hpp"
#include "harness/synth/summary.hpp"
#include "text/bpe_trainer.hpp"
#include "text/tokenizer.hpp"

using namespace ds4;

namespace {

std::filesystem::path temp_dir() {
    const auto dir = std::filesystem::path(DS4_BINARY_DIR) / "synth_test_tmp";
    std::filesystem::create_directories(dir);
    return dir;
}

std::filesystem::path synthesise(const model::model_dims& d, const std::string& name, std::uint64_t seed,
                                 int threads = 2, bool mtp = false) {
    const auto path = temp_dir() / name;
    synth::write_options opt;
    opt.seed = seed;
    opt.threads = threads;
    const synth::write_result r = mtp ? synth::write_mtp(path, d, opt) : synth::write_model(path, d, opt);
    REQUIRE_FALSE(r.truncated);
    REQUIRE(r.file_bytes == std::filesystem::file_size(path));
    return path;
}

// FNV-1a over the whole file: enough to tell two files apart, and independent of the generator.
std::uint64_t file_hash(const std::filesystem::path& p) {
    const gguf::file f = gguf::file::open(p);
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (std::byte b : f.bytes()) h = (h ^ static_cast<std::uint8_t>(b)) * 0x100000001b3ull;
    return h;
}

struct moments {
    double sum = 0, sum2 = 0;
    std::uint64_t n = 0, non_finite = 0;
    void add(float v) {
        if (!std::isfinite(v)) {
            ++non_finite;
            return;
        }
        sum += v, sum2 += double(v) * v, ++n;
    }
    double rms() const { return std::sqrt(sum2 / double(n)); }
    double mean() const { return sum / double(n); }
};

// Decodes up to `max_blocks` blocks spread over the tensor (a stride, so every expert and row
// region is sampled) with the format header's dequantize.
template <class Block>
moments decode_sample(const gguf::tensor_info& t, std::uint64_t max_blocks, int elems) {
    const std::uint64_t n_blocks = t.n_bytes / sizeof(Block);
    const std::uint64_t stride = std::max<std::uint64_t>(1, n_blocks / max_blocks);
    moments m;
    std::vector<float> out(static_cast<std::size_t>(elems));
    for (std::uint64_t b = 0; b < n_blocks; b += stride) {
        Block blk;
        std::memcpy(&blk, t.data + b * sizeof(Block), sizeof(Block));
        dequantize(blk, out.data());
        for (float v : out) m.add(v);
    }
    return m;
}

moments decode_tensor(const gguf::tensor_info& t, std::uint64_t max_blocks = 4096) {
    switch (t.type) {
        case ggml_type::q8_0: return decode_sample<q8_0_block>(t, max_blocks, 32);
        case ggml_type::q2_k: return decode_sample<q2_k_block>(t, max_blocks, 256);
        case ggml_type::q4_k: return decode_sample<q4_k_block>(t, max_blocks, 256);
        case ggml_type::iq2_xxs: return decode_sample<iq2_xxs_block>(t, max_blocks, 256);
        case ggml_type::f16: {
            moments m;
            for (std::uint64_t i = 0; i < t.n_elements; ++i) {
                std::uint16_t h;
                std::memcpy(&h, t.data + 2 * i, 2);
                m.add(f16_to_f32(h));
            }
            return m;
        }
        case ggml_type::f32: {
            moments m;
            for (std::uint64_t i = 0; i < t.n_elements; ++i) {
                float v;
                std::memcpy(&v, t.data + 4 * i, 4);
                m.add(v);
            }
            return m;
        }
        default: FAIL("no decoder for " << t.name); return {};
    }
}

// Statistics every synthetic file must meet. The projection band: target 0.02 +- 12% (the
// sample error at 4096 blocks is well under 1%; F16 rounding of the block scale is < 0.1%).
void check_weights(const gguf::file& f, const model::model_dims& d, bool base_model = true) {
    for (const gguf::tensor_info& t : f.tensors()) {
        CAPTURE(t.name);
        if (t.type == ggml_type::i32) continue;
        const moments m = decode_tensor(t);
        REQUIRE(m.non_finite == 0);
        const std::string_view n = t.name;
        if (n.ends_with("norm.weight")) {
            CHECK(std::sqrt(m.sum2 / m.n) == doctest::Approx(1.0).epsilon(0.1));
        } else if (n.ends_with("_scale.weight")) {
            CHECK(m.mean() > 0.04);
            CHECK(m.mean() < 0.16);
        } else if (n.ends_with("_base.weight") || n.ends_with("attn_sinks.weight") || n.ends_with(".bias")) {
            CHECK(m.rms() < 0.5);
        } else {
            CHECK(m.rms() > 0.0176);
            CHECK(m.rms() < 0.0224);
            CHECK(std::fabs(m.mean()) < 0.1 * m.rms());
        }
    }
    // The hash tables (base model only): n_expert_used distinct valid expert ids per token.
    for (int il = 0; base_model && il < d.n_hash_layer; ++il) {
        const gguf::tensor_info& t = f.tensor("blk." + std::to_string(il) + ".ffn_gate_tid2eid.weight");
        REQUIRE(t.dims == std::vector<std::uint64_t>{6, static_cast<std::uint64_t>(d.n_vocab)});
        std::vector<std::int32_t> ids(t.n_elements);
        std::memcpy(ids.data(), t.data, t.n_bytes);
        std::vector<std::uint64_t> per_expert(static_cast<std::size_t>(d.n_expert));
        bool all_ok = true;
        for (int tok = 0; tok < d.n_vocab; ++tok) {
            std::set<std::int32_t> row;
            for (int s = 0; s < 6; ++s) {
                const std::int32_t e = ids[static_cast<std::size_t>(tok) * 6 + s];
                all_ok = all_ok && e >= 0 && e < d.n_expert;
                if (e >= 0 && e < d.n_expert) ++per_expert[static_cast<std::size_t>(e)];
                row.insert(e);
            }
            all_ok = all_ok && row.size() == 6;
        }
        CHECK(all_ok);
        // Every expert is used by some token (6 * n_vocab draws over n_expert experts).
        CHECK(*std::min_element(per_expert.begin(), per_expert.end()) > 0);
    }
}

}  // namespace

TEST_CASE("tiny: synthesise, read, validate against the declared shape, check the weights") {
    const model::model_dims d = model::dims_of<model::tiny_shape>();
    const auto path = synthesise(d, "tiny.gguf", 1);
    const gguf::file f = gguf::file::open(path);
    const model::validation_report r = model::validate_declared(f);
    CHECK_MESSAGE(r.ok(), r.to_string());
    CHECK(model::expected_dims(f) == d);
    CHECK(model::dims_from_gguf(f) == d);
    CHECK(f.at("general.architecture").as_string() == "deepseek4");
    CHECK(f.at("tokenizer.ggml.model").as_string() == "gpt2");
    CHECK(f.at("tokenizer.ggml.pre").as_string() == "joyai-llm");
    // Every tensor of the inventory, in inventory order, and nothing else.
    const auto inv = model::model_inventory(d);
    REQUIRE(f.tensors().size() == inv.size());
    for (std::size_t i = 0; i < inv.size(); ++i) CHECK(f.tensors()[i].name == inv[i].name);
    check_weights(f, d);
}

TEST_CASE("tiny MTP: synthesise, read, validate, check the weights") {
    const model::model_dims d = model::dims_of<model::tiny_shape>();
    const auto path = synthesise(d, "tiny-mtp.gguf", 1, 2, true);
    const gguf::file f = gguf::file::open(path);
    CHECK(synth::is_mtp_file(f));
    const model::validation_report r = synth::validate_file(f);
    CHECK_MESSAGE(r.ok(), r.to_string());
    CHECK(f.tensor("mtp.0.ffn_gate_exps.weight").type == ggml_type::q4_k);
    CHECK(f.find_tensor("token_embd.weight") == nullptr);
    check_weights(f, d, false);
}

TEST_CASE("tokenizer arrays: bytes, merges, each special token exactly once, unique fillers") {
    const model::model_dims d = model::dims_of<model::tiny_shape>();
    const gguf::file f = gguf::file::open(synthesise(d, "tok.gguf", 5));
    const std::vector<std::string_view> tokens = f.at(model::tokens_key).strings();
    const std::vector<std::string_view> merges = f.at(model::merges_key).strings();
    REQUIRE(tokens.size() == static_cast<std::size_t>(d.n_vocab));
    CHECK(merges.size() > 500);  // the corpus supports far more than a toy vocabulary
    // The 256 byte tokens come first, in GPT-2 mapped form.
    for (int b = 0; b < 256; ++b) CHECK(tokens[static_cast<std::size_t>(b)] == ref::byte_to_unicode(std::uint8_t(b)));
    const std::unordered_set<std::string_view> unique(tokens.begin(), tokens.end());
    CHECK(unique.size() == tokens.size());
    for (const std::string& s : ref::ds4_special_tokens()) {
        CAPTURE(s);
        CHECK(std::count(tokens.begin(), tokens.end(), s) == 1);
    }
    // BOS/EOS ids point at the DS4 strings.
    const auto specials = ref::ds4_special_tokens();
    CHECK(tokens[f.at("tokenizer.ggml.bos_token_id").as_u64()] == specials[0]);
    CHECK(tokens[f.at("tokenizer.ggml.eos_token_id").as_u64()] == specials[1]);
    // Every merge joins two tokens into a token.
    bool merges_ok = true;
    for (std::string_view m : merges) {
        const auto sp = m.find(' ');
        if (sp == std::string_view::npos) {
            merges_ok = false;
            continue;
        }
        const std::string left(m.substr(0, sp)), right(m.substr(sp + 1));
        merges_ok = merges_ok && unique.count(left) && unique.count(right) && unique.count(left + right);
    }
    CHECK(merges_ok);
    // The reference tokenizer loads it and round-trips text with a special token.
    std::vector<std::string> tok_strings(tokens.begin(), tokens.end()), merge_strings(merges.begin(), merges.end());
    const ref::tokenizer tk(tok_strings, merge_strings);
    CHECK(tk.bos_id() == static_cast<std::int32_t>(f.at("tokenizer.ggml.bos_token_id").as_u64()));
    const std::string text = "<｜User｜>Hello, world! 模型 has 43 layers.\n<｜Assistant｜>";
    const std::vector<std::int32_t> ids = tk.encode(text, true);
    CHECK(ids.front() == tk.user_id());
    CHECK(ids.back() == tk.assistant_id());
    CHECK(ids.size() < text.size() / 2);  // the merges compress ordinary text
    CHECK(tk.decode(ids) == text);
}

TEST_CASE("reproducible: same seed -> same bytes for any thread count; another seed -> other weights") {
    const model::model_dims d = model::dims_of<model::tiny_shape>();
    const std::uint64_t a = file_hash(synthesise(d, "seed7a.gguf", 7, 2));
    const std::uint64_t b = file_hash(synthesise(d, "seed7b.gguf", 7, 1));
    const std::uint64_t c = file_hash(synthesise(d, "seed7c.gguf", 7, 3));
    const std::uint64_t e = file_hash(synthesise(d, "seed8.gguf", 8, 2));
    CHECK(a == b);
    CHECK(a == c);
    CHECK(a != e);
    // Same layout, different data: the directory is identical, every large tensor differs.
    const gguf::file f7 = gguf::file::open(temp_dir() / "seed7a.gguf");
    const gguf::file f8 = gguf::file::open(temp_dir() / "seed8.gguf");
    REQUIRE(f7.size() == f8.size());
    for (std::size_t i = 0; i < f7.tensors().size(); ++i) {
        const auto& t7 = f7.tensors()[i];
        const auto& t8 = f8.tensors()[i];
        CHECK(t7.file_offset == t8.file_offset);
        if (t7.n_bytes >= 64) CHECK(std::memcmp(t7.data, t8.data, t7.n_bytes) != 0);
    }
    // Distinct tensors get distinct streams (no two Q8_0 tensors start alike).
    CHECK(std::memcmp(f7.tensor("blk.0.attn_q_a.weight").data, f7.tensor("blk.1.attn_q_a.weight").data, 256) != 0);
}

TEST_CASE("limit-bytes stops early and leaves no finished file") {
    const model::model_dims d = model::dims_of<model::tiny_shape>();
    synth::write_options opt;
    opt.limit_bytes = 1 << 20;
    const synth::write_result r = synth::write_model(temp_dir() / "cut.gguf", d, opt);
    CHECK(r.truncated);
    CHECK(r.data_bytes <= opt.limit_bytes);
    CHECK_THROWS_AS(gguf::file::open(temp_dir() / "cut.gguf"), ds4::error);
}

TEST_CASE("small (~1.2 GB): synthesise, read, validate, sample the weights") {
    const model::model_dims d = model::dims_of<model::small_shape>();
    const auto t0 = std::chrono::steady_clock::now();
    const auto path = synthesise(d, "small.gguf", 3);
    const double write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
        const gguf::file f = gguf::file::open(path);
        const model::validation_report r = model::validate_declared(f);
        CHECK_MESSAGE(r.ok(), r.to_string());
        CHECK(model::expected_dims(f) == d);
        // Sample rather than decode all 1.2 GB: the experts, a Q8_0 projection, the embedding.
        for (const char* name : {"blk.5.ffn_gate_exps.weight", "blk.6.ffn_down_exps.weight", "blk.7.attn_q_b.weight",
                                 "output.weight"}) {
            CAPTURE(name);
            const moments m = decode_tensor(f.tensor(name));
            CHECK(m.non_finite == 0);
            CHECK(m.rms() > 0.0176);
            CHECK(m.rms() < 0.0224);
        }
    }
    MESSAGE("small: " << std::filesystem::file_size(path) / 1e9 << " GB written in " << write_s << " s");
    std::filesystem::remove(path);
}

TEST_CASE("the ds4-synth command line writes the same bytes and validates with --summary") {
    const auto exe = std::filesystem::path(DS4_BINARY_DIR) / "harness" / "ds4-synth";
    if (!std::filesystem::exists(exe)) {
        MESSAGE("ds4-synth not built; skipping the command-line check");
        return;
    }
    const auto out = temp_dir() / "cli.gguf";
    const auto mtp = temp_dir() / "cli-mtp.gguf";
    const std::string cmd = exe.string() + " --preset tiny --seed 7 --out " + out.string() + " --mtp " + mtp.string() +
                            " > " + (temp_dir() / "cli.log").string() + " 2>&1";
    REQUIRE(std::system(cmd.c_str()) == 0);
    CHECK(file_hash(out) == file_hash(synthesise(model::dims_of<model::tiny_shape>(), "seed7.gguf", 7)));
    CHECK(std::system((exe.string() + " --summary " + out.string() + " > /dev/null").c_str()) == 0);
    CHECK(std::system((exe.string() + " --summary " + mtp.string() + " > /dev/null").c_str()) == 0);
    // A bad argument is an error exit with a message, not a crash.
    CHECK(std::system((exe.string() + " --preset huge --out /dev/null 2> /dev/null").c_str()) != 0);
    CHECK(std::system((exe.string() + " --preset tiny --layers 5 --out /dev/null 2> /dev/null").c_str()) != 0);
    CHECK(std::system((exe.string() + " --preset tiny --layers 7 --out /dev/null 2> /dev/null").c_str()) != 0);

    // --layers: small's first 6 of 8 layers under the custom preset, checked by the loader's
    // structural rules; every tensor of the 6-layer inventory and nothing of layers 6 and 7.
    const auto cut = temp_dir() / "small6.gguf";
    REQUIRE(std::system((exe.string() + " --preset small --layers 6 --out " + cut.string() + " > /dev/null 2>&1").c_str()) == 0);
    {
        const gguf::file f = gguf::file::open(cut);
        model::model_dims want = model::dims_of<model::small_shape>();
        want.n_layer = 6;
        want.compress_ratios = {0, 0, 4, 128, 4, 128};
        want.preset = "custom";
        CHECK(model::expected_dims(f) == want);
        const model::validation_report r = model::validate_declared(f);
        CHECK_MESSAGE(r.ok(), r.to_string());
        const auto inv = model::model_inventory(want);
        REQUIRE(f.tensors().size() == inv.size());
        for (std::size_t i = 0; i < inv.size(); ++i) CHECK(f.tensors()[i].name == inv[i].name);
        CHECK(f.find_tensor("blk.5.attn_q_b.weight") != nullptr);
        CHECK(f.find_tensor("blk.6.attn_q_b.weight") == nullptr);
    }
    std::filesystem::remove_all(temp_dir());
}
