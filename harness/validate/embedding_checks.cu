// ds4-validate rows for kernels/embedding.cuh: the F16 row of each token widened into all n_hc
// streams (the reference engine's step writes X exactly so: f16_to_f32 per value), with token ids
// out of range giving NaN rows; odd and flash vocabularies and widths; rows past the live count
// untouched; a graph captured at 3 rows replayed at 7 with new token ids.
#include <cuda_runtime.h>

#include <random>
#include <string>
#include <vector>

#include "ds4/core/device_buffer.hpp"
#include "ds4/core/half.hpp"
#include "ds4/kernels/embedding.cuh"
#include "harness/validate/checks.hpp"
#include "harness/validate/row_inputs.hpp"

namespace ds4::validate {
namespace {

constexpr unsigned char poison = 0xa5;

struct embed_run {
    int n_vocab, n_embd, n_hc, capacity;
    std::vector<std::uint16_t> table;
    device_buffer<std::uint16_t> d_table;
    device_buffer<std::int32_t> d_tokens;
    device_buffer<float> d_X;
    device_count rows;
    kernels::embedding_launch a;

    embed_run(std::mt19937_64& g, int vocab, int embd, int hc, int cap)
        : n_vocab(vocab), n_embd(embd), n_hc(hc), capacity(cap) {
        const std::vector<float> v = spread_values(g, std::size_t(vocab) * embd, 0.05f);
        table.resize(v.size());
        for (std::size_t i = 0; i < v.size(); ++i) table[i] = f32_to_f16(v[i]);
        table[g() % table.size()] = 0x7c00;  // +inf and a subnormal widen exactly too
        table[g() % table.size()] = 0x0003;
        d_table = device_buffer<std::uint16_t>(std::span<const std::uint16_t>(table));
        d_tokens = device_buffer<std::int32_t>(cap);
        d_X = device_buffer<float>(std::size_t(cap) * hc * embd);
        a = {d_table.data(), d_tokens.data(), d_X.data(), vocab, embd, hc, rows.get()};
    }

    // Random ids (one out of range when there are 3+ rows), n_rows live; runs and compares.
    template <class Run>
    comparison run(std::mt19937_64& g, int n_rows, Run&& launch) {
        std::vector<std::int32_t> tok(capacity);
        for (auto& t : tok) t = std::int32_t(g() % std::uint64_t(n_vocab));
        if (n_rows >= 3) tok[1] = g() % 2 ? -1 : n_vocab;
        d_tokens.upload(tok);
        rows.set(n_rows);
        d_X.fill_bytes(poison);
        cuda_check(cudaDeviceSynchronize(), "embedding inputs");
        launch();
        const std::vector<float> got = d_X.download();
        const std::size_t row = std::size_t(n_hc) * n_embd;
        std::vector<float> want(n_rows * row);
        for (int r = 0; r < n_rows; ++r)
            for (int h = 0; h < n_hc; ++h)
                for (int d = 0; d < n_embd; ++d) {
                    const bool ok = tok[r] >= 0 && tok[r] < n_vocab;
                    want[r * row + std::size_t(h) * n_embd + d] =
                        ok ? f16_to_f32(table[std::size_t(tok[r]) * n_embd + d]) : std::nanf("");
                }
        comparison c = compare(std::span<const float>(got.data(), want.size()), want);
        c.mismatches += written_outside(got, n_rows * row, capacity * row, poison);
        return c;
    }

    std::string shape(int n_rows) const {
        return std::to_string(n_vocab) + "x" + std::to_string(n_embd) + " hc" + std::to_string(n_hc) + " x" +
               std::to_string(n_rows);
    }
};

}  // namespace

std::vector<check_row> check_embedding(std::uint64_t seed, bool quick) {
    std::mt19937_64 g(seed ^ 0x656d62u);
    struct shape {
        int vocab, embd, hc;
    };
    std::vector<shape> shapes = {{97, 200, 4}, {1536, 256, 4}, {33, 8, 3}};
    if (!quick) shapes.push_back({129280, 4096, 4});
    std::vector<check_row> out;
    for (const auto& s : shapes)
        for (int rows : quick ? std::vector<int>{1, 5} : std::vector<int>{1, 5, 64}) {
            embed_run e(g, s.vocab, s.embd, s.hc, rows + 3);
            const comparison c = e.run(g, rows, [&] { kernels::launch_embedding(e.a, e.capacity, nullptr); });
            out.push_back(
                row_of("embedding", e.shape(rows), "exact", c, rows >= 3 ? "one id out of range: NaN row" : ""));
        }
    const shape s = quick ? shape{1536, 256, 4} : shape{129280, 4096, 4};
    embed_run e(g, s.vocab, s.embd, s.hc, 8);
    comparison total;
    total.add(e.run(g, 3, [&] { kernels::launch_embedding(e.a, e.capacity, nullptr); }));
    const replayed_graph graph([&](cudaStream_t st) { kernels::launch_embedding(e.a, e.capacity, st); });
    for (int rows : {7, 2}) total.add(e.run(g, rows, graph));
    out.push_back(row_of("embedding", e.shape(8), "exact", total, "graph captured at 3 rows; replayed at 7, 2"));
    return out;
}

}  // namespace ds4::validate
