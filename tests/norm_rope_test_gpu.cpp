// GPU test for kernels/norm_rope.cuh (RMSNorm, head norm and RoPE): the ds4-validate family at small and
// odd shapes, fresh random inputs, bitwise against the reference, graph replay included.
#include <doctest/doctest.h>

#include "harness/validate/checks.hpp"
#include "tests/support/gpu_checks.hpp"

TEST_CASE("norm_rope kernels equal the reference bitwise (quick shapes)") {
    ds4::test::check_family("norm_rope_test_gpu", ds4::validate::check_norm_rope);
}
