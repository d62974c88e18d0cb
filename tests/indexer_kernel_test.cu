// GPU test for kernels/indexer.cuh: the ds4-validate indexer checks at small and odd shapes, on fresh
// random inputs (int8 tensor-core scores with key and sequence fallbacks, the scalar-only launch,
// batches with per-head path flags checked against the CPU predicate), and the int8 operand
// conversion on the device against the same function on the host (byte permutes).
// Skipped (exit 77) without a CUDA device.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/indexer_int8.hpp"  // not indexer.cuh: its kernels live in the checks library
#include "tests/support/gpu_checks.hpp"

namespace {

__global__ void convert_kernel(const std::uint32_t* words, const std::uint32_t* shifts, std::uint32_t* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    std::uint32_t lo, hi;
    ds4::kernels::indexer_codes_to_int8(words[i], ds4::kernels::indexer_int8_table_for(shifts[i] & 3u), lo, hi);
    out[2 * i] = lo;
    out[2 * i + 1] = hi;
}

__global__ void meta_kernel(const std::uint32_t* exps, std::uint32_t* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = ds4::kernels::indexer_key_meta_of(exps[i], unsigned(i) & 15u);
}

void require_device() { ds4::test::require_device_or_skip("indexer_kernel_test_gpu"); }

}  // namespace

TEST_CASE("int8 operand conversion: device byte permutes equal the host's") {
    require_device();
    const std::uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937_64 g(seed);
    const int n = 1 << 16;
    std::vector<std::uint32_t> words(n), shifts(n);
    for (int i = 0; i < n; ++i) {
        words[i] = i < 16 ? 0x11111111u * unsigned(i) : std::uint32_t(g());
        shifts[i] = std::uint32_t(g() % 4);
    }
    ds4::device_buffer<std::uint32_t> dw{std::span<const std::uint32_t>(words)}, ds{std::span<const std::uint32_t>(shifts)},
        dout(2 * std::size_t(n));
    convert_kernel<<<(n + 255) / 256, 256>>>(dw.data(), ds.data(), dout.data(), n);
    ds4::cuda_check_launch("convert_kernel");
    ds4::cuda_check(cudaDeviceSynchronize(), "convert_kernel");
    const auto out = dout.download();
    int bad = 0;
    for (int i = 0; i < n; ++i) {
        std::uint32_t lo, hi;
        ds4::kernels::indexer_codes_to_int8(words[i], ds4::kernels::indexer_int8_table_for(shifts[i]), lo, hi);
        bad += out[2 * i] != lo || out[2 * i + 1] != hi;
    }
    CHECK(bad == 0);
}

TEST_CASE("int8 key meta word: the device's equals the host's") {
    require_device();
    const std::uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937_64 g(seed);
    const int n = 1 << 16;
    std::vector<std::uint32_t> exps(n);
    for (int i = 0; i < n; ++i) exps[i] = std::uint32_t(g());
    ds4::device_buffer<std::uint32_t> de{std::span<const std::uint32_t>(exps)}, dout{std::size_t(n)};
    meta_kernel<<<(n + 255) / 256, 256>>>(de.data(), dout.data(), n);
    ds4::cuda_check_launch("meta_kernel");
    ds4::cuda_check(cudaDeviceSynchronize(), "meta_kernel");
    const auto out = dout.download();
    int bad = 0;
    for (int i = 0; i < n; ++i) bad += out[i] != ds4::kernels::indexer_key_meta_of(exps[i], unsigned(i) & 15u);
    CHECK(bad == 0);
}

TEST_CASE("indexer kernels equal the reference bitwise (quick shapes)") {
    ds4::test::check_family("indexer_kernel_test_gpu", ds4::validate::check_indexer);
}
