#pragma once
// A cold launch for the kernel benchmarks: before each launch, a read of 256 MB with plain loads,
// which leaves L2 holding none of the kernel's code or inputs, as a decode step's weight streams
// do between two launches of one layer's small kernels (their warm benches cannot show what the
// code's fetch costs them: the compressor's emission ran 8.6 us warm, 10.5 cold, ~14 in the H100
// decode graph; bench/NOTES.md, fiftieth session). A cold row's time minus BM_l2_flush's is the
// kernel's cold time.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <optional>

#include "bench/gpu_timer.hpp"
#include "ds4/core/device_buffer.hpp"

namespace ds4::bench {

// A template only for linkage (a __global__ function cannot be inline).
template <int = 0>
__global__ void l2_flush_kernel(const int4* p, std::size_t n, int* sink) {
    int acc = 0;
    for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
        const int4 v = p[i];
        acc ^= v.x ^ v.w;
    }
    if (acc == 0x5a5a5a5a) *sink = acc;  // never in practice; keeps the loads
}

struct l2_flusher {
    static constexpr std::size_t n = (std::size_t(256) << 20) / sizeof(int4);
    device_buffer<int4> buf{n};
    device_buffer<int> sink{1};
    void launch(cudaStream_t s) { l2_flush_kernel<><<<1024, 256, 0, s>>>(buf.data(), n, sink.data()); }
};

// A bench's optional flush: before(s) reads the 256 MB when the row is cold, nothing otherwise.
struct cold_launches {
    std::optional<l2_flusher> flusher;
    explicit cold_launches(bool cold) {
        if (cold) flusher.emplace();
    }
    void before(cudaStream_t s) {
        if (flusher) flusher->launch(s);
    }
};

// The flush alone (each bench binary registers it: BENCHMARK(ds4::bench::BM_l2_flush)).
inline void BM_l2_flush(benchmark::State& state) {
    l2_flusher f;
    const timing t = time_launches([&](int, cudaStream_t s) { f.launch(s); });
    report(state, t, double(l2_flusher::n * sizeof(int4)), 0);
}

}  // namespace ds4::bench
