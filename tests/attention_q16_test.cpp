// The tensor-core attention's F16 query operand layout (kernels/attention_q16.hpp): hand-worked
// core-matrix offsets, every (head row, dim) of a 64 x 512 token at its own half, and four
// consecutive dims from a multiple of 4 on contiguous (norm_rope's 8-byte store relies on it).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ds4/kernels/attention_q16.hpp"

using ds4::kernels::core_matrix_offset;

TEST_CASE("core-matrix offsets, worked by hand") {
    // (r, c) in a [R][512] matrix: core matrix (r / 8, c / 8) of 64 halves, then row r % 8 of 8.
    CHECK(core_matrix_offset(0, 0, 512) == 0);
    CHECK(core_matrix_offset(0, 7, 512) == 7);
    CHECK(core_matrix_offset(1, 0, 512) == 8);
    CHECK(core_matrix_offset(7, 7, 512) == 63);
    CHECK(core_matrix_offset(0, 8, 512) == 64);      // the next core matrix along the row
    CHECK(core_matrix_offset(8, 0, 512) == 64 * 64);  // 64 core matrices across 512 dims
    CHECK(core_matrix_offset(9, 10, 512) == 64 * 64 + 64 + 8 + 2);
    CHECK(core_matrix_offset(63, 511, 512) == 64 * 512 - 1);
}

TEST_CASE("a token's 64 x 512 operand: one half per element, runs of four contiguous") {
    const int D = 512;
    REQUIRE(ds4::kernels::q16_token_halves(D) == 64 * D);
    std::vector<int> seen(std::size_t(64) * D, 0);
    for (int r = 0; r < 64; ++r)
        for (int c = 0; c < D; ++c) {
            const int o = core_matrix_offset(r, c, D);
            REQUIRE(o >= 0);
            REQUIRE(o < 64 * D);
            ++seen[std::size_t(o)];
            if (c % 4 != 0) CHECK(o == core_matrix_offset(r, c - c % 4, D) + c % 4);
        }
    for (int n : seen) CHECK(n == 1);
}

TEST_CASE("the query's scale is log2(e) / sqrt(D) in float") {
    const double want = 1.4426950408889634 / std::sqrt(512.0);  // 0.0637587...
    CHECK(std::fabs(double(ds4::kernels::attention_q_scale_log2(512)) - want) <= want * 0x1p-23);
    CHECK(ds4::kernels::attention_q_scale_log2(128) == doctest::Approx(1.4426950408889634 / std::sqrt(128.0)));
}
