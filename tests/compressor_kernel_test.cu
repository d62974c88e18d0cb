// GPU test for kernels/compressor.cuh: the ds4-validate compressor checks at small and odd shapes, on fresh
// random inputs. Skipped (exit 77) without a CUDA device.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <random>

#include "ds4/core/cuda_check.hpp"
#include "harness/validate/checks.hpp"

TEST_CASE("compressor kernels equal the reference bitwise (quick shapes)") {
    if (!ds4::cuda_device_present()) {
        std::fprintf(stderr, "compressor_kernel_test_gpu: no CUDA device, skipped\n");
        std::exit(77);
    }
    const std::uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    for (const auto& row : ds4::validate::check_compressor(seed, true)) {
        INFO(row.kernel << " " << row.shape << " mismatches " << row.cmp.mismatches << " special "
                        << row.cmp.special_mismatches << " max ulp " << row.cmp.max_ulp);
        CHECK(row.pass);
    }
}
