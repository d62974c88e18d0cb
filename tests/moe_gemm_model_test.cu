// GPU test for kernels/moe_gemm.cuh on a real forward pass's MoE inputs: the tiny model (seed 1)
// prefilled on the CPU reference with the 40-row prompt of the conformance case that failed with
// DS4_MOE_GEMM=1 (suite seed 320307584), each layer's xn and routes through moe_gemm as the CUDA
// backend's chunk path calls it (a plan of 256 rows, the fixture's chunk_rows; 39 live rows, the
// chunk before the row that wants logits; one workspace for every layer), bitwise against
// reference/moe's moe_routed. tests/moe_gemm_emulation_test.cpp checks the same inputs through
// the CPU emulation; a failure here and not there is device-only (a race, uninitialised shared
// memory). Skipped (exit 77) without a CUDA device.
#include <vector>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/moe_gemm.cuh"
#include "tests/support/gpu_checks.hpp"
#include "tests/support/moe_gemm_device.hpp"
#include "tests/support/moe_model_inputs.hpp"

namespace {

// regs: the default fragment-decoding kernels (false: the shared-memory tile kernels).
void check_forward_pass(bool wgmma, bool regs = true) {
    using namespace ds4;
    const int n = 40, chunk = n - 1, chunk_rows = 256;
    const auto tokens = test::conformance_tokens(320307584u + 11u + unsigned(n), n, model::tiny_shape::n_vocab);
    const std::vector<test::problem> layers = test::forward_moe_problems(1, tokens);
    REQUIRE(!layers.empty());
    const test::problem& P0 = layers.front();
    auto plan = kernels::moe_gemm_plan::make({P0.n_embd, P0.n_ff, P0.ne}, chunk_rows);
    plan.set_gate_up_wgmma(wgmma);
    plan.set_down_wgmma(wgmma);
    plan.set_gate_up_regs(regs);
    plan.set_down_regs(regs);
    kernels::moe_gemm_plan::prepare(current_device());
    device_buffer<std::uint8_t> ws(plan.workspace_bytes());
    ws.fill_bytes(0x7f);  // once: the layers run one after another on the same workspace
    cudaStream_t stream = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "moe_gemm_model_test stream");
    for (std::size_t il = 0; il < layers.size(); ++il) {
        CAPTURE(il);
        const test::problem& P = layers[il];
        const test::device_problem D(P);
        kernels::moe_gemm(plan, D.args(chunk), ws.data(), stream);
        cuda_check(cudaStreamSynchronize(stream), "moe_gemm_model_test moe_gemm");
        CHECK(test::differing_rows(test::reference_routed(P), D.out.download(), chunk, P.n_embd) == 0);
    }
    cuda_check(cudaStreamDestroy(stream), "moe_gemm_model_test stream");
}

}  // namespace

TEST_CASE("moe_gemm on a real forward pass's MoE inputs equals reference/moe bitwise") {
    ds4::test::require_device_or_skip("moe_gemm_model_test_gpu");
    check_forward_pass(false);
}

TEST_CASE("moe_gemm on the tile kernels on a real forward pass's MoE inputs equals reference/moe bitwise") {
    ds4::test::require_device_or_skip("moe_gemm_model_test_gpu");
    check_forward_pass(false, false);
}

TEST_CASE("moe_gemm on the wgmma kernels on a real forward pass's MoE inputs equals reference/moe bitwise") {
    ds4::test::require_device_or_skip("moe_gemm_model_test_gpu");
    if (!ds4::kernels::moe_gemm_wgmma_available_on(ds4::current_device())) {
        MESSAGE("no sm_90a device: the wgmma kernels are not run");
        return;
    }
    check_forward_pass(true);
}
