#pragma once
// PRMT (byte permute) on host and device, the primitive of the lookup-table decodes (IQ2_XXS
// signs, E2M1 codes): byte k of the result is byte (sel >> 4k) & 7 of the 8-byte {lo, hi}.
// byte_perm is __byte_perm on the device (the selector nibbles masked to 3 bits); prmt is the
// bare instruction, the same for selectors whose nibbles 0-3 have bit 3 clear (bit 3 selects
// PRMT's sign replication) and one instruction cheaper.
#include <cstdint>

#include "ds4/core/host_device.hpp"

namespace ds4 {

namespace detail {
DS4_HD_INLINE std::uint32_t byte_perm_host(std::uint32_t lo, std::uint32_t hi, std::uint32_t sel) {
    const std::uint64_t src = std::uint64_t(lo) | (std::uint64_t(hi) << 32);
    std::uint32_t r = 0;
    for (int k = 0; k < 4; ++k) r |= std::uint32_t((src >> (8 * ((sel >> (4 * k)) & 7u))) & 255u) << (8 * k);
    return r;
}
}  // namespace detail

DS4_HD_INLINE std::uint32_t byte_perm(std::uint32_t lo, std::uint32_t hi, std::uint32_t sel) {
#if defined(__CUDA_ARCH__)
    return __byte_perm(lo, hi, sel);
#else
    return detail::byte_perm_host(lo, hi, sel);
#endif
}

DS4_HD_INLINE std::uint32_t prmt(std::uint32_t lo, std::uint32_t hi, std::uint32_t sel) {
#if defined(__CUDA_ARCH__)
    std::uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(lo), "r"(hi), "r"(sel));
    return r;
#else
    return detail::byte_perm_host(lo, hi, sel);
#endif
}

}  // namespace ds4
