#pragma once
// Timing for the kernel benchmarks: CUDA events around each launch after warm-up, the median
// of many runs, and the machine's own measured read ceiling to report against. Inputs are
// rotated by the caller (the launch gets the run index) so that nothing is served from the
// 60 MB L2 of an H200.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/cuda_graph.hpp"

namespace ds4::bench {

struct timing {
    double median_s = 0;
    double min_s = 0;
    int runs = 0;
};

// Median time of one launch. Launches are captured `batch` at a time into a CUDA graph (each
// with its own rotation index) and the graph replays are timed with events: the decode path
// replays graphs, and eager timing of a few-microsecond kernel measures the host's launch
// latency instead of the kernel (seen: a 4096->256 F16 matvec read as 6.5 us eager).
//
// DS4_BENCH_EAGER=1 runs the warm-up launches only, without a graph, and reports their mean: for
// profilers (ncu's source-level sections replay graph nodes too slowly to finish), never for
// figures.
// An owned CUDA event for timing.
class cuda_event {
public:
    cuda_event() { cuda_check(cudaEventCreate(&e_), "cudaEventCreate"); }
    cuda_event(cuda_event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
    cuda_event& operator=(cuda_event&&) = delete;
    cuda_event(const cuda_event&) = delete;
    cuda_event& operator=(const cuda_event&) = delete;
    ~cuda_event() {
        if (e_) cudaEventDestroy(e_);
    }
    void record(cudaStream_t stream) { cuda_check(cudaEventRecord(e_, stream), "cudaEventRecord"); }
    cudaEvent_t get() const { return e_; }

private:
    cudaEvent_t e_ = nullptr;
};

inline double elapsed_s(const cuda_event& a, const cuda_event& b) {
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, a.get(), b.get()), "cudaEventElapsedTime");
    return ms * 1e-3;
}

inline bool eager_only() {
    const char* e = std::getenv("DS4_BENCH_EAGER");
    return e != nullptr && std::string(e) == "1";
}

template <class Launch>
timing time_launches(Launch&& launch, int warmup = 3, int runs = 31, int batch = 20) {
    const cuda_stream stream;
    std::vector<cuda_event> ev(eager_only() ? 2 : 2 * runs);
    if (eager_only()) {
        ev[0].record(stream);
        for (int i = 0; i < warmup; ++i) launch(i, stream.get());
        ev[1].record(stream);
        stream.synchronize("eager runs");
        const double mean = elapsed_s(ev[0], ev[1]) / std::max(warmup, 1);
        return {mean, mean, warmup};
    }
    // The caller has prepared the device (the kernel family's prepare_*); the warm-up launches are
    // eager and would do it otherwise. A capture must not probe.
    for (int i = 0; i < warmup; ++i) launch(i, stream.get());
    stream.synchronize("warm-up");
    const cuda_graph graph(stream, [&] {
        for (int i = 0; i < batch; ++i) launch(warmup + i, stream.get());
    });
    for (int i = 0; i < 2; ++i) graph.launch(stream);
    for (int i = 0; i < runs; ++i) {
        ev[2 * std::size_t(i)].record(stream);
        graph.launch(stream);
        ev[2 * std::size_t(i) + 1].record(stream);
    }
    stream.synchronize("timed runs");
    std::vector<double> t(static_cast<std::size_t>(runs));
    for (int i = 0; i < runs; ++i) t[std::size_t(i)] = elapsed_s(ev[2 * std::size_t(i)], ev[2 * std::size_t(i) + 1]) / batch;
    std::sort(t.begin(), t.end());
    return {t[t.size() / 2], t.front(), runs * batch};
}

// How many copies of an input of `bytes` to rotate through so the working set is several
// times the L2 (at least 4 copies' worth of 64 MB, capped to keep memory modest).
inline int rotation_count(std::size_t bytes) {
    const std::size_t target = std::size_t(512) << 20;
    const std::size_t n = (target + bytes - 1) / std::max<std::size_t>(bytes, 1);
    return int(std::clamp<std::size_t>(n, 1, 64));
}

// Streaming-read ceiling of this GPU, measured once per process by bandwidth_probe.cu.
double measured_read_ceiling();

// Publishes the median time and the roofline counters of one benchmark.
inline void report(benchmark::State& state, const timing& t, double bytes, double flops) {
    for (auto _ : state) state.SetIterationTime(t.median_s);
    const double ceiling = measured_read_ceiling();
    state.counters["us"] = t.median_s * 1e6;
    state.counters["GB/s"] = bytes / t.median_s * 1e-9;
    state.counters["ceil_GB/s"] = ceiling * 1e-9;
    state.counters["pct_ceil"] = 100.0 * (bytes / t.median_s) / ceiling;
    state.counters["bytes"] = bytes;
    if (flops > 0) state.counters["TFLOP/s"] = flops / t.median_s * 1e-12;
}

}  // namespace ds4::bench
