// GPU test for kernels/kv_store.cuh and kernels/attention_decode.cuh: the ds4-validate attention
// checks in quick mode (store bytes on edge and random rows; flash decode at tiny, mid and flash
// shapes, 1 and 5 verify rows, masks, idle slots, NaN/Inf rows; a captured decode step replayed
// at positions 25..2051). Skipped (exit 77) without a CUDA device.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <random>

#include "ds4/core/cuda_check.hpp"
#include "harness/validate/checks.hpp"

TEST_CASE("kv store bytes and flash decode equal the reference (quick shapes)") {
    if (!ds4::cuda_device_present()) {
        std::fprintf(stderr, "attention_test_gpu: no CUDA device, skipped\n");
        std::exit(77);
    }
    const std::uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    for (const auto& row : ds4::validate::check_attention(seed, true)) {
        INFO(row.kernel << " " << row.shape << " mismatches " << row.cmp.mismatches << " special "
                        << row.cmp.special_mismatches << " max ulp " << row.cmp.max_ulp << " " << row.note);
        CHECK(row.pass);
    }
}
