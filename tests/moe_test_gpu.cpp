// GPU test for kernels/moe.cuh: the ds4-validate MoE checks (small, odd and real shapes with a
// few experts, hash/biased/tied routing, 1..16 rows, each step captured once and replayed at
// another live row count) on fresh random inputs. Skipped (exit 77) without a CUDA device.
#include "tests/support/gpu_checks.hpp"

TEST_CASE("moe decode equals the reference bitwise (quick shapes)") {
    ds4::test::check_family("moe_test_gpu", ds4::validate::check_moe);
}
