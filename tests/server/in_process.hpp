#pragma once
// The scheduler in-process on the tiny synthetic model and the CPU backend, for the server's
// in-process tests: the model files (a temp file each, per test binary), requests submitted to a
// scheduler of their own and their answers collected (bounded in time), answers compared.
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/open_backend.hpp"
#include "ds4/core/error.hpp"
#include "ds4/model/shape.hpp"
#include "examples/server/model_tokenizer.hpp"
#include "examples/server/scheduler.hpp"
#include "harness/synth/generator.hpp"

namespace ds4::server::test {

inline std::filesystem::path temp_path(const std::string& what) {
    return std::filesystem::temp_directory_path() / ("ds4_sched_test_" + std::to_string(::getpid()) + "_" + what + ".gguf");
}

struct files {
    std::filesystem::path model = temp_path("model"), mtp = temp_path("mtp");
    files() {
        synth::write_options opt;
        opt.seed = 1;
        synth::write_model(model, model::dims_of<model::tiny_shape>(), opt);
        opt.seed = 2;
        synth::write_mtp(mtp, model::dims_of<model::tiny_shape>(), opt);
    }
    ~files() {
        std::filesystem::remove(model);
        std::filesystem::remove(mtp);
    }
};

inline const files& tiny_files() {
    static const files f;
    return f;
}

inline std::unique_ptr<engine::backend> cpu_backend(bool with_mtp) {
    backends::backend_options o;
    o.model = tiny_files().model;
    if (with_mtp) o.mtp = tiny_files().mtp;
    o.kind = backends::backend_kind::cpu;
    o.threads = 1;
    return backends::open_backend(o);
}

inline const ref::tokenizer& tok() {
    static const ref::tokenizer t = tokenizer_from_gguf(tiny_files().model);
    return t;
}

struct request {
    std::string text;  // the prompt, or
    std::vector<std::int32_t> tokens;  // these tokens when not empty
    engine::sampler sampler;
    int max_tokens = 24;
};

struct answer {
    std::vector<std::int32_t> prompt;
    std::vector<std::int32_t> tokens;  // sampled, EOS excluded (logprobs report every other token)
    std::vector<float> logprobs;
    finish_reason reason = finish_reason::error;
    int cached = 0;
    int drafted = 0, accepted = 0;  // the final event's timings
};

// The job a request makes (raw text out, every token's log-probability).
inline std::shared_ptr<job> make_job(const request& r) {
    auto j = std::make_shared<job>();
    j->prompt = r.tokens.empty() ? tok().encode(r.text, true) : r.tokens;
    j->sampler = r.sampler;
    j->max_tokens = r.max_tokens;
    j->output.raw_text = true;
    j->output.n_logprobs = 0;
    return j;
}

inline std::shared_ptr<job> submit(scheduler& sched, const request& r) {
    std::shared_ptr<job> j = make_job(r);
    sched.submit(j);
    return j;
}

// Waits (bounded) for every job's final event.
inline std::vector<answer> collect(const std::vector<std::shared_ptr<job>>& jobs) {
    std::vector<answer> out(jobs.size());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    for (std::size_t left = jobs.size(); left > 0;) {
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        for (std::size_t i = 0; i < jobs.size(); ++i) {
            out[i].prompt = jobs[i]->prompt;
            for (gen_event& ev : jobs[i]->out->drain()) {
                for (const token_logprobs& t : ev.logprobs) {
                    out[i].tokens.push_back(t.token);
                    out[i].logprobs.push_back(t.logprob);
                }
                if (!ev.final) continue;
                REQUIRE_FALSE(ev.error.has_value());
                out[i].reason = ev.reason;
                out[i].cached = ev.usage.cached_tokens;
                out[i].drafted = ev.timings.draft_tokens;
                out[i].accepted = ev.timings.draft_tokens_accepted;
                --left;
            }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return out;
}

// A request with logit_bias and penalties.
struct controlled {
    request r;
    logit_controls c;
};

inline std::vector<answer> serve_controlled(engine::backend& b, scheduler_options so, const std::vector<controlled>& reqs,
                                            scheduler_stats* stats = nullptr) {
    scheduler sched(b, tok(), so);
    std::vector<std::shared_ptr<job>> jobs;
    for (const controlled& q : reqs) {
        std::shared_ptr<job> j = make_job(q.r);
        j->logits = q.c;
        sched.submit(j);
        jobs.push_back(j);
    }
    std::vector<answer> out = collect(jobs);
    if (stats) *stats = sched.stats();
    return out;
}

// The requests with no logit controls (to be given some).
inline std::vector<controlled> uncontrolled(const std::vector<request>& reqs) {
    std::vector<controlled> c;
    for (const request& r : reqs) c.push_back({r, {}});
    return c;
}

// Runs the requests at once on a scheduler of their own.
inline std::vector<answer> serve(engine::backend& b, scheduler_options so, const std::vector<request>& reqs,
                                 scheduler_stats* stats = nullptr) {
    return serve_controlled(b, so, uncontrolled(reqs), stats);
}

inline void require_same(const std::vector<answer>& got, const std::vector<answer>& want) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
        CAPTURE(i);
        CHECK(got[i].tokens == want[i].tokens);
        CHECK(got[i].logprobs == want[i].logprobs);  // bitwise: the same rows' logits
        CHECK(got[i].reason == want[i].reason);
    }
}

inline std::vector<request> mixed_requests() {
    engine::sampler hot;
    hot.temperature = 0.9f;
    hot.top_p = 0.95f;
    hot.seed = 1234;
    engine::sampler topk;
    topk.temperature = 1.3f;
    topk.top_k = 40;
    topk.seed = 99;
    return {{"Hello there, how are you today?", {}, {}, 24},
            {"Write a short poem about the sea.", {}, hot, 31},
            {"List three prime numbers.", {}, topk, 17}};
}

inline scheduler_options plain() {
    scheduler_options so;
    so.spec_tokens = 0;
    so.prefix_cache = 0;
    return so;
}

// What starting a scheduler with these options throws (empty: it started).
inline std::string start_error(engine::backend& b, const scheduler_options& so) {
    try {
        scheduler s(b, tok(), so);
    } catch (const ds4::error& e) {
        return e.what();
    }
    return {};
}

}  // namespace ds4::server::test
