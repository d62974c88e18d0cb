#pragma once
// The bits of a wgmma shared-memory matrix descriptor, no swizzle (PTX ISA, "Matrix Descriptor
// Format"): start address >> 4 in bits 0-13, leading byte offset >> 4 in bits 16-29, stride byte
// offset >> 4 in bits 32-45; base offset and layout type (bits 49-51, 62-63) zero. Host and
// device, so that CPU emulations build the descriptors the kernels build.
#include <cstdint>

#include "ds4/core/host_device.hpp"

namespace ds4::kernels {

DS4_HD_INLINE constexpr std::uint64_t wgmma_desc_bits(std::uint32_t smem_addr, std::uint32_t lbo, std::uint32_t sbo) {
    return std::uint64_t((smem_addr & 0x3ffffu) >> 4) | (std::uint64_t(lbo >> 4) << 16) | (std::uint64_t(sbo >> 4) << 32);
}

}  // namespace ds4::kernels
