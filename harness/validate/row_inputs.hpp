#pragma once
// Inputs and bookkeeping shared by the per-row kernel checks (embedding, norm_rope,
// quantize_act, hyper_connection, sampling): random values with a spread of magnitudes, the
// untouched-rows count, the live-row count a replayed graph reads and the replayed graph.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/cuda_graph.hpp"
#include "ds4/core/device_buffer.hpp"
#include "harness/validate/compare.hpp"

namespace ds4::validate {

// Normal values whose scale changes every 64 elements (2^-3 .. 2^3 times sigma), never zero.
inline std::vector<float> spread_values(std::mt19937_64& g, std::size_t n, float sigma) {
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> v(n);
    float s = sigma;
    for (std::size_t i = 0; i < n; ++i) {
        if (i % 64 == 0) s = std::ldexp(sigma, int(g() % 7) - 3);
        v[i] = s * n01(g);
        if (v[i] == 0.0f) v[i] = s;
    }
    return v;
}

// Counts the elements of `got` in [begin, end) that are not the poison byte pattern: a kernel
// that writes past the live rows fails the check even if the values it wrote look right.
template <class T>
std::size_t written_outside(const std::vector<T>& got, std::size_t begin, std::size_t end, unsigned char poison) {
    std::size_t bad = 0;
    const auto* bytes = reinterpret_cast<const unsigned char*>(got.data());
    for (std::size_t b = begin * sizeof(T); b < end * sizeof(T); ++b) bad += bytes[b] != poison;
    return bad;
}

// The live-row count a kernel reads from device memory (graph contract).
struct device_count {
    device_buffer<std::int32_t> buf{1};
    void set(std::int32_t n) { buf.upload(std::span<const std::int32_t>(&n, 1)); }
    const std::int32_t* get() const { return buf.data(); }
};

// A family's launches captured once on a stream of their own; calling it replays them and waits.
// Inputs change between calls only in device memory, as the graph contract requires.
struct replayed_graph {
    cuda_stream stream;
    cuda_graph graph;

    template <class Body>
    explicit replayed_graph(Body&& body) : graph(stream, [&] { body(stream.get()); }) {}
    void operator()() const {
        graph.launch(stream);
        stream.synchronize("graph replay");
    }
};

// One run of a check's launches: eager and synchronised, or (graph) the launches captured on the
// first replay and replayed with `live` rows read from device memory.
template <class Body>
void run_eager_or_replayed(bool graph, device_count& live_count, std::optional<replayed_graph>& rg, int live,
                           Body&& body, const char* what) {
    if (graph) {
        live_count.set(live);
        if (!rg) rg.emplace(body);
        (*rg)();
    } else {
        body(nullptr);
        cuda_check(cudaDeviceSynchronize(), what);
    }
}

}  // namespace ds4::validate
