#pragma once
// Round-to-nearest-even onto a small float grid (E4M3FN, E2M1), shared by e4m3.hpp and
// e2m1.hpp. The rounding is integer arithmetic on exactly scaled values, so it is the same on
// host and device and needs no table; ties go to the even code because, on these grids, code
// parity equals the parity of the integer significand that round_half_even chooses.
#include <cstdint>

#include "ds4/core/half.hpp"
#include "ds4/core/host_device.hpp"
#include "ds4/core/rounding.hpp"

namespace ds4::detail {

// A sign-magnitude minifloat: codes 0..MaxCode are the non-negative finite magnitudes, code
// c = (biased exponent << MantBits) | mantissa, biased exponent 0 being the subnormals.
// NanCode < 0 means the format has no NaN and NaN saturates to MaxCode.
template <int MantBits, int MinNormalExp, int MaxCode, int NanCode>
struct minifloat {
    static constexpr int mant_bits = MantBits;
    static constexpr int max_code = MaxCode;
    static constexpr int nan_code = NanCode;

    // Exact value of a magnitude code (small integer times a power of two).
    DS4_HD_INLINE static float value(int code) {
        const int e = code >> MantBits;
        const int m = code & ((1 << MantBits) - 1);
        if (e == 0) return static_cast<float>(m) * exp2i(MinNormalExp - MantBits);
        return static_cast<float>((1 << MantBits) + m) * exp2i(MinNormalExp + e - 1 - MantBits);
    }

    // Nearest magnitude code of a >= 0 (not NaN); at or above the largest value saturates.
    DS4_HD_INLINE static int magnitude_code(float a) {
        if (a >= value(MaxCode)) return MaxCode;
        int code;
        if (a < exp2i(MinNormalExp)) {
            // Subnormal range: a uniform grid of step 2^(MinNormalExp-MantBits); rounding up
            // to 2^MantBits lands on the smallest normal, whose code is that same integer.
            code = round_half_even(a * exp2i(MantBits - MinNormalExp));
        } else {
            // Scale a into [2^M, 2^(M+1)); a round-up to 2^(M+1) carries into the exponent
            // field by itself because the code is linear in (exponent, significand).
            const int e = floor_log2(a);
            const int q = round_half_even(a * exp2i(MantBits - e));
            code = ((e - MinNormalExp + 1) << MantBits) + (q - (1 << MantBits));
        }
        return code < MaxCode ? code : MaxCode;
    }
};

}  // namespace ds4::detail
