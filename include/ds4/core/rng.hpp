#pragma once
// Counter-based random numbers identical on CPU and GPU: Philox4x32-10 (Salmon et al., "Parallel
// random numbers: as easy as 1, 2, 3", SC'11), checked against Random123's known-answer vectors.
// A draw is a pure function of (seed, step, lane): no state to carry between decode steps or
// to keep in sync between the host and a captured CUDA graph.
#include <cstdint>

#include "ds4/core/host_device.hpp"

namespace ds4 {

struct philox4x32 {
    std::uint32_t v[4];
};

DS4_HD_INLINE philox4x32 philox4x32_10(philox4x32 ctr, std::uint32_t k0, std::uint32_t k1) {
    constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;  // round multipliers
    constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;  // Weyl key increments
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += w0;
            k1 += w1;
        }
        const std::uint64_t p0 = std::uint64_t(m0) * ctr.v[0];
        const std::uint64_t p1 = std::uint64_t(m1) * ctr.v[2];
        const philox4x32 next = {{std::uint32_t(p1 >> 32) ^ ctr.v[1] ^ k0, std::uint32_t(p1),
                                  std::uint32_t(p0 >> 32) ^ ctr.v[3] ^ k1, std::uint32_t(p0)}};
        ctr = next;
    }
    return ctr;
}

// Four independent 32-bit words for (seed, step, lane). The sampler uses lane 0 of each step;
// lanes leave room for more draws per step (e.g. several sequences sharing a seed).
DS4_HD_INLINE philox4x32 rng_words(std::uint64_t seed, std::uint64_t step, std::uint32_t lane = 0) {
    const philox4x32 ctr = {{std::uint32_t(step), std::uint32_t(step >> 32), lane, 0u}};
    return philox4x32_10(ctr, std::uint32_t(seed), std::uint32_t(seed >> 32));
}

// Uniform float in [0, 1) with 24 random bits: exactly representable, so no rounding differs.
DS4_HD_INLINE float rng_uniform(std::uint64_t seed, std::uint64_t step, std::uint32_t lane = 0) {
    return float(rng_words(seed, step, lane).v[0] >> 8) * 0x1p-24f;
}

}  // namespace ds4
