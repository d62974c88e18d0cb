// The KV row as stored (docs/model.md §2.4 steps 5-6): E4M3 on the nope dims per 64-block, the RoPE
// tail only F16-rounded, everything F16-representable afterwards.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/format/e4m3.hpp"
#include "reference/kv_store.hpp"

TEST_CASE("kv_row_as_stored: FP8 on the nope blocks, F16 on the whole row") {
    for (int head_dim : {512, 128 + 64}) {
        std::mt19937 rng(head_dim);
        std::normal_distribution<float> g(0.0f, 1.0f);
        std::vector<float> row(head_dim);
        for (auto& v : row) v = g(rng);
        row[3] = 37.0f;  // one large value sets its block's scale
        std::vector<float> stored = row;
        ds4::ref::kv_row_as_stored(stored.data(), head_dim, 64);
        const int nope = head_dim - 64;
        for (int b = 0; b < nope; b += 64) {
            // Every stored value is (E4M3 value) * 2^e for the block's exponent e.
            const int e = ds4::e4m3_block_scale_exp(row.data() + b, 64);
            for (int i = b; i < b + 64; ++i) {
                const float q = stored[i] * ds4::exp2i(-e);
                CHECK(ds4::e4m3_round(q) == q);
                CHECK(std::fabs(stored[i] - row[i]) <= std::fabs(row[i]) * 0.0625f + ds4::exp2i(e - 9));
            }
        }
        for (int i = nope; i < head_dim; ++i) CHECK(stored[i] == ds4::f16_round(row[i]));
        for (float v : stored) CHECK(ds4::f16_round(v) == v);
    }
}
