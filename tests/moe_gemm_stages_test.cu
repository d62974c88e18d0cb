// GPU test for kernels/moe_gemm.cuh, stage by stage: after one moe_gemm call it reads the
// workspace back and checks each launch's output on its own against the host formats: the sort
// (offsets, each expert's set of pairs), Q8_K of x, mid (gate/up, clamps, SiLU, route weight),
// Q8_K of mid with its 16-sums, each pair's down output ys, and the slot sum. When the end result
// is wrong, the first failing CHECK names the launch that broke it. Skipped (exit 77) without a
// CUDA device.
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "ds4/core/device_buffer.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/kernels/moe_gemm.cuh"
#include "tests/support/gpu_checks.hpp"
#include "tests/support/moe_gemm_device.hpp"
#include "tests/support/moe_gemm_problem.hpp"

namespace {

using namespace ds4;

template <class T>
std::vector<T> fetch(const T* p, std::size_t n) {
    std::vector<T> h(n);
    cuda_check(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "moe_gemm_stages_test D2H");
    return h;
}

template <class T>
std::size_t differing(const std::vector<T>& a, const std::vector<T>& b) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
    return n + (a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

}  // namespace

TEST_CASE("moe_gemm stage by stage against the host formats") {
    test::require_device_or_skip("moe_gemm_stages_test_gpu");
    constexpr int slots = test::moe_problem_slots;
    const std::uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937_64 g(seed);
    const test::problem P = test::make_problem(g, 512, 512, 12, 7);
    const kernels::moe_gemm_shape s{P.n_embd, P.n_ff, 16};
    const int n_pairs = P.rows * slots, nb_in = P.n_embd / 256, nb_ff = P.n_ff / 256;

    const test::device_problem D(P);
    const auto plan = kernels::moe_gemm_plan::make(s, P.rows);
    device_buffer<std::uint8_t> ws(plan.workspace_bytes());
    ws.fill_bytes(0x7f);  // nothing below may pass by reading what a fresh allocation happens to hold
    kernels::moe_gemm_plan::prepare(current_device());
    kernels::moe_gemm(plan, D.args(P.rows), ws.data(), nullptr);
    cuda_check(cudaDeviceSynchronize(), "moe_gemm");
    const kernels::moe_gemm_work W = plan.carve(ws.data()).first;

    // Sort: offsets, and each expert's group holds exactly its pairs (in any order).
    std::vector<std::int32_t> want_off(std::size_t(s.n_expert) + 1, 0);
    for (int p = 0; p < n_pairs; ++p) ++want_off[std::size_t(P.sel[std::size_t(p)]) + 1];
    for (int e = 0; e < s.n_expert; ++e) want_off[std::size_t(e) + 1] += want_off[std::size_t(e)];
    const auto off = fetch(W.offsets, want_off.size());
    CHECK_MESSAGE(differing(off, want_off) == 0, "sort: offsets");
    auto sorted = fetch(W.sorted, std::size_t(n_pairs));
    std::size_t bad_groups = 0;
    for (int e = 0; e < s.n_expert; ++e) {
        std::vector<std::int32_t> grp(sorted.begin() + want_off[std::size_t(e)], sorted.begin() + want_off[std::size_t(e) + 1]), want;
        std::sort(grp.begin(), grp.end());
        for (int p = 0; p < n_pairs; ++p)
            if (P.sel[std::size_t(p)] == e) want.push_back(p);
        bad_groups += grp != want;
    }
    CHECK_MESSAGE(bad_groups == 0, "sort: pairs of an expert's group");

    // Q8_K of x.
    const test::q8k_rows xq = test::quantize_rows(P.x, P.rows, P.n_embd);
    CHECK_MESSAGE(differing(fetch(W.xq, xq.q.size()), xq.q) == 0, "Q8_K of x: quants");
    CHECK_MESSAGE(differing(fetch(W.xq_d, xq.d.size()), xq.d) == 0, "Q8_K of x: scales");

    // mid from the reference block dots.
    std::vector<float> want_mid(std::size_t(n_pairs) * P.n_ff);
    std::vector<q8_k_block> xb(static_cast<std::size_t>(nb_in));
    for (int p = 0; p < n_pairs; ++p) {
        const int r = p / slots, e = P.sel[std::size_t(p)];
        quantize_q8_k(P.x.data() + std::size_t(r) * P.n_embd, xb.data(), P.n_embd);
        for (int f = 0; f < P.n_ff; ++f) {
            const std::size_t row = (std::size_t(e) * P.n_ff + f) * nb_in;
            const float gv = std::fmin(dot_iq2_xxs_q8_k(P.gate.data() + row, xb.data(), nb_in), 10.0f);
            const float uv = std::fmax(std::fmin(dot_iq2_xxs_q8_k(P.upw.data() + row, xb.data(), nb_in), 10.0f), -10.0f);
            want_mid[std::size_t(p) * P.n_ff + f] = mul_rn(mul_rn(silu(gv), uv), P.w[std::size_t(p)]);
        }
    }
    const auto mid = fetch(W.mid, want_mid.size());
    CHECK_MESSAGE(differing(mid, want_mid) == 0, "gate/up: mid");

    // Q8_K of the device's mid (so this stage is checked apart from gate/up).
    const test::q8k_rows mq = test::quantize_rows(mid, n_pairs, P.n_ff);
    CHECK_MESSAGE(differing(fetch(W.midq, mq.q.size()), mq.q) == 0, "Q8_K of mid: quants");
    CHECK_MESSAGE(differing(fetch(W.midq_d, mq.d.size()), mq.d) == 0, "Q8_K of mid: scales");
    CHECK_MESSAGE(differing(fetch(W.midq_bsums, mq.bsums.size()), mq.bsums) == 0, "Q8_K of mid: 16-sums");

    // ys from the device's midq, and the slot sum from the device's ys.
    std::vector<float> want_ys(std::size_t(n_pairs) * P.n_embd);
    std::vector<q8_k_block> mb(static_cast<std::size_t>(nb_ff));
    for (int p = 0; p < n_pairs; ++p) {
        const int e = P.sel[std::size_t(p)];
        quantize_q8_k(mid.data() + std::size_t(p) * P.n_ff, mb.data(), P.n_ff);
        for (int o = 0; o < P.n_embd; ++o)
            want_ys[std::size_t(p) * P.n_embd + o] =
                dot_q2_k_q8_k(P.down.data() + (std::size_t(e) * P.n_embd + o) * nb_ff, mb.data(), nb_ff);
    }
    const auto ys = fetch(W.ys, want_ys.size());
    CHECK_MESSAGE(differing(ys, want_ys) == 0, "down: ys");
    std::vector<float> want_out(std::size_t(P.rows) * P.n_embd);
    for (int r = 0; r < P.rows; ++r)
        for (int o = 0; o < P.n_embd; ++o) {
            float acc = 0.0f;
            for (int k = 0; k < slots; ++k) acc = add_rn(acc, ys[std::size_t(r * slots + k) * P.n_embd + o]);
            want_out[std::size_t(r) * P.n_embd + o] = acc;
        }
    CHECK_MESSAGE(differing(D.out.download(), want_out) == 0, "slot sum: out");
}
