// The shared numerics of core/math.hpp, core/rope.hpp and core/rng.hpp give the same bits on the
// GPU as on the host (docs/README.md decision 1). Exits 77 (skipped) without a CUDA device.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ds4/core/math.hpp"
#include "ds4/core/rng.hpp"
#include "ds4/core/rope.hpp"

namespace {

constexpr int n_fn = 9;

// out[i*n_fn + f] = function f of input i.
__host__ __device__ void eval_all(float x, std::uint32_t i, const ds4::rope_params& rp, float* out) {
    float s, c;
    ds4::sincos_f32(x * 4096.0f, &s, &c);  // large angles as RoPE produces them
    out[0] = ds4::exp_f32(x);
    out[1] = ds4::log1p_f32(x);
    out[2] = ds4::softplus(x);
    out[3] = ds4::sigmoid(x);
    out[4] = ds4::silu(x);
    out[5] = s;
    out[6] = c;
    out[7] = ds4::rope_theta(rp, i * 97u, static_cast<int>(i % 32u));
    out[8] = ds4::rng_uniform(0x9e3779b97f4a7c15ull ^ i, i);
}

__global__ void eval_kernel(const float* x, int n, ds4::rope_params rp, float* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) eval_all(x[i], std::uint32_t(i), rp, out + std::size_t(i) * n_fn);
}

void require_device() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) std::exit(77);
}

#define CUDA_OK(call) REQUIRE((call) == cudaSuccess)

}  // namespace

TEST_CASE("math, rope and rng are bit-identical on host and device") {
    require_device();
    // A sweep through float bit patterns, plus edges.
    std::vector<float> x;
    for (std::uint64_t u = 0; u <= 0xffffffffu; u += 4099) x.push_back(ds4::bits_float(std::uint32_t(u)));
    for (float v : {0.0f, -0.0f, 88.72f, 88.73f, -103.9f, -104.0f, 20.0f, -20.0f, 1e-30f}) x.push_back(v);
    const int n = int(x.size());
    for (const bool compressed : {false, true}) {
        const ds4::rope_params rp = ds4::ds4_rope_params(compressed);
        std::vector<float> host(std::size_t(n) * n_fn), dev(host.size());
        for (int i = 0; i < n; ++i) eval_all(x[i], std::uint32_t(i), rp, host.data() + std::size_t(i) * n_fn);
        float *dx = nullptr, *dout = nullptr;
        CUDA_OK(cudaMalloc(&dx, x.size() * sizeof(float)));
        CUDA_OK(cudaMalloc(&dout, dev.size() * sizeof(float)));
        CUDA_OK(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
        eval_kernel<<<(n + 255) / 256, 256>>>(dx, n, rp, dout);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpy(dev.data(), dout, dev.size() * sizeof(float), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaFree(dx));
        CUDA_OK(cudaFree(dout));
        int mismatches[n_fn] = {};
        for (std::size_t k = 0; k < host.size(); ++k) {
            // Bitwise, except that any NaN equals any NaN (payloads are not part of the contract).
            const bool both_nan = host[k] != host[k] && dev[k] != dev[k];
            if (!both_nan && std::memcmp(&host[k], &dev[k], 4) != 0) ++mismatches[k % n_fn];
        }
        for (int f = 0; f < n_fn; ++f) CHECK_MESSAGE(mismatches[f] == 0, "function " << f << " over " << n << " inputs");
    }
}
