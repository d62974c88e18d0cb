// GPU test for kernels/kv_store.cuh, kernels/attention_decode.cuh (exact) and
// kernels/attention_decode_mma.cuh (tensor cores, bounded): the ds4-validate attention checks in
// quick mode (store bytes on edge and random rows; both decode kernels at tiny, mid and flash
// shapes, 1, 2 and 5 verify rows, masks / selected lists, idle slots, NaN/Inf rows, forced small
// splits; each kernel's decode step captured on its first call and replayed at positions 25..2051 with
// 0..4 rows per sequence; the fast
// E4M3 -> F16 tile decode on every code and exponent). Skipped (exit 77) without a CUDA device.
#include "tests/support/gpu_checks.hpp"

TEST_CASE("kv store bytes and both flash decode kernels meet their contracts (quick shapes)") {
    ds4::test::check_family("attention_test_gpu", ds4::validate::check_attention);
}
