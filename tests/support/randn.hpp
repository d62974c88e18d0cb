#pragma once
// Seeded normal random vectors for the CPU tests' inputs (never zeros, reproducible per seed).
#include <cstddef>
#include <random>
#include <vector>

namespace ds4::test {

inline std::vector<float> randn(std::size_t n, unsigned seed, float sd = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.0f, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = g(rng);
    return v;
}

}  // namespace ds4::test
