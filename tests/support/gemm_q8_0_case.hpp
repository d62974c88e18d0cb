#pragma once
// A Q8_0 GEMM problem for the CPU emulations of kernels/gemm_q8_0*.cuh: random GGUF Q8_0 weight
// rows and their tiled copy, Q8_0-act activation rows (every third row 30x larger) and their split
// copy (quants, scales) as the kernels read them.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ds4/format/q8_0.hpp"
#include "ds4/format/tiled.hpp"

namespace ds4::test {

struct case_data {
    int rows, in, n_rows;
    std::vector<q8_0_block> w;         // [rows][nb]
    std::vector<q8_0_act_block> x;     // [n_rows][nb]
    q8_0_tiled_layout L;
    std::vector<std::uint8_t> quants;  // tiled
    std::vector<std::uint16_t> scales;
    std::vector<std::int8_t> act_qs;   // split layout, stride in
    std::vector<float> act_d;          // stride in / 32
};

inline case_data make_case(std::mt19937_64& g, int rows, int in, int n_rows) {
    case_data c{rows, in, n_rows, {}, {}, q8_0_tiled_layout::make(rows, in), {}, {}, {}, {}};
    const int nb = in / 32;
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> v(static_cast<std::size_t>(in));
    c.w.resize(std::size_t(rows) * nb);
    for (int r = 0; r < rows; ++r) {
        for (auto& e : v) e = n01(g) * 0.05f;
        quantize_q8_0(v.data(), c.w.data() + std::size_t(r) * nb, std::size_t(in));
    }
    c.quants.resize(c.L.quant_bytes());
    c.scales.resize(c.L.scale_count());
    repack_q8_0(c.L, c.w.data(), c.quants.data(), c.scales.data());
    c.x.resize(std::size_t(n_rows) * nb);
    c.act_qs.resize(std::size_t(n_rows) * in);
    c.act_d.resize(std::size_t(n_rows) * nb);
    for (int r = 0; r < n_rows; ++r) {
        for (auto& e : v) e = n01(g) * (r % 3 == 0 ? 30.0f : 1.0f);
        quantize_q8_0_act(v.data(), c.x.data() + std::size_t(r) * nb, in);
        for (int b = 0; b < nb; ++b) {
            const q8_0_act_block& xb = c.x[std::size_t(r) * nb + b];
            std::memcpy(c.act_qs.data() + std::size_t(r) * in + b * 32, xb.qs, 32);
            c.act_d[std::size_t(r) * nb + b] = xb.d;
        }
    }
    return c;
}

}  // namespace ds4::test
