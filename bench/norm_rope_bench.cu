// RMSNorm and the fused head norm + RoPE at flash shape.
//
// BM_rms_norm (arg: rows): attn_norm over 4096, with weight. Bytes = per row 4096 F32 read and
// written, plus the 16 KiB weight once.
// BM_q_norm_rope (arg: rows): 64 heads x 512, no weight, RoPE/YaRN on each head's last 64 at the
// row's position. Bytes = per row 32768 F32 read and written.
// BM_q_norm_rope_cold (arg: rows): each launch after bench/l2_flush.cuh's read (subtract
// BM_l2_flush): the code and inputs cold, as in a decode step.
// Inputs and outputs rotate out of the L2; positions are distinct per row.
#include <cstdint>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "bench/l2_flush.cuh"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/norm_rope.cuh"
#include "ds4/model/shape.hpp"

namespace {

using namespace ds4;
using S = model::flash_shape;

struct rotated_rows {
    std::vector<device_buffer<float>> x, out;
    int rot = 1;
    rotated_rows(int rows, int n) {
        rot = bench::rotation_count(std::size_t(rows) * n * 8);
        std::vector<float> h(std::size_t(rows) * n);
        for (std::size_t i = 0; i < h.size(); ++i) h[i] = float(int(i % 199) - 99) * 0.02f;
        for (int i = 0; i < rot; ++i) {
            x.emplace_back(std::span<const float>(h));
            out.emplace_back(h.size());
        }
    }
};

void BM_rms_norm(benchmark::State& state) {
    const int rows = int(state.range(0));
    rotated_rows b(rows, S::n_embd);
    const std::vector<float> w(S::n_embd, 1.01f);
    device_buffer<float> dw{std::span<const float>(w)};
    auto launch = [&](int i, cudaStream_t s) {
        kernels::launch_rms_norm(b.x[i % b.rot].data(), S::n_embd, dw.data(), b.out[i % b.rot].data(), S::n_embd, S::n_embd,
                                 S::rms_eps, nullptr, rows, s);
    };
    bench::report(state, bench::time_launches(launch), double(rows) * S::n_embd * 8 + S::n_embd * 4.0, 0);
}

void q_norm_rope(benchmark::State& state, bool cold) {
    const int rows = int(state.range(0));
    bench::cold_launches flush(cold);
    constexpr int n = S::n_head * S::head_dim;
    rotated_rows b(rows, n);
    std::vector<std::int32_t> pos(rows);
    for (int r = 0; r < rows; ++r) pos[r] = 2048 + 37 * r;
    device_buffer<std::int32_t> dpos{std::span<const std::int32_t>(pos)};
    auto launch = [&](int i, cudaStream_t s) {
        flush.before(s);
        kernels::norm_rope_launch a;
        a.x = b.x[i % b.rot].data();
        a.out = b.out[i % b.rot].data();
        a.x_stride = a.out_stride = n;
        a.n_head = S::n_head;
        a.head_dim = S::head_dim;
        a.eps = S::rms_eps;
        a.n_rot = S::n_rot;
        a.rope = ds4_rope_params(true, S::n_rot);
        a.pos = dpos.data();
        kernels::launch_norm_rope(a, rows, s);
    };
    bench::report(state, bench::time_launches(launch), double(rows) * n * 8, 0);
}

void BM_q_norm_rope(benchmark::State& state) { q_norm_rope(state, false); }
void BM_q_norm_rope_cold(benchmark::State& state) { q_norm_rope(state, true); }

}  // namespace

BENCHMARK(BM_rms_norm)->Arg(1)->Arg(16)->Arg(256)->UseManualTime()->Iterations(1);
BENCHMARK(BM_q_norm_rope)->Arg(1)->Arg(16)->Arg(256)->UseManualTime()->Iterations(1);
BENCHMARK(BM_q_norm_rope_cold)->Arg(1)->UseManualTime()->Iterations(1);
BENCHMARK(ds4::bench::BM_l2_flush)->UseManualTime()->Iterations(1);
