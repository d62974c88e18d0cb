// GPU test for kernels/attention_prefill.cuh: the ds4-validate attention_prefill checks in quick
// mode (tiny and flash shapes, ratio 4 and 128, chunks at position 0 and 2000, NaN/Inf rows and
// q, poisoned outputs) under the bounded contract, and one launch per head_dim captured once and
// replayed at other chunks and positions. Skipped (exit 77) without a CUDA device.
#include "tests/support/gpu_checks.hpp"

TEST_CASE("prefill attention within its bound of the fp64 evaluation (quick shapes)") {
    ds4::test::check_family("attention_prefill_test_gpu", ds4::validate::check_attention_prefill);
}
