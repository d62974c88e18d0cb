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
#include <vector>

#include "ds4/core/cuda_check.hpp"

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
inline bool eager_only() {
    const char* e = std::getenv("DS4_BENCH_EAGER");
    return e != nullptr && std::string(e) == "1";
}

template <class Launch>
timing time_launches(Launch&& launch, int warmup = 3, int runs = 31, int batch = 20) {
    cudaStream_t stream = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    if (eager_only()) {
        cudaEvent_t ev[2];
        for (auto& e : ev) cuda_check(cudaEventCreate(&e), "cudaEventCreate");
        cuda_check(cudaEventRecord(ev[0], stream), "cudaEventRecord");
        for (int i = 0; i < warmup; ++i) launch(i, stream);
        cuda_check(cudaEventRecord(ev[1], stream), "cudaEventRecord");
        cuda_check(cudaStreamSynchronize(stream), "eager runs");
        float ms = 0;
        cuda_check(cudaEventElapsedTime(&ms, ev[0], ev[1]), "cudaEventElapsedTime");
        for (auto& e : ev) cudaEventDestroy(e);
        cudaStreamDestroy(stream);
        const double mean = ms * 1e-3 / std::max(warmup, 1);
        return {mean, mean, warmup};
    }
    for (int i = 0; i < warmup; ++i) launch(i, stream);  // also settles per-kernel host setup
    cuda_check(cudaStreamSynchronize(stream), "warm-up");
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
    for (int i = 0; i < batch; ++i) launch(warmup + i, stream);
    cuda_check(cudaStreamEndCapture(stream, &graph), "end capture");
    cuda_check(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate");
    for (int i = 0; i < 2; ++i) cuda_check(cudaGraphLaunch(exec, stream), "graph warm-up");
    std::vector<cudaEvent_t> ev(2 * runs);
    for (auto& e : ev) cuda_check(cudaEventCreate(&e), "cudaEventCreate");
    for (int i = 0; i < runs; ++i) {
        cuda_check(cudaEventRecord(ev[2 * i], stream), "cudaEventRecord");
        cuda_check(cudaGraphLaunch(exec, stream), "graph launch");
        cuda_check(cudaEventRecord(ev[2 * i + 1], stream), "cudaEventRecord");
    }
    cuda_check(cudaStreamSynchronize(stream), "timed runs");
    std::vector<double> t(runs);
    for (int i = 0; i < runs; ++i) {
        float ms = 0;
        cuda_check(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
        t[i] = ms * 1e-3 / batch;
    }
    for (auto& e : ev) cudaEventDestroy(e);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
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
