// GPU test for kernels/quantize_act.cuh (out_a input quantization): the ds4-validate family at small and
// odd shapes, fresh random inputs, bitwise against the reference, graph replay included.
#include <doctest/doctest.h>

#include "harness/validate/checks.hpp"
#include "tests/support/gpu_checks.hpp"

TEST_CASE("quantize_act kernels equal the reference bitwise (quick shapes)") {
    ds4::test::check_family("quantize_act_test_gpu", ds4::validate::check_quantize_act);
}
