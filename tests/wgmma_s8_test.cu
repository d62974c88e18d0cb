// GPU test for the int8 warpgroup MMA that moe_gemm_wgmma.cuh and gemm_q8_0_wgmma.cuh build on
// (kernels/wgmma_s8.cuh, wgmma_operand.hpp, wgmma_desc.hpp): one warpgroup multiplies operands
// written into shared memory in wgmma_operand.hpp's layout, and every thread's 16 accumulators
// must equal tests/support/wgmma_s8_emulation.hpp's model of the PTX ISA (descriptor, core-matrix
// layout, D fragment) that the kernels' CPU emulations rely on. Cases: s8 x s8 from zero at k-step
// 0 and 3 (the descriptor's address advance), the same accumulated onto a first product (scale-d 1),
// u8 x s8 (the down kernel's min term), and operands at the second pair half (the +512-byte start).
// A failure here and not in the emulations means the model, not a kernel, disagrees with the
// hardware. Skipped (exit 77) without a CUDA device; without an sm_90a-capable device it checks
// nothing and says so.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/per_device.hpp"
#include "ds4/kernels/wgmma.cuh"
#include "ds4/kernels/wgmma_desc.hpp"
#include "ds4/kernels/wgmma_operand.hpp"
#include "ds4/kernels/wgmma_s8.cuh"
#include "tests/support/gpu_checks.hpp"
#include "tests/support/wgmma_s8_emulation.hpp"

namespace {

using namespace ds4;
using namespace ds4::kernels;

// Two operands of 16 KiB (A at 0, B after it) copied into shared memory as given; one warpgroup
// issues the wgmma(s) of `mode` and writes d[thread][16].
//   mode 0: D = A . B at k-step `kstep`, B from row `b_row0`
//   mode 1: D = A . B at k-step 0, then D += A . B at k-step `kstep`
//   mode 2: D = A (u8) . B at k-step `kstep`
template <int = 0>
__global__ void __launch_bounds__(128) wgmma_probe_kernel(const std::uint8_t* operands, int mode, int kstep, int b_row0, std::int32_t* d_out) {
    pdl_enter();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __shared__ alignas(128) std::uint8_t smem[2 * wg_operand_bytes];
    for (int i = int(threadIdx.x); i < 2 * wg_operand_bytes / 16; i += 128)
        reinterpret_cast<uint4*>(smem)[i] = reinterpret_cast<const uint4*>(operands)[i];
    wgmma_detail::fence_proxy_async();
    __syncthreads();
    namespace wg = wgmma_detail;
    const std::uint64_t da = wg::smem_desc(smem, wg_lbo, wg_sbo);
    const std::uint64_t db = wg::smem_desc(smem + wg_operand_bytes + wg_offset(b_row0, 0), wg_lbo, wg_sbo);
    const std::uint64_t step = wg_kstep_bytes >> 4;
    int d[16];
    for (int i = 0; i < 16; ++i) d[i] = 0;
    wg::fence();
    if (mode == 0) {
        wg::mma_m64n32k32<0>(d, da + step * kstep, db + step * kstep);
    } else if (mode == 1) {
        wg::mma_m64n32k32<0>(d, da, db);
        wg::mma_m64n32k32<1>(d, da + step * kstep, db + step * kstep);
    } else {
        wg::mma_m64n32k32<0, true>(d, da + step * kstep, db + step * kstep);
    }
    wg::commit();
    wg::wait_all();
    wg::pin(d);
    for (int i = 0; i < 16; ++i) d_out[threadIdx.x * 16 + i] = d[i];
#else
    (void)operands, (void)mode, (void)kstep, (void)b_row0, (void)d_out;
#endif
}

bool runs_wgmma() { return wgmma_detail::runs_wgmma_code(current_device()); }

std::vector<std::int32_t> run(const std::vector<std::uint8_t>& ops, int mode, int kstep, int b_row0) {
    const device_buffer<std::uint8_t> dops{std::span<const std::uint8_t>(ops)};
    device_buffer<std::int32_t> dd(128 * 16);
    launch_kernel("wgmma_probe_kernel", wgmma_probe_kernel<>, 1, 128, 0, nullptr, dops.data(), mode, kstep, b_row0, dd.data());
    cuda_check_launch("wgmma_probe_kernel");
    cuda_check(cudaDeviceSynchronize(), "wgmma probe");
    return dd.download();
}

std::vector<std::int32_t> model(const std::vector<std::uint8_t>& ops, int mode, int kstep, int b_row0) {
    const std::uint64_t da = wgmma_desc_bits(0, wg_lbo, wg_sbo);
    const std::uint64_t db = wgmma_desc_bits(std::uint32_t(wg_operand_bytes + wg_offset(b_row0, 0)), wg_lbo, wg_sbo);
    const std::uint64_t step = wg_kstep_bytes >> 4;
    std::vector<std::int32_t> d;
    if (mode == 1) {
        test::wgmma_m64nNk32_s8(ops, da, db, 32, d, false);
        test::wgmma_m64nNk32_s8(ops, da + step * std::uint64_t(kstep), db + step * std::uint64_t(kstep), 32, d, true);
    } else {
        test::wgmma_m64nNk32_s8(ops, da + step * std::uint64_t(kstep), db + step * std::uint64_t(kstep), 32, d, false, mode == 2);
    }
    return d;
}

}  // namespace

TEST_CASE("the int8 wgmma on the device matches the PTX model the kernels' emulations use") {
    test::require_device_or_skip("wgmma_s8_test_gpu");
    if (!runs_wgmma()) {
        MESSAGE("no sm_90 device running this build's sm_90a code: nothing checked");
        return;
    }
    std::mt19937_64 g(20261208);
    std::vector<std::uint8_t> ops(2 * std::size_t(wg_operand_bytes));
    for (auto& b : ops) b = std::uint8_t(g());
    struct probe {
        int mode, kstep, b_row0;
    };
    for (const probe p : {probe{0, 0, 0}, probe{0, 3, 0}, probe{1, 5, 0}, probe{2, 7, 0}, probe{0, 2, 32}}) {
        CAPTURE(p.mode);
        CAPTURE(p.kstep);
        CAPTURE(p.b_row0);
        CHECK(run(ops, p.mode, p.kstep, p.b_row0) == model(ops, p.mode, p.kstep, p.b_row0));
    }
}
