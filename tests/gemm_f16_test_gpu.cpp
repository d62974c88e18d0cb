// GPU test for kernels/gemm_f16.cuh: the ds4-validate gemm_f16 checks at odd shapes (1, 7, 17, 33
// and 130 rows, inputs ending inside a 512-input segment and below one, several matrices, signed
// zeros, infinities and NaN among the inputs, a graph replayed at other live row counts) on fresh
// random inputs, bitwise against reference/matvec's f16 row dot.
// Skipped (exit 77) without a CUDA device.
#include "tests/support/gpu_checks.hpp"

TEST_CASE("gemm_f16 equals the reference bitwise (quick shapes)") {
    ds4::test::check_family("gemm_f16_test_gpu", ds4::validate::check_gemm_f16);
}
