#pragma once
// Dense matvecs of the reference (docs/model.md §2.9, §7.3): y[o] = W[o] . x for a row-major weight
// of n_out rows of n_in values, as the GGUF stores [n_in, n_out].
//   Q8_0:  x is quantised once to Q8_0 activation blocks (F32 scale, half-even); each row is
//          q8_0_row_dot (ds4/format/row_dot.hpp: block dots in the segment order the kernels use).
//   F16:   F32 activation, f16_row_dot (same header: lane partials and a fixed butterfly).
//   F32:   sequential acc += w*x.
// Rows are spread over the reference thread pool; each row is one thread's sequential code, so
// the result does not depend on the thread count.
#include <cstdint>

#include "ds4/format/q8_0.hpp"

namespace ds4::ref {

void matvec_q8_0(const q8_0_block* w, const float* x, int n_in, int n_out, float* y);
// With the activation already quantised (several matvecs reading one input quantise it once).
void matvec_q8_0_prequant(const q8_0_block* w, const q8_0_act_block* xq, int n_in, int n_out, float* y);
void matvec_f16(const std::uint16_t* w, const float* x, int n_in, int n_out, float* y);
void matvec_f32(const float* w, const float* x, int n_in, int n_out, float* y);

// Sequential F32 dot, the attention score order of §2.4 step 9.
float dot_f32(const float* a, const float* b, int n);

}  // namespace ds4::ref
