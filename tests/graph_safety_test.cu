// GPU test for the graph-safety machinery (core/cuda_graph.hpp, core/per_device.hpp, the kernel
// families' prepare_*): on a device nothing has prepared, a launch recorded into a graph must fail
// with a ds4::error naming the kernel instead of probing inside the capture, and the stream must
// stay usable; after prepare the same launch captures, and its replay equals an uncaptured launch
// bitwise; cuda_graph moves. One process, run first thing, so the device really is unprepared.
// Skipped (exit 77) without a CUDA device.
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "ds4/core/cuda_graph.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/core/half.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/attention_prefill.cuh"
#include "ds4/kernels/matvec.cuh"
#include "harness/fixtures/matvec_args.hpp"
#include "harness/fixtures/prefill_args.hpp"
#include "tests/support/gpu_checks.hpp"

namespace {

using namespace ds4;

TEST_CASE("capture on an unprepared device fails naming the kernel; prepared, it replays bitwise") {
    test::require_device_or_skip("graph_safety_test_gpu");
    std::mt19937_64 rng(std::random_device{}());
    const int rows = 96, in = 256, capacity = 4;
    const auto lay = q8_0_tiled_layout::make(rows, in);
    std::vector<std::uint8_t> quants(lay.quant_bytes());
    for (auto& q : quants) q = std::uint8_t(rng());
    std::vector<std::uint16_t> scales(lay.scale_count());
    for (auto& s : scales) s = f32_to_f16(1e-3f * float(1 + rng() % 7));
    const auto d_quants = fixtures::to_device(quants);
    const auto d_scales = fixtures::to_device(scales);
    const auto d_x = fixtures::to_device(fixtures::normal_vector(rng, std::size_t(capacity) * in));
    device_buffer<float> d_y(std::size_t(capacity) * rows);
    kernels::matvec_launch a = fixtures::matvec_args(kernels::matvec_format::q8_0, d_x.data(), in, capacity,
                                                     {{d_quants.data(), d_scales.data(), d_y.data(), rows}});
    const int sms = fixtures::sm_count();
    const fixtures::matvec_scratch scratch(kernels::plan_matvec(a, capacity, sms));
    const cuda_stream stream;
    auto step = [&] { kernels::launch_matvec(a, capacity, scratch.ws(), sms, stream); };

    // Unprepared: the launch refuses inside the capture, and the capture is ended cleanly.
    CHECK_THROWS_WITH_AS(cuda_graph(stream, step), doctest::Contains("matvec"), ds4::error);
    const fixtures::paged_kv host_kv = fixtures::paged_kv::random(rng, {128, 64}, 1, 2, 1);
    const fixtures::device_kv kv(host_kv);
    const auto d_q = fixtures::to_device(fixtures::normal_vector(rng, std::size_t(8) * 128 * 8));
    const auto d_sinks = fixtures::to_device(fixtures::normal_vector(rng, 8));
    device_buffer<float> d_out(std::size_t(8) * 128 * 8);
    const auto pa = fixtures::prefill_args(kv.view(), d_q.data(), d_out.data(), d_sinks.data(), 0, 8,
                                           ds4_rope_params(false, 64));
    CHECK_THROWS_WITH_AS(cuda_graph(stream, [&] { kernels::attention_prefill({8, 128, 64, 16, 4}, pa, stream); }),
                         doctest::Contains("attention_prefill"), ds4::error);
    stream.synchronize("stream after a refused capture");

    // Prepared: captured on its first call, replayed, equal to the uncaptured launch.
    kernels::prepare_matvec(current_device());
    kernels::prepare_attention_prefill(current_device());
    cuda_graph graph(stream, step);
    REQUIRE(graph);
    d_y.fill_bytes(0xff);
    cuda_check(cudaDeviceSynchronize(), "poison");
    graph.launch(stream);
    stream.synchronize("replay");
    const auto replayed = d_y.download();
    d_y.fill_bytes(0xff);
    cuda_check(cudaDeviceSynchronize(), "poison");
    step();
    stream.synchronize("uncaptured");
    const auto eager = d_y.download();
    CHECK(replayed == eager);  // finite weights and inputs: == is bitwise here (no NaN)
    for (float v : eager) CHECK(std::isfinite(v));

    // Move-only ownership: the moved-from graph is empty, the new owner replays.
    cuda_graph moved = std::move(graph);
    CHECK_FALSE(graph);
    CHECK_THROWS_AS(graph.launch(stream), ds4::error);
    moved.launch(stream);
    stream.synchronize("moved replay");
    CHECK(d_y.download() == eager);

    // The prefill launch captures once prepared, too.
    const cuda_graph prefill(stream, [&] { kernels::attention_prefill({8, 128, 64, 16, 4}, pa, stream); });
    prefill.launch(stream);
    stream.synchronize("prefill replay");
}

}  // namespace
