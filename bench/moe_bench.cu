// kernels/moe.cuh at the real DeepSeek-V4-Flash shape (4096 wide, FF 2048, 256 experts, shared
// FF 2048), hash routing over random tid2eid rows, 1..16 rows. One launch = the whole MoE step
// of one layer (router and shared expert included), so `us` is the MoE time per layer and decode
// step. Bytes counted (the spec's target): the distinct selected experts' gate+up+down
// (7,077,888 bytes each, tiled = GGUF size) plus activations in and out; `all_GB/s` adds the
// router and shared-expert weights read by the same step.
// Rotation: all 256 experts resident (1.8 GB) and the experts of consecutive launches drawn
// independently; router and shared weights rotated over 8 copies (8 x 29 MB), inputs over 64.
// BM_moe_route_rows (args: rows, hash): a prefill chunk's route launch (launch_moe_route_rows)
// on router logits already computed: probabilities in place, six slots and weights per row. Bytes:
// the logits read and the probabilities written (rows x 256 x 8) plus the routes; the logits of
// 8 rotations (after the first pass they hold probabilities: finite, positive, as timed).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <set>
#include <vector>

#include "backends/cuda/switch_option.hpp"
#include "bench/gpu_timer.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/moe.cuh"
#include "harness/fixtures/moe_args.hpp"

namespace ds4::bench {
namespace {

using kernels::moe_shape;

constexpr moe_shape shape{4096, 2048, 2048, 256};
constexpr int rotations = 64;
constexpr int dense_copies = 8;

// Random payloads on the device: quants any bits (every IQ2_XXS/Q2_K/Q8_0 pattern is valid),
// scales a fixed finite F16 so no NaN path is timed.
__global__ void fill_bits(std::uint32_t* p, std::size_t n, std::uint32_t seed) {
    for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
        std::uint32_t x = std::uint32_t(i) * 0x9e3779b9u ^ seed;
        x ^= x >> 16;
        x *= 0x85ebca6bu;
        x ^= x >> 13;
        x *= 0xc2b2ae35u;
        p[i] = x ^ (x >> 16);
    }
}
__global__ void fill_value(std::uint32_t* p, std::size_t n, std::uint32_t v) {
    for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
        p[i] = v;
}

template <class T>
void random_bits(device_buffer<T>& b, std::uint32_t seed) {
    fill_bits<<<1024, 256>>>(reinterpret_cast<std::uint32_t*>(b.data()), b.bytes() / 4, seed);
    cuda_check_launch("fill_bits");
}
template <class T>
void constant(device_buffer<T>& b, std::uint32_t v) {
    fill_value<<<1024, 256>>>(reinterpret_cast<std::uint32_t*>(b.data()), b.bytes() / 4, v);
    cuda_check_launch("fill_value");
}

struct dense_copy {
    device_buffer<std::uint16_t> router, sh_gate_d, sh_up_d, sh_down_d;
    device_buffer<std::uint8_t> sh_gate_q, sh_up_q, sh_down_q;
};

struct layer {
    device_buffer<std::uint8_t> gate_q, up_q, down_q;
    device_buffer<std::uint16_t> gate_d, up_d;
    device_buffer<std::uint32_t> down_dd;
    std::vector<dense_copy> dense;
    std::vector<std::int32_t> tid2eid;  // host copy, for counting distinct experts
    device_buffer<std::int32_t> tid2eid_dev;
    std::size_t dense_bytes = 0;
};

const layer& the_layer() {
    static const layer L = [] {
        layer l;
        const auto G = iq2_xxs_tiled_layout::make(shape.n_ff, shape.n_embd);
        const auto D = q2_k_tiled_layout::make(shape.n_embd, shape.n_ff);
        const std::size_t E = shape.n_expert;
        l.gate_q = device_buffer<std::uint8_t>(G.quant_bytes() * E);
        l.up_q = device_buffer<std::uint8_t>(G.quant_bytes() * E);
        l.gate_d = device_buffer<std::uint16_t>(G.scale_count() * E);
        l.up_d = device_buffer<std::uint16_t>(G.scale_count() * E);
        l.down_q = device_buffer<std::uint8_t>(D.quant_bytes() * E);
        l.down_dd = device_buffer<std::uint32_t>(D.dd_count() * E);
        random_bits(l.gate_q, 1);
        random_bits(l.up_q, 2);
        random_bits(l.down_q, 3);
        constant(l.gate_d, 0x1c001c00u);   // F16 0.0039 (IQ2_XXS d for RMS ~0.02)
        constant(l.up_d, 0x1c001c00u);
        constant(l.down_dd, 0x14001800u);  // d = 0.0020, dmin = 0.0010
        const auto S = q8_0_tiled_layout::make(shape.n_ff_shared, shape.n_embd);
        const auto SD = q8_0_tiled_layout::make(shape.n_embd, shape.n_ff_shared);
        for (int c = 0; c < dense_copies; ++c) {
            dense_copy d;
            d.router = device_buffer<std::uint16_t>(std::size_t(shape.n_expert) * shape.n_embd);
            constant(d.router, 0x20002000u);  // F16 0.0078: finite logits
            d.sh_gate_q = device_buffer<std::uint8_t>(S.quant_bytes());
            d.sh_up_q = device_buffer<std::uint8_t>(S.quant_bytes());
            d.sh_down_q = device_buffer<std::uint8_t>(SD.quant_bytes());
            d.sh_gate_d = device_buffer<std::uint16_t>(S.scale_count());
            d.sh_up_d = device_buffer<std::uint16_t>(S.scale_count());
            d.sh_down_d = device_buffer<std::uint16_t>(SD.scale_count());
            random_bits(d.sh_gate_q, 10 + c);
            random_bits(d.sh_up_q, 20 + c);
            random_bits(d.sh_down_q, 30 + c);
            constant(d.sh_gate_d, 0x0a8f0a8fu);  // F16 2e-4
            constant(d.sh_up_d, 0x0a8f0a8fu);
            constant(d.sh_down_d, 0x0a8f0a8fu);
            l.dense.push_back(std::move(d));
        }
        l.dense_bytes = std::size_t(shape.n_expert) * shape.n_embd * 2 + 2 * (S.quant_bytes() + S.scale_count() * 2) + SD.quant_bytes() +
                        SD.scale_count() * 2;
        std::mt19937_64 g(7);
        const int n_vocab = rotations * kernels::matvec_max_rows;
        l.tid2eid.resize(std::size_t(n_vocab) * kernels::moe_slots);
        std::vector<int> ids(shape.n_expert);
        for (int t = 0; t < n_vocab; ++t) {
            for (int e = 0; e < shape.n_expert; ++e) ids[e] = e;
            std::shuffle(ids.begin(), ids.end(), g);
            for (int s = 0; s < kernels::moe_slots; ++s) l.tid2eid[std::size_t(t) * kernels::moe_slots + s] = ids[s];
        }
        l.tid2eid_dev = device_buffer<std::int32_t>(std::span<const std::int32_t>(l.tid2eid));
        cuda_check(cudaDeviceSynchronize(), "bench fill");
        return l;
    }();
    return L;
}

// Arg side: 1 runs the shared expert on a second stream, forked and joined inside every step, as
// the CUDA backend's decode graph does (cuda_ops route()); 0 runs the six launches on one stream.
void BM_moe_decode(benchmark::State& state) {
    const int n_rows = int(state.range(0));
    const bool use_side = state.range(1) != 0;
    const layer& L = the_layer();
    int sms = 0;
    cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "sm count");
    kernels::moe_decode_plan plan(shape, kernels::matvec_capacity_for(n_rows), sms);
    // DS4_ROUTER_CLUSTER=0: the 256-CTA router (A/B against the cluster, the default on sm_90).
    plan.set_router_cluster(cuda_backend::switch_option("DS4_ROUTER_CLUSTER", std::getenv("DS4_ROUTER_CLUSTER"), true));
    device_buffer<std::uint8_t> scratch(plan.scratch_bytes());
    scratch.fill_bytes(0);
    // Rotation i: rows read tokens i*16 .. i*16 + n_rows - 1 (each its own random tid2eid row).
    std::vector<std::int32_t> tokens(std::size_t(rotations) * kernels::matvec_max_rows);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = std::int32_t(i);
    device_buffer<std::int32_t> tok{std::span<const std::int32_t>(tokens)};
    device_buffer<float> xs(std::size_t(rotations) * n_rows * shape.n_embd);
    constant(xs, 0x3f000000u);  // 0.5
    device_buffer<float> out(std::size_t(n_rows) * shape.n_embd);
    double distinct = 0;
    for (int i = 0; i < rotations; ++i) {
        std::set<int> e;
        for (int r = 0; r < n_rows; ++r)
            for (int s = 0; s < kernels::moe_slots; ++s)
                e.insert(L.tid2eid[std::size_t(i * kernels::matvec_max_rows + r) * kernels::moe_slots + s]);
        distinct += double(e.size()) / rotations;
    }
    const cuda_stream side_stream;
    cuda_event fork_ev, join_ev;
    kernels::moe_side side;
    if (use_side) side = {side_stream.get(), {fork_ev.get(), join_ev.get()}};
    auto launch = [&](int i, cudaStream_t s) {
        const int k = i % rotations;
        const dense_copy& d = L.dense[i % dense_copies];
        kernels::moe_weights w = fixtures::moe_weights_of(L, d);
        w.tid2eid = L.tid2eid_dev.data();
        plan.launch(w, xs.data() + std::size_t(k) * n_rows * shape.n_embd, shape.n_embd,
                    tok.data() + k * kernels::matvec_max_rows, n_rows, out.data(), shape.n_embd, scratch.data(), s,
                    nullptr, side);
    };
    plan.prepare(current_device());
    const timing t = time_launches(launch);
    const double per_expert = 2.0 * 2162688.0 + 2752512.0;
    const double act = 2.0 * n_rows * shape.n_embd * sizeof(float);
    report(state, t, distinct * per_expert + act, 0);
    state.counters["experts"] = distinct;
    state.counters["all_GB/s"] = (distinct * per_expert + act + double(L.dense_bytes)) / t.median_s * 1e-9;
}
void BM_moe_route_rows(benchmark::State& state) {
    const int n_rows = int(state.range(0));
    const bool hash = state.range(1) != 0;
    constexpr int rot = 8;
    std::mt19937_64 g(3);
    std::normal_distribution<float> n01(0.0f, 2.0f);
    std::vector<float> logits(std::size_t(rot) * n_rows * shape.n_expert);
    for (auto& v : logits) v = n01(g);
    device_buffer<float> dl{std::span<const float>(logits)};
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(n_rows));
    for (int r = 0; r < n_rows; ++r) tokens[std::size_t(r)] = r % (rotations * kernels::matvec_max_rows);
    device_buffer<std::int32_t> tok{std::span<const std::int32_t>(tokens)};
    device_buffer<std::int32_t> sel(std::size_t(n_rows) * kernels::moe_slots);
    device_buffer<float> wts(std::size_t(n_rows) * kernels::moe_slots);
    const layer& L = the_layer();
    kernels::moe_weights w = fixtures::moe_weights_of(L, L.dense[0]);
    w.tid2eid = hash ? L.tid2eid_dev.data() : nullptr;
    auto launch = [&](int i, cudaStream_t s) {
        kernels::launch_moe_route_rows(shape, w, dl.data() + std::size_t(i % rot) * n_rows * shape.n_expert, tok.data(), n_rows,
                                       sel.data(), wts.data(), s);
    };
    const timing t = time_launches(launch);
    report(state, t, double(n_rows) * (shape.n_expert * 8.0 + kernels::moe_slots * 8.0), 0);
}
BENCHMARK(BM_moe_route_rows)
    ->ArgNames({"rows", "hash"})
    ->ArgsProduct({{16, 2048}, {0, 1}})
    ->UseManualTime()
    ->Iterations(1);

BENCHMARK(BM_moe_decode)
    ->ArgNames({"rows", "side"})
    ->ArgsProduct({{1, 2, 4, 8, 16}, {0, 1}})
    ->UseManualTime()
    ->Iterations(1);

}  // namespace
}  // namespace ds4::bench
