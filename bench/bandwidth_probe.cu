// The ceilings every kernel row is reported against, measured on the machine the benchmark
// runs on: a streaming read with 16-byte loads and several loads in flight per thread, and a
// device-to-device copy (bytes read plus bytes written).
#include <benchmark/benchmark.h>

#include <cstdint>

#include "bench/gpu_timer.hpp"
#include "ds4/core/device_buffer.hpp"

namespace ds4::bench {
namespace {

constexpr int read_unroll = 8;

// Grid-stride read of `n` int4; the xor result is stored once per thread so the loads cannot
// be removed, and it costs nothing next to the read.
__global__ void stream_read(const int4* __restrict__ src, std::size_t n, int* __restrict__ sink) {
    const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
    std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    int acc = 0;
    for (; i + (read_unroll - 1) * stride < n; i += read_unroll * stride) {
        int4 v[read_unroll];
#pragma unroll
        for (int u = 0; u < read_unroll; ++u) v[u] = __ldcs(src + i + u * stride);
#pragma unroll
        for (int u = 0; u < read_unroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) {
        const int4 v = __ldcs(src + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x7fffffff) sink[0] = acc;
}

__global__ void fill_pattern(int4* dst, std::size_t n) {
    for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
        dst[i] = make_int4(int(i), int(i * 3u), int(i * 7u), int(i ^ 0x5a5a5a5a));
}

constexpr std::size_t probe_bytes = std::size_t(2) << 30;

struct probe_result {
    timing read, copy;
};

probe_result run_probe() {
    const std::size_t n = probe_bytes / sizeof(int4);
    device_buffer<int4> a(n), b(n);
    device_buffer<int> sink(1);
    fill_pattern<<<1024, 256>>>(a.data(), n);
    cuda_check_launch("fill_pattern");
    int sms = 0;
    cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "sm count");
    probe_result r;
    r.read = time_launches([&](int, cudaStream_t s) {
        stream_read<<<sms * 8, 512, 0, s>>>(a.data(), n, sink.data());
        cuda_check_launch("stream_read");
    }, 3, 21);
    r.copy = time_launches([&](int, cudaStream_t s) {
        cuda_check(cudaMemcpyAsync(b.data(), a.data(), probe_bytes, cudaMemcpyDeviceToDevice, s), "copy");
    }, 3, 21);
    return r;
}

const probe_result& probe() {
    static const probe_result r = run_probe();
    return r;
}

void BM_stream_read(benchmark::State& state) {
    const auto& t = probe().read;
    report(state, t, double(probe_bytes), 0);
}
void BM_device_copy(benchmark::State& state) {
    const auto& t = probe().copy;
    report(state, t, 2.0 * double(probe_bytes), 0);
}
BENCHMARK(BM_stream_read)->UseManualTime()->Iterations(1);
BENCHMARK(BM_device_copy)->UseManualTime()->Iterations(1);

}  // namespace

double measured_read_ceiling() { return double(probe_bytes) / probe().read.median_s; }

}  // namespace ds4::bench
