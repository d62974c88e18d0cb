#pragma once
// The GPU tests' two steps: skip (exit 77, ctest's SKIP_RETURN_CODE) without a CUDA device, and
// run one ds4-validate family at its quick shapes on a fresh seed, every row a CHECK.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "ds4/core/cuda_check.hpp"
#include "harness/validate/checks.hpp"

namespace ds4::test {

inline void require_device_or_skip(const char* test) {
    if (ds4::cuda_device_present()) return;
    std::fprintf(stderr, "%s: no CUDA device, skipped\n", test);
    std::exit(77);
}

template <class Family>
void check_family(const char* test, Family&& family) {
    require_device_or_skip(test);
    const std::uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    for (const auto& row : family(seed, true)) {
        INFO(row.kernel << " " << row.shape << " mismatches " << row.cmp.mismatches << " special "
                        << row.cmp.special_mismatches << " max ulp " << row.cmp.max_ulp << " " << row.note);
        CHECK(row.pass);
    }
}

}  // namespace ds4::test
