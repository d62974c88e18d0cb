// GPU test for kernels/moe_gemm.cuh: the ds4-validate moe_gemm checks at small shapes (1, 7, 33
// and 130 rows, experts with no pair, a crowded expert, hash-style repeated experts, a graph
// replayed at other live counts) on fresh random inputs, bitwise against reference/moe.
// Skipped (exit 77) without a CUDA device.
#include "tests/support/gpu_checks.hpp"

TEST_CASE("moe_gemm equals the reference bitwise (quick shapes)") {
    ds4::test::check_family("moe_gemm_test_gpu", ds4::validate::check_moe_gemm);
}
