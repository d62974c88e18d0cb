#pragma once
// The tensor-core attention's query operand as its producer can write it: q * log2(e)/sqrt(D)
// rounded to F16, 64 head rows x D dims per token in the "core matrix" layout wgmma reads from
// shared memory (8 rows x 16 bytes contiguous). The sm_90a attention kernels then copy a token's
// 64 KiB straight into shared memory (cp.async, every copy in flight at once) instead of loading
// 128 KiB of F32 through registers in rounds and converting it there: the prologue that held each
// split CTA ~7 us before its first tile (bench/RESULTS.md, forty-first session's probe).
// The values are the ones the kernel's own conversion forms (the same product, the same rounding),
// so a result does not depend on which form the kernel read.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ds4/core/host_device.hpp"

namespace ds4::kernels {

inline constexpr int q16_rows = 64;  // head rows per token (rows past n_head stay zero)

// Half offset of element (r, c) of a [R][C] F16 matrix in the core-matrix layout.
DS4_HD_INLINE constexpr int core_matrix_offset(int r, int c, int C) {
    return ((r >> 3) * (C >> 3) + (c >> 3)) * 64 + (r & 7) * 8 + (c & 7);
}

// Halves per token of the q16 operand for head dimension D.
DS4_HD_INLINE constexpr std::int64_t q16_token_halves(int D) { return std::int64_t(q16_rows) * D; }

// The factor q is multiplied by before the F16 rounding: softmax in exp2 units, 1/sqrt(D).
DS4_HD_INLINE float attention_q_scale_log2(int D) { return 1.4426950408889634f / sqrtf(float(D)); }

}  // namespace ds4::kernels
