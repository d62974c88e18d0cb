#pragma once
// A device copy of 4-byte words by a group of threads (a block, or a grid's worth of blocks).
//
// Copies on the decode path are frontier saves (a ratio-128 compressor state is 256 KB a buffer)
// between short kernels: one 4-byte load and store at a time waits an L2 round trip per word,
// so each thread issues `Pieces` 16-byte loads before its first store. Bits travel unchanged
// (floats are copied as words). Unaligned copies take a word loop.
#include <cuda_runtime.h>

#include <cstdint>

namespace ds4 {

// dst[i] = src[i] for i < n words. The calling thread is `member` of a group of `group` threads
// that together copy everything (member < group; every member calls with the same arguments).
template <int Pieces = 4>
__device__ __forceinline__ void copy_words(const void* src, void* dst, std::uint64_t n, std::uint64_t member,
                                           std::uint64_t group) {
    const bool aligned = ((reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(dst)) & 15u) == 0;
    if (!aligned || n % 4 != 0) {
        const auto* s = static_cast<const std::uint32_t*>(src);
        auto* d = static_cast<std::uint32_t*>(dst);
        for (std::uint64_t i = member; i < n; i += group) d[i] = s[i];
        return;
    }
    const auto* s = static_cast<const uint4*>(src);
    auto* d = static_cast<uint4*>(dst);
    const std::uint64_t n4 = n / 4;
    for (std::uint64_t base = member; base < n4; base += Pieces * group) {
        uint4 v[Pieces];
#pragma unroll
        for (int k = 0; k < Pieces; ++k)
            if (base + k * group < n4) v[k] = s[base + k * group];
#pragma unroll
        for (int k = 0; k < Pieces; ++k)
            if (base + k * group < n4) d[base + k * group] = v[k];
    }
}

}  // namespace ds4
