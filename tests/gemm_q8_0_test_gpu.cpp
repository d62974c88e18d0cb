// GPU test for kernels/gemm_q8_0.cuh: the ds4-validate gemm checks at odd shapes (1, 7, 33 and
// 130 rows, inputs ending inside a stage and a segment, grouped pre-quantized inputs, a graph
// replayed at other live row counts; the pipelined 128 x 128 kernel and the first 64 x 128 one)
// on fresh random inputs, bitwise against reference/matvec.
// Skipped (exit 77) without a CUDA device.
#include "tests/support/gpu_checks.hpp"

TEST_CASE("gemm_q8_0 equals the reference bitwise (quick shapes)") {
    ds4::test::check_family("gemm_q8_0_test_gpu", ds4::validate::check_gemm);
}
