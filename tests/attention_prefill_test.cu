// GPU test for kernels/attention_prefill.cuh: the ds4-validate attention_prefill checks in quick
// mode (tiny and flash shapes, ratio 4 and 128, chunks at position 0 and 2000, NaN/Inf rows and
// q, poisoned outputs) under the bounded contract. Skipped (exit 77) without a CUDA device.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <random>

#include "ds4/core/cuda_check.hpp"
#include "harness/validate/checks.hpp"

TEST_CASE("prefill attention within its bound of the fp64 evaluation (quick shapes)") {
    if (!ds4::cuda_device_present()) {
        std::fprintf(stderr, "attention_prefill_test_gpu: no CUDA device, skipped\n");
        std::exit(77);
    }
    const std::uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    for (const auto& row : ds4::validate::check_attention_prefill(seed, true)) {
        INFO(row.kernel << " " << row.shape << " over bound " << row.cmp.mismatches << " special "
                        << row.cmp.special_mismatches << " max|d| " << row.cmp.max_abs << " " << row.note);
        CHECK(row.pass);
    }
}
