// GPU test for kernels/hyper_connection.cuh (HC pre and post, output HC mix): the ds4-validate family at small and
// odd shapes, fresh random inputs, bitwise against the reference, graph replay included.
#include <doctest/doctest.h>

#include "harness/validate/checks.hpp"
#include "tests/support/gpu_checks.hpp"

TEST_CASE("hyper_connection kernels equal the reference bitwise (quick shapes)") {
    ds4::test::check_family("hyper_connection_test_gpu", ds4::validate::check_hyper_connection);
}
