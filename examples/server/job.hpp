#pragma once
// A generation job: what an API handler hands to the scheduler, and the events the engine thread
// sends back through the job's channel to the connection that streams or buffers them.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ds4/engine/step.hpp"
#include "examples/server/errors.hpp"

namespace ds4::server {

using clock = std::chrono::steady_clock;

// One piece of output, already split by where the APIs put it.
struct delta {
    enum class kind { reasoning, content, tool_begin, tool_arguments, tool_end };
    kind type = kind::content;
    std::string text;     // reasoning/content/arguments text; tool_begin: the tool's name
    int tool_index = 0;   // tool_*: the call's index in this response
    std::string tool_id;  // tool_begin: the call's API id
};

// One sampled token as logprobs report it.
struct token_logprobs {
    std::int32_t token = 0;
    float logprob = 0.0f;
    std::vector<engine::token_logprob> top;
};

enum class finish_reason { stop, length, tool_calls, cancelled, error };

struct usage_counts {
    int prompt_tokens = 0;
    int completion_tokens = 0;
    int cached_tokens = 0;
    int reasoning_tokens = 0;
};

struct timing_figures {
    double queue_ms = 0;    // arrival to admission
    double ttft_ms = 0;     // arrival to the first sampled token
    double prefill_ms = 0;  // admission to the first sampled token
    double decode_ms = 0;   // first to last sampled token
    double prefill_tokens_per_s = 0;
    double decode_tokens_per_s = 0;
    int draft_tokens = 0;           // speculative decoding: drafts verified for this answer
    int draft_tokens_accepted = 0;  // of those, the ones equal to the token sampled before them
};

struct gen_event {
    int choice = 0;  // the request's choice (OpenAI's n) the event belongs to
    std::vector<delta> deltas;
    std::vector<token_logprobs> logprobs;  // the tokens this event covers, when asked for
    bool final = false;
    // final only:
    finish_reason reason = finish_reason::stop;
    std::string stop_sequence;  // the stop string that ended it, if one did
    usage_counts usage;
    timing_figures timings;
    std::optional<api_error> error;
    std::string raw_reasoning;  // the exact text sampled, for the tool-call memory
    std::string raw_content;
};

// Engine thread -> connection. push() may run on the engine thread while drain() runs on an I/O
// thread; the wake callback is coalesced so a fast stream posts one wake per drain, not per token.
class channel {
public:
    void set_wake(std::function<void()> wake);
    void push(gen_event ev);
    std::vector<gen_event> drain();

private:
    std::mutex mutex_;
    std::deque<gen_event> events_;
    std::function<void()> wake_;
    bool wake_pending_ = false;
};

struct stop_options {
    std::vector<std::string> strings;
};

// What the output processor needs besides the tokens.
struct output_options {
    bool thinking = true;       // the prompt ended in <think>: output starts as reasoning
    bool parse_tools = true;    // DSML in the content becomes tool calls
    bool raw_text = false;      // /v1/completions: no reasoning split, no DSML
    std::vector<std::string> stop;
    int n_logprobs = -1;        // -1: no logprobs; 0..20: the sampled token plus that many alternatives
    // vLLM's extension (benchmark clients send it): EOS is a token like any other, with no text,
    // so the answer runs to max_tokens or a stop string.
    bool ignore_eos = false;
};

// OpenAI's logit_bias and its frequency and presence penalties (over the answer's tokens, as
// vLLM counts them): the scheduler turns them into each row's sampler::adjust.
struct logit_controls {
    std::vector<engine::logit_adjust> bias;  // each token once
    float frequency_penalty = 0.0f, presence_penalty = 0.0f;
    bool any() const { return !bias.empty() || frequency_penalty != 0.0f || presence_penalty != 0.0f; }
};

struct job {
    std::vector<std::int32_t> prompt;
    engine::sampler sampler;  // its adjust stays empty: the scheduler sets each row's from `logits`
    logit_controls logits;
    int max_tokens = 0;
    output_options output;
    clock::time_point arrival = clock::now();
    clock::time_point deadline = clock::time_point::max();
    std::shared_ptr<channel> out = std::make_shared<channel>();
    std::atomic<bool> cancelled{false};
    // OpenAI's n: choice i > 0 of a request is a job of its own with the first choice's prompt and
    // channel; it waits in the queue until the first choice's prompt is prefilled (prompt_ready,
    // set by the scheduler once that prompt is in the prefix cache, or when the first choice
    // ends), so that it forks the cached prompt instead of prefilling it again.
    int choice = 0;
    std::shared_ptr<std::atomic<bool>> prompt_ready = std::make_shared<std::atomic<bool>>(false);
    std::shared_ptr<const std::atomic<bool>> after;  // the first choice's prompt_ready, or null
};

}  // namespace ds4::server
