// GPU test for kernels/matvec.cuh: the ds4-validate matvec checks at small and odd shapes, on
// fresh random inputs, and launches captured once and replayed at other live row counts.
// Skipped (exit 77) without a CUDA device.
#include "tests/support/gpu_checks.hpp"

TEST_CASE("matvec kernels equal the reference bitwise (quick shapes)") {
    ds4::test::check_family("matvec_test_gpu", ds4::validate::check_matvec);
}
