// ds4-validate rows for kernels/quantize_act.cuh against quantize_q8_0_act (format/q8_0.hpp),
// bitwise on the int8 codes and the F32 scales: the out_a input (flash: 64 heads x 512 = 32768
// per row) and odd lengths, with exact rounding ties (a block whose amax is 127 has scale 1, so
// k + 0.5 values are ties), an all-zero block (scale 0) and outliers; rows past the live count
// untouched; a graph captured at 1 row replayed at 5.
#include <cuda_runtime.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ds4/core/device_buffer.hpp"
#include "ds4/format/q8_0.hpp"
#include "ds4/kernels/quantize_act.cuh"
#include "harness/validate/checks.hpp"
#include "harness/validate/row_inputs.hpp"

namespace ds4::validate {
namespace {

constexpr unsigned char poison = 0x5a;

struct quant_run {
    int n, capacity;
    device_buffer<float> x;
    device_buffer<std::int8_t> qs;
    device_buffer<float> d;
    device_count rows;
    kernels::quantize_act_launch a;

    quant_run(int n_, int cap)
        : n(n_), capacity(cap), x(std::size_t(cap) * n_), qs(std::size_t(cap) * n_), d(std::size_t(cap) * (n_ / 32)) {
        a = {x.data(), n, n, qs.data(), d.data(), rows.get()};
    }

    template <class Run>
    comparison run(std::mt19937_64& g, int n_rows, Run&& launch) {
        std::vector<float> h = spread_values(g, std::size_t(capacity) * n, 1.0f);
        for (int r = 0; r < capacity; ++r) {
            float* row = h.data() + std::size_t(r) * n;
            const int b = int(g() % (n / 32));
            for (int i = 0; i < 32; ++i) row[b * 32 + i] = float(int(g() % 200) - 100) + 0.5f;
            row[b * 32] = 127.0f;
            if (n >= 64) std::fill(row + ((b + 1) % (n / 32)) * 32, row + ((b + 1) % (n / 32)) * 32 + 32, 0.0f);
            row[g() % n] = 1e4f;
        }
        x.upload(h);
        rows.set(n_rows);
        qs.fill_bytes(poison);
        d.fill_bytes(poison);
        cuda_check(cudaDeviceSynchronize(), "quantize_act inputs");
        launch();
        const std::vector<std::int8_t> got_q = qs.download();
        const std::vector<float> got_d = d.download();
        std::vector<q8_0_act_block> want(std::size_t(n_rows) * (n / 32));
        quantize_q8_0_act(h.data(), want.data(), n_rows * n);
        std::vector<float> want_d(want.size());
        comparison c;
        for (std::size_t b = 0; b < want.size(); ++b) {
            want_d[b] = want[b].d;
            c.mismatches += std::memcmp(want[b].qs, got_q.data() + b * 32, 32) != 0;
        }
        comparison cd = compare(std::span<const float>(got_d.data(), want_d.size()), want_d);
        c.add(cd);
        c.mismatches += written_outside(got_q, std::size_t(n_rows) * n, std::size_t(capacity) * n, poison);
        c.mismatches += written_outside(got_d, std::size_t(n_rows) * (n / 32), std::size_t(capacity) * (n / 32), poison);
        return c;
    }
};

}  // namespace

std::vector<check_row> check_quantize_act(std::uint64_t seed, bool quick) {
    std::mt19937_64 g(seed ^ 0x71756eu);
    std::vector<int> lengths = {32, 96, 544, 4128};
    if (!quick) lengths.push_back(32768);
    std::vector<check_row> out;
    for (int n : lengths)
        for (int rows : quick ? std::vector<int>{1, 3} : std::vector<int>{1, 5, 16}) {
            quant_run q(n, rows + 2);
            const comparison c = q.run(g, rows, [&] { kernels::launch_quantize_act(q.a, q.capacity, nullptr); });
            const std::string shape = std::to_string(n) + " x" + std::to_string(rows);
            out.push_back(row_of("quantize_act", shape, "exact", c, "codes + scales"));
        }
    quant_run q(quick ? 544 : 32768, 6);
    comparison total;
    total.add(q.run(g, 1, [&] { kernels::launch_quantize_act(q.a, q.capacity, nullptr); }));
    const replayed_graph graph([&](cudaStream_t st) { kernels::launch_quantize_act(q.a, q.capacity, st); });
    total.add(q.run(g, 5, graph));
    out.push_back(
        row_of("quantize_act", std::to_string(q.n) + " x6", "exact", total, "graph captured at 1 row; replayed at 5"));
    return out;
}

}  // namespace ds4::validate
