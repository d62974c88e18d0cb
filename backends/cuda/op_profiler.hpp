#pragma once
// Opt-in timing of the CUDA backend's op families (engine::backend::set_profiling, or
// DS4_OP_TIMING=1 in the environment when the backend opens): a pair of CUDA events around every
// op of the layer program, the step's span between two more, resolved after each step (the
// profiled step is synchronised, so two steps never overlap while it is on). A family's time is
// the sum of its ops' event spans; "gaps" is the step's GPU span minus every op's: time the GPU
// waited for the host between launches. Launches are the launcher calls the op set makes (a
// kernel-library launcher may run more than one kernel: split-K reductions, the indexer's passes,
// the MoE's phases). Weight bytes are what a family's ops stream from the weights at the rows they
// ran (routed experts: n_expert_used distinct experts per row, an upper bound when rows share
// experts); the floor is those bytes at `bandwidth`, the H200's measured ~4.4 TB/s.
#include <cuda_runtime.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ds4/core/cuda_check.hpp"

namespace ds4::cuda_backend {

enum class op_family {
    inputs,      // the step's host-to-device input upload
    embed,
    hc_pre,
    hc_post,
    norm,        // attn_norm, ffn_norm (the q and kv norms are in their paths)
    q_path,      // q_a, q norm, q_b, per-head norm + RoPE
    kv_path,     // kv projection, norm, store
    compressor,  // compressor projections, frontier saves, compressor launches
    indexer,
    attention,
    out_proj,    // activation quantisation, out_a, out_b
    moe,         // router, routed experts and shared expert (one fused launcher)
    output_head, // output HC mix, norm, vocabulary matvec
    sampling,    // device sampler and the logits copies
    count
};

inline constexpr std::array<const char*, std::size_t(op_family::count)> op_family_names{
    "inputs", "embed",     "hc_pre",   "hc_post", "norm", "q_path",      "kv_path",
    "compressor", "indexer", "attention", "out_proj", "moe", "output_head", "sampling"};

class op_profiler {
public:
    static constexpr double bandwidth = 4.4e12;  // bytes/s: the H200's measured streaming rate

    op_profiler() = default;
    op_profiler(const op_profiler&) = delete;
    op_profiler& operator=(const op_profiler&) = delete;
    ~op_profiler() {
        for (cudaEvent_t e : events_) cudaEventDestroy(e);
    }

    bool on() const { return on_; }
    void enable(bool on) {
        on_ = on;
        totals_ = {};
        steps_ = 0;
        gap_ms_ = span_ms_ = host_ms_ = 0;
        marks_.clear();
        used_ = 0;
    }

    // The step's first and last marks; step_end waits for the step and adds its record.
    void step_begin(cudaStream_t s) {
        if (!on_) return;
        marks_.clear();
        used_ = 0;
        step_start_ = record(s);
        host_t0_ = std::chrono::steady_clock::now();
    }
    void step_end(cudaStream_t s) {
        if (!on_) return;
        host_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_t0_).count();
        const cudaEvent_t stop = record(s);
        cuda_check(cudaEventSynchronize(stop), "op timing: step");
        double in_ops = 0;
        for (const mark& m : marks_) {
            float ms = 0;
            cuda_check(cudaEventElapsedTime(&ms, m.begin, m.end), "op timing: elapsed");
            family& f = totals_[std::size_t(m.f)];
            f.ms += ms;
            in_ops += ms;
            f.calls += 1;
            f.launches += m.launches;
            f.bytes += m.bytes;
        }
        float span = 0;
        cuda_check(cudaEventElapsedTime(&span, step_start_, stop), "op timing: elapsed");
        span_ms_ += span;
        gap_ms_ += span - in_ops;
        ++steps_;
    }

    // One op: begin() before its launches, end() after; count() each launcher call between.
    void begin(cudaStream_t s, op_family f, std::uint64_t weight_bytes) {
        if (!on_) return;
        marks_.push_back({record(s), nullptr, f, 0, weight_bytes});
    }
    void count(int launches = 1) {
        if (on_ && !marks_.empty()) marks_.back().launches += launches;
    }
    void end(cudaStream_t s) {
        if (on_ && !marks_.empty()) marks_.back().end = record(s);
    }

    std::string report() const {
        if (steps_ == 0) return "";
        std::string out = "family,calls_per_step,launches_per_step,gpu_ms_per_step,weight_bytes_per_step,floor_ms\n";
        const double n = double(steps_);
        char line[256];
        double bytes = 0, launches = 0;
        for (std::size_t k = 0; k < totals_.size(); ++k) {
            const family& f = totals_[k];
            if (f.calls == 0) continue;
            std::snprintf(line, sizeof line, "%s,%.1f,%.1f,%.4f,%.0f,%.4f\n", op_family_names[k], double(f.calls) / n,
                          double(f.launches) / n, f.ms / n, double(f.bytes) / n, double(f.bytes) / n / bandwidth * 1e3);
            out += line;
            bytes += double(f.bytes) / n;
            launches += double(f.launches) / n;
        }
        std::snprintf(line, sizeof line, "gaps,,,%.4f,,\n", gap_ms_ / n);
        out += line;
        std::snprintf(line, sizeof line, "host_enqueue,,,%.4f,,\n", host_ms_ / n);
        out += line;
        std::snprintf(line, sizeof line, "total,,%.1f,%.4f,%.0f,%.4f\n", launches, span_ms_ / n, bytes,
                      bytes / bandwidth * 1e3);
        out += line;
        return out;
    }

private:
    struct mark {
        cudaEvent_t begin, end;
        op_family f;
        int launches;
        std::uint64_t bytes;
    };
    struct family {
        double ms = 0;
        std::uint64_t calls = 0, launches = 0, bytes = 0;
    };

    cudaEvent_t record(cudaStream_t s) {
        if (used_ == events_.size()) {
            cudaEvent_t e = nullptr;
            cuda_check(cudaEventCreate(&e), "op timing: cudaEventCreate");
            events_.push_back(e);
        }
        const cudaEvent_t e = events_[used_++];
        cuda_check(cudaEventRecord(e, s), "op timing: cudaEventRecord");
        return e;
    }

    bool on_ = false;
    std::vector<cudaEvent_t> events_;
    std::size_t used_ = 0;
    std::vector<mark> marks_;
    cudaEvent_t step_start_ = nullptr;
    std::chrono::steady_clock::time_point host_t0_;
    std::array<family, std::size_t(op_family::count)> totals_{};
    std::uint64_t steps_ = 0;
    double gap_ms_ = 0, span_ms_ = 0, host_ms_ = 0;
};

// An op's begin/end as a scope.
class op_scope {
public:
    op_scope(op_profiler& p, cudaStream_t s, op_family f, std::uint64_t weight_bytes) : p_(p), s_(s) {
        p_.begin(s, f, weight_bytes);
    }
    ~op_scope() {
        // A failed record leaves the op without an end; step_end's elapsed time then reports it.
        try {
            p_.end(s_);
        } catch (...) {
        }
    }
    op_scope(const op_scope&) = delete;
    op_scope& operator=(const op_scope&) = delete;

private:
    op_profiler& p_;
    cudaStream_t s_;
};

}  // namespace ds4::cuda_backend
