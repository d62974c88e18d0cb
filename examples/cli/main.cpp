// ds4-cli: one chat turn on the CPU reference engine. Renders the prompt with the DeepSeek-V4
// chat template, tokenizes it, prefills it in one forward call, then decodes token by token
// (greedy at --temp 0, else the reference sampler), streaming the text to stdout and the
// prefill/decode throughput to stderr.
//
// Without --model it uses the tiny synthetic model, generated once into .cache/ds4-tiny.gguf.
// --mtp FILE loads the MTP head (model.md §4) and reports, as a diagnostic only, how often its
// first draft at each position equals the target's greedy next token (the acceptance rate of
// greedy self-speculation's free first draft); the generated text does not depend on it.
// Exit codes: 0 done, 1 a model or runtime error, 2 bad flags.
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <unistd.h>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/model/metadata.hpp"
#include "ds4/model/shape.hpp"
#include "harness/synth/generator.hpp"
#include "text/chat_template.hpp"
#include "reference/engine.hpp"
#include "reference/mtp.hpp"
#include "reference/parallel.hpp"
#include "reference/sampling.hpp"
#include "text/tokenizer.hpp"

namespace {

constexpr const char* usage =
    "usage: ds4-cli [--model FILE] --prompt TEXT [--system TEXT] [--no-think] [-n N]\n"
    "               [--temp T] [--top-p P] [--top-k K] [--min-p P] [--seed S] [--threads N]\n"
    "               [--mtp FILE]\n"
    "\n"
    "Runs one chat turn on the CPU reference engine and streams the reply. Without --model the\n"
    "tiny synthetic model is generated once into .cache/ds4-tiny.gguf (random weights: the text\n"
    "is noise, the throughput is real). -n is the number of tokens to generate (default 32);\n"
    "--temp 0 (the default) is greedy. --mtp FILE loads the matching MTP head and prints how often\n"
    "its first draft equalled the target's greedy next token (a diagnostic; output unchanged).\n";

// A flag error: reported with the flag and the value, exit code 2.
struct usage_error {
    std::string what;
};

struct options {
    std::string model, prompt, system, mtp;
    bool have_prompt = false, think = true;
    int n_predict = 32, threads = 0;
    ds4::ref::sampling_params sampling;
};

template <class T>
std::string number_text(T v) {
    if constexpr (std::is_floating_point_v<T>) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", double(v));
        return buf;
    } else {
        return std::to_string(v);
    }
}

template <class T>
T parse_number(std::string_view flag, std::string_view text, T lo, T hi) {
    T v{};
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || end != text.data() + text.size() || !(v >= lo && v <= hi))
        throw usage_error{std::string(flag) + ": '" + std::string(text) + "' is not a number in [" + number_text(lo) +
                          ", " + number_text(hi) + "]"};
    return v;
}

options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        auto value = [&]() -> std::string_view {
            if (i + 1 >= argc) throw usage_error{std::string(a) + " needs a value"};
            return argv[++i];
        };
        if (a == "--model") o.model = value();
        else if (a == "--prompt") o.prompt = value(), o.have_prompt = true;
        else if (a == "--system") o.system = value();
        else if (a == "--mtp") o.mtp = value();
        else if (a == "--no-think") o.think = false;
        else if (a == "-n") o.n_predict = parse_number<int>(a, value(), 0, 1 << 20);
        else if (a == "--temp") o.sampling.temperature = parse_number<float>(a, value(), 0.0f, 100.0f);
        else if (a == "--top-p") o.sampling.top_p = parse_number<float>(a, value(), 0.0f, 1.0f);
        else if (a == "--top-k") o.sampling.top_k = parse_number<int>(a, value(), 0, 1 << 30);
        else if (a == "--min-p") o.sampling.min_p = parse_number<float>(a, value(), 0.0f, 1.0f);
        else if (a == "--seed") o.sampling.seed = parse_number<std::uint64_t>(a, value(), 0, UINT64_MAX);
        else if (a == "--threads") o.threads = parse_number<int>(a, value(), 1, 1024);
        else if (a == "--help" || a == "-h") {
            std::fputs(usage, stdout);
            std::exit(0);
        } else
            throw usage_error{"unknown flag '" + std::string(a) + "'"};
    }
    if (!o.have_prompt) throw usage_error{"--prompt is required"};
    return o;
}

// The default model: generated once, written under a temporary name and renamed, so an
// interrupted first run never leaves a half-written file where the next run would find it.
std::filesystem::path default_model() {
    const std::filesystem::path dir = ".cache", path = dir / "ds4-tiny.gguf";
    if (std::filesystem::exists(path)) return path;
    std::filesystem::create_directories(dir);
    const std::filesystem::path tmp = dir / ("ds4-tiny.gguf.tmp" + std::to_string(::getpid()));
    std::fprintf(stderr, "ds4-cli: generating the tiny synthetic model into %s\n", path.c_str());
    ds4::synth::write_options opt;
    opt.seed = 1;
    ds4::synth::write_model(tmp, ds4::model::dims_of<ds4::model::tiny_shape>(), opt);
    std::filesystem::rename(tmp, path);
    return path;
}

ds4::ref::tokenizer tokenizer_of(const ds4::gguf::file& f) {
    std::vector<std::string> tokens, merges;
    for (std::string_view t : f.at(ds4::model::tokens_key).strings()) tokens.emplace_back(t);
    for (std::string_view m : f.at(ds4::model::merges_key).strings()) merges.emplace_back(m);
    return ds4::ref::tokenizer(std::move(tokens), std::move(merges));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(const options& o) {
    using namespace ds4::ref;
    if (o.threads > 0) set_thread_count(o.threads);
    const std::filesystem::path path = o.model.empty() ? default_model() : std::filesystem::path(o.model);
    ds4::require(std::filesystem::exists(path), "model file '" + path.string() + "' does not exist");
    const std::unique_ptr<cpu_engine> engine = cpu_engine::load(path);
    const ds4::model::model_dims& d = engine->dims();
    const tokenizer tok = tokenizer_of(engine->file());

    std::vector<chat_message> messages;
    if (!o.system.empty()) messages.push_back({chat_role::system, o.system, {}, {}, {}});
    messages.push_back({chat_role::user, o.prompt, {}, {}, {}});
    render_options ro;
    ro.thinking = o.think;
    ro.context_tokens = std::size_t(d.context_length);
    const std::vector<std::int32_t> prompt = tok.encode(render_chat(messages, ro), true);
    ds4::require(!prompt.empty() && int(prompt.size()) < d.context_length,
                 "prompt of " + std::to_string(prompt.size()) + " tokens does not fit the context of " +
                     std::to_string(d.context_length));
    const int n_predict = std::min(o.n_predict, d.context_length - int(prompt.size()));

    std::unique_ptr<mtp_head> mtp;
    mtp_state mtp_st;
    if (!o.mtp.empty()) {
        ds4::require(std::filesystem::exists(o.mtp), "MTP file '" + o.mtp + "' does not exist");
        mtp = mtp_head::load(o.mtp, *engine);
        mtp_st = mtp->new_state();
    }
    // The MTP head needs the final HC state of every position (its window holds one row per
    // position), so with --mtp every prompt row returns its state.
    forward_options fopt;
    fopt.want_hc_state = mtp != nullptr;

    const sequence_id seq = engine->create_sequence();
    std::vector<forward_row> rows;
    for (std::size_t i = 0; i < prompt.size(); ++i)
        rows.push_back({seq, std::int32_t(i), prompt[i], mtp != nullptr || i + 1 == prompt.size()});
    const auto t_prefill = std::chrono::steady_clock::now();
    forward_result r = engine->forward(rows, fopt);
    const double prefill_s = seconds_since(t_prefill);

    // MTP time is kept out of the throughput figures.
    double mtp_s = 0;
    int mtp_hits = 0, mtp_total = 0;
    if (mtp) {
        const auto t0 = std::chrono::steady_clock::now();
        for (std::size_t i = 0; i + 1 < prompt.size(); ++i) mtp->draft(mtp_st, prompt[i], r.hc_state_of(i), std::int32_t(i));
        mtp_s += seconds_since(t0);
    }
    std::int32_t cur_token = prompt.back();  // the token whose logits are r's last row
    const double mtp_prompt_s = mtp_s;  // before the decode clock starts

    const auto t_decode = std::chrono::steady_clock::now();
    int generated = 0;
    std::int32_t pos = std::int32_t(prompt.size());
    for (; generated < n_predict; ++generated) {
        const std::size_t last = r.rows.size() - 1;
        if (mtp) {
            // §4 step 1: draft[0] = MTP(x_p, h_p, p), compared with argmax of the target at p.
            const auto t0 = std::chrono::steady_clock::now();
            const mtp_step s = mtp->draft(mtp_st, cur_token, r.hc_state_of(last), pos - 1);
            mtp_hits += s.token == sample_argmax(r.logits_of(last), r.n_vocab);
            ++mtp_total;
            mtp_s += seconds_since(t0);
        }
        const int next = sample(r.logits_of(last), r.n_vocab, o.sampling, std::uint64_t(generated));
        if (next == tok.eos_id()) break;
        const std::string& piece = tok.token_to_piece(next);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        if (generated + 1 == n_predict) {
            ++generated;
            break;  // the last token's logits are never needed
        }
        const forward_row row{seq, pos++, next, true};
        r = engine->forward(std::span(&row, 1), fopt);
        cur_token = next;
    }
    const double decode_s = seconds_since(t_decode) - (mtp_s - mtp_prompt_s);
    std::fputc('\n', stdout);
    std::fprintf(stderr, "ds4-cli: %s (%s), %d threads\n", path.c_str(), d.preset.c_str(), thread_count());
    std::fprintf(stderr, "prefill: %zu tokens in %.3f s = %.2f tok/s\n", prompt.size(), prefill_s,
                 double(prompt.size()) / prefill_s);
    // Decode time counts the forward passes that produced each generated token after the first
    // (which came from the prefill), i.e. generated - 1 passes.
    const int passes = generated > 0 ? generated - 1 : 0;
    std::fprintf(stderr, "decode: %d tokens, %d forward passes in %.3f s = %.2f tok/s\n", generated, passes, decode_s,
                 passes > 0 ? double(passes) / decode_s : 0.0);
    if (mtp)
        std::fprintf(stderr, "mtp: first draft equalled the target's greedy next token at %d of %d positions (%.1f%%), "
                             "%.3f s in the MTP head\n",
                     mtp_hits, mtp_total, mtp_total > 0 ? 100.0 * mtp_hits / mtp_total : 0.0, mtp_s);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    options o;
    try {
        o = parse(argc, argv);
    } catch (const usage_error& e) {
        std::fprintf(stderr, "ds4-cli: %s\n\n%s", e.what.c_str(), usage);
        return 2;
    }
    try {
        return run(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ds4-cli: %s\n", e.what());
        return 1;
    }
}
