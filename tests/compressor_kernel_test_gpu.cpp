// GPU test for kernels/compressor.cuh: the ds4-validate compressor checks at small and odd shapes, on fresh
// random inputs. Skipped (exit 77) without a CUDA device.
#include "tests/support/gpu_checks.hpp"

TEST_CASE("compressor kernels equal the reference bitwise (quick shapes)") {
    ds4::test::check_family("compressor_kernel_test_gpu", ds4::validate::check_compressor);
}
