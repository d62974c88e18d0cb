// ds4-synth: writes synthetic DeepSeek-V4-Flash GGUFs with the exact layout of the shipped q2
// model (docs/README.md decision 9), or describes and validates an existing file.
//
//   ds4-synth --preset tiny|small|flash [--layers N] [--seed N] --out FILE [--mtp FILE]
//             [--threads N] [--limit-bytes N] [--ffn-gain G] [--kv-norm-gain G]
//             [--residual-gain G | --gain-calibrated]
//   ds4-synth --summary FILE
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include "ds4/core/error.hpp"
#include "ds4/gguf/reader.hpp"
#include "ds4/model/shape.hpp"
#include "harness/synth/generator.hpp"
#include "harness/synth/summary.hpp"

namespace {

constexpr const char* usage =
    "usage: ds4-synth --preset tiny|small|flash [--layers N] [--seed N] --out FILE [--mtp FILE]\n"
    "                 [--threads N] [--limit-bytes N] [--ffn-gain G] [--kv-norm-gain G]\n"
    "                 [--residual-gain G | --gain-calibrated]\n"
    "       ds4-synth --summary FILE\n"
    "\n"
    "Writes a GGUF with the tensor names, types, shapes and metadata of the shipped q2\n"
    "DeepSeek-V4-Flash model (flash: ~81 GiB; small: ~1.2 GB; tiny: ~13 MB), random weights\n"
    "seeded by N (default 0), and with --mtp the matching MTP file. --layers keeps the preset's\n"
    "first N layers (N >= 6; the file's preset is then 'custom'): a flash model that fits a GPU\n"
    "smaller than the full file, for A/B runs. --limit-bytes stops after\n"
    "N bytes of tensor data (for throughput runs; the file is left truncated). --summary\n"
    "validates a file against the shape it declares and describes it. --ffn-gain scales the\n"
    "FFN gate/up weights of the routed and shared experts (SwiGLU inputs beyond the clamp),\n"
    "--kv-norm-gain the KV norms (FP8 blocks under the amax floor): models for tests of the\n"
    "saturating paths. --residual-gain scales the sublayer output projections (attn_output_b,\n"
    "ffn_down_exps, ffn_down_shexp), so the layers are near-identity in the residual stream;\n"
    "--gain-calibrated is --residual-gain with the calibrated gain below, at which a perturbation\n"
    "of the attention outputs is not amplified by chaos (docs/numerics.md): the model for\n"
    "whole-model error bounds of bounded kernels.\n";

struct cli {
    std::string preset;
    std::uint64_t seed = 0;
    std::string out, mtp, summary;
    int threads = 2;
    int layers = 0;  // 0: the preset's own count
    std::uint64_t limit_bytes = 0;
    ds4::synth::saturation sat;
};

std::uint64_t parse_number(std::string_view flag, std::string_view text) {
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    ds4::require(ec == std::errc{} && end == text.data() + text.size(),
                 std::string(flag) + ": '" + std::string(text) + "' is not a non-negative integer");
    return v;
}

float parse_gain(std::string_view flag, std::string_view text) {
    float v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    ds4::require(ec == std::errc{} && end == text.data() + text.size() && v > 0 && v < 1e6f,
                 std::string(flag) + ": '" + std::string(text) + "' is not a gain in (0, 1e6)");
    return v;
}

cli parse(int argc, char** argv) {
    cli c;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        auto value = [&]() -> std::string_view {
            ds4::require(i + 1 < argc, std::string(a) + " needs a value");
            return argv[++i];
        };
        if (a == "--preset") c.preset = value();
        else if (a == "--seed") c.seed = parse_number(a, value());
        else if (a == "--out") c.out = value();
        else if (a == "--mtp") c.mtp = value();
        else if (a == "--summary") c.summary = value();
        else if (a == "--layers") c.layers = static_cast<int>(std::min<std::uint64_t>(parse_number(a, value()), 1u << 20));
        else if (a == "--threads") c.threads = static_cast<int>(parse_number(a, value()));
        else if (a == "--limit-bytes") c.limit_bytes = parse_number(a, value());
        else if (a == "--ffn-gain") c.sat.routed_gain = c.sat.shared_gain = parse_gain(a, value());
        else if (a == "--kv-norm-gain") c.sat.kv_norm_gain = parse_gain(a, value());
        else if (a == "--residual-gain") c.sat.residual_gain = parse_gain(a, value());
        else if (a == "--gain-calibrated") c.sat.residual_gain = ds4::synth::calibrated_residual_gain;
        else if (a == "--help" || a == "-h") {
            std::fputs(usage, stdout);
            std::printf("\ncalibrated residual gain: %g (tiny model: attention-output perturbations amplified at most %gx)\n",
                        double(ds4::synth::calibrated_residual_gain), ds4::synth::calibrated_amplification);
            std::exit(0);
        } else
            ds4::fail("unknown argument '" + std::string(a) + "'");
    }
    if (c.summary.empty()) {
        ds4::require(!c.preset.empty(), "--preset is required");
        ds4::require(!c.out.empty(), "--out is required");
    }
    ds4::require(c.threads >= 1 && c.threads <= 64, "--threads must be 1..64");
    return c;
}

void report_write(const char* what, const std::string& path, const ds4::model::model_dims& d,
                  const ds4::synth::write_result& r) {
    std::printf("wrote       %s %s: preset %s, %zu tensors, vocab %d, %.3f GB in %.2f s, %.2f GB/s%s\n", what,
                path.c_str(), d.preset.c_str(), r.n_tensors, d.n_vocab, r.file_bytes / 1e9, r.seconds,
                r.file_bytes / 1e9 / r.seconds, r.truncated ? " (TRUNCATED by --limit-bytes)" : "");
}

// A finished regular file is reopened and summarised; /dev/null or a truncated file is not.
void summarise_if_possible(const std::string& path, const ds4::synth::write_result& r) {
    if (r.truncated || !std::filesystem::is_regular_file(path)) return;
    const ds4::gguf::file f = ds4::gguf::file::open(path);
    ds4::synth::print_summary(stdout, f, ds4::synth::validate_file(f));
}

int run(const cli& c) {
    if (!c.summary.empty()) {
        const ds4::gguf::file f = ds4::gguf::file::open(c.summary);
        const auto report = ds4::synth::validate_file(f);
        ds4::synth::print_summary(stdout, f, report);
        return report.ok() ? 0 : 1;
    }
    ds4::model::model_dims d;
    ds4::require(ds4::model::dims_of_preset(c.preset, d), "--preset: unknown preset '" + c.preset + "'");
    if (c.layers != 0) {
        // The preset's first N layers under the custom preset: the file carries its own keys,
        // which the loader checks against the structural rules rather than the preset's count.
        ds4::require(c.layers >= 6 && c.layers <= d.n_layer, "--layers: " + std::to_string(c.layers) + " is not in 6.." +
                                                                  std::to_string(d.n_layer) + " (preset " + c.preset + ")");
        d.n_layer = c.layers;
        d.compress_ratios.resize(std::size_t(c.layers));
        d.preset = std::string(ds4::model::custom_preset);
    }
    ds4::synth::write_options opt;
    opt.seed = c.seed;
    opt.threads = c.threads;
    opt.limit_bytes = c.limit_bytes;
    opt.sat = c.sat;
    opt.progress = true;
    const auto base = ds4::synth::write_model(c.out, d, opt);
    report_write("model", c.out, d, base);
    summarise_if_possible(c.out, base);
    if (!c.mtp.empty()) {
        const auto mtp = ds4::synth::write_mtp(c.mtp, d, opt);
        report_write("MTP", c.mtp, d, mtp);
        summarise_if_possible(c.mtp, mtp);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(parse(argc, argv));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ds4-synth: %s\n", e.what());
        return 2;
    }
}
