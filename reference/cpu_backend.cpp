#include "reference/cpu_backend.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "ds4/core/error.hpp"
#include "ds4/engine/snapshot_format.hpp"
#include "ds4/engine/step_plan.hpp"
#include "ds4/graph/layer_program.hpp"
#include "ds4/model/kv_layout.hpp"
#include "ds4/model/metadata.hpp"
#include "ds4/model/validate.hpp"
#include "reference/cpu_ops.hpp"
#include "reference/sampling.hpp"

namespace ds4::ref {
namespace {

using engine::sequence_id;
namespace snap = engine::snapshot_format;

constexpr std::size_t sz(int v) { return static_cast<std::size_t>(v); }

// What draft() starts from: the MTP step of a sequence's last kept row (docs/model.md §4 step 1).
struct draft_seed {
    std::int32_t pos = -1;
    std::int32_t token = 0;     // draft[0] = argmax of that MTP step's logits
    std::vector<float> hc;      // that step's output HC state: prev_hc of draft[1]
};

struct sequence {
    std::int32_t length = 0;
    std::vector<layer_kv> layers;
    // The MTP block's own window (one layer, raw rows only). Its rows start at mtp_start: a step
    // without keep_hc_state, a restore or a rollback past it restarts the window there.
    std::vector<layer_kv> mtp;
    std::int32_t mtp_start = 0;
    std::int32_t mtp_length = 0;
    std::optional<draft_seed> seed;
};

std::string seq_name(sequence_id s) { return "sequence " + std::to_string(s); }

std::uint64_t host_bytes(int name) {
    const long pages = sysconf(name), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? std::uint64_t(pages) * std::uint64_t(page) : 0;
}

class cpu_backend final : public engine::backend {
public:
    cpu_backend(gguf::file file, const cpu_backend_options& o)
        : file_(std::move(file)),
          d_(bind_dims(file_)),
          weights_(bind_model_weights(file_, d_)),
          opts_(o),
          attn_row_{d_.head_dim, d_.n_rot},
          idx_row_{d_.indexer_head_dim},
          attn_pool_(attn_row_.bytes()),
          idx_pool_(idx_row_.bytes()),
          ops_(d_, weights_, o.max_rollback) {
        require(o.max_rollback >= 0 && o.max_draft >= 0 && o.max_rows_per_step > 0,
                "cpu backend: max_rollback and max_draft must be >= 0, max_rows_per_step > 0");
        if (!o.mtp.empty()) {
            mtp_file_.emplace(gguf::file::open(o.mtp));
            model::require_valid_mtp(*mtp_file_, d_);
            mtp_ = bind_mtp_weights(*mtp_file_, d_, file_);
        }
    }
    ~cpu_backend() override { seqs_.clear(); }  // page tables release into the pools first

    const model::model_dims& dims() const override { return d_; }

    engine::capabilities caps() const override {
        engine::capabilities c;
        c.name = "cpu";
        c.max_rows_per_step = opts_.max_rows_per_step;
        c.max_in_flight = 1;
        c.page_rows = model::kv_page_rows;
        c.max_rollback = opts_.max_rollback;
        c.max_draft = mtp_ ? opts_.max_draft : 0;
        c.exact = true;
        c.logit_adjust = true;
        return c;
    }

    engine::memory_ledger memory() const override {
        engine::memory_ledger m;
        m.weights = file_.bytes().size() + (mtp_file_ ? mtp_file_->bytes().size() : 0);
        m.kv_used = attn_pool_.pages_in_use() * attn_pool_.page_bytes() + idx_pool_.pages_in_use() * idx_pool_.page_bytes();
        m.kv_pages_used = std::int64_t(attn_pool_.pages_in_use() + idx_pool_.pages_in_use());
        m.sequences = std::int32_t(seqs_.size());
        for (const auto& [id, s] : seqs_) m.sequence_state += state_bytes(*s);
        m.device_total = host_bytes(_SC_PHYS_PAGES);
        m.device_free = host_bytes(_SC_AVPHYS_PAGES);
        return m;
    }

    std::uint64_t sequence_bytes(std::int32_t length) const override {
        require(length >= 0, "sequence_bytes: negative length " + std::to_string(length));
        auto pages = [](std::int64_t rows) { return (rows + model::kv_page_rows - 1) / model::kv_page_rows; };
        std::uint64_t b = 0;
        const std::int64_t raw = std::min<std::int64_t>(length, d_.n_swa + opts_.max_rollback) + model::kv_page_rows;
        for (int il = 0; il < d_.n_layer; ++il) {
            b += std::uint64_t(pages(raw)) * attn_pool_.page_bytes();
            const int r = d_.ratio_of(il);
            if (r == 0) continue;
            b += std::uint64_t(pages(length / r)) * attn_pool_.page_bytes();
            b += std::uint64_t(1 + opts_.max_rollback) * frontier_bytes(r, d_.head_dim);
            if (r != 4) continue;
            b += std::uint64_t(pages(length / r)) * idx_pool_.page_bytes();
            b += std::uint64_t(1 + opts_.max_rollback) * frontier_bytes(4, d_.indexer_head_dim);
        }
        if (mtp_) b += std::uint64_t(pages(raw)) * attn_pool_.page_bytes() + sz(d_.hc_dim()) * sizeof(float);
        return b;
    }

    sequence_id create() override {
        const sequence_id id = next_id_++;
        seqs_.emplace(id, new_sequence());
        return id;
    }

    sequence_id fork(sequence_id source) override {
        const sequence& src = get(source, "fork");
        auto s = std::make_unique<sequence>();
        s->length = src.length;
        s->layers = share_layers(src.layers);
        s->mtp = share_layers(src.mtp);
        s->mtp_start = src.mtp_start;
        s->mtp_length = src.mtp_length;
        s->seed = src.seed;
        const sequence_id id = next_id_++;
        seqs_.emplace(id, std::move(s));
        return id;
    }

    void free(sequence_id seq) override { require(seqs_.erase(seq) == 1, "free: no " + seq_name(seq)); }

    std::int32_t length(sequence_id seq) const override { return get(seq, "length").length; }

    void truncate(sequence_id id, std::int32_t length) override {
        sequence& s = get(id, "truncate");
        require(length >= 0 && length <= s.length, "truncate: " + seq_name(id) + " has length " +
                                                       std::to_string(s.length) + "; cannot truncate to " +
                                                       std::to_string(length));
        if (length == s.length) return;
        require(s.length - length <= opts_.max_rollback,
                "truncate: " + seq_name(id) + " from " + std::to_string(s.length) + " to " + std::to_string(length) +
                    " is beyond the rollback reach of " + std::to_string(opts_.max_rollback) + " positions");
        // Every compressed layer must hold the frontier at `length` (a restore starts a new history).
        std::vector<const frontier*> at(s.layers.size(), nullptr);
        for (std::size_t il = 0; il < s.layers.size(); ++il) {
            if (d_.ratio_of(int(il)) == 0) continue;
            for (const frontier& f : s.layers[il].history)
                if (f.pos == length) at[il] = &f;
            require(at[il] != nullptr, "truncate: " + seq_name(id) + " has no compressor frontier at position " +
                                           std::to_string(length) + " (positions before a restore cannot be rolled back to)");
        }
        for (std::size_t il = 0; il < s.layers.size(); ++il) {
            layer_kv& k = s.layers[il];
            if (at[il] != nullptr) {
                k.attn_state = at[il]->attn_state;
                k.idx_state = at[il]->idx_state;
                k.n_comp = at[il]->n_comp;
            }
            std::erase_if(k.history, [&](const frontier& f) { return f.pos >= length; });
        }
        s.length = length;
        s.mtp_length = std::min(s.mtp_length, length);
        s.mtp_start = std::min(s.mtp_start, length);
        if (s.seed && s.seed->pos >= length) s.seed.reset();
    }

    std::vector<std::byte> snapshot(sequence_id id) const override {
        const sequence& s = get(id, "snapshot");
        snap::writer w;
        snap::put_shape(w, d_);
        w.put(s.length);
        const std::size_t ab = sz(attn_row_.bytes()), ib = sz(idx_row_.bytes());
        for (int il = 0; il < d_.n_layer; ++il) {
            const layer_kv& k = s.layers[sz(il)];
            const std::int32_t n_raw = std::min(s.length, d_.n_swa);
            for (std::int32_t i = s.length - n_raw; i < s.length; ++i) w.bytes(k.raw.row(i), ab);
            const int r = d_.ratio_of(il);
            if (r == 0) continue;
            w.put(k.n_comp);
            for (std::int64_t c = 0; c < k.n_comp; ++c) w.bytes(k.comp.row(c), ab);
            put_state(w, k.attn_state);
            if (r != 4) continue;
            for (std::int64_t c = 0; c < k.n_comp; ++c) w.bytes(k.idx.row(c), ib);
            put_state(w, k.idx_state);
        }
        return snap::seal(w.out);
    }

    void restore(sequence_id id, std::span<const std::byte> blob) override {
        get(id, "restore");
        // Parsed into a fresh sequence first: a bad blob throws before the live state is touched.
        seqs_[id] = parse_snapshot(blob);
    }

    engine::step_ticket submit(const engine::step_request& step) override {
        const plan p = validate(step);
        engine::step_result res = run_step(step, p);
        const engine::step_ticket t{next_ticket_++};
        results_.emplace(t.id, std::move(res));
        return t;
    }

    engine::step_result wait(engine::step_ticket t) override {
        const auto it = results_.find(t.id);
        require(it != results_.end(), "wait: ticket " + std::to_string(t.id) + " is unknown or was already waited for");
        engine::step_result r = std::move(it->second);
        results_.erase(it);
        return r;
    }

    std::vector<std::int32_t> draft(sequence_id id, std::int32_t n) override {
        sequence& s = get(id, "draft");
        require(mtp_.has_value(), "draft: no MTP head is loaded");
        require(n >= 1 && n <= opts_.max_draft,
                "draft: n = " + std::to_string(n) + " must be in [1, " + std::to_string(opts_.max_draft) + "]");
        require(s.seed.has_value() && s.seed->pos == s.length - 1,
                "draft: " + seq_name(id) + " has no kept HC state at its last position " + std::to_string(s.length - 1) +
                    " (submit its last row with keep_hc_state)");
        std::vector<std::int32_t> drafts{s.seed->token};
        if (n == 1) return drafts;
        // Recursive drafts read speculative rows: they run on a copy-on-write view of the window.
        std::vector<layer_kv> spec = share_layers(s.mtp);
        std::vector<float> hc = s.seed->hc;
        for (std::int32_t k = 1; k < n; ++k) {
            cpu_ops::batch b;
            b.rows.resize(1);
            row_work& r = b.rows[0];
            r.kv = &spec;
            r.pos = s.seed->pos + k;
            r.token = drafts.back();
            r.wants_output = true;
            r.window_start = s.mtp_start;
            r.prev_hc = hc.data();
            ops_.prepare(b);
            graph::mtp_forward(ops_, b, *mtp_);
            drafts.push_back(sample_argmax(r.logits.data(), d_.n_vocab));
            hc = r.X;
        }
        return drafts;
    }

private:
    using plan = engine::step_plan;

    static model::model_dims bind_dims(const gguf::file& f) {
        const model::model_dims want = model::expected_dims(f);
        model::require_valid(f, want);
        return want;
    }

    static std::uint64_t frontier_bytes(int ratio, int head_dim) {
        const int coff = ratio == 4 ? 2 : 1;
        return std::uint64_t(2) * std::uint64_t(coff * ratio) * std::uint64_t(coff * head_dim) * sizeof(float);
    }

    std::uint64_t state_bytes(const sequence& s) const {
        std::uint64_t b = s.seed ? s.seed->hc.size() * sizeof(float) : 0;
        for (const layer_kv& k : s.layers) {
            const std::uint64_t f = (k.attn_state.kv.size() + k.attn_state.score.size() + k.idx_state.kv.size() +
                                     k.idx_state.score.size()) * sizeof(float);
            b += f * (1 + k.history.size());
        }
        return b;
    }

    sequence& get(sequence_id id, std::string_view who) const {
        const auto it = seqs_.find(id);
        require(it != seqs_.end(), std::string(who) + ": no " + seq_name(id));
        return *it->second;
    }

    std::unique_ptr<sequence> new_sequence() {
        auto s = std::make_unique<sequence>();
        s->layers = new_layers(d_, attn_pool_, idx_pool_);
        if (mtp_) s->mtp = new_mtp_layers(attn_pool_);
        return s;
    }

    static std::vector<layer_kv> share_layers(const std::vector<layer_kv>& src) {
        std::vector<layer_kv> out;
        for (const layer_kv& k : src) {
            layer_kv c;
            c.raw = k.raw.share();
            c.comp = k.comp.share();
            c.idx = k.idx.share();
            c.attn_state = k.attn_state;
            c.idx_state = k.idx_state;
            c.n_comp = k.n_comp;
            c.history = k.history;
            out.push_back(std::move(c));
        }
        return out;
    }

    static void put_state(snap::writer& w, const compressor_state& st) {
        w.bytes(st.kv.data(), st.kv.size() * sizeof(float));
        w.bytes(st.score.data(), st.score.size() * sizeof(float));
    }
    static void get_state(snap::reader& rd, compressor_state& st, std::string_view what) {
        rd.bytes(st.kv.data(), st.kv.size() * sizeof(float), what);
        rd.bytes(st.score.data(), st.score.size() * sizeof(float), what);
    }

    std::unique_ptr<sequence> parse_snapshot(std::span<const std::byte> blob) {
        snap::reader rd = snap::open(blob, d_);
        auto s = new_sequence();
        s->length = rd.get<std::int32_t>("length");
        require(s->length >= 0, "snapshot: negative length");
        require(d_.context_length == 0 || s->length <= d_.context_length,
                "snapshot: length " + std::to_string(s->length) + " exceeds the context length");
        s->mtp_start = s->mtp_length = s->length;
        const std::size_t ab = sz(attn_row_.bytes()), ib = sz(idx_row_.bytes());
        for (int il = 0; il < d_.n_layer; ++il) {
            layer_kv& k = s->layers[sz(il)];
            const std::int32_t n_raw = std::min(s->length, d_.n_swa);
            for (std::int32_t i = s->length - n_raw; i < s->length; ++i) rd.bytes(k.raw.row_for_write(i), ab, "raw row");
            const int r = d_.ratio_of(il);
            if (r == 0) continue;
            k.n_comp = rd.get<std::int64_t>("compressed row count");
            require(k.n_comp == std::int64_t(s->length) / r,
                    "snapshot: layer " + std::to_string(il) + " has " + std::to_string(k.n_comp) +
                        " compressed rows for length " + std::to_string(s->length));
            for (std::int64_t c = 0; c < k.n_comp; ++c) rd.bytes(k.comp.row_for_write(c), ab, "compressed row");
            get_state(rd, k.attn_state, "compressor state");
            if (r != 4) continue;
            for (std::int64_t c = 0; c < k.n_comp; ++c) rd.bytes(k.idx.row_for_write(c), ib, "indexer row");
            get_state(rd, k.idx_state, "indexer compressor state");
        }
        require(rd.done(), "snapshot: trailing bytes after the last layer");
        return s;
    }

    plan validate(const engine::step_request& step) const {
        return engine::plan_step(
            step, d_, opts_.max_rows_per_step, [&](sequence_id s, const std::string& who) { return get(s, who).length; },
            true);
    }

    engine::step_result run_step(const engine::step_request& step, const plan& p) {
        cpu_ops::batch b;
        std::vector<std::size_t> row_of;  // batch row -> step row
        for (sequence_id seq : p.order) {
            sequence& s = *seqs_.at(seq);
            for (std::size_t i : p.rows.at(seq)) {
                row_work r;
                r.kv = &s.layers;
                r.pos = step.rows[i].pos;
                r.token = step.rows[i].token;
                r.wants_output = step.rows[i].out != engine::output::none;
                b.rows.push_back(std::move(r));
                row_of.push_back(i);
            }
        }
        ops_.prepare(b);
        graph::forward(graph::base_layer_rules{d_}, ops_, b);
        for (sequence_id seq : p.order) seqs_.at(seq)->length += std::int32_t(p.rows.at(seq).size());
        if (step.keep_hc_state && mtp_) advance_mtp(b, p);

        engine::step_result res;
        res.n_vocab = d_.n_vocab;
        std::vector<std::size_t> batch_of(step.rows.size());
        for (std::size_t k = 0; k < row_of.size(); ++k) batch_of[row_of[k]] = k;
        for (std::size_t i = 0; i < step.rows.size(); ++i) {
            if (p.sampler_of[i] == SIZE_MAX) continue;
            row_work& r = b.rows[batch_of[i]];
            const engine::sampler& sp = step.samplers[p.sampler_of[i]];
            engine::apply_adjust(sp, r.logits.data());
            const sampling_params params{sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.seed};
            engine::sampled out;
            out.row = i;
            // The draw is a function of (seed, position): batch-invariant and replayable.
            out.token = sample(r.logits.data(), d_.n_vocab, params, std::uint64_t(r.pos));
            out.logprob = logprob_of(r.logits.data(), d_.n_vocab, out.token);
            for (const token_logprob& t : top_logprobs(r.logits.data(), d_.n_vocab, sp.n_logprobs))
                out.top.push_back({t.token, t.logprob});
            res.outputs.push_back(std::move(out));
            if (step.rows[i].out == engine::output::logits) {
                res.logits_rows.push_back(i);
                res.logits.insert(res.logits.end(), r.logits.begin(), r.logits.end());
            }
        }
        return res;
    }

    // The MTP block runs over every row of a step that keeps its HC state, so its window holds
    // the real rows (§4: step 0 of a draft is the real row of the target's position); the last
    // row of each sequence seeds draft().
    void advance_mtp(const cpu_ops::batch& base, const plan& p) {
        cpu_ops::batch b;
        std::size_t k = 0;
        for (sequence_id seq : p.order) {
            sequence& s = *seqs_.at(seq);
            const std::size_t n = p.rows.at(seq).size();
            const std::int32_t first = base.rows[k].pos;
            if (s.mtp_length != first) s.mtp_start = first;  // a gap restarts the MTP window
            for (std::size_t j = 0; j < n; ++j, ++k) {
                row_work r;
                r.kv = &s.mtp;
                r.pos = base.rows[k].pos;
                r.token = base.rows[k].token;
                r.wants_output = j + 1 == n;
                r.window_start = s.mtp_start;
                r.prev_hc = base.rows[k].X.data();
                b.rows.push_back(std::move(r));
            }
        }
        ops_.prepare(b);
        graph::mtp_forward(ops_, b, *mtp_);
        k = 0;
        for (sequence_id seq : p.order) {
            sequence& s = *seqs_.at(seq);
            const std::size_t n = p.rows.at(seq).size();
            const row_work& last = b.rows[k + n - 1];
            s.mtp_length = last.pos + 1;
            s.seed = draft_seed{last.pos, sample_argmax(last.logits.data(), d_.n_vocab), last.X};
            k += n;
        }
    }

    gguf::file file_;
    model::model_dims d_;
    model_weights weights_;
    cpu_backend_options opts_;
    std::optional<gguf::file> mtp_file_;
    std::optional<mtp_weights> mtp_;
    model::attention_row_layout attn_row_;
    model::indexer_row_layout idx_row_;
    // Pools before sequences: page tables release into them when sequences are destroyed.
    model::kv_page_pool attn_pool_;
    model::kv_page_pool idx_pool_;
    cpu_ops ops_;
    std::map<sequence_id, std::unique_ptr<sequence>> seqs_;
    sequence_id next_id_ = 0;
    std::map<std::uint64_t, engine::step_result> results_;
    std::uint64_t next_ticket_ = 1;
};

}  // namespace

std::unique_ptr<engine::backend> make_cpu_backend(gguf::file model, const cpu_backend_options& options) {
    return std::make_unique<cpu_backend>(std::move(model), options);
}

std::unique_ptr<engine::backend> make_cpu_backend(const std::filesystem::path& model, const cpu_backend_options& options) {
    return make_cpu_backend(gguf::file::open(model), options);
}

}  // namespace ds4::ref
