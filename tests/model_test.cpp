// The model shape, the tensor inventory and the validator (include/ds4/model/).
//
// Expected values come from docs/model.md, not from the code under test: the per-tensor byte sizes
// and totals of the §5.3 table, the ratio rule of §1, the MTP list of §4. The validator is fed
// files written with the GGUF writer from an otherwise-valid tiny layout with known differences
// injected, and must report exactly those.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ds4/gguf/reader.hpp"
#include "ds4/gguf/writer.hpp"
#include "ds4/model/metadata.hpp"
#include "ds4/model/shape.hpp"
#include "ds4/model/tensors.hpp"
#include "ds4/model/validate.hpp"

using namespace ds4;
using namespace ds4::model;

namespace {

// The name by value: GCC 13+ flags a reference returned from a call that bound a temporary
// std::string (-Wdangling-reference), which -Werror turned into a build failure there.
const tensor_spec& find(const std::vector<tensor_spec>& inv, std::string_view name) {
    const auto it = std::find_if(inv.begin(), inv.end(), [&](const tensor_spec& t) { return t.name == name; });
    REQUIRE_MESSAGE(it != inv.end(), std::string(name));
    return *it;
}
bool has(const std::vector<tensor_spec>& inv, const std::string& name) {
    return std::any_of(inv.begin(), inv.end(), [&](const tensor_spec& t) { return t.name == name; });
}

}  // namespace

TEST_CASE("flash ratio rule: 2 window-only, 21 ratio-4 (even), 20 ratio-128 (odd) layers") {
    const model_dims d = dims_of<flash_shape>();
    REQUIRE(d.compress_ratios.size() == 43);
    int zero = 0, four = 0, long_ = 0;
    for (int il = 0; il < 43; ++il) {
        const int want = il < 2 ? 0 : (il % 2 == 0 ? 4 : 128);  // ds4.c:411 as docs/model.md §1 states it
        CHECK(d.ratio_of(il) == want);
        CHECK(ratio_of<flash_shape>(il) == want);
        CHECK(d.has_indexer(il) == (want == 4));
        CHECK(d.is_hash_layer(il) == (il < 3));
        zero += want == 0, four += want == 4, long_ += want == 128;
    }
    CHECK(zero == 2);
    CHECK(four == 21);
    CHECK(long_ == 20);
}

TEST_CASE("reduced shapes keep every structural rule") {
    for (const model_dims& d : {dims_of<small_shape>(), dims_of<tiny_shape>()}) {
        CAPTURE(d.preset);
        CHECK(rule_violations(d).empty());
        CHECK(d.ratio_of(0) == 0);
        CHECK(d.ratio_of(1) == 0);
        CHECK(d.ratio_of(2) == 4);  // hash-routed and indexed
        CHECK(d.ratio_of(3) > 4);
        CHECK(d.ratio_of(4) == 4);  // learned routing and indexed
        CHECK(d.n_hc == 4);
        CHECK(d.head_dim - d.n_rot >= 64);
        CHECK((d.head_dim - d.n_rot) % 64 == 0);
        CHECK(d.indexer_head_dim == 128);
    }
    const model_dims t = dims_of<tiny_shape>();
    CHECK(t.n_swa <= 32);
    CHECK(t.indexer_top_k <= 16);
    // The tiny file is a few MB, the small one about a GB.
    CHECK(total_bytes(model_inventory(t)) < 20'000'000);
    const std::uint64_t small = total_bytes(model_inventory(dims_of<small_shape>()));
    CHECK(small > 800'000'000);
    CHECK(small < 1'500'000'000);
    CHECK(rule_violations(dims_of<flash_shape>()).empty());
}

TEST_CASE("flash inventory: every row of the docs/model.md §5.3 table") {
    const model_dims d = dims_of<flash_shape>();
    const auto inv = model_inventory(d);
    // 6 globals; 23 tensors in every layer; exp_probs_b on 40 learned-routing layers;
    // 4 compressor tensors on 41 compressed layers; 6 indexer tensors on 21; 3 hash tables.
    CHECK(inv.size() == 6 + 43 * 23 + 40 + 41 * 4 + 21 * 6 + 3);

    struct row {
        const char* name;
        ggml_type type;
        std::vector<std::uint64_t> dims;
        std::uint64_t bytes;
    };
    using enum ggml_type;
    const std::vector<row> table{
        {"token_embd.weight", f16, {4096, 129280}, 1'059'061'760},
        {"output_hc_base.weight", f32, {4}, 16},
        {"output_hc_fn.weight", f16, {16384, 4}, 131'072},
        {"output_hc_scale.weight", f32, {1}, 4},
        {"output_norm.weight", f32, {4096}, 16'384},
        {"output.weight", q8_0, {4096, 129280}, 562'626'560},
        {"blk.7.hc_attn_fn.weight", f16, {16384, 24}, 786'432},
        {"blk.7.hc_ffn_fn.weight", f16, {16384, 24}, 786'432},
        {"blk.7.hc_attn_scale.weight", f32, {3}, 12},
        {"blk.7.hc_ffn_base.weight", f32, {24}, 96},
        {"blk.7.attn_norm.weight", f32, {4096}, 16'384},
        {"blk.7.attn_q_a.weight", q8_0, {4096, 1024}, 4'456'448},
        {"blk.7.attn_q_a_norm.weight", f32, {1024}, 4'096},
        {"blk.7.attn_q_b.weight", q8_0, {1024, 32768}, 35'651'584},
        {"blk.7.attn_kv.weight", q8_0, {4096, 512}, 2'228'224},
        {"blk.7.attn_kv_a_norm.weight", f32, {512}, 2'048},
        {"blk.7.attn_sinks.weight", f32, {64}, 256},
        {"blk.7.attn_output_a.weight", q8_0, {4096, 8192}, 35'651'584},
        {"blk.7.attn_output_b.weight", q8_0, {8192, 4096}, 35'651'584},
        {"blk.8.attn_compressor_ape.weight", f16, {1024, 4}, 8'192},
        {"blk.7.attn_compressor_ape.weight", f16, {512, 128}, 131'072},
        {"blk.8.attn_compressor_kv.weight", f16, {4096, 1024}, 8'388'608},
        {"blk.7.attn_compressor_gate.weight", f16, {4096, 512}, 4'194'304},
        {"blk.7.attn_compressor_norm.weight", f32, {512}, 2'048},
        {"blk.8.indexer.attn_q_b.weight", f16, {1024, 8192}, 16'777'216},
        {"blk.8.indexer.proj.weight", f16, {4096, 64}, 524'288},
        {"blk.8.indexer_compressor_ape.weight", f16, {256, 4}, 2'048},
        {"blk.8.indexer_compressor_kv.weight", f16, {4096, 256}, 2'097'152},
        {"blk.8.indexer_compressor_gate.weight", f16, {4096, 256}, 2'097'152},
        {"blk.8.indexer_compressor_norm.weight", f32, {128}, 512},
        {"blk.7.ffn_gate_inp.weight", f16, {4096, 256}, 2'097'152},
        {"blk.7.exp_probs_b.bias", f32, {256}, 1'024},
        {"blk.7.ffn_gate_exps.weight", iq2_xxs, {4096, 2048, 256}, 553'648'128},
        {"blk.7.ffn_up_exps.weight", iq2_xxs, {4096, 2048, 256}, 553'648'128},
        {"blk.7.ffn_down_exps.weight", q2_k, {2048, 4096, 256}, 704'643'072},
        {"blk.7.ffn_gate_shexp.weight", q8_0, {4096, 2048}, 8'912'896},
        {"blk.7.ffn_down_shexp.weight", q8_0, {2048, 4096}, 8'912'896},
        {"blk.2.ffn_gate_tid2eid.weight", i32, {6, 129280}, 3'102'720},
    };
    for (const row& r : table) {
        CAPTURE(r.name);
        const tensor_spec& t = find(inv, r.name);
        CHECK(t.type == r.type);
        CHECK(t.dims == r.dims);
        CHECK(t.n_bytes() == r.bytes);
    }
    // Presence rules.
    CHECK_FALSE(has(inv, "blk.1.attn_compressor_kv.weight"));
    CHECK_FALSE(has(inv, "blk.7.indexer.proj.weight"));
    CHECK_FALSE(has(inv, "blk.3.ffn_gate_tid2eid.weight"));
    CHECK(has(inv, "blk.42.indexer.proj.weight"));
    CHECK(has(inv, "blk.41.attn_compressor_norm.weight"));
    CHECK(find(inv, "blk.7.exp_probs_b.bias").when == presence::optional);
    CHECK(find(inv, "blk.0.ffn_gate_tid2eid.weight").when == presence::hash);
    // Expert alternatives and the gate/up pairing.
    const tensor_spec& up = find(inv, "blk.5.ffn_up_exps.weight");
    CHECK(up.accepts(q4_k));
    CHECK(up.accepts(q2_k));
    CHECK_FALSE(up.accepts(q8_0));
    CHECK(up.same_type_as == "blk.5.ffn_gate_exps.weight");

    // Totals of §5.3: 86.71 GB = 80.76 GiB; experts 77.9 GB (IQ2_XXS 47.6, Q2_K 30.3).
    const std::uint64_t total = total_bytes(inv);
    CHECK(total > 86'705'000'000ull);
    CHECK(total < 86'715'000'000ull);
    CHECK(total / 1073741824.0 == doctest::Approx(80.76).epsilon(0.0002));
    std::map<ggml_type, std::uint64_t> by_type;
    for (const tensor_spec& t : inv) by_type[t.type] += t.n_bytes();
    CHECK(by_type[iq2_xxs] / 1e9 == doctest::Approx(47.6).epsilon(0.002));
    CHECK(by_type[q2_k] / 1e9 == doctest::Approx(30.3).epsilon(0.002));
}

TEST_CASE("flash MTP inventory (docs/model.md §4)") {
    const auto inv = mtp_inventory(dims_of<flash_shape>());
    // 8 head tensors; 12 attention-side; 5 FFN-side + the required router bias; 6 experts.
    CHECK(inv.size() == 8 + 12 + 6 + 6);
    using enum ggml_type;
    CHECK(find(inv, "mtp.0.e_proj.weight").type == q8_0);
    CHECK(find(inv, "mtp.0.h_proj.weight").dims == std::vector<std::uint64_t>{4096, 4096});
    CHECK(find(inv, "mtp.0.hc_head_fn.weight").dims == std::vector<std::uint64_t>{16384, 4});
    CHECK(find(inv, "mtp.0.hc_head_fn.weight").accepts(f16));
    CHECK(find(inv, "mtp.0.exp_probs_b.bias").required());
    CHECK(find(inv, "mtp.0.ffn_gate_exps.weight").type == q4_k);
    CHECK(find(inv, "mtp.0.ffn_down_exps.weight").type == q4_k);
    CHECK(find(inv, "mtp.0.ffn_up_shexp.weight").type == q8_0);
    for (const tensor_spec& t : inv) {
        CHECK(t.name.find("compressor") == std::string::npos);
        CHECK(t.name.find("indexer") == std::string::npos);
        CHECK(t.name.find("tid2eid") == std::string::npos);
    }
    // "about 3.5 GB" (download_model.sh): the Q4_K experts are 3 x 1.18 GB.
    CHECK(total_bytes(inv) / 1073741824.0 == doctest::Approx(3.55).epsilon(0.01));
}

// ----------------------------------------------------------------------------------------------
// Validator on written files.

namespace {

// What to write: the keys of `keys` (minus `omit_key`), tokenizer arrays, and `tensors`.
struct recipe {
    model_dims keys = dims_of<tiny_shape>();
    std::vector<tensor_spec> tensors = model_inventory(dims_of<tiny_shape>());
    std::string omit_key;
    int n_tokens = tiny_shape::n_vocab;

    tensor_spec& tensor(const std::string& name) {
        const auto it = std::find_if(tensors.begin(), tensors.end(), [&](const tensor_spec& t) { return t.name == name; });
        REQUIRE_MESSAGE(it != tensors.end(), name);
        return *it;
    }
    void drop(const std::string& name) {
        const auto n = tensors.size();
        std::erase_if(tensors, [&](const tensor_spec& t) { return t.name == name; });
        REQUIRE(tensors.size() == n - 1);
    }
};

std::filesystem::path temp_dir() {
    const auto dir = std::filesystem::path(DS4_BINARY_DIR) / "model_test_tmp";
    std::filesystem::create_directories(dir);
    return dir;
}

gguf::file write(const recipe& r, const std::string& name) {
    const auto path = temp_dir() / (name + ".gguf");
    {
        gguf::writer w(path);
        w.add_string("general.architecture", "deepseek4");
        write_model_keys(w, r.keys, r.omit_key);
        std::vector<std::string> tokens;
        for (int i = 0; i < r.n_tokens; ++i) tokens.push_back("t" + std::to_string(i));
        w.add_array(std::string(tokens_key), tokens);
        w.add_array(std::string(merges_key), {"t 0"});
        for (const tensor_spec& t : r.tensors) w.add_tensor(t.name, t.type, t.dims);
        w.begin_data();
        static const std::vector<std::byte> zeros(1 << 20);
        for (const tensor_spec& t : r.tensors)
            for (std::uint64_t left = t.n_bytes(); left > 0;) {
                const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, zeros.size()));
                w.write(std::span<const std::byte>(zeros.data(), n));
                left -= n;
            }
        w.finish();
    }
    return gguf::file::open(path);
}

std::vector<std::string> subjects(const validation_report& r) {
    std::vector<std::string> s;
    for (const difference& d : r.differences) s.push_back(d.subject);
    return s;
}

}  // namespace

TEST_CASE("validator: a valid tiny layout has no differences, and reads back its shape") {
    const gguf::file f = write(recipe{}, "valid");
    const validation_report r = validate(f, dims_of<tiny_shape>());
    CHECK_MESSAGE(r.ok(), r.to_string());
    CHECK(dims_from_gguf(f) == dims_of<tiny_shape>());
    CHECK(expected_dims(f) == dims_of<tiny_shape>());
    CHECK(validate_declared(f).ok());
    CHECK_NOTHROW(require_valid(f, dims_of<tiny_shape>()));
    // The same file is nothing like flash.
    CHECK(validate(f, dims_of<flash_shape>()).differences.size() > 100);
}

TEST_CASE("validator: tensor differences are reported exactly, all of them") {
    recipe r;
    r.tensor("blk.2.attn_q_b.weight").type = ggml_type::f16;           // wrong type
    r.tensor("blk.3.attn_kv.weight").dims[1] += 32;                    // wrong dim
    r.tensor("output_hc_scale.weight").dims = {1, 1};                  // wrong ndim
    r.drop("blk.4.indexer.proj.weight");                               // missing
    r.drop("blk.5.exp_probs_b.bias");                                  // optional: not a difference
    r.tensor("blk.4.ffn_up_exps.weight").type = ggml_type::q2_k;       // accepted type, but != gate
    auto& t = r.tensor("blk.1.attn_sinks.weight");                     // type and dims both wrong
    t.type = ggml_type::f16;
    t.dims = {16};
    const validation_report rep = validate(write(r, "tensors"), dims_of<tiny_shape>());
    CAPTURE(rep.to_string());
    REQUIRE(rep.differences.size() == 7);
    const std::vector<std::string> want{"blk.1.attn_sinks.weight",    "blk.1.attn_sinks.weight",
                                        "blk.2.attn_q_b.weight",      "blk.3.attn_kv.weight",
                                        "blk.4.indexer.proj.weight",  "blk.4.ffn_up_exps.weight",
                                        "output_hc_scale.weight"};
    CHECK(subjects(rep) == want);
    using k = difference_kind;
    CHECK(rep.differences[0].kind == k::tensor_type);
    CHECK(rep.differences[1].kind == k::tensor_dims);
    CHECK(rep.differences[2].kind == k::tensor_type);
    CHECK(rep.differences[2].found == "F16");
    CHECK(rep.differences[2].expected == "Q8_0");
    CHECK(rep.differences[3].kind == k::tensor_dims);
    CHECK(rep.differences[3].found == "[256, 160]");
    CHECK(rep.differences[3].expected == "[256, 128]");
    CHECK(rep.differences[4].kind == k::missing_tensor);
    CHECK(rep.differences[5].kind == k::tensor_type_pair);
    CHECK(rep.differences[6].kind == k::tensor_dims);
    CHECK(rep.differences[6].found == "[1, 1]");

    // The throwing variant names the tensors.
    try {
        require_valid(rep);
        FAIL("require_valid did not throw");
    } catch (const ds4::error& e) {
        const std::string m = e.what();
        CHECK(m.find("blk.4.indexer.proj.weight") != std::string::npos);
        CHECK(m.find("blk.2.attn_q_b.weight") != std::string::npos);
        CHECK(m.find("7 difference") != std::string::npos);
    }
}

TEST_CASE("validator: all-Q4_K experts (the q4 model) are accepted") {
    recipe r;
    for (tensor_spec& t : r.tensors)
        if (t.base.ends_with("_exps.weight")) t.type = ggml_type::q4_k;
    const validation_report rep = validate(write(r, "q4k"), dims_of<tiny_shape>());
    CHECK_MESSAGE(rep.ok(), rep.to_string());
}

TEST_CASE("validator: key differences are reported with expected and found values") {
    recipe r;
    r.keys.n_head = 7;                    // wrong integer value (the tensors stay right)
    r.keys.rms_eps = 1.1e-6f;             // float beyond the 1e-6 relative tolerance
    r.keys.rope_freq_base = 10000.001f;   // within it (1e-7 relative)
    r.keys.compress_ratios[3] = 8;        // one wrong ratio entry
    r.omit_key = "deepseek4.expert_used_count";
    r.n_tokens = tiny_shape::n_vocab - 1;  // vocabulary one short
    const validation_report rep = validate(write(r, "keys"), dims_of<tiny_shape>());
    CAPTURE(rep.to_string());
    const std::vector<std::string> want{"deepseek4.attention.head_count", "deepseek4.expert_used_count",
                                        "deepseek4.attention.layer_norm_rms_epsilon",
                                        "deepseek4.attention.compress_ratios[3]", "tokenizer.ggml.tokens"};
    CHECK(subjects(rep) == want);
    REQUIRE(rep.differences.size() == 5);
    CHECK(rep.differences[0].expected == "8");
    CHECK(rep.differences[0].found == "7");
    CHECK(rep.differences[1].kind == difference_kind::missing_key);
    CHECK(rep.differences[2].kind == difference_kind::key_value);
    CHECK(rep.differences[3].expected == "16");
    CHECK(rep.differences[3].found == "8");
    CHECK(rep.differences[4].found == "1535 entries");
    CHECK_THROWS_WITH_AS(require_valid(rep), doctest::Contains("deepseek4.attention.head_count"), ds4::error);
}

TEST_CASE("validator: short compress_ratios and a wrong swiglu clamp") {
    recipe r;
    r.keys.compress_ratios.resize(4);  // written as 4 + the trailing MTP entry: 5 < 6 layers
    const validation_report rep = validate(write(r, "short_ratios"), dims_of<tiny_shape>());
    CAPTURE(rep.to_string());
    REQUIRE(rep.differences.size() == 1);
    CHECK(rep.differences[0].subject == "deepseek4.attention.compress_ratios");
    CHECK(rep.differences[0].found == "5 entries");
    CHECK(rep.differences[0].expected == ">= 6 entries");

    recipe c;
    c.keys.swiglu_clamp_exp = 9.0f;
    const validation_report rc = validate(write(c, "clamp"), dims_of<tiny_shape>());
    CHECK(rc.differences.size() == 6);  // one per layer entry
    CHECK(rc.differences.front().subject == "deepseek4.swiglu_clamp_exp[0]");
}

TEST_CASE("expected_dims: flash without a preset key, presets by name, custom by its own keys") {
    recipe no_preset;
    no_preset.keys.preset.clear();
    const gguf::file f = write(no_preset, "no_preset");
    CHECK(expected_dims(f) == dims_of<flash_shape>());  // a shipped file: the flash constants rule
    CHECK_FALSE(validate_declared(f).ok());
    // dims_from_gguf still reads what the file says.
    model_dims declared = dims_from_gguf(f);
    CHECK(declared.n_layer == tiny_shape::n_layer);
    CHECK(declared.preset.empty());

    recipe custom;
    custom.keys.preset = std::string(custom_preset);
    const gguf::file fc = write(custom, "custom");
    model_dims want = dims_of<tiny_shape>();
    want.preset = "custom";
    CHECK(expected_dims(fc) == want);
    CHECK(validate_declared(fc).ok());

    recipe broken;
    broken.keys.preset = std::string(custom_preset);
    broken.keys.compress_ratios[2] = 8;  // breaks the ratio-4-on-even-layers rule
    CHECK_THROWS_WITH_AS(expected_dims(write(broken, "custom_broken")), doctest::Contains("compress_ratios[2]"),
                         ds4::error);

    recipe unknown;
    unknown.keys.preset = "huge";
    CHECK_THROWS_WITH_AS(expected_dims(write(unknown, "unknown_preset")), doctest::Contains("ds4.synth.preset"),
                         ds4::error);

    recipe missing;
    missing.omit_key = "deepseek4.attention.sliding_window";
    CHECK_THROWS_WITH_AS(dims_from_gguf(write(missing, "missing_key")),
                         doctest::Contains("deepseek4.attention.sliding_window"), ds4::error);
    std::filesystem::remove_all(temp_dir());
}
