#include "reference/matvec.hpp"

#include <string>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/format/row_dot.hpp"
#include "reference/parallel.hpp"

namespace ds4::ref {
namespace {
// Below this many rows a thread costs more than it saves: the 24-row HC mix and the 64-head
// indexer projection stay on the calling thread.
constexpr std::int64_t min_rows_per_thread = 64;
}  // namespace

void matvec_q8_0_prequant(const q8_0_block* w, const q8_0_act_block* xq, int n_in, int n_out, float* y) {
    require(n_in % 32 == 0, "matvec_q8_0: n_in = " + std::to_string(n_in) + " is not a multiple of 32");
    const int nb = n_in / 32;
    parallel_for(n_out, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t o = begin; o < end; ++o) y[o] = q8_0_row_dot(w + o * nb, xq, nb);
    }, min_rows_per_thread);
}

void matvec_q8_0(const q8_0_block* w, const float* x, int n_in, int n_out, float* y) {
    require(n_in % 32 == 0, "matvec_q8_0: n_in = " + std::to_string(n_in) + " is not a multiple of 32");
    std::vector<q8_0_act_block> xq(n_in / 32);
    quantize_q8_0_act(x, xq.data(), n_in);
    matvec_q8_0_prequant(w, xq.data(), n_in, n_out, y);
}

void matvec_f16(const std::uint16_t* w, const float* x, int n_in, int n_out, float* y) {
    parallel_for(n_out, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t o = begin; o < end; ++o) y[o] = f16_row_dot(w + o * n_in, x, n_in);
    }, min_rows_per_thread);
}

float dot_f32(const float* a, const float* b, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) acc += a[i] * b[i];
    return acc;
}

void matvec_f32(const float* w, const float* x, int n_in, int n_out, float* y) {
    parallel_for(n_out, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t o = begin; o < end; ++o) y[o] = dot_f32(w + o * n_in, x, n_in);
    }, min_rows_per_thread);
}

}  // namespace ds4::ref
