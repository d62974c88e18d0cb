// GPU test for kernels/kv_store.cuh, kernels/attention_decode.cuh (exact) and
// kernels/attention_decode_mma.cuh (tensor cores, bounded): the ds4-validate attention checks in
// quick mode (store bytes on edge and random rows; both decode kernels at tiny, mid and flash
// shapes, 1, 2 and 5 verify rows, masks / selected lists, idle slots, NaN/Inf rows, forced small
// splits; each kernel's decode step captured at position 0 and replayed at 25..2051; the fast
// E4M3 -> F16 tile decode on every code and exponent). Skipped (exit 77) without a CUDA device.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <random>

#include "ds4/core/cuda_check.hpp"
#include "harness/validate/checks.hpp"

TEST_CASE("kv store bytes and both flash decode kernels meet their contracts (quick shapes)") {
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
