#pragma once
// The split-KV geometry of the tensor-core flash decode (attention_decode_mma.cuh), host-only
// arithmetic so that it is testable without a GPU. A query row's visible rows are cut into slots:
// its raw window in runs of raw_split rows, then its visible compressed rows in runs of
// split_rows (by rank); each slot is one CTA and one partial (m, l, o) for the merge.
//
// Choice (split_rows 0): one CTA runs per SM, so a launch costs about waves x (tiles per slot +
// writing and merging its partial, about one tile's time), waves = ceil(query rows x slots /
// n_sm); the plan minimises that over split sizes of 64 rows and up.
#include <algorithm>
#include <cmath>

namespace ds4::kernels {

inline constexpr int attn_split_granule = 64;  // rows per tile; splits are whole tiles

struct attention_split {
    int split_rows = 0;  // compressed rows per slot, a multiple of 64
    int raw_split = 0;   // window rows per raw slot: min(split_rows, n_swa rounded up to 64)
    int raw_slots = 0, comp_slots = 0;
};

// n_swa > 0, query_rows >= 1, max_comp >= 0, n_sm >= 1; split_rows 0 (choose) or a multiple of 64.
inline attention_split plan_attention_split(int n_swa, double query_rows, int max_comp, int n_sm, int split_rows = 0) {
    constexpr int G = attn_split_granule;
    const int swa_rows = (n_swa + G - 1) / G * G;
    if (split_rows == 0) {
        double best = 1e300;
        split_rows = G;
        for (int rows = G;; rows += G) {
            const int raw = std::min(rows, swa_rows);
            const int slots = (n_swa + raw - 1) / raw + (max_comp + rows - 1) / rows;
            const double waves = std::ceil(query_rows * slots / n_sm);
            const double cost = waves * (rows / G + 1.0);
            if (cost < best) best = cost, split_rows = rows;
            if (rows >= max_comp) break;
        }
    }
    attention_split p;
    p.split_rows = split_rows;
    p.raw_split = std::min(split_rows, swa_rows);
    p.raw_slots = (n_swa + p.raw_split - 1) / p.raw_split;
    p.comp_slots = (max_comp + split_rows - 1) / split_rows;
    return p;
}

}  // namespace ds4::kernels
