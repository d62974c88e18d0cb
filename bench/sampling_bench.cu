// Device sampling at flash vocabulary (129280), one block per row.
//
// BM_sampling (args: rows, mode): mode 0 greedy; 1 temperature 0.8 with top_k 40; 2 temperature
// 1 with top_p 0.9; modes 1 and 2 with 20 top log-probabilities; 3 greedy with the chosen token's
// log-probability (what the engine's decode asks: the normaliser launch runs). Logits are peaked (a few dozen
// tokens well above the rest, as a trained model's usually are), so the sorted prefix is short.
// Bytes = the logits read once (517 KiB per row); the kernel streams them about 8 times from L2,
// so the figure is against the one-read floor. Logits rotate out of the L2.
#include <cstdint>
#include <random>
#include <vector>

#include "bench/gpu_timer.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/sampling.cuh"
#include "ds4/model/shape.hpp"

namespace {

using namespace ds4;
constexpr int n_vocab = model::flash_shape::n_vocab;

void BM_sampling(benchmark::State& state) {
    const int rows = int(state.range(0)), mode = int(state.range(1));
    const int rot = bench::rotation_count(std::size_t(rows) * n_vocab * 4);
    std::mt19937_64 g(11);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> l(std::size_t(rows) * n_vocab);
    for (auto& v : l) v = 2.0f * n01(g) - 10.0f;
    for (int r = 0; r < rows; ++r)
        for (int p = 0; p < 40; ++p) l[std::size_t(r) * n_vocab + g() % n_vocab] = 8.0f + 0.5f * float(p);
    kernels::sampling_row p;
    if (mode == 1) p.temperature = 0.8f, p.top_k = 40, p.n_logprobs = 20;
    if (mode == 2) p.temperature = 1.0f, p.top_p = 0.9f, p.n_logprobs = 20;
    if (mode == 3) p.n_logprobs = 0;
    std::vector<kernels::sampling_row> params(rows, p);
    for (int r = 0; r < rows; ++r) params[r].seed = g(), params[r].step = std::uint64_t(r);
    std::vector<device_buffer<float>> logits;
    for (int i = 0; i < rot; ++i) logits.emplace_back(std::span<const float>(l));
    device_buffer<kernels::sampling_row> d_params{std::span<const kernels::sampling_row>(params)};
    device_buffer<std::int32_t> token(rows), status(rows);
    device_buffer<float> logprob(rows);
    device_buffer<kernels::sampled_logprob> top(std::size_t(rows) * kernels::sampling_max_logprobs);
    device_buffer<float> work(kernels::sampling_work_floats(rows));
    work.fill_bytes(0);
    auto launch = [&](int i, cudaStream_t s) {
        const kernels::sampling_launch a{logits[i % rot].data(), n_vocab, n_vocab, d_params.data(), token.data(),
                                         status.data(), logprob.data(), top.data(), nullptr, work.data()};
        kernels::launch_sampling(a, rows, s);
    };
    bench::report(state, bench::time_launches(launch), double(rows) * n_vocab * 4, 0);
}

}  // namespace

BENCHMARK(BM_sampling)
    ->Args({1, 0})->Args({1, 3})->Args({1, 1})->Args({1, 2})->Args({16, 0})->Args({16, 1})->Args({256, 0})->Args({256, 3})
    ->Args({256, 2})
    ->UseManualTime()->Iterations(1);
