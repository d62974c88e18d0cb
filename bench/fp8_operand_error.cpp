// Host-only numerics analysis, no GPU: what E4M3 (FP8) tensor-core operands would cost one
// attention step at the flash shape (64 heads x 512, 2048 stored rows), against an fp64
// evaluation on the same stored rows. FP8 wgmma runs at twice the F16 rate, which is what an 80%
// read-ceiling decode would need at 131 kFLOP per 592-byte row (bench/NOTES.md); this measures
// the accuracy it would give up. Variants: F16 q and P (what the kernels do), q rounded to E4M3
// per 64-dim block (S in FP8), and P rounded to E4M3 at scale 2^8 with F16 q (P.V in FP8). q is
// drawn at three scales: the larger the scale, the sharper the softmax.
// Usage: fp8_operand_error (prints one line per q scale).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/format/e4m3.hpp"

namespace {

constexpr int D = 512, H = 64, N = 2048, n_rot = 64;

float f16_round(float x) { return ds4::f16_to_f32(ds4::f32_to_f16(x)); }

enum class operands { exact, f16, q_e4m3, p_e4m3 };

// Softmax(q . K^T / sqrt(D)) . K for one head, in fp64 apart from the operand rounding asked for.
std::vector<double> attend(const std::vector<float>& K, const float* q, operands op) {
    std::vector<float> qq(q, q + D);
    if (op == operands::f16 || op == operands::p_e4m3)
        for (auto& v : qq) v = f16_round(v);
    if (op == operands::q_e4m3)
        for (int b = 0; b < D; b += ds4::e4m3_block_size) ds4::e4m3_block_roundtrip(&qq[std::size_t(b)], ds4::e4m3_block_size);
    std::vector<double> s(N);
    double m = -INFINITY;
    for (int r = 0; r < N; ++r) {
        double acc = 0;
        for (int d = 0; d < D; ++d) acc += double(qq[std::size_t(d)]) * K[std::size_t(r) * D + std::size_t(d)];
        s[std::size_t(r)] = acc / std::sqrt(double(D));
        m = std::max(m, s[std::size_t(r)]);
    }
    double l = 0;
    std::vector<double> o(D, 0.0);
    for (int r = 0; r < N; ++r) {
        const double p = std::exp(s[std::size_t(r)] - m);
        l += p;
        double w = p;
        if (op == operands::f16 || op == operands::q_e4m3) w = f16_round(float(p));
        if (op == operands::p_e4m3) w = ds4::e4m3_round(float(p * 256.0)) / 256.0;
        for (int d = 0; d < D; ++d) o[std::size_t(d)] += w * K[std::size_t(r) * D + std::size_t(d)];
    }
    for (auto& v : o) v /= l;
    return o;
}

}  // namespace

int main() {
    for (const float q_scale : {1.0f, 4.0f, 16.0f}) {
        std::mt19937_64 rng(1);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        // Stored rows as the KV store keeps them: E4M3 with power-of-two block scales, F16 tail.
        std::vector<float> K(std::size_t(N) * D), q(std::size_t(H) * D);
        for (auto& v : K) v = nd(rng);
        for (int r = 0; r < N; ++r) {
            float* row = &K[std::size_t(r) * D];
            for (int b = 0; b < D - n_rot; b += ds4::e4m3_block_size) ds4::e4m3_block_roundtrip(row + b, ds4::e4m3_block_size);
            for (int d = D - n_rot; d < D; ++d) row[d] = f16_round(row[d]);
        }
        for (auto& v : q) v = nd(rng) * q_scale;
        double norm = 0, err[3] = {0, 0, 0};
        for (int h = 0; h < H; ++h) {
            const float* qh = &q[std::size_t(h) * D];
            const auto ref = attend(K, qh, operands::exact);
            const operands ops[3] = {operands::f16, operands::q_e4m3, operands::p_e4m3};
            for (int i = 0; i < 3; ++i) {
                const auto o = attend(K, qh, ops[i]);
                for (int d = 0; d < D; ++d) err[i] += (o[std::size_t(d)] - ref[std::size_t(d)]) * (o[std::size_t(d)] - ref[std::size_t(d)]);
            }
            for (int d = 0; d < D; ++d) norm += ref[std::size_t(d)] * ref[std::size_t(d)];
        }
        std::printf("q scale %4.1f: relative L2 vs fp64: F16 q and P %.2e | q E4M3 %.2e | P E4M3 %.2e\n", double(q_scale),
                    std::sqrt(err[0] / norm), std::sqrt(err[1] / norm), std::sqrt(err[2] / norm));
    }
    return 0;
}
