// The out_a input quantization at flash shape: 64 heads x 512 = 32768 values per row to Q8_0
// activations (int8 codes + one F32 scale per 32).
//
// BM_quantize_act (arg: rows). Bytes = per row, 32768 F32 read, 32768 codes and 1024 scales
// written. Inputs and outputs rotate out of the L2.
#include <cstdint>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/quantize_act.cuh"
#include "ds4/model/shape.hpp"

namespace {

using namespace ds4;
using S = model::flash_shape;

void BM_quantize_act(benchmark::State& state) {
    const int rows = int(state.range(0));
    constexpr int n = S::n_head * S::head_dim;
    const std::size_t row_bytes = std::size_t(n) * 4 + n + n / 32 * 4;
    const int rot = bench::rotation_count(row_bytes * rows);
    std::vector<float> x(std::size_t(rows) * n);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 251) - 125) * 0.01f;
    std::vector<device_buffer<float>> dx, dd;
    std::vector<device_buffer<std::int8_t>> dq;
    for (int i = 0; i < rot; ++i) {
        dx.emplace_back(std::span<const float>(x));
        dq.emplace_back(x.size());
        dd.emplace_back(x.size() / 32);
    }
    auto launch = [&](int i, cudaStream_t s) {
        const kernels::quantize_act_launch a{dx[i % rot].data(), n, n, dq[i % rot].data(), dd[i % rot].data(), nullptr};
        kernels::launch_quantize_act(a, rows, s);
    };
    bench::report(state, bench::time_launches(launch), double(row_bytes) * rows, 0);
}

}  // namespace

BENCHMARK(BM_quantize_act)->Arg(1)->Arg(16)->Arg(256)->UseManualTime()->Iterations(1);
