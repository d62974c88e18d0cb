// ds4-bench: the whole model through the engine contract, on whichever backend open_backend
// picks (the CUDA backend on a GPU machine, the CPU reference elsewhere).
//
//   frontier sweep  one sequence; prefill in chunks of --chunk tokens up to each frontier (every
//                   --step tokens up to --max-ctx), then --decode greedy decode steps; per
//                   frontier the incremental prefill tok/s (the chunks since the last frontier)
//                   and the decode tok/s at that context.
//   batch sweep     N sequences (1, 2, 4, ... --max-batch), forked (copy on write) from one
//                   prompt of --batch-ctx tokens prefilled once, each then decoding greedily
//                   from its own random first token (so their rows and routes differ), --decode
//                   steps in which every sequence decodes one token; aggregate and per-sequence
//                   decode tok/s. The sweep stops at the first N the backend cannot hold (its
//                   error is printed: the figure a server would refuse at).
//   op breakdown    (--op-breakdown) one sequence prefilled with --batch-ctx tokens, then --decode
//                   decode steps at batch 1 with the backend's op timing on
//                   (engine::backend::set_profiling): per op family the calls, launches and GPU
//                   ms per step, the weight bytes it streams and their bandwidth floor; printed
//                   as a table and written to --op-csv.
//   prefill breakdown (--prefill-breakdown) the same for one --chunk-token prefill step after
//                   --batch-ctx tokens of context (per family: GPU ms of that step).
//   verify sweep    (--verify K) the cost side of speculative decoding: one sequence of
//                   --batch-ctx tokens, then --decode steps of k rows of it (k = 1..K: the decode
//                   row and k - 1 verify rows, every row sampled), each followed by the rollback
//                   of the k - 1 verify rows (truncate: every draft rejected, the worst case); per
//                   k the median step and rollback ms and the step's cost against k = 1. With
//                   acceptance a the drafts of a step yield 1 + a + ... + a^(k-1) tokens.
// Times are wall-clock medians around submit + wait, after one warm-up step of the same shape:
// what a server sees. The CSV goes to --csv, an SVG plot of both sweeps to --svg; the memory
// figures are the backend's ledger (device memory as the device reports it, never RSS).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backends/open_backend.hpp"
#include "ds4/core/error.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using ds4::engine::output;

struct options {
    std::string model, backend = "auto", csv = "ds4-bench.csv", svg = "ds4-bench.svg", op_csv = "ds4-bench-ops.csv";
    int chunk = 2048, step = 2048, max_ctx = 65536, decode = 128, max_batch = 256, batch_ctx = 2048;
    int max_rollback = -1;
    int chunk_rows = 0;
    int verify = 0;
    bool exact = false, frontier = true, batch = true, op_breakdown = false, prefill_breakdown = false;
};

double seconds(clock_type::time_point a, clock_type::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

struct frontier_row {
    int ctx;
    double prefill_tok_s, decode_tok_s, decode_ms_median;
    std::uint64_t device_used;
};

struct verify_row {
    int rows;
    double step_ms_median, rollback_ms_median, step_vs_one;
};

struct batch_row {
    int n_seq;
    double aggregate_tok_s, per_seq_tok_s, step_ms_median;
    std::uint64_t device_used;
};

std::uint64_t device_used(const ds4::engine::backend& b) {
    const ds4::engine::memory_ledger m = b.memory();
    return m.device_total - m.device_free;
}

class runner {
public:
    runner(ds4::engine::backend& b, const options& o) : b_(b), o_(o), pick_(0, b.dims().n_vocab - 1) {}

    // Prefills seq from its length to `to` in chunks; returns the seconds it took.
    double prefill(ds4::engine::sequence_id seq, int to) {
        double t = 0.0;
        for (int p = b_.length(seq); p < to;) {
            const int n = std::min(o_.chunk, to - p);
            std::vector<ds4::engine::row> rows;
            for (int i = 0; i < n; ++i) rows.push_back({seq, p + i, token(), output::none});
            const auto t0 = clock_type::now();
            b_.run({rows, {}, false});
            t += seconds(t0, clock_type::now());
            p += n;
        }
        return t;
    }

    // n greedy decode steps over all `seqs` at once; returns each step's seconds. With `digest`,
    // folds every sampled token into it (FNV-1a): two runs of one model and seed that print the
    // same digest sampled the same tokens, a whole-model check that two switches give the same
    // bits (a random-weight model's argmax moves with any rounding change upstream).
    std::vector<double> decode(const std::vector<ds4::engine::sequence_id>& seqs, int n,
                               std::uint64_t* digest = nullptr) {
        std::vector<std::int32_t> next(seqs.size());
        for (auto& t : next) t = token();
        const std::vector<ds4::engine::sampler> samplers(seqs.size());
        std::vector<double> times;
        for (int s = 0; s < n; ++s) {
            std::vector<ds4::engine::row> rows;
            for (std::size_t i = 0; i < seqs.size(); ++i) rows.push_back({seqs[i], b_.length(seqs[i]), next[i], output::sample});
            const auto t0 = clock_type::now();
            const ds4::engine::step_result r = b_.run({rows, samplers, false});
            times.push_back(seconds(t0, clock_type::now()));
            for (std::size_t i = 0; i < seqs.size(); ++i) {
                next[i] = r.outputs[i].token;
                if (digest) *digest = (*digest ^ std::uint64_t(std::uint32_t(next[i]))) * 0x100000001b3ull;
            }
        }
        return times;
    }

    std::vector<frontier_row> frontier_sweep() {
        std::vector<frontier_row> out;
        const ds4::engine::sequence_id warm = b_.create();
        decode({warm}, 1);  // warm-up: first launches, graph capture
        b_.free(warm);
        const ds4::engine::sequence_id seq = b_.create();
        for (int f = o_.step; f <= o_.max_ctx; f += o_.step) {
            const int from = b_.length(seq);
            const double pt = prefill(seq, f);
            // The decode rows are rolled back so the next frontier continues the prompt.
            const ds4::engine::sequence_id probe = b_.fork(seq);
            std::uint64_t digest = 0xcbf29ce484222325ull;
            const std::vector<double> dt = decode({probe}, o_.decode, &digest);
            b_.free(probe);
            const double med = median(dt);
            out.push_back({f, double(f - from) / pt, med > 0 ? 1.0 / med : 0.0, med * 1e3, device_used(b_)});
            std::fprintf(stderr, "frontier %7d: prefill %9.1f tok/s, decode %8.2f tok/s (%.3f ms/token), tokens %016llx\n",
                         f, out.back().prefill_tok_s, out.back().decode_tok_s, out.back().decode_ms_median,
                         static_cast<unsigned long long>(digest));
        }
        b_.free(seq);
        return out;
    }

    // The backend's op-family record of --decode steps at batch 1 (CSV text; "" when the
    // backend cannot profile).
    std::string op_breakdown() {
        const ds4::engine::sequence_id seq = b_.create();
        prefill(seq, o_.batch_ctx);
        decode({seq}, 2);  // warm-up, untimed
        std::string report;
        if (b_.set_profiling(true)) {
            decode({seq}, o_.decode);
            report = b_.profile_report();
            b_.set_profiling(false);
        }
        b_.free(seq);
        return report;
    }

    // The backend's op-family record of one --chunk-token prefill step after --batch-ctx tokens.
    std::string prefill_breakdown() {
        const ds4::engine::sequence_id seq = b_.create();
        prefill(seq, o_.batch_ctx);
        std::string report;
        if (b_.set_profiling(true)) {
            prefill(seq, o_.batch_ctx + o_.chunk);
            report = b_.profile_report();
            b_.set_profiling(false);
        }
        b_.free(seq);
        return report;
    }

    std::vector<verify_row> verify_sweep() {
        std::vector<verify_row> out;
        const ds4::engine::sequence_id seq = b_.create();
        prefill(seq, o_.batch_ctx);
        for (int k = 1; k <= o_.verify; ++k) {
            const std::vector<ds4::engine::sampler> samplers(static_cast<std::size_t>(k));
            std::vector<double> step, back;
            for (int s = 0; s <= o_.decode; ++s) {  // step 0 warms this row count up, untimed
                const std::int32_t at = b_.length(seq);
                std::vector<ds4::engine::row> rows;
                for (int i = 0; i < k; ++i) rows.push_back({seq, at + i, token(), output::sample});
                const auto t0 = clock_type::now();
                b_.run({rows, samplers, false});
                const auto t1 = clock_type::now();
                if (k > 1) b_.truncate(seq, at + 1);
                const auto t2 = clock_type::now();
                if (s == 0) continue;
                step.push_back(seconds(t0, t1));
                back.push_back(seconds(t1, t2));
            }
            const double med = median(step);
            out.push_back({k, med * 1e3, median(back) * 1e3, out.empty() ? 1.0 : med * 1e3 / out.front().step_ms_median});
            std::fprintf(stderr, "verify %2d rows: %.3f ms/step (%.2fx one row), rollback %.3f ms\n", k,
                         out.back().step_ms_median, out.back().step_vs_one, out.back().rollback_ms_median);
        }
        b_.free(seq);
        return out;
    }

    std::vector<batch_row> batch_sweep() {
        std::vector<batch_row> out;
        const ds4::engine::sequence_id base = b_.create();
        prefill(base, o_.batch_ctx);
        for (int n = 1; n <= o_.max_batch; n *= 2) {
            std::vector<ds4::engine::sequence_id> seqs;
            try {
                for (int i = 0; i < n; ++i) seqs.push_back(b_.fork(base));
                decode(seqs, 1);  // warm-up of this row count
                const double med = median(decode(seqs, o_.decode));
                out.push_back({n, med > 0 ? n / med : 0.0, med > 0 ? 1.0 / med : 0.0, med * 1e3, device_used(b_)});
                std::fprintf(stderr, "batch %4d: %10.1f tok/s aggregate, %8.2f tok/s per sequence (%.3f ms/step)\n", n,
                             out.back().aggregate_tok_s, out.back().per_seq_tok_s, out.back().step_ms_median);
            } catch (const ds4::error& e) {
                std::fprintf(stderr, "batch %4d: stopped: %s\n", n, e.what());
                for (auto s : seqs) b_.free(s);
                break;
            }
            for (auto s : seqs) b_.free(s);
        }
        b_.free(base);
        return out;
    }

private:
    std::int32_t token() { return pick_(rng_); }

    ds4::engine::backend& b_;
    const options& o_;
    std::mt19937 rng_{1234};
    std::uniform_int_distribution<std::int32_t> pick_;
};

// One polyline chart: x on a log2 axis when asked, y linear from 0.
std::string chart(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                  const std::vector<std::pair<double, double>>& a, const std::string& a_name,
                  const std::vector<std::pair<double, double>>& b, const std::string& b_name, bool log_x, int y0) {
    const double w = 560, h = 260, left = 70, top = y0 + 30;
    double xmin = 1e300, xmax = -1e300, ymax = 0;
    for (const auto* s : {&a, &b})
        for (auto [x, y] : *s) {
            const double xv = log_x ? std::log2(x) : x;
            xmin = std::min(xmin, xv), xmax = std::max(xmax, xv), ymax = std::max(ymax, y);
        }
    if (xmax <= xmin) xmax = xmin + 1;
    if (ymax <= 0) ymax = 1;
    auto px = [&](double x) { return left + ((log_x ? std::log2(x) : x) - xmin) / (xmax - xmin) * w; };
    auto py = [&](double y) { return top + h - y / ymax * h; };
    std::string s;
    char buf[256];
    std::snprintf(buf, sizeof buf, "<text x='%g' y='%d' font-size='14'>%s</text>\n", left, y0 + 18, title.c_str());
    s += buf;
    std::snprintf(buf, sizeof buf, "<rect x='%g' y='%g' width='%g' height='%g' fill='none' stroke='#999'/>\n", left, top, w, h);
    s += buf;
    std::snprintf(buf, sizeof buf, "<text x='%g' y='%g' font-size='11'>%s</text><text x='4' y='%g' font-size='11'>%.0f</text>"
                                   "<text x='4' y='%g' font-size='11'>%s</text>\n",
                  left + w / 2 - 40, top + h + 28, xlabel.c_str(), top + 10, ymax, top + h / 2, ylabel.c_str());
    s += buf;
    auto line = [&](const std::vector<std::pair<double, double>>& v, const char* color, const std::string& name, int k) {
        std::string pts;
        for (auto [x, y] : v) {
            std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(x), py(y));
            pts += buf;
        }
        s += "<polyline fill='none' stroke='" + std::string(color) + "' stroke-width='2' points='" + pts + "'/>\n";
        std::snprintf(buf, sizeof buf, "<text x='%g' y='%g' font-size='11' fill='%s'>%s</text>\n", left + w + 8,
                      top + 14.0 * (k + 1), color, name.c_str());
        s += buf;
    };
    if (!a.empty()) line(a, "#1f77b4", a_name, 0);
    if (!b.empty()) line(b, "#d62728", b_name, 1);
    return s;
}

// The op breakdown's CSV as an aligned table on stderr.
void print_table(const std::string& csv, const std::string& title) {
    std::fprintf(stderr, "%s (per step):\n", title.c_str());
    std::fprintf(stderr, "%-13s %8s %9s %10s %12s %10s\n", "family", "calls", "launches", "gpu_ms", "weight_MB",
                 "floor_ms");
    std::size_t at = csv.find('\n') + 1;  // past the header
    while (at < csv.size()) {
        const std::size_t end = csv.find('\n', at);
        std::vector<std::string> f;
        std::size_t c = at;
        for (std::size_t k; (k = csv.find(',', c)) < end; c = k + 1) f.push_back(csv.substr(c, k - c));
        f.push_back(csv.substr(c, end - c));
        at = end + 1;
        if (f.size() != 6) continue;
        const double mb = f[4].empty() ? 0.0 : std::stod(f[4]) / 1e6;
        std::fprintf(stderr, "%-13s %8s %9s %10s %12s %10s\n", f[0].c_str(), f[1].c_str(), f[2].c_str(),
                     f[3].c_str(), f[4].empty() ? "" : std::to_string(mb).substr(0, std::to_string(mb).find('.') + 2).c_str(),
                     f[5].c_str());
    }
}

}  // namespace

int main(int argc, char** argv) {
    options o;
    CLI::App app{"ds4-bench: frontier and batch sweeps of the whole model through the engine contract"};
    app.add_option("-m,--model", o.model, "GGUF model file")->required();
    app.add_option("--backend", o.backend, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    app.add_flag("--exact", o.exact, "CUDA: the exact CUDA-core attention");
    app.add_option("--max-rollback", o.max_rollback,
                   "truncate() reach the backend keeps per sequence (frontier copies); -1: its default")
        ->check(CLI::Range(-1, 1 << 16));
    app.add_option("--chunk", o.chunk, "prefill chunk (tokens)")->check(CLI::Range(1, 1 << 20));
    app.add_option("--chunk-rows", o.chunk_rows, "CUDA: rows of the backend's largest prefill chunk (16..4096); 0: its default")
        ->check(CLI::Range(0, 4096));
    app.add_option("--step", o.step, "frontier spacing (tokens)")->check(CLI::Range(1, 1 << 24));
    app.add_option("--max-ctx", o.max_ctx, "last frontier (tokens)")->check(CLI::Range(1, 1 << 24));
    app.add_option("--decode", o.decode, "greedy decode steps per measurement")->check(CLI::Range(1, 1 << 16));
    app.add_option("--max-batch", o.max_batch, "largest batch of the batch sweep")->check(CLI::Range(1, 4096));
    app.add_option("--batch-ctx", o.batch_ctx, "tokens each sequence of the batch sweep holds")->check(CLI::Range(1, 1 << 24));
    app.add_option("--csv", o.csv, "CSV output");
    app.add_option("--svg", o.svg, "SVG plot output");
    app.add_flag("!--no-frontier", o.frontier, "skip the frontier sweep");
    app.add_flag("!--no-batch", o.batch, "skip the batch sweep");
    app.add_flag("--op-breakdown", o.op_breakdown, "per-op-family timing of decode at batch 1 (after the sweeps)");
    app.add_option("--op-csv", o.op_csv, "CSV output of --op-breakdown");
    app.add_flag("--prefill-breakdown", o.prefill_breakdown,
                 "per-op-family timing of one --chunk-token prefill step after --batch-ctx tokens (after the sweeps)");
    app.add_option("--verify", o.verify,
                   "verify sweep: steps of 1..K rows of one sequence, the K - 1 verify rows rolled back (0: off)")
        ->check(CLI::Range(0, 64));
    CLI11_PARSE(app, argc, argv);
    try {
        ds4::backends::backend_options bo;
        bo.model = o.model;
        bo.kind = ds4::backends::parse_backend_kind(o.backend);
        bo.exact = o.exact;
        bo.max_rollback = o.max_rollback;
        bo.chunk_rows = o.chunk_rows;
        const auto t_load = clock_type::now();
        const auto b = ds4::backends::open_backend(bo);
        const ds4::engine::memory_ledger m = b->memory();
        std::fprintf(stderr, "ds4-bench: %s on %s, loaded in %.1f s, weights %.2f GiB, device used %.2f of %.2f GiB\n",
                     o.model.c_str(), b->caps().name.c_str(), seconds(t_load, clock_type::now()),
                     double(m.weights) / (1u << 30), double(m.device_total - m.device_free) / (1u << 30),
                     double(m.device_total) / (1u << 30));
        ds4::require(!o.frontier || o.max_ctx <= b->dims().context_length, "--max-ctx " + std::to_string(o.max_ctx) +
                                                                " exceeds the model's context " +
                                                                std::to_string(b->dims().context_length));
        ds4::require(o.verify <= b->caps().max_rollback + 1,
                     "--verify " + std::to_string(o.verify) + " rolls back " + std::to_string(o.verify - 1) +
                         " rows, over the backend's reach of " + std::to_string(b->caps().max_rollback) + " (--max-rollback)");
        runner r(*b, o);
        const auto fr = o.frontier ? r.frontier_sweep() : std::vector<frontier_row>{};
        const auto br = o.batch ? r.batch_sweep() : std::vector<batch_row>{};
        const auto vr = o.verify > 0 ? r.verify_sweep() : std::vector<verify_row>{};
        std::ofstream csv(o.csv);
        csv << "sweep,x,prefill_tok_s,decode_tok_s,per_seq_tok_s,ms_median,device_used_bytes\n";
        for (const auto& f : fr)
            csv << "frontier," << f.ctx << ',' << f.prefill_tok_s << ',' << f.decode_tok_s << ',' << f.decode_tok_s << ','
                << f.decode_ms_median << ',' << f.device_used << '\n';
        for (const auto& x : br)
            csv << "batch," << x.n_seq << ",," << x.aggregate_tok_s << ',' << x.per_seq_tok_s << ',' << x.step_ms_median
                << ',' << x.device_used << '\n';
        // Verify rows: x = rows a step, ms_median the step's; decode_tok_s the tokens a second if
        // every draft were accepted (k per step).
        for (const auto& v : vr)
            csv << "verify," << v.rows << ",," << v.rows * 1e3 / v.step_ms_median << ",," << v.step_ms_median << ",\n";
        std::vector<std::pair<double, double>> pre, dec, agg, per;
        for (const auto& f : fr) pre.push_back({double(f.ctx), f.prefill_tok_s}), dec.push_back({double(f.ctx), f.decode_tok_s});
        for (const auto& x : br) agg.push_back({double(x.n_seq), x.aggregate_tok_s}), per.push_back({double(x.n_seq), x.per_seq_tok_s});
        std::ofstream svg(o.svg);
        svg << "<svg xmlns='http://www.w3.org/2000/svg' width='760' height='700' font-family='sans-serif'>\n"
            << chart("frontier sweep (" + b->caps().name + ")", "context (tokens)", "tok/s", pre, "prefill", dec,
                     "decode", false, 0)
            << chart("batch sweep", "sequences (log2)", "tok/s", agg, "aggregate", per, "per sequence", true, 340)
            << "</svg>\n";
        std::fprintf(stderr, "ds4-bench: wrote %s and %s\n", o.csv.c_str(), o.svg.c_str());
        if (o.op_breakdown) {
            const std::string ops = r.op_breakdown();
            if (ops.empty()) {
                std::fprintf(stderr, "ds4-bench: the %s backend has no op timing\n", b->caps().name.c_str());
            } else {
                std::ofstream(o.op_csv) << ops;
                print_table(ops, "op breakdown, decode at batch 1, " + std::to_string(o.batch_ctx) + " tokens of context");
                std::fprintf(stderr, "ds4-bench: wrote %s\n", o.op_csv.c_str());
            }
        }
        if (o.prefill_breakdown) {
            const std::string ops = r.prefill_breakdown();
            if (ops.empty())
                std::fprintf(stderr, "ds4-bench: the %s backend has no op timing\n", b->caps().name.c_str());
            else
                print_table(ops, "op breakdown, one prefill step of " + std::to_string(o.chunk) + " tokens after " +
                                     std::to_string(o.batch_ctx));
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ds4-bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
