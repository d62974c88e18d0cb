// The CUDA backend in exact mode against the CPU reference backend on the tiny synthetic model:
// the same steps (prefill chunks, decode rows and verify rows of three sequences mixed in one
// step) give bit-identical logits, samples and log-probabilities; both write the same snapshot
// bytes after the same history; a snapshot taken on one restores on the other and the sequence
// continues with the same bits; fork and truncate agree. The default mode (tensor-core attention)
// stays within a stated bound of the reference, measured on the gain-calibrated tiny model
// (docs/numerics.md). Skipped (exit 77) without a device.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "backends/cuda/cuda_backend.hpp"
#include "ds4/core/cuda_check.hpp"
#include "harness/synth/generator.hpp"
#include "reference/cpu_backend.hpp"
#include "tests/conformance/backend_conformance.hpp"

using namespace ds4;
using engine::output;
using engine::sequence_id;

namespace {

struct pair_of_backends {
    std::unique_ptr<engine::backend> cpu, cuda, fast;  // fast: the tensor-core attention
    // The same pair of modes on the gain-calibrated model (ds4-synth --gain-calibrated).
    std::unique_ptr<engine::backend> cpu_calibrated, fast_calibrated;
};

pair_of_backends& backends() {
    static pair_of_backends b = [] {
        if (!cuda_device_present()) {
            std::fprintf(stderr, "cuda_cross_backend_test_gpu: no CUDA device, skipped\n");
            std::exit(77);
        }
        const auto path = std::filesystem::temp_directory_path() /
                          ("ds4_cross_backend_" + std::to_string(::getpid()) + ".gguf");
        synth::write_options opt;
        opt.seed = 7;
        synth::write_model(path, model::dims_of<model::tiny_shape>(), opt);
        pair_of_backends p;
        p.cpu = ref::make_cpu_backend(path);
        cuda_backend::options o;
        o.exact = true;
        o.kv_capacity_bytes = std::uint64_t(1) << 30;
        p.cuda = cuda_backend::make_cuda_backend(path, o);
        o.exact = false;
        p.fast = cuda_backend::make_cuda_backend(path, o);
        std::filesystem::remove(path);
        opt.sat.residual_gain = synth::calibrated_residual_gain;
        synth::write_model(path, model::dims_of<model::tiny_shape>(), opt);
        p.cpu_calibrated = ref::make_cpu_backend(path);
        p.fast_calibrated = cuda_backend::make_cuda_backend(path, o);
        std::filesystem::remove(path);
        return p;
    }();
    return b;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs the same step on both backends and checks every output.
void same_step(const std::vector<engine::row>& rows, const std::vector<engine::sampler>& samplers) {
    pair_of_backends& b = backends();
    const engine::step_result c = b.cpu->run({rows, samplers, false});
    const engine::step_result g = b.cuda->run({rows, samplers, false});
    REQUIRE(c.outputs.size() == g.outputs.size());
    REQUIRE(c.logits_rows == g.logits_rows);
    for (std::size_t i = 0; i < c.logits_rows.size(); ++i) {
        CAPTURE(c.logits_rows[i]);
        CHECK(same_bits(c.logits_of(i), g.logits_of(i)));
    }
    for (std::size_t i = 0; i < c.outputs.size(); ++i) {
        CAPTURE(c.outputs[i].row);
        CHECK(c.outputs[i].row == g.outputs[i].row);
        CHECK(c.outputs[i].token == g.outputs[i].token);
        CHECK(std::memcmp(&c.outputs[i].logprob, &g.outputs[i].logprob, sizeof(float)) == 0);
        REQUIRE(c.outputs[i].top.size() == g.outputs[i].top.size());
        for (std::size_t k = 0; k < c.outputs[i].top.size(); ++k) {
            CHECK(c.outputs[i].top[k].token == g.outputs[i].top[k].token);
            CHECK(std::memcmp(&c.outputs[i].top[k].logprob, &g.outputs[i].top[k].logprob, sizeof(float)) == 0);
        }
    }
}

}  // namespace

TEST_CASE("cuda exact == cpu reference, bitwise, for prefill, decode and verify rows mixed in steps") {
    pair_of_backends& b = backends();
    const unsigned seed = std::random_device{}();
    INFO("seed " << seed);
    const int n = conformance::n_tokens;
    const auto ta = conformance::random_tokens(*b.cpu, seed + 1, n), tb = conformance::random_tokens(*b.cpu, seed + 2, n),
               tc = conformance::random_tokens(*b.cpu, seed + 3, n);
    // Sequence ids agree: both backends start from zero and count the same creates.
    const sequence_id a = b.cpu->create(), bb = b.cpu->create(), c = b.cpu->create();
    REQUIRE(b.cuda->create() == a);
    REQUIRE(b.cuda->create() == bb);
    REQUIRE(b.cuda->create() == c);
    const engine::sampler hot{0.8f, 0.9f, 0.01f, 30, 4242, 4};
    int pa = 0, pb = 0, pc = 0;
    // Each step: a's next chunk (prefill, then single decode rows), b's verify-sized runs of 3,
    // c joining late with one long prefill chunk; outputs alternate between logits and samples.
    for (int step = 0; pa < n || pb < n || pc < n; ++step) {
        std::vector<engine::row> rows;
        std::vector<engine::sampler> samplers;
        auto add = [&](sequence_id s, const std::vector<std::int32_t>& t, int& p, int count) {
            for (int k = 0; k < count && p < n; ++k, ++p) {
                const output o = (p + step) % 3 == 0 ? output::sample : output::logits;
                rows.push_back({s, p, t[std::size_t(p)], o});
                samplers.push_back((p % 2) ? hot : engine::sampler{});
            }
        };
        add(a, ta, pa, step == 0 ? 20 : 1);
        add(bb, tb, pb, 3);
        if (step >= 2) add(c, tc, pc, step == 2 ? 30 : 2);
        // Reverse the row order every other step: the order inside a step must not matter.
        if (step % 2) {
            std::reverse(rows.begin(), rows.end());
            std::reverse(samplers.begin(), samplers.end());
        }
        CAPTURE(step);
        same_step(rows, samplers);
    }
    for (sequence_id s : {a, bb, c}) {
        CHECK(b.cpu->snapshot(s) == b.cuda->snapshot(s));
        b.cpu->free(s);
        b.cuda->free(s);
    }
}

// Steps whose rows all want output and whose sequences have at most 16 rows each are captured
// (decode rows, verify runs) and keyed by their row-capacity bucket: one graph replays for 3 and
// 4 rows, for 19 and 20 (two sub-batches), for any split of the rows into runs. Every step
// equals the reference bitwise; after the verify runs (whose later rows save their frontiers
// inside the compressor launch) each sequence rolls back 2 rows and the snapshots still agree.
TEST_CASE("captured steps replay across row counts of a bucket and across runs; rollbacks after them agree") {
    pair_of_backends& b = backends();
    const unsigned seed = std::random_device{}();
    INFO("seed " << seed);
    constexpr int n_seq = 6;
    std::vector<sequence_id> ids;
    std::vector<std::vector<std::int32_t>> toks;
    std::vector<int> pos(n_seq, 0);
    for (int q = 0; q < n_seq; ++q) {
        ids.push_back(b.cpu->create());
        REQUIRE(b.cuda->create() == ids.back());
        toks.push_back(conformance::random_tokens(*b.cpu, seed + 10 + unsigned(q), 4 * conformance::n_tokens));
    }
    const engine::sampler hot{0.8f, 0.9f, 0.01f, 30, 4242, 4};
    // Prompts of 5 + q tokens, outputs only at the last.
    {
        std::vector<engine::row> rows;
        for (int q = 0; q < n_seq; ++q)
            for (; pos[q] < 5 + q; ++pos[q])
                rows.push_back({ids[q], pos[q], toks[q][std::size_t(pos[q])], pos[q] == 4 + q ? output::logits : output::none});
        const std::vector<engine::sampler> samplers(n_seq);  // one per output row: each prompt's last
        same_step(rows, samplers);
    }
    // Rows per sequence of each step (0: not in the step).
    const std::vector<std::vector<int>> plan = {
        {1, 1, 1, 0, 0, 0}, {1, 1, 1, 1, 0, 0},  // 3 and 4 rows: bucket 4
        {3, 1, 0, 0, 0, 0}, {1, 2, 0, 0, 0, 0},  // runs, 4 and 3 rows
        {1, 1, 1, 1, 1, 1}, {2, 1, 1, 1, 1, 0},  // 6 rows, bucket 8, then runs
        {4, 4, 4, 4, 4, 0}, {4, 4, 4, 4, 3, 0},  // 20 and 19 rows: 16 + bucket 4
        {1, 1, 1, 1, 1, 1},
    };
    // Every fourth position's sampler carries logit adjustments (logit_bias, penalties): the
    // adjustment launch is in the captured step too.
    const std::int32_t n_vocab = b.cpu->dims().n_vocab;
    std::deque<std::vector<engine::logit_adjust>> adjust;
    auto run_plan = [&](const std::vector<int>& counts, int step) {
        std::vector<engine::row> rows;
        std::vector<engine::sampler> samplers;
        for (int q = 0; q < n_seq; ++q)
            for (int k = 0; k < counts[std::size_t(q)]; ++k, ++pos[q]) {
                const output o = (pos[q] + step) % 3 == 0 ? output::sample : output::logits;
                rows.push_back({ids[q], pos[q], toks[q][std::size_t(pos[q])], o});
                samplers.push_back((pos[q] % 2) ? hot : engine::sampler{});
                if (pos[q] % 4 == 1) {
                    adjust.push_back({{(pos[q] * 7) % n_vocab, 1.5f}, {(pos[q] * 7 + 1) % n_vocab, -2.25f}});
                    samplers.back().adjust = adjust.back();
                }
            }
        if (step % 2) {
            std::reverse(rows.begin(), rows.end());
            std::reverse(samplers.begin(), samplers.end());
        }
        CAPTURE(step);
        same_step(rows, samplers);
    };
    int step = 0;
    for (const auto& counts : plan) run_plan(counts, step++);
    for (int q = 0; q < n_seq; ++q) {
        pos[q] -= 2;
        b.cpu->truncate(ids[q], pos[q]);
        b.cuda->truncate(ids[q], pos[q]);
        CHECK(b.cpu->snapshot(ids[q]) == b.cuda->snapshot(ids[q]));
    }
    for (const auto& counts : plan) run_plan(counts, step++);
    for (int q = 0; q < n_seq; ++q) {
        CHECK(b.cpu->snapshot(ids[q]) == b.cuda->snapshot(ids[q]));
        b.cpu->free(ids[q]);
        b.cuda->free(ids[q]);
    }
}

TEST_CASE("snapshots cross backends; fork and truncate agree") {
    pair_of_backends& b = backends();
    const unsigned seed = std::random_device{}();
    INFO("seed " << seed);
    const int n = conformance::n_tokens;
    const auto t = conformance::random_tokens(*b.cpu, seed + 5, n);
    auto span_rows = [&](sequence_id s, int from, int to) {
        std::vector<engine::row> rows;
        for (int p = from; p < to; ++p) rows.push_back({s, p, t[std::size_t(p % n)], output::logits});
        return rows;
    };
    auto logits = [&](engine::backend& be, sequence_id s, int from, int to) {
        const auto rows = span_rows(s, from, to);
        const std::vector<engine::sampler> samplers(rows.size());
        return be.run({rows, samplers, false}).logits;
    };
    const sequence_id x = b.cpu->create();
    REQUIRE(b.cuda->create() == x);
    logits(*b.cpu, x, 0, 37);
    logits(*b.cuda, x, 0, 37);
    const auto cpu_blob = b.cpu->snapshot(x), cuda_blob = b.cuda->snapshot(x);
    CHECK(cpu_blob == cuda_blob);

    // CPU snapshot -> CUDA sequence, CUDA snapshot -> CPU sequence; both continue alike.
    const sequence_id y = b.cpu->create();
    REQUIRE(b.cuda->create() == y);
    b.cuda->restore(y, cpu_blob);
    b.cpu->restore(y, cuda_blob);
    CHECK(b.cuda->length(y) == 37);
    CHECK(b.cpu->snapshot(y) == b.cuda->snapshot(y));
    const auto cont_cpu = logits(*b.cpu, y, 37, n), cont_cuda = logits(*b.cuda, y, 37, n);
    CHECK(same_bits(cont_cpu, cont_cuda));
    const auto x_cpu = logits(*b.cpu, x, 37, n), x_cuda = logits(*b.cuda, x, 37, n);
    CHECK(same_bits(cont_cuda, x_cuda));
    CHECK(same_bits(x_cpu, x_cuda));

    // Fork x at n, speculate 5 rows, truncate back to n + 1: the same snapshot bytes on both.
    const sequence_id f = b.cpu->fork(x);
    REQUIRE(b.cuda->fork(x) == f);
    auto spec = span_rows(f, n, n + 5);
    for (auto& r : spec) r.token = (r.token + 11) % b.cpu->dims().n_vocab;
    const std::vector<engine::sampler> samplers(spec.size());
    const auto sc = b.cpu->run({spec, samplers, false}), sg = b.cuda->run({spec, samplers, false});
    CHECK(same_bits(sc.logits, sg.logits));
    b.cpu->truncate(f, n + 1);
    b.cuda->truncate(f, n + 1);
    CHECK(b.cpu->snapshot(f) == b.cuda->snapshot(f));
    CHECK(b.cuda->snapshot(x) == b.cpu->snapshot(x));  // the fork's writes never reached x
    for (sequence_id s : {x, y, f}) {
        b.cpu->free(s);
        b.cuda->free(s);
    }
}

// The tensor-core attention rounds q and p to F16 (kernels/attention_decode_mma.cuh): each call's
// output is within relative L2 3e-3 of the exact order (docs/kernels.md). The layers after it
// carry that error to the logits, and on a random-weight model they amplify it chaotically (the
// default tiny model: 37x at 3e-3 per call), so the bound is stated on the gain-calibrated tiny
// model (docs/numerics.md). With every attention output of every layer perturbed by relative L2
// 3e-3, the reference's logits move by at most calibrated_amplification_at_3e_3 (5) * 3e-3 per
// row (measured 2.7-3.2x; tests/synth_calibration_test.cpp checks it). The response grows with
// the perturbation (about 7e-3 at 1e-3, 8-10e-3 at 3e-3), so a kernel within its per-call bound
// stays under the response at the bound; the margin of 2 covers the difference between the
// Gaussian perturbation of the calibration and the kernel's rounding-shaped error and other
// token sets:
//   logits relative L2 <= 3e-3 * 5 * 2 = 3e-2 per row.
constexpr double attention_call_rel_l2 = 3e-3;
constexpr double whole_model_margin = 2.0;
constexpr double whole_model_rel_l2 =
    attention_call_rel_l2 * synth::calibrated_amplification_at_3e_3 * whole_model_margin;

namespace {

struct logits_gap {
    double worst_rel = 0.0, worst_abs = 0.0;  // relative L2; max |diff| / max |logit|
    std::vector<double> rel;                   // per row
};

// A 48-token prefill of the same tokens on the reference and on the tensor-core mode.
logits_gap prefill_gap(engine::backend& cpu, engine::backend& fast, const std::vector<std::int32_t>& t) {
    const int n = int(t.size());
    const sequence_id s = cpu.create(), f = fast.create();
    std::vector<engine::row> rows_c, rows_f;
    for (int p = 0; p < n; ++p) {
        rows_c.push_back({s, p, t[std::size_t(p)], output::logits});
        rows_f.push_back({f, p, t[std::size_t(p)], output::logits});
    }
    const std::vector<engine::sampler> samplers(rows_c.size());
    const engine::step_result c = cpu.run({rows_c, samplers, false});
    const engine::step_result g = fast.run({rows_f, samplers, false});
    REQUIRE(c.logits_rows.size() == g.logits_rows.size());
    logits_gap gap;
    for (std::size_t i = 0; i < c.logits_rows.size(); ++i) {
        const auto a = c.logits_of(i), x = g.logits_of(i);
        double num = 0.0, den = 0.0, amax = 0.0, dmax = 0.0;
        for (std::size_t k = 0; k < a.size(); ++k) {
            const double d = double(x[k]) - double(a[k]);
            num += d * d;
            den += double(a[k]) * double(a[k]);
            amax = std::max(amax, std::abs(double(a[k])));
            dmax = std::max(dmax, std::abs(d));
        }
        gap.rel.push_back(std::sqrt(num / std::max(den, 1e-30)));
        gap.worst_rel = std::max(gap.worst_rel, gap.rel.back());
        gap.worst_abs = std::max(gap.worst_abs, dmax / std::max(amax, 1e-30));
    }
    cpu.free(s);
    fast.free(f);
    return gap;
}

}  // namespace

TEST_CASE("cuda default mode (tensor-core attention) stays within the stated bound of the reference") {
    pair_of_backends& b = backends();
    const unsigned seed = std::random_device{}();
    INFO("seed " << seed);
    const auto t = conformance::random_tokens(*b.cpu, seed + 9, conformance::n_tokens);
    b.cuda->free(b.cuda->create());  // keeps the exact backend's ids in step with the CPU's

    const logits_gap cal = prefill_gap(*b.cpu_calibrated, *b.fast_calibrated, t);
    for (std::size_t i = 0; i < cal.rel.size(); ++i) {
        CAPTURE(i);
        CHECK(cal.rel[i] <= whole_model_rel_l2);
    }
    MESSAGE("calibrated model (gain " << synth::calibrated_residual_gain << "): tensor-core mode vs reference over "
                                      << cal.rel.size() << " rows: worst relative L2 " << cal.worst_rel
                                      << " (bound " << whole_model_rel_l2 << "), worst max |diff| / max |logit| "
                                      << cal.worst_abs);
    // The default (chaotic) model: information only, no bound is stated on it.
    const logits_gap raw = prefill_gap(*b.cpu, *b.fast, t);
    MESSAGE("default model (not asserted): worst relative L2 " << raw.worst_rel << ", worst max |diff| / max |logit| "
                                                                << raw.worst_abs);
}
