#pragma once
// The host/device pieces of kernels/moe.cuh's decode decomposition that are not arithmetic on
// weights: the order in which the experts launch hands out its work items, the top-6 candidate
// order, and the slot sum. The CPU emulation (tests/moe_decode_emulation_test.cpp) replays the
// schedule with these same functions, so it proves the hand-off can never wait on an item that
// no running CTA holds, and that the route equals reference/moe's insertion sort.
#include "ds4/core/host_device.hpp"
#include "ds4/core/rounding.hpp"

namespace ds4::kernels {

inline constexpr int moe_slots = 6;
inline constexpr int moe_max_experts = 256;
// Pairs computed per pass over a weight tile: the lead of an expert loops over passes when more
// pairs name it (many rows on one expert re-read the tile from L1/L2, never change the bits).
inline constexpr int moe_pair_chunk = 4;

// The top-6's candidate order: biased score descending, expert id ascending on ties. It is the
// order reference/moe's insertion sort with strict > produces; NaN scores never win.
DS4_HD_INLINE bool moe_route_before(float v, int e, float best_v, int best_e) {
    return v > best_v || (v == best_v && e < best_e);
}

// w_s = p_s / max(sum p, 2^-14) * scale, the sum in slot order from 0.
DS4_HD_INLINE void moe_route_weights(const float (&p)[moe_slots], float scale, float (&w)[moe_slots]) {
    float sum = 0.0f;
    for (int s = 0; s < moe_slots; ++s) sum = add_rn(sum, p[s]);
    const float denom = max_num(sum, 6.103515625e-5f);
    for (int s = 0; s < moe_slots; ++s) w[s] = mul_rn(div_rn(p[s], denom), scale);
}

// 32-row output tiles of n_embd per down item: 1 or 2, the plan's choice by row capacity. A down
// item is a few microseconds of latency around a little arithmetic, so two tiles an item (half the
// items) pay where many pairs make many waves of them, although the two-tile item stages its
// weights through shared memory (moe.cuh's down_item). H200, BM_moe_decode side:1, one tile ->
// two (us): rows 1 43.8 -> 46.3, 2 69.8 -> 70.9, 4 119.8 -> 116.2, 8 235.3 -> 220.3, 16 501.0 -> 459.7.
inline constexpr int moe_down_tiles_max = 2;
inline constexpr int moe_down2_min_capacity = 4;
DS4_HD_INLINE int moe_down_items(int n_embd_tiles, int tiles_per_item) {
    return (n_embd_tiles + tiles_per_item - 1) / tiles_per_item;
}

// One item of the experts launch. CTAs take tickets from a device counter in arrival order and
// ticket t runs item t: every gate/up item (pair-major, 32-row tiles of n_ff) comes before every
// down item (pair-major, 1 or 2 32-row tiles of n_embd each; `tile` is the item's index). A down item waits only for gate/up items of
// its pair, which hold smaller tickets, so they were handed to CTAs that are already running
// and that wait on nothing: the launch cannot deadlock, whatever the residency or the order in
// which the hardware starts CTAs (the ticket, not blockIdx, fixes the order).
struct moe_item {
    bool down = false;
    int pair = 0, tile = 0;
};

DS4_HD_INLINE moe_item moe_item_at(int ticket, int pairs, int gu_tiles, int dn_tiles) {
    moe_item it;
    const int gu_items = pairs * gu_tiles;
    it.down = ticket >= gu_items;
    const int local = it.down ? ticket - gu_items : ticket;
    const int tiles = it.down ? dn_tiles : gu_tiles;
    it.pair = local / tiles;
    it.tile = local % tiles;
    return it;
}

DS4_HD_INLINE int moe_item_count(int pairs, int gu_tiles, int dn_tiles) { return pairs * (gu_tiles + dn_tiles); }

// The layer's output for one row and column: the six slots in order from 0, then the shared
// expert, each addition rounded on its own (reference/moe's slot loop, then moe + shared).
DS4_HD_INLINE float moe_slot_sum(const float (&ys)[moe_slots], float shared) {
    float acc = 0.0f;
    for (int s = 0; s < moe_slots; ++s) acc = add_rn(acc, ys[s]);
    return add_rn(acc, shared);
}

}  // namespace ds4::kernels
