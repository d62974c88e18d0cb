#pragma once
// How kernels/hyper_connection.cuh's hc pre launch splits the work: host and device, so that the
// CPU emulation (tests/hyper_connection_emulation_test.cpp) runs the kernel's own decomposition
// without a GPU.
//
// Rows are taken in groups of rows_per_block; each group has blocks_per_group blocks, block b
// holding the segments [b*s/n, (b+1)*s/n) of the flat state (512 elements each, the F16 matvec
// order's segments) for every mix output.
#include <cstddef>
#include <cstdint>

#include "ds4/core/host_device.hpp"

namespace ds4::kernels {

struct hc_pre_grid {
    int rows_per_block, blocks_per_group, groups;
};

// Blocks the grid aims at (the H200 has 132 SMs; one block per SM at 256 threads with the
// scale's registers): enough to pull the 786 KB of fn at bandwidth, few enough that the
// per-block scale stays cheap. Chosen by reasoning, not yet measured.
inline constexpr int hc_target_blocks = 128;
// The largest row group (the kernel's finish sizes its shared arrays by it).
inline constexpr int hc_max_group_rows = 8;

// One row per group up to 16 rows of capacity (decode: no block streams more than one row's
// state for its scale), 4 or 8 above (prefill chunks: each fn load shared by the group's rows);
// 4..32 blocks per group, never more than the segments.
DS4_HD_INLINE hc_pre_grid hc_pre_geometry(int capacity, int segments) {
    const int rb = capacity <= 16 ? 1 : (capacity <= 64 ? 4 : hc_max_group_rows);
    const int groups = (capacity + rb - 1) / rb;
    int b = hc_target_blocks / groups;
    b = b < 4 ? 4 : (b > 32 ? 32 : b);
    return {rb, b < segments ? b : segments, groups};
}

// Block b of n's segments: every segment in exactly one block, none empty when n <= segments.
struct hc_segment_run {
    int begin, end;
};
DS4_HD_INLINE hc_segment_run hc_block_segments(int b, int n, int segments) {
    return {int(std::int64_t(b) * segments / n), int(std::int64_t(b + 1) * segments / n)};
}

// The scratch: hc_max_groups arrival counters (an unsigned each) at its start, then the
// partials. The counters sit at the same place for every capacity, so one scratch serves
// launches of any capacity up to the one it was sized for (a counter placed after the
// partials would land among a larger launch's partials).
inline constexpr int hc_max_rows = 65535;
inline constexpr int hc_max_groups = (hc_max_rows + hc_max_group_rows - 1) / hc_max_group_rows;
static_assert(hc_max_groups >= 64, "the geometry's one- and four-row groups stop at 16 groups");

inline std::size_t hc_scratch_floats(int capacity, int n_mix, int segments) {
    static_assert(sizeof(unsigned) == sizeof(float));
    return std::size_t(hc_max_groups) + std::size_t(capacity) * std::size_t(n_mix) * std::size_t(segments);
}
DS4_HD_INLINE std::int64_t hc_partial_index(int row, int o, int s, int n_mix, int segments) {
    return hc_max_groups + (std::int64_t(row) * n_mix + o) * segments + s;
}

}  // namespace ds4::kernels
