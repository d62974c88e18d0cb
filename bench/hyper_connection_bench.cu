// Hyper-connection pre/post and the output HC mix at flash shape (4 streams x 4096).
//
// BM_hc_pre (arg: rows): the one launch (mix partials, then the group's finish); /1 is decode at
// batch 1, the figure issue 12 asks for (us per call, graph-replayed). Bytes = the F16 mix weight
// (24 x 16384, 768 KiB) once, and per row the 64 KiB state read, x_in (16 KiB) and the split
// written. The kernel reads the state more than once (the RMS scale in every block of a row
// group, the mix, the weighted sum): the figure is against that one-read floor.
// BM_hc_pre_norm (arg: rows): the same launch with the RMSNorm that follows folded in, as the CUDA
// backend runs it for attn_norm / ffn_norm (xn written too; bytes as BM_hc_pre plus the norm
// weight and xn).
// BM_hc_post_pre_norm (arg: rows): BM_hc_pre_norm with the previous sublayer's hc post folded in
// (hc_pre_launch::post_F), as the backend launches it at decode: compare with BM_hc_post +
// BM_hc_pre_norm. Bytes as BM_hc_pre_norm plus F read and Y written per row.
// BM_hc_post (arg: rows): Y = F*post + comb^T X. Bytes = per row F (16 KiB) and X (64 KiB) read,
// Y (64 KiB) written.
// BM_hc_post_scales (arg: rows): hc post forming each row's RMS scale for the next chunk hc pre
// (hc_post_launch::row_scale, one block per row). Bytes as BM_hc_post plus the scales.
// BM_hc_pre_chunk_given_scales (arg: rows): BM_hc_pre_chunk reading those scales instead of
// forming them (hc_pre_launch::row_scale). Bytes as BM_hc_pre_chunk.
// BM_output_hc_mix (arg: rows): as hc pre with 4 outputs. Bytes = 4 x 16384 F16 once, per row
// the state read and e written.
// BM_hc_split_rows (arg: rows): the tail of a prefill chunk's four-launch HC pre
// (hyper_connection_rows.cuh: split + Sinkhorn per row, then x_in), on a mix already computed.
// Bytes = per row the mix (24 floats) and the state (64 KiB) read, the split and x_in (16 KiB)
// written.
// BM_hc_pre_chunk (arg: rows): a prefill chunk's hc pre with its norm in one launch
// (hyper_connection_chunk.cuh); BM_hc_pre_chunk_five: the same outputs by the five launches it
// replaces (the flat state's RMSNorm, gemm_f16's mix, the split, x_in, the norm), as the backend
// runs chunks without DS4_HC_CHUNK=1. Bytes as BM_hc_pre_norm.
// States rotate out of the L2; the weights do not (they are small and read every layer).
#include <cstdint>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "bench/l2_flush.cuh"
#include "ds4/core/device_buffer.hpp"
#include "ds4/core/half.hpp"
#include "ds4/kernels/hyper_connection.cuh"
#include "ds4/kernels/hyper_connection_chunk.cuh"
#include "ds4/kernels/hyper_connection_rows.cuh"
#include "ds4/model/shape.hpp"

namespace {

using namespace ds4;
using S = model::flash_shape;
constexpr int n_flat = S::n_hc * S::n_embd;

struct hc_bufs {
    int rows, rot, n_mix;
    device_buffer<std::uint16_t> fn;
    device_buffer<float> scale, base, partials, norm_w;
    std::vector<device_buffer<float>> X, x_in, split, Y, F, xn;

    hc_bufs(int rows_, bool output) : rows(rows_), n_mix(output ? S::n_hc : 2 * S::n_hc + S::n_hc * S::n_hc) {
        rot = bench::rotation_count(std::size_t(rows) * n_flat * 8);
        std::vector<std::uint16_t> w(std::size_t(n_mix) * n_flat);
        for (std::size_t i = 0; i < w.size(); ++i) w[i] = f32_to_f16(float(int(i % 97) - 48) * 1e-3f);
        fn = device_buffer<std::uint16_t>(std::span<const std::uint16_t>(w));
        const std::vector<float> sc = {0.5f, 0.7f, 1.1f}, b(n_mix, 0.1f);
        scale = device_buffer<float>(std::span<const float>(sc));
        base = device_buffer<float>(std::span<const float>(b));
        std::vector<float> x(std::size_t(rows) * n_flat);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 211) - 105) * 0.01f;
        for (int i = 0; i < rot; ++i) {
            X.emplace_back(std::span<const float>(x));
            Y.emplace_back(x.size());
            F.emplace_back(std::span<const float>(x.data(), std::size_t(rows) * S::n_embd));
            x_in.emplace_back(std::size_t(rows) * S::n_embd);
            split.emplace_back(std::size_t(rows) * n_mix);
            xn.emplace_back(std::size_t(rows) * S::n_embd);
        }
        const std::vector<float> nw(S::n_embd, 1.25f);
        norm_w = device_buffer<float>(std::span<const float>(nw));
        partials = device_buffer<float>(kernels::hc_partial_floats(pre(0, output), rows));
        partials.fill_bytes(0);  // the arrival counters start at zero (every launch leaves them so)
    }

    kernels::hc_pre_launch pre(int i, bool output, bool norm = false) const {
        kernels::hc_pre_launch a;
        a.X = X[i % rot].data();
        a.fn = fn.data();
        a.scale = scale.data();
        a.base = base.data();
        a.n_embd = S::n_embd;
        a.n_hc = S::n_hc;
        a.iters = S::n_hc_sinkhorn_iter;
        a.output_mix = output;
        a.x_in = x_in[i % rot].data();
        a.x_in_stride = S::n_embd;
        a.split = split[i % rot].data();
        a.partials = partials.data();
        if (norm) {
            a.norm_weight = norm_w.data();
            a.norm_out = xn[i % rot].data();
            a.norm_stride = S::n_embd;
        }
        return a;
    }
};

void BM_hc_pre(benchmark::State& state) {
    const int rows = int(state.range(0));
    hc_bufs b(rows, false);
    auto launch = [&](int i, cudaStream_t s) { kernels::launch_hc_pre<S::n_hc>(b.pre(i, false), rows, s); };
    const double bytes = b.n_mix * n_flat * 2.0 + rows * (n_flat * 4.0 + S::n_embd * 4.0 + b.n_mix * 4.0);
    bench::report(state, bench::time_launches(launch), bytes, 0);
}

void BM_hc_pre_norm(benchmark::State& state) {
    const int rows = int(state.range(0));
    hc_bufs b(rows, false);
    auto launch = [&](int i, cudaStream_t s) { kernels::launch_hc_pre<S::n_hc>(b.pre(i, false, true), rows, s); };
    const double bytes = b.n_mix * n_flat * 2.0 + S::n_embd * 4.0 + rows * (n_flat * 4.0 + 2 * S::n_embd * 4.0 + b.n_mix * 4.0);
    bench::report(state, bench::time_launches(launch), bytes, 0);
}

void hc_post_pre_norm(benchmark::State& state, bool cold) {
    const int rows = int(state.range(0));
    hc_bufs b(rows, false);
    bench::cold_launches flush(cold);
    // The splits the folded post reads: a plain hc pre's (each launch then leaves its own there).
    for (int i = 0; i < b.rot; ++i) kernels::launch_hc_pre<S::n_hc>(b.pre(i, false, true), rows, nullptr);
    cuda_check(cudaDeviceSynchronize(), "hc_post_pre splits");
    auto launch = [&](int i, cudaStream_t s) {
        flush.before(s);
        kernels::hc_pre_launch a = b.pre(i, false, true);
        a.post_F = b.F[i % b.rot].data();
        a.post_F_stride = S::n_embd;
        a.post_split = b.split[i % b.rot].data();
        a.post_Y = b.Y[i % b.rot].data();
        kernels::launch_hc_pre<S::n_hc>(a, rows, s);
    };
    const double bytes = b.n_mix * n_flat * 2.0 + S::n_embd * 4.0 +
                         rows * (2 * n_flat * 4.0 + 3 * S::n_embd * 4.0 + b.n_mix * 4.0);
    bench::report(state, bench::time_launches(launch), bytes, 0);
}

void BM_hc_post_pre_norm(benchmark::State& state) { hc_post_pre_norm(state, false); }
// Each launch after bench/l2_flush.cuh's read (subtract BM_l2_flush): code and inputs cold.
void BM_hc_post_pre_norm_cold(benchmark::State& state) { hc_post_pre_norm(state, true); }

// HC pre at one row with `iters` Sinkhorn passes (the model's 20, or 1): the difference is the
// share of the launch that the Sinkhorn's serial tail holds (the mix and everything else alike).
void BM_hc_pre_iters(benchmark::State& state) {
    const int iters = int(state.range(0));
    hc_bufs b(1, false);
    auto launch = [&](int i, cudaStream_t s) {
        kernels::hc_pre_launch a = b.pre(i, false, true);
        a.iters = iters;
        kernels::launch_hc_pre<S::n_hc>(a, 1, s);
    };
    const double bytes = b.n_mix * n_flat * 2.0 + S::n_embd * 4.0 + n_flat * 4.0 + 2 * S::n_embd * 4.0 + b.n_mix * 4.0;
    bench::report(state, bench::time_launches(launch), bytes, 0);
}

void BM_hc_post(benchmark::State& state) {
    const int rows = int(state.range(0));
    hc_bufs b(rows, false);
    auto launch = [&](int i, cudaStream_t s) {
        const kernels::hc_post_launch a{b.F[i % b.rot].data(), S::n_embd, b.X[i % b.rot].data(), b.split[i % b.rot].data(),
                                        b.Y[i % b.rot].data(), S::n_embd, S::n_hc, nullptr};
        kernels::launch_hc_post<S::n_hc>(a, rows, s);
    };
    bench::report(state, bench::time_launches(launch), rows * (S::n_embd * 4.0 + n_flat * 8.0), 0);
}

void BM_hc_post_scales(benchmark::State& state) {
    const int rows = int(state.range(0));
    hc_bufs b(rows, false);
    device_buffer<float> scales(static_cast<std::size_t>(rows));
    auto launch = [&](int i, cudaStream_t s) {
        kernels::hc_post_launch a{b.F[i % b.rot].data(), S::n_embd, b.X[i % b.rot].data(), b.split[i % b.rot].data(),
                                  b.Y[i % b.rot].data(), S::n_embd, S::n_hc, nullptr};
        a.row_scale = scales.data();
        kernels::launch_hc_post<S::n_hc>(a, rows, s);
    };
    bench::report(state, bench::time_launches(launch), rows * (S::n_embd * 4.0 + n_flat * 8.0 + 4.0), 0);
}

void BM_output_hc_mix(benchmark::State& state) {
    const int rows = int(state.range(0));
    hc_bufs b(rows, true);
    auto launch = [&](int i, cudaStream_t s) { kernels::launch_hc_pre<S::n_hc>(b.pre(i, true), rows, s); };
    const double bytes = b.n_mix * n_flat * 2.0 + rows * (n_flat * 4.0 + S::n_embd * 4.0);
    bench::report(state, bench::time_launches(launch), bytes, 0);
}


void BM_hc_pre_chunk(benchmark::State& state) {
    const int rows = int(state.range(0));
    hc_bufs b(rows, false);
    kernels::prepare_hc_pre_chunk<S::n_hc>(current_device());
    auto launch = [&](int i, cudaStream_t s) { kernels::launch_hc_pre_chunk<S::n_hc>(b.pre(i, false, true), rows, s); };
    const double bytes = b.n_mix * n_flat * 2.0 + S::n_embd * 4.0 + rows * (n_flat * 4.0 + 2 * S::n_embd * 4.0 + b.n_mix * 4.0);
    bench::report(state, bench::time_launches(launch), bytes, 0);
}

void BM_hc_pre_chunk_given_scales(benchmark::State& state) {
    const int rows = int(state.range(0));
    hc_bufs b(rows, false);
    kernels::prepare_hc_pre_chunk<S::n_hc>(current_device());
    std::vector<float> ones(static_cast<std::size_t>(rows), 1.0f);  // any scales: the work does not depend on them
    const device_buffer<float> scales{std::span<const float>(ones)};
    auto launch = [&](int i, cudaStream_t s) {
        kernels::hc_pre_launch a = b.pre(i, false, true);
        a.row_scale = scales.data();
        kernels::launch_hc_pre_chunk<S::n_hc>(a, rows, s);
    };
    const double bytes = b.n_mix * n_flat * 2.0 + S::n_embd * 4.0 + rows * (n_flat * 4.0 + 2 * S::n_embd * 4.0 + b.n_mix * 4.0);
    bench::report(state, bench::time_launches(launch), bytes, 0);
}

void BM_hc_pre_chunk_five(benchmark::State& state) {
    const int rows = int(state.range(0));
    hc_bufs b(rows, false);
    device_buffer<float> flat(std::size_t(rows) * n_flat), mix(std::size_t(rows) * b.n_mix);
    const std::vector<std::int32_t> live = {rows};
    const device_buffer<std::int32_t> dlive{std::span<const std::int32_t>(live)};
    kernels::prepare_gemm_f16(current_device());
    auto launch = [&](int i, cudaStream_t s) {
        kernels::hc_pre_launch p = b.pre(i, false, true);
        p.n_rows = dlive.data();
        kernels::launch_hc_pre_rows(p, flat.data(), mix.data(), rows, s);
    };
    const double bytes = b.n_mix * n_flat * 2.0 + S::n_embd * 4.0 + rows * (n_flat * 4.0 + 2 * S::n_embd * 4.0 + b.n_mix * 4.0);
    bench::report(state, bench::time_launches(launch), bytes, 0);
}

}  // namespace

void BM_hc_split_rows(benchmark::State& state) {
    const int rows = int(state.range(0));
    hc_bufs b(rows, false);
    std::vector<float> mix(std::size_t(rows) * b.n_mix);
    for (std::size_t i = 0; i < mix.size(); ++i) mix[i] = float(int(i % 13) - 6) * 0.05f;
    const device_buffer<float> dmix{std::span<const float>(mix)};
    const std::vector<std::int32_t> live = {rows};
    const device_buffer<std::int32_t> dlive{std::span<const std::int32_t>(live)};
    auto launch = [&](int i, cudaStream_t s) {
        kernels::hc_split_rows_launch a;
        a.mix = dmix.data();
        a.X = b.X[i % b.rot].data();
        a.scale = b.scale.data();
        a.base = b.base.data();
        a.n_embd = S::n_embd;
        a.n_hc = S::n_hc;
        a.iters = S::n_hc_sinkhorn_iter;
        a.split = b.split[i % b.rot].data();
        a.x_in = b.x_in[i % b.rot].data();
        a.x_in_stride = S::n_embd;
        a.n_rows = dlive.data();
        kernels::launch_hc_split_rows(a, rows, s);
    };
    bench::report(state, bench::time_launches(launch), rows * (b.n_mix * 8.0 + n_flat * 4.0 + S::n_embd * 4.0), 0);
}

BENCHMARK(BM_hc_pre)->Arg(1)->Arg(16)->Arg(256)->UseManualTime()->Iterations(1);
BENCHMARK(BM_hc_pre_norm)->Arg(1)->Arg(16)->UseManualTime()->Iterations(1);
BENCHMARK(BM_hc_post_pre_norm)->Arg(1)->Arg(16)->UseManualTime()->Iterations(1);
BENCHMARK(BM_hc_post_pre_norm_cold)->Arg(1)->UseManualTime()->Iterations(1);
BENCHMARK(ds4::bench::BM_l2_flush)->UseManualTime()->Iterations(1);
BENCHMARK(BM_hc_pre_iters)->ArgName("iters")->Arg(1)->Arg(20)->UseManualTime()->Iterations(1);
BENCHMARK(BM_hc_post)->Arg(1)->Arg(16)->Arg(256)->Arg(2048)->UseManualTime()->Iterations(1);
BENCHMARK(BM_output_hc_mix)->Arg(1)->Arg(16)->Arg(256)->UseManualTime()->Iterations(1);
BENCHMARK(BM_hc_post_scales)->Arg(256)->Arg(2048)->UseManualTime()->Iterations(1);
BENCHMARK(BM_hc_pre_chunk)->Arg(256)->Arg(2048)->UseManualTime()->Iterations(1);
BENCHMARK(BM_hc_pre_chunk_given_scales)->Arg(256)->Arg(2048)->UseManualTime()->Iterations(1);
BENCHMARK(BM_hc_pre_chunk_five)->Arg(256)->Arg(2048)->UseManualTime()->Iterations(1);
BENCHMARK(BM_hc_split_rows)->Arg(256)->Arg(2048)->UseManualTime()->Iterations(1);
