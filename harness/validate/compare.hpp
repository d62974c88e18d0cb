#pragma once
// Comparison of a kernel's output with the reference under a numerics contract. NaN and Inf
// positions are checked apart from values: a kernel that produces NaN where the reference
// does not (or the reverse) fails whatever the bound.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <span>
#include <string>
#include <utility>

namespace ds4::validate {

struct comparison {
    double max_abs = 0;       // over finite pairs
    std::uint64_t max_ulp = 0;  // distance in representable floats, over finite pairs
    std::size_t mismatches = 0;  // elements not bit-equal (exact) or over the bound (bounded)
    std::size_t special_mismatches = 0;  // NaN/Inf position or sign disagreements
    std::size_t count = 0;

    // Folds another comparison of the same check in (several launches, one table row).
    void add(const comparison& o) {
        max_abs = std::max(max_abs, o.max_abs);
        max_ulp = std::max(max_ulp, o.max_ulp);
        mismatches += o.mismatches;
        special_mismatches += o.special_mismatches;
        count += o.count;
    }
};

inline std::uint64_t ulp_distance(float a, float b) {
    // Map the sign-magnitude encoding onto a monotonic integer line.
    auto key = [](float f) -> std::int64_t {
        const std::int32_t i = std::bit_cast<std::int32_t>(f);
        return i < 0 ? std::int64_t(std::numeric_limits<std::int32_t>::min()) - i : i;
    };
    const std::int64_t d = key(a) - key(b);
    return std::uint64_t(d < 0 ? -d : d);
}

// bound_ulp < 0 means exact (bitwise, except that +0 and -0 must match too).
inline comparison compare(std::span<const float> got, std::span<const float> want, double bound_ulp = -1,
                          double bound_rel = 0) {
    comparison c;
    c.count = want.size();
    for (std::size_t i = 0; i < want.size(); ++i) {
        const float g = got[i], w = want[i];
        const bool gs = !std::isfinite(g), ws = !std::isfinite(w);
        if (gs || ws) {
            const bool same = (std::isnan(g) && std::isnan(w)) || (std::isinf(g) && std::isinf(w) && std::signbit(g) == std::signbit(w));
            if (!same) ++c.special_mismatches;
            continue;
        }
        const double diff = std::fabs(double(g) - double(w));
        const std::uint64_t u = ulp_distance(g, w);
        if (diff > c.max_abs) c.max_abs = diff;
        if (u > c.max_ulp) c.max_ulp = u;
        if (bound_ulp < 0) {
            if (std::bit_cast<std::uint32_t>(g) != std::bit_cast<std::uint32_t>(w)) ++c.mismatches;
        } else if (double(u) > bound_ulp && diff > bound_rel * std::fabs(double(w))) {
            ++c.mismatches;
        }
    }
    return c;
}

// Bounded comparison for attention-like outputs: NaN/Inf positions as compare(), mismatches =
// finite elements whose |diff| exceeds bound_abs, and the relative L2 error over finite pairs.
struct bounded_comparison {
    comparison cmp;
    double rel_l2 = 0;
};

inline bounded_comparison compare_bounded(std::span<const float> got, std::span<const float> want, double bound_abs) {
    bounded_comparison b{compare(got, want, 1e30, 0), 0};
    double num = 0, den = 0;
    std::size_t over = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        if (!std::isfinite(got[i]) || !std::isfinite(want[i])) continue;
        const double d = double(got[i]) - double(want[i]);
        num += d * d;
        den += double(want[i]) * double(want[i]);
        over += std::fabs(d) > bound_abs;
    }
    b.cmp.mismatches = over;
    b.rel_l2 = std::sqrt(num / (den > 1e-300 ? den : 1e-300));
    return b;
}

inline bool passed(const comparison& c) { return c.mismatches == 0 && c.special_mismatches == 0; }

// One line of ds4-validate's table.
struct check_row {
    std::string kernel, shape, contract;
    comparison cmp;
    bool pass = false;
    std::string note;
};

// A row whose verdict is `passed(cmp)`.
inline check_row row_of(std::string kernel, std::string shape, std::string contract, const comparison& cmp,
                        std::string note) {
    return {std::move(kernel), std::move(shape), std::move(contract), cmp, passed(cmp), std::move(note)};
}

}  // namespace ds4::validate
