// ds4-cli: one chat turn. Renders the prompt with the DeepSeek-V4 chat template, tokenizes it,
// prefills it in one step, then decodes token by token on the engine contract (the CUDA backend
// where a device is present, else the CPU reference; --backend chooses), streaming the text to
// stdout and the timings to stderr. Without --model it generates the tiny synthetic model once
// into .cache/ and uses it, so a fresh checkout answers a request with no download.
//
// --mtp FILE loads the MTP head (docs/model.md §4) and reports, as a diagnostic, how often its
// first draft equals the target's greedy next token.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/open_backend.hpp"
#include "ds4/core/error.hpp"
#include "ds4/gguf/reader.hpp"
#include "ds4/model/metadata.hpp"
#include "ds4/model/shape.hpp"
#include "harness/synth/generator.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"

namespace {

struct options {
    std::string model, prompt, system, mtp, backend = "auto";
    bool think = true;
    int n_predict = 32, threads = 0;
    ds4::engine::sampler sampler;
};

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
    using namespace ds4;
    const std::filesystem::path path = o.model.empty() ? default_model() : std::filesystem::path(o.model);
    require(std::filesystem::exists(path), "model file '" + path.string() + "' does not exist");
    require(o.mtp.empty() || std::filesystem::exists(o.mtp), "MTP file '" + o.mtp + "' does not exist");
    backends::backend_options bo;
    bo.model = path;
    bo.mtp = o.mtp;
    bo.kind = backends::parse_backend_kind(o.backend);
    bo.threads = o.threads;
    const std::unique_ptr<engine::backend> b = backends::open_backend(bo);
    const model::model_dims& d = b->dims();
    // The tokenizer reads the vocabulary through its own mapping of the file (no copy of weights).
    const ref::tokenizer tok = tokenizer_of(gguf::file::open(path));

    std::vector<ref::chat_message> messages;
    if (!o.system.empty()) messages.push_back({ref::chat_role::system, o.system, {}, {}, {}});
    messages.push_back({ref::chat_role::user, o.prompt, {}, {}, {}});
    ref::render_options ro;
    ro.thinking = o.think;
    ro.context_tokens = std::size_t(d.context_length);
    const std::vector<std::int32_t> prompt = tok.encode(ref::render_chat(messages, ro), true);
    require(!prompt.empty() && int(prompt.size()) < d.context_length,
            "prompt of " + std::to_string(prompt.size()) + " tokens does not fit the context of " +
                std::to_string(d.context_length));
    const int n_predict = std::min(o.n_predict, d.context_length - int(prompt.size()));
    const bool mtp = b->caps().max_draft > 0;

    const auto t_prefill = std::chrono::steady_clock::now();
    const engine::sequence_id seq = b->create();
    std::vector<engine::row> rows;
    for (std::size_t i = 0; i < prompt.size(); ++i)
        rows.push_back({seq, std::int32_t(i), prompt[i],
                        i + 1 == prompt.size() ? engine::output::sample : engine::output::none});
    engine::step_result r = b->run({rows, std::span(&o.sampler, 1), mtp});
    const double prefill_s = seconds_since(t_prefill);

    int mtp_hits = 0, mtp_total = 0;
    const auto t_decode = std::chrono::steady_clock::now();
    int generated = 0;
    std::int32_t pos = std::int32_t(prompt.size());
    for (; generated < n_predict; ++generated) {
        const std::int32_t next = r.outputs.back().token;
        if (mtp && o.sampler.temperature <= 0.0f) {
            // §4 step 2: the first draft is accepted for free only when it equals the target's greedy token.
            mtp_hits += b->draft(seq, 1)[0] == next;
            ++mtp_total;
        }
        if (next == tok.eos_id()) break;
        const std::string& piece = tok.token_to_piece(next);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        if (generated + 1 == n_predict) {
            ++generated;
            break;  // the last token's successor is never needed
        }
        const engine::row row{seq, pos++, next, engine::output::sample};
        r = b->run({std::span(&row, 1), std::span(&o.sampler, 1), mtp});
    }
    const double decode_s = seconds_since(t_decode);
    std::fputc('\n', stdout);
    std::fprintf(stderr, "ds4-cli: %s (%s) on %s\n", path.c_str(), d.preset.c_str(), b->caps().name.c_str());
    std::fprintf(stderr, "prefill: %zu tokens in %.3f s = %.2f tok/s\n", prompt.size(), prefill_s,
                 double(prompt.size()) / prefill_s);
    // Decode counts the steps that produced each generated token after the first (which came
    // from the prefill), i.e. generated - 1 steps.
    const int steps = generated > 0 ? generated - 1 : 0;
    std::fprintf(stderr, "decode: %d tokens, %d steps in %.3f s = %.2f tok/s\n", generated, steps, decode_s,
                 steps > 0 ? double(steps) / decode_s : 0.0);
    if (mtp_total > 0)
        std::fprintf(stderr, "mtp: first draft equalled the target's greedy next token at %d of %d positions (%.1f%%)\n",
                     mtp_hits, mtp_total, 100.0 * mtp_hits / mtp_total);
    b->free(seq);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    options o;
    CLI::App app{"ds4-cli: one chat turn on the ds4 engine, the reply streamed to stdout"};
    app.add_option("-m,--model", o.model, "GGUF model file (default: the tiny synthetic model, generated into .cache/)");
    app.add_option("-p,--prompt", o.prompt, "the user message")->required();
    app.add_option("--system", o.system, "a system message");
    app.add_option("-n,--n-predict", o.n_predict, "tokens to generate")->check(CLI::Range(1, 1 << 20));
    app.add_option("--temp", o.sampler.temperature, "temperature; 0 = greedy")->check(CLI::Range(0.0f, 100.0f));
    app.add_option("--top-k", o.sampler.top_k, "top-k filter; 0 = off")->check(CLI::Range(0, 1 << 20));
    app.add_option("--top-p", o.sampler.top_p, "top-p filter; 1 = off")->check(CLI::Range(1e-6f, 1.0f));
    app.add_option("--min-p", o.sampler.min_p, "min-p filter; 0 = off")->check(CLI::Range(0.0f, 1.0f));
    app.add_option("--seed", o.sampler.seed, "sampling seed");
    app.add_option("--threads", o.threads, "CPU backend threads; 0 = all cores")->check(CLI::Range(0, 1024));
    app.add_option("--backend", o.backend, "auto (CUDA where a device is present), cpu or cuda")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    app.add_option("--mtp", o.mtp, "MTP head GGUF: report how often its first draft is the greedy next token");
    app.add_flag("!--no-think", o.think, "render the prompt with thinking off");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    try {
        return run(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ds4-cli: %s\n", e.what());
        return 1;
    }
}
