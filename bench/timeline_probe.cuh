#pragma once
// A timeline of one launch, for experiments (never included by a committed kernel): a kernel
// includes this header and calls probe_mark(slot) where it wants a timestamp (globaltimer, ns,
// 32 ns steps on the H200), usually on one thread per block or warpgroup with the slot derived
// from blockIdx; a bench calls probe_dump(name, launch, n_slots) after its timing, which replays
// `launch` eight times in a captured graph with the marks switched on and prints the last
// replay's marks relative to the earliest. The marks cost a global load and a branch when off.
// How it was used and what it found: bench/NOTES.md, eighteenth session.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace ds4::bench {

// One copy per translation unit: the bench that dumps and the kernels it launches share it.
static __device__ unsigned long long* probe_buf = nullptr;

__device__ __forceinline__ unsigned long long* probe_target() { return probe_buf; }

__device__ __forceinline__ void probe_mark(int slot) {
    unsigned long long* b = probe_target();
    if (b != nullptr) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        b[slot] = t;
    }
}

// A raw value (an item's kind, a ticket) beside the marks, for the dump to print.
__device__ __forceinline__ void probe_value(int slot, unsigned long long v) {
    unsigned long long* b = probe_target();
    if (b != nullptr) b[slot] = v;
}

// DS4_PROBE=1 turns it on; launch(i, stream) is the bench's own launch.
template <class Launch>
void probe_dump(const char* name, Launch&& launch, int n_slots) {
    if (std::getenv("DS4_PROBE") == nullptr) return;
    unsigned long long* d = nullptr;
    if (cudaMalloc(&d, sizeof(unsigned long long) * std::size_t(n_slots)) != cudaSuccess) return;
    cudaMemset(d, 0, sizeof(unsigned long long) * std::size_t(n_slots));
    cudaMemcpyToSymbol(probe_buf, &d, sizeof(d));
    cudaStream_t s = nullptr;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    for (int i = 0; i < 8; ++i) launch(i, s);
    cudaStreamEndCapture(s, &g);
    cudaGraphInstantiate(&ge, g, 0);
    for (int r = 0; r < 3; ++r) cudaGraphLaunch(ge, s);
    cudaStreamSynchronize(s);
    std::vector<unsigned long long> h(static_cast<std::size_t>(n_slots));
    cudaMemcpy(h.data(), d, sizeof(unsigned long long) * h.size(), cudaMemcpyDeviceToHost);
    unsigned long long t0 = ~0ull;
    for (const auto v : h)
        if (v >= (1ull << 40) && v < t0) t0 = v;
    std::printf("PROBE %s (ns from the first mark; the last launch of a graph of 8)\n", name);
    for (int i = 0; i < n_slots; ++i)
        if (h[std::size_t(i)] != 0) {
            const unsigned long long v = h[std::size_t(i)];
            if (v < (1ull << 40)) std::printf("  slot %5d value %llu\n", i, v);  // a probe_value
            else std::printf("  slot %5d %9lld\n", i, static_cast<long long>(v - t0));
        }
    std::fflush(stdout);
    unsigned long long* off = nullptr;
    cudaMemcpyToSymbol(probe_buf, &off, sizeof(off));
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
    cudaFree(d);
    (void)cudaGetLastError();
}

}  // namespace ds4::bench
