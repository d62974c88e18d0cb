#pragma once
// Host/device roles of moe_gemm_wgmma.cuh's warpgroups (its operands are wgmma_operand.hpp's
// layout), so that the CPU emulation (tests/moe_gemm_wgmma_emulation_test.cpp) replays the
// kernels' own index math against an independent model of what wgmma reads.
#include <cstdint>

#include "ds4/core/host_device.hpp"
#include "ds4/kernels/wgmma_operand.hpp"

namespace ds4::kernels {

inline constexpr int moe_wg_n = 32;  // pairs of a warpgroup's wgmma (N)

// Warpgroup wg of a CTA: weight rows of matrix h (gate/up: 0 gate, 1 up; down: output rows
// 64 h ..) against pairs 32 ph .. 32 ph + 31. Pairs-half 0 comes first so a group of at most 32
// pairs keeps two warpgroups busy and skips the other two.
struct moe_wg_role {
    int h, ph;
};
DS4_HD_INLINE constexpr moe_wg_role moe_wg_role_of(int wg) { return {wg & 1, wg >> 1}; }

}  // namespace ds4::kernels
