#include "examples/server/scheduler.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

#include "ds4/core/error.hpp"
#include "examples/server/ngram_drafter.hpp"
#include "examples/server/output_processor.hpp"

namespace ds4::server {

namespace {

// A row's sampler::adjust: the bias, less frequency x count + presence (count > 0) over the
// answer's tokens before the row (counts, then `more`: the drafts fed before a verify row).
std::vector<engine::logit_adjust> logit_deltas(const logit_controls& c, const std::map<std::int32_t, int>& counts,
                                               std::span<const std::int32_t> more) {
    std::map<std::int32_t, int> n = counts;
    for (std::int32_t t : more) ++n[t];
    std::map<std::int32_t, float> delta;
    for (const engine::logit_adjust& b : c.bias) delta[b.token] = b.delta;
    if (c.frequency_penalty != 0.0f || c.presence_penalty != 0.0f)
        for (const auto& [t, k] : n) delta[t] = delta[t] - (c.frequency_penalty * float(k) + c.presence_penalty);
    std::vector<engine::logit_adjust> out;
    for (const auto& [t, d] : delta)
        if (d != 0.0f) out.push_back({t, d});
    return out;
}

std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count();
}

double ms_between(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

struct scheduler::active {
    std::shared_ptr<job> j;
    engine::sequence_id seq = -1;
    std::uint64_t bytes = 0;      // charged at admission, returned at retirement
    int prefilled = 0;            // prompt tokens already in the KV state
    int cached = 0;               // of those, how many came from the prefix cache
    std::vector<std::int32_t> fed;  // sampled tokens; all but the last are in the KV state
    int generated = 0;
    std::int32_t last_token = 0;  // the token the next decode row feeds
    std::uint64_t last_token_step = 0;
    std::vector<std::int32_t> drafts;  // this step's verify rows' tokens, after last_token's row
    int accepted = 0;                  // of those, how many the step's sampled tokens confirmed
    int drafted_total = 0, accepted_total = 0;  // over the answer
    bool draft_ready = false;          // the backend kept the drafter's state of the last row
    std::optional<ngram_drafter> lookup;  // --draft ngram
    std::map<std::int32_t, int> counts;   // the answer's tokens (fed) by id: the penalties' counts
    output_processor proc;
    clock::time_point admitted, first_token, last_token_time;
    bool done = false;

    active(std::shared_ptr<job> job_, const ref::tokenizer& tok)
        : j(std::move(job_)), proc(tok, j->output), admitted(clock::now()) {}
    bool decoding() const { return prefilled == int(j->prompt.size()); }
};

void channel::set_wake(std::function<void()> wake) {
    std::lock_guard lock(mutex_);
    wake_ = std::move(wake);
    wake_pending_ = false;
}

void channel::push(gen_event ev) {
    std::function<void()> wake;
    {
        std::lock_guard lock(mutex_);
        events_.push_back(std::move(ev));
        if (wake_ && !wake_pending_) {
            wake_pending_ = true;
            wake = wake_;
        }
    }
    if (wake) wake();
}

std::vector<gen_event> channel::drain() {
    std::lock_guard lock(mutex_);
    wake_pending_ = false;
    std::vector<gen_event> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
    events_.clear();
    return out;
}

draft_source parse_draft_source(const std::string& word) {
    if (word == "auto") return draft_source::automatic;
    if (word == "mtp") return draft_source::mtp;
    if (word == "ngram") return draft_source::ngram;
    if (word == "off") return draft_source::off;
    throw error("--draft " + word + ": expected auto, mtp, ngram or off");
}

const char* draft_source_name(draft_source d) {
    switch (d) {
        case draft_source::automatic: return "auto";
        case draft_source::mtp: return "mtp";
        case draft_source::ngram: return "ngram";
        case draft_source::off: return "off";
    }
    return "?";
}

namespace {

// --draft against the backend: automatic is mtp where the backend has a drafter, else off (an
// explicit --spec-tokens then still asks for one).
draft_source resolve_draft(const scheduler_options& o, const engine::capabilities& caps) {
    if (o.draft == draft_source::automatic) return caps.max_draft > 0 || o.spec_tokens > 0 ? draft_source::mtp : draft_source::off;
    require(o.draft != draft_source::mtp || caps.max_draft > 0,
            "--draft mtp needs an MTP drafter (--mtp FILE); the " + caps.name + " backend has none loaded");
    if (o.draft == draft_source::ngram) {
        require(o.ngram_min >= 1 && o.ngram_min <= o.ngram_max && o.ngram_max <= ngram_drafter::max_n,
                "--ngram-min " + std::to_string(o.ngram_min) + " / --ngram-max " + std::to_string(o.ngram_max) +
                    ": need 1 <= min <= max <= " + std::to_string(ngram_drafter::max_n));
        require(caps.max_rollback >= 1, "--draft ngram needs a backend that rolls back rejected drafts; the " + caps.name +
                                            " backend keeps no rollback history");
    }
    return o.draft;
}

// --spec-tokens against the source and what the backend can do: -1 picks 2 with an MTP drafter,
// 3 with prompt lookup (a draft there costs a verify row and nothing else).
int resolve_spec(int asked, draft_source draft, const engine::capabilities& caps) {
    require(asked >= -1, "--spec-tokens must be >= 0 (or -1: the source's default)");
    if (draft == draft_source::off) {
        require(asked <= 0, "--spec-tokens " + std::to_string(asked) + " with --draft off");
        return 0;
    }
    if (draft == draft_source::ngram) {
        if (asked == -1) return std::min(3, caps.max_rollback);
        require(asked <= caps.max_rollback, "--spec-tokens " + std::to_string(asked) + " is over the " + caps.name +
                                                " backend's rollback of " + std::to_string(caps.max_rollback));
        return asked;
    }
    if (asked == -1) return caps.max_draft > 0 ? std::min({2, caps.max_draft - 1, caps.max_rollback}) : 0;
    if (asked == 0) return 0;
    require(caps.max_draft > 0, "--spec-tokens " + std::to_string(asked) + " needs an MTP drafter (--mtp FILE) or --draft ngram; the " +
                                    caps.name + " backend has no MTP drafter loaded");
    require(asked + 1 <= caps.max_draft && asked <= caps.max_rollback,
            "--spec-tokens " + std::to_string(asked) + " is over the " + caps.name + " backend's reach (" +
                std::to_string(caps.max_draft - 1) + " drafts after the first, rollback of " + std::to_string(caps.max_rollback) + ")");
    return asked;
}

}  // namespace

scheduler::scheduler(engine::backend& backend, const ref::tokenizer& tok, scheduler_options options)
    : backend_(backend),
      tok_(tok),
      options_(options),
      caps_(backend.caps()),
      draft_(resolve_draft(options, caps_)),
      spec_(resolve_spec(options.spec_tokens, draft_, caps_)) {
    require(options_.max_seqs >= 1, "--max-seqs must be at least 1");
    require(options_.step_tokens >= 1 && options_.prefill_chunk >= 1, "--step-tokens and --prefill-chunk must be >= 1");
    // Every decode row plus one prefill chunk must fit one submit.
    if (caps_.max_rows_per_step > 0)
        require(options_.max_seqs + options_.prefill_chunk <= caps_.max_rows_per_step,
                "--max-seqs + --prefill-chunk (" + std::to_string(options_.max_seqs + options_.prefill_chunk) + ") is over the " +
                    caps_.name + " backend's " + std::to_string(caps_.max_rows_per_step) + " rows per step");
    // The free-memory floor: what the caller set, else 4 GiB on a device backend (other users
    // of the GPU, allocator slack, the driver) and nothing on the CPU backend (the host's memory).
    floor_ = options_.mem_floor >= 0 ? std::uint64_t(options_.mem_floor) : caps_.name.rfind("cpu", 0) == 0 ? 0 : 4ull << 30;
    require(options_.kv_disk_queue >= 1, "--kv-disk-queue must be at least 1 (0 would drop every save)");
    require(options_.kv_disk_drain_ms >= 0, "--kv-disk-drain-s must not be negative");
    if (!options_.kv_dir.empty())
        disk_ = std::make_unique<disk_kv>(disk_kv_options{options_.kv_dir, options_.kv_disk_budget, options_.model_id,
                                                          options_.kv_disk_queue, options_.debug_disk_write_delay_ms});
    if (!options_.debug_forced_output.empty()) {
        forced_ = tok_.encode(options_.debug_forced_output, true);
        forced_.push_back(tok_.eos_id());
    }
    stats_.spec_tokens = spec_;
    stats_.draft = spec_ > 0 ? draft_ : draft_source::off;
    heartbeat_ns_ = now_ns();
    thread_ = std::thread([this] { loop(); });
}

scheduler::~scheduler() { stop(); }

std::uint64_t scheduler::ceiling(const engine::memory_ledger& m) const {
    if (options_.kv_budget > 0 && m.kv_capacity > 0) return std::min(options_.kv_budget, m.kv_capacity);
    return options_.kv_budget > 0 ? options_.kv_budget : m.kv_capacity;
}

void scheduler::submit(std::shared_ptr<job> j) {
    {
        std::lock_guard lock(mutex_);
        if (draining_ || stop_) throw_api_error(error_code::shutting_down, "the server is shutting down");
        incoming_.push_back(std::move(j));
        ++pending_;
    }
    wake_.notify_one();
}

void scheduler::begin_drain() {
    std::lock_guard lock(mutex_);
    draining_ = true;
}

bool scheduler::empty() const { return pending_.load() == 0; }

void scheduler::stop() {
    {
        std::lock_guard lock(mutex_);
        if (stop_ && !thread_.joinable()) return;
        stop_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
    if (disk_) disk_->close(std::chrono::milliseconds(options_.kv_disk_drain_ms));
}

double scheduler::heartbeat_age_ms() const { return double(now_ns() - heartbeat_ns_.load()) / 1e6; }

scheduler_stats scheduler::stats() const {
    std::lock_guard lock(mutex_);
    scheduler_stats s = stats_;
    s.heartbeat_age_ms = heartbeat_age_ms();
    s.draining = draining_;
    // Read live (disk_kv has its own lock), not as of the engine loop's last pass: a save queued
    // before an answer was sent shows as pending to a client that asks after the answer.
    s.disk_enabled = disk_ != nullptr;
    if (disk_) s.disk = disk_->stats();
    return s;
}

// New jobs enter the queue here, on the engine thread: sequence_bytes is a backend call, and only
// this thread makes those. A job that can never fit is refused before it waits.
void scheduler::take_new() {
    std::deque<std::shared_ptr<job>> fresh;
    {
        std::lock_guard lock(mutex_);
        fresh.swap(incoming_);
    }
    const std::uint64_t limit = ceiling(backend_.memory());
    for (std::shared_ptr<job>& j : fresh) {
        const std::uint64_t bytes = backend_.sequence_bytes(std::int32_t(j->prompt.size()) + j->max_tokens);
        if (limit > 0 && bytes > limit) {
            active a(j, tok_);
            ++refusals_;
            finish(a, finish_reason::error,
                   api_error{error_code::insufficient_memory,
                             "the request needs " + std::to_string(bytes) + " bytes of KV state, " + std::to_string(bytes - limit) +
                                 " more than the server's whole KV budget of " + std::to_string(limit) +
                                 "; a smaller max_tokens or prompt fits",
                             "max_tokens", false, bytes - limit});
            continue;
        }
        waiting_.push_back(std::move(j));
    }
}

void scheduler::finish(active& a, finish_reason reason, std::optional<api_error> error, gen_event ev) {
    a.proc.finish(ev);
    ev.final = true;
    ev.reason = reason;
    if (reason == finish_reason::stop && a.proc.tool_calls() > 0) ev.reason = finish_reason::tool_calls;
    ev.stop_sequence = a.proc.matched_stop();
    ev.error = std::move(error);
    ev.usage.prompt_tokens = int(a.j->prompt.size());
    ev.usage.completion_tokens = a.generated;
    ev.usage.reasoning_tokens = a.proc.reasoning_tokens();
    ev.usage.cached_tokens = a.cached;
    timing_figures& t = ev.timings;
    t.queue_ms = ms_between(a.j->arrival, a.admitted);
    if (a.generated > 0) {
        t.ttft_ms = ms_between(a.j->arrival, a.first_token);
        t.prefill_ms = ms_between(a.admitted, a.first_token);
        t.decode_ms = ms_between(a.first_token, a.last_token_time);
        if (t.prefill_ms > 0) t.prefill_tokens_per_s = double(a.j->prompt.size() - std::size_t(a.cached)) / (t.prefill_ms / 1e3);
        if (t.decode_ms > 0) t.decode_tokens_per_s = (a.generated - 1) / (t.decode_ms / 1e3);
    }
    t.draft_tokens = a.drafted_total;
    t.draft_tokens_accepted = a.accepted_total;
    ev.raw_reasoning = a.proc.raw_reasoning();
    ev.raw_content = a.proc.raw_content();
    ev.choice = a.j->choice;
    a.j->prompt_ready->store(true);  // whatever happened, the other choices need not wait
    if (a.seq >= 0) {
        // A turn that ended normally stays as an idle prefix (prompt and answer): the next turn
        // of the conversation starts with it.
        const bool normal = !error && reason != finish_reason::cancelled;
        if (!normal || !keep_turn(a)) backend_.free(a.seq);
        a.seq = -1;
    }
    charged_ -= a.bytes;
    a.done = true;
    {
        std::lock_guard lock(mutex_);
        if (reason == finish_reason::cancelled) ++stats_.requests_cancelled;
        else if (reason == finish_reason::error) ++stats_.requests_failed;
        else ++stats_.requests_finished;
    }
    a.j->out->push(std::move(ev));
    --pending_;
}

void scheduler::admit() {
    engine::memory_ledger m = backend_.memory();
    // Later choices of a request wait (without holding up the jobs behind them) for the first
    // choice's prompt.
    auto next = [&] {
        return std::find_if(waiting_.begin(), waiting_.end(), [](const std::shared_ptr<job>& j) { return !j->after || j->after->load(); });
    };
    for (auto it = next(); it != waiting_.end() && int(running_.size()) < options_.max_seqs; it = next()) {
        const std::shared_ptr<job> j = *it;  // a copy: erased from the queue below
        const std::uint64_t bytes = backend_.sequence_bytes(std::int32_t(j->prompt.size()) + j->max_tokens);
        // A bounded pool admits what fits beside the running sequences' charges; an unbounded
        // (CPU) pool is bounded by free memory, less what the running sequences may still grow
        // into and a floor that is never crossed.
        const std::uint64_t limit = ceiling(m);
        const std::uint64_t growth = charged_ > m.kv_used ? charged_ - m.kv_used : 0;
        const std::uint64_t need = limit > 0 ? charged_ + cache_bytes_ + bytes : growth + bytes + floor_;
        const std::uint64_t have = limit > 0 ? limit : m.device_free;
        const bool fits = limit > 0 ? need <= have : m.device_free == 0 || need <= have;
        if (!fits && evict_one()) {  // idle prefixes go before anyone waits
            m = backend_.memory();
            continue;
        }
        if (!fits) {
            if (!running_.empty()) break;  // wait for memory to come back
            auto a = std::make_unique<active>(j, tok_);
            waiting_.erase(it);
            // Nothing else runs and nothing idle is left to evict: only memory outside this
            // server's reach is missing, which may come back (429), unless the device could not
            // hold it even empty (503).
            const std::uint64_t missing = need > have ? need - have : bytes;
            const bool ever = limit > 0 || m.device_total == 0 || bytes + floor_ <= m.device_total - std::min(m.device_total, m.weights + m.scratch);
            ++refusals_;
            api_error e{error_code::insufficient_memory,
                        "the request needs " + std::to_string(bytes) + " bytes of KV state; " + std::to_string(missing) +
                            " bytes are missing (free device memory " + std::to_string(m.device_free) + ", floor " +
                            std::to_string(floor_) + ")",
                        "", ever, missing};
            finish(*a, finish_reason::error, e);
            continue;
        }
        auto a = std::make_unique<active>(j, tok_);
        waiting_.erase(it);
        a->seq = start_sequence(*a->j, a->cached);
        a->prefilled = a->cached;
        a->bytes = bytes;
        charged_ += bytes;
        running_.push_back(std::move(a));
    }
}

bool scheduler::step_once() {
    const clock::time_point start = clock::now();
    take_new();
    const clock::time_point now = clock::now();
    // Cancelled and timed-out work leaves before the step is built.
    for (auto it = waiting_.begin(); it != waiting_.end();) {
        job& j = **it;
        if (j.cancelled || now > j.deadline) {
            active a(*it, tok_);
            if (j.cancelled) finish(a, finish_reason::cancelled);
            else finish(a, finish_reason::error, api_error{error_code::timeout, "the request timed out in the queue", "", true});
            it = waiting_.erase(it);
        } else
            ++it;
    }
    for (auto& a : running_) {
        if (a->j->cancelled) finish(*a, finish_reason::cancelled);
        else if (now > a->j->deadline)
            finish(*a, finish_reason::error, api_error{error_code::timeout, "the request timed out", "", true});
    }
    std::erase_if(running_, [](const auto& a) { return a->done; });
    admit();
    if (running_.empty()) return false;

    std::vector<engine::row> rows;
    std::vector<engine::sampler> samplers;
    // Output rows' logit adjustments; the samplers' spans point here until the step returns.
    std::deque<std::vector<engine::logit_adjust>> adjust_store;
    auto row_sampler = [&](const active& a, std::span<const std::int32_t> more) {
        engine::sampler sp = a.j->sampler;
        if (a.j->logits.any()) {
            adjust_store.push_back(logit_deltas(a.j->logits, a.counts, more));
            sp.adjust = adjust_store.back();
        }
        return sp;
    };
    struct output_row {
        active* a;
        int j;  // 0: the decode row (or the prompt's last row); i: the row fed the i-th draft
    };
    std::vector<output_row> owner;  // per output row
    const int max_rows = options_.step_tokens;
    // Verify rows take what the decode rows and one prefill chunk leave of the step.
    const int decoding = int(std::count_if(running_.begin(), running_.end(), [](const auto& a) { return a->decoding(); }));
    const bool prompts = decoding < int(running_.size());
    const int row_cap = caps_.max_rows_per_step > 0 ? std::min(max_rows, caps_.max_rows_per_step) : max_rows;
    int spec_room = spec_ > 0 ? std::max(0, row_cap - decoding - (prompts ? options_.prefill_chunk : 0)) : 0;
    double draft_s = 0;
    for (auto& a : running_) {
        if (!a->decoding()) continue;
        const std::int32_t pos = std::int32_t(a->j->prompt.size()) + a->generated - 1;
        rows.push_back({a->seq, pos, a->last_token, engine::output::sample});
        samplers.push_back(row_sampler(*a, {}));
        owner.push_back({a.get(), 0});
        a->drafts.clear();
        a->accepted = 0;
        // Drafts past the answer's token budget or the context would never be kept.
        const int m = std::min({spec_, spec_room, a->j->max_tokens - a->generated - 1, backend_.dims().context_length - 1 - pos});
        if (draft_ == draft_source::ngram) {
            if (m < 1) continue;
            const clock::time_point d0 = clock::now();
            if (!a->lookup) a->lookup.emplace(options_.ngram_min, options_.ngram_max);
            a->drafts = a->lookup->draft(a->j->prompt, a->fed, m);
            draft_s += std::chrono::duration<double>(clock::now() - d0).count();
        } else {
            if (!a->draft_ready || m < 1) continue;
            a->draft_ready = false;
            const clock::time_point d0 = clock::now();
            std::vector<std::int32_t> d;
            try {
                d = backend_.draft(a->seq, m + 1);
            } catch (const std::exception& e) {  // costs the speculation only
                std::fprintf(stderr, "ds4-server: draft: %s\n", e.what());
            }
            draft_s += std::chrono::duration<double>(clock::now() - d0).count();
            // The first draft re-predicts the token just sampled (docs/model.md §4); the rest build on it.
            if (d.size() < 2 || d[0] != a->last_token) continue;
            a->drafts.assign(d.begin() + 1, d.end());
        }
        a->drafted_total += int(a->drafts.size());
        for (std::size_t i = 0; i < a->drafts.size(); ++i) {
            rows.push_back({a->seq, pos + 1 + std::int32_t(i), a->drafts[i], engine::output::sample});
            samplers.push_back(row_sampler(*a, std::span<const std::int32_t>(a->drafts).first(i + 1)));
            owner.push_back({a.get(), int(i) + 1});
        }
        spec_room -= int(a->drafts.size());
    }
    int prefill_rows = 0;
    for (auto& a : running_) {
        if (a->decoding()) continue;
        const int room = std::max(max_rows - int(rows.size()), prefill_rows == 0 ? options_.prefill_chunk : 0);
        if (room <= 0) break;
        const int n = std::min({options_.prefill_chunk, room, int(a->j->prompt.size()) - a->prefilled});
        for (int k = 0; k < n; ++k) {
            const int p = a->prefilled + k;
            const bool last = p + 1 == int(a->j->prompt.size());
            rows.push_back({a->seq, p, a->j->prompt[std::size_t(p)], last ? engine::output::sample : engine::output::none});
            if (last) {
                samplers.push_back(row_sampler(*a, {}));
                owner.push_back({a.get(), 0});
            }
        }
        prefill_rows += n;
    }

    const clock::time_point t0 = clock::now();
    engine::step_result result;
    try {
        result = backend_.run({rows, samplers, spec_ > 0 && draft_ == draft_source::mtp});
    } catch (const std::exception& e) {
        // The step's sequences are in an unknown state: every running job fails, the others go on.
        std::fprintf(stderr, "ds4-server: step failed: %s\n", e.what());
        for (auto& a : running_) finish(*a, finish_reason::error, api_error{error_code::internal, e.what(), "", false});
        running_.clear();
        return true;
    }
    if (options_.debug_step_delay_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(options_.debug_step_delay_ms));
    ++step_index_;
    const clock::time_point t1 = clock::now();
    std::vector<active*> in_step;
    for (const output_row& o : owner)
        if (in_step.empty() || in_step.back() != o.a) in_step.push_back(o.a);

    // Prefill progress is applied before outputs so decoding() is right for the sampled rows.
    for (auto& a : running_)
        if (!a->decoding()) {
            int n = 0;
            for (const engine::row& r : rows)
                if (r.seq == a->seq) ++n;
            a->prefilled += n;
        }
    int max_gap = 0, decode_tokens = 0;
    for (std::size_t i = 0; i < result.outputs.size() && i < owner.size(); ++i) {
        active& a = *owner[i].a;
        const int j = owner[i].j;
        // A row after a rejected draft was fed a token the answer does not have.
        if (a.done || j > a.accepted) continue;
        engine::sampled& s = result.outputs[i];
        if (!forced_.empty()) s = {s.row, forced_[std::min(std::size_t(a.generated), forced_.size() - 1)], 0.0f, {}};
        if (j < int(a.drafts.size()) && s.token == a.drafts[std::size_t(j)]) ++a.accepted, ++a.accepted_total;
        const bool first = a.generated == 0;
        if (first) a.first_token = t1;
        else if (j == 0) max_gap = std::max(max_gap, int(step_index_ - a.last_token_step));
        if (!first) ++decode_tokens;
        a.last_token_step = step_index_;
        a.last_token_time = t1;
        ++a.generated;
        a.last_token = s.token;
        a.fed.push_back(s.token);
        if (a.j->logits.any()) ++a.counts[s.token];  // only the penalties read them
        gen_event ev;
        ev.choice = a.j->choice;
        if (a.j->output.n_logprobs >= 0 && (s.token != tok_.eos_id() || a.j->output.ignore_eos))
            ev.logprobs.push_back({s.token, s.logprob, s.top});
        const bool over = a.proc.on_token(s.token, ev);
        const std::int32_t next_pos = std::int32_t(a.j->prompt.size()) + a.generated;
        const bool length = a.generated >= a.j->max_tokens || next_pos >= backend_.dims().context_length;
        const bool done = over || length;
        if (!done && (!ev.deltas.empty() || !ev.logprobs.empty())) a.j->out->push(std::move(ev));
        // The prompt is cached once its first token is on its way: with disk KV, caching takes a
        // snapshot of the whole sequence on this thread (a device-to-host copy of its KV, about
        // 0.5 s at 33K tokens on the H200), which the client's first token must not wait for.
        // Before finish(), which may free the sequence.
        if (first) {
            cache_prompt(a);
            a.j->prompt_ready->store(true);
        }
        if (done) {
            // The rows past this token go first, so that a kept turn holds exactly its tokens.
            try {
                settle(a);
            } catch (const std::exception& e) {
                finish(a, finish_reason::error, api_error{error_code::internal, e.what(), "", false});
                continue;
            }
            finish(a, over ? finish_reason::stop : finish_reason::length, {}, std::move(ev));
        }
    }
    std::uint64_t drafted = 0, accepted = 0;
    for (active* a : in_step) {
        drafted += a->drafts.size();
        accepted += std::uint64_t(a->accepted);
        if (a->done) continue;
        try {
            // The drafter's state is that of the step's last row of the sequence: usable only
            // when no row was rolled back.
            a->draft_ready = !settle(*a) && spec_ > 0;
        } catch (const std::exception& e) {  // the sequence's state is unknown: it fails, the others go on
            std::fprintf(stderr, "ds4-server: rollback after verify rows failed: %s\n", e.what());
            finish(*a, finish_reason::error, api_error{error_code::internal, e.what(), "", false});
        }
    }
    spec_drafted_ += drafted;
    spec_accepted_ += accepted;
    std::erase_if(running_, [](const auto& a) { return a->done; });

    const double dt = std::chrono::duration<double>(t1 - t0).count() + draft_s;
    {
        std::lock_guard lock(mutex_);
        stats_.backend_s += dt;
        stats_.host_s += std::chrono::duration<double>(clock::now() - start).count() - dt;
        stats_.steps = step_index_;
        stats_.prefill_tokens += std::uint64_t(prefill_rows);
        stats_.decode_tokens += std::uint64_t(decode_tokens);
        stats_.max_step_rows = std::max(stats_.max_step_rows, int(rows.size()));
        stats_.max_step_prefill_rows = std::max(stats_.max_step_prefill_rows, prefill_rows);
        stats_.max_decode_gap_steps = std::max(stats_.max_decode_gap_steps, max_gap);
        stats_.spec_drafted = spec_drafted_;
        stats_.spec_accepted = spec_accepted_;
        // Exponential window of about 5 s of step time.
        const double keep = std::max(0.0, 1.0 - dt / 5.0);
        rate_window_s_ = rate_window_s_ * keep + dt;
        rate_prefill_ = rate_prefill_ * keep + prefill_rows;
        rate_decode_ = rate_decode_ * keep + decode_tokens;
        stats_.prefill_tokens_per_s = rate_window_s_ > 0 ? rate_prefill_ / rate_window_s_ : 0;
        stats_.decode_tokens_per_s = rate_window_s_ > 0 ? rate_decode_ / rate_window_s_ : 0;
    }
    return true;
}

bool scheduler::settle(active& a) {
    if (a.seq < 0 || a.generated == 0) return false;
    const std::int32_t keep = std::int32_t(a.j->prompt.size()) + a.generated - 1;
    if (backend_.length(a.seq) <= keep) return false;
    backend_.truncate(a.seq, keep);
    return true;
}

engine::sequence_id scheduler::start_sequence(const job& j, int& reused) {
    reused = 0;
    cached_prefix* best = nullptr;
    int best_len = 0;
    // At most prompt - 1 tokens: the last prompt row must run to give the first token.
    const std::size_t limit = j.prompt.size() - 1;
    if (const auto m = index_.find(j.prompt, int(limit), caps_.max_rollback)) {
        best = &entry(m->id);
        best_len = m->length;
    }
    ++cache_lookups_;
    // Disk KV: a stored prefix longer than what memory holds is restored instead of prefilled
    // (a snapshot restores exactly; it is never rolled back, so it must be a whole prefix).
    if (disk_) {
        const int floor = std::max(best && best_len >= options_.prefix_cache_min ? best_len : 0, options_.prefix_cache_min - 1);
        if (auto hit = disk_->find(j.prompt, floor, int(limit))) {
            const engine::sequence_id seq = backend_.create();
            try {
                backend_.restore(seq, hit->second);
                reused = hit->first;
                ++cache_hits_;
                cached_tokens_ += std::uint64_t(reused);
                disk_tokens_ += std::uint64_t(reused);
                return seq;
            } catch (const std::exception& e) {
                std::fprintf(stderr, "ds4-server: disk KV: a %d-token prefix did not restore (%s); prefilling instead\n", hit->first, e.what());
                backend_.free(seq);
            }
        }
    }
    if (!best || best_len < options_.prefix_cache_min) return backend_.create();
    const engine::sequence_id seq = backend_.fork(best->seq);
    try {
        if (backend_.length(seq) > best_len) backend_.truncate(seq, best_len);
    } catch (const std::exception&) {
        // A backend whose rollback cannot reach here: prefill from scratch.
        backend_.free(seq);
        return backend_.create();
    }
    best->last_used = step_index_;
    reused = best_len;
    ++cache_hits_;
    cached_tokens_ += std::uint64_t(best_len);
    return seq;
}

void scheduler::cache_prompt(const active& a) {
    const std::vector<std::int32_t>& p = a.j->prompt;
    if (options_.prefix_cache <= 0 || int(p.size()) < options_.prefix_cache_min) return;
    if (const auto m = index_.find(p, int(p.size()), 0); m && m->length == int(p.size())) {
        entry(m->id).last_used = step_index_;
        return;
    }
    const std::uint64_t bytes = backend_.sequence_bytes(std::int32_t(p.size()));
    cache_.push_back({backend_.fork(a.seq), p, step_index_, bytes});
    index_.insert(p, cache_.back().seq);
    if (disk_ && caps_.max_rollback >= 1) {
        // All but the last prompt token, as the same prompt again can use it (its last row must run).
        const engine::sequence_id f = backend_.fork(a.seq);
        try {
            backend_.truncate(f, std::int32_t(p.size()) - 1);
            save_to_disk(f, std::span(p).first(p.size() - 1));
        } catch (const std::exception& e) {
            std::fprintf(stderr, "ds4-server: disk KV: %s\n", e.what());
        }
        backend_.free(f);
    } else if (disk_) {
        save_to_disk(a.seq, p);
    }
    cache_bytes_ += bytes;
    while (int(cache_.size()) > options_.prefix_cache) evict_one();
}

bool scheduler::keep_turn(const active& a) {
    if (options_.prefix_cache <= 0 || a.fed.empty()) return false;
    std::vector<std::int32_t> tokens = a.j->prompt;
    tokens.insert(tokens.end(), a.fed.begin(), a.fed.end() - 1);
    if (backend_.length(a.seq) != std::int32_t(tokens.size())) return false;
    const std::uint64_t bytes = backend_.sequence_bytes(std::int32_t(tokens.size()));
    save_to_disk(a.seq, tokens);
    index_.insert(tokens, a.seq);
    cache_.push_back({a.seq, std::move(tokens), step_index_, bytes});
    cache_bytes_ += bytes;
    while (int(cache_.size()) > options_.prefix_cache) evict_one();
    return true;
}

void scheduler::save_to_disk(engine::sequence_id seq, std::span<const std::int32_t> tokens) {
    // The snapshot is taken here (backend calls belong to this thread); the writer thread does the rest.
    if (!disk_ || int(tokens.size()) < options_.prefix_cache_min || !disk_->wants(tokens)) return;
    try {
        std::vector<std::byte> snap = backend_.snapshot(seq);
        if (options_.debug_snapshot_delay_ms > 0)
            std::this_thread::sleep_for(std::chrono::milliseconds(options_.debug_snapshot_delay_ms));
        disk_->save(tokens, std::move(snap));
    } catch (const std::exception& e) {  // a snapshot that fails costs only the save
        std::fprintf(stderr, "ds4-server: disk KV: snapshot failed: %s\n", e.what());
    }
}

scheduler::cached_prefix& scheduler::entry(engine::sequence_id seq) {
    const auto it = std::find_if(cache_.begin(), cache_.end(), [&](const cached_prefix& c) { return c.seq == seq; });
    require(it != cache_.end(), "prefix cache: the index names sequence " + std::to_string(seq) + ", which is not cached");
    return *it;
}

bool scheduler::evict_one() {
    if (cache_.empty()) return false;
    auto lru = std::min_element(cache_.begin(), cache_.end(), [](const auto& x, const auto& y) { return x.last_used < y.last_used; });
    backend_.free(lru->seq);
    index_.erase(lru->tokens, lru->seq);
    cache_bytes_ -= lru->bytes;
    cache_.erase(lru);
    return true;
}

void scheduler::loop() {
    for (;;) {
        heartbeat_ns_ = now_ns();
        {
            std::lock_guard lock(mutex_);
            if (stop_) break;
        }
        bool worked;
        try {
            worked = step_once();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "ds4-server: engine loop: %s\n", e.what());
            worked = false;
        }
        {
            std::lock_guard lock(mutex_);
            stats_.running = int(running_.size());
            stats_.waiting = int(waiting_.size() + incoming_.size());
            stats_.prefilling = int(std::count_if(running_.begin(), running_.end(), [](const auto& a) { return !a->decoding(); }));
            stats_.decoding = stats_.running - stats_.prefilling;
            stats_.charged_bytes = charged_;
            stats_.cache_entries = int(cache_.size());
            stats_.cache_hits = cache_hits_;
            stats_.cached_tokens = cached_tokens_;
            stats_.cache_lookups = cache_lookups_;
            stats_.cache_bytes = cache_bytes_;
            stats_.disk_tokens = disk_tokens_;
            stats_.refusals = refusals_;
            stats_.mem_floor = floor_;
        }
        if (!worked) {
            std::unique_lock lock(mutex_);
            wake_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_ || !incoming_.empty(); });
        }
    }
    take_new();
    const api_error e{error_code::shutting_down, "the server shut down before the request finished", "", true};
    for (auto& a : running_) finish(*a, finish_reason::error, e);
    running_.clear();
    for (auto& j : waiting_) {
        active a(j, tok_);
        finish(a, finish_reason::error, e);
    }
    waiting_.clear();
    while (evict_one()) {
    }
}

}  // namespace ds4::server
