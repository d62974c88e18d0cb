// A CPU emulation of kernels/gemm_q8_0.cuh's pipelined kernel (gemm_q8_0_tile_kernel), built on
// its own index functions (kernels/gemm_q8_0_tile.hpp): every stage's shared-memory bytes as the
// loader places them (zero fill included), every lane's ldmatrix fragments (as the PTX ISA
// defines ldmatrix) fed to the mma model of tests/support/mma_s8_emulation.hpp (the PTX fragment
// tables), the bias read-back, the reference chain and the segment ends at stage boundaries;
// bitwise against format/row_dot.hpp's q8_0_row_dot. Shapes: a partial last row tile and weight
// tile, in = 21 blocks (a segment end inside, a zero-padded last stage), and in = 40 blocks (two
// segment ends, no padding).
// The GPU-only parts that the emulation cannot run are checked as schedules: the stage carve
// (disjoint, aligned, every fragment and scale read inside its own array) and the cp.async ring
// (gemm_tile::ring_*: each k-stage has landed when read, and no slot is refilled while read).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/q8_0.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/gemm_q8_0_tile.hpp"
#include "tests/support/gemm_q8_0_case.hpp"
#include "tests/support/mma_s8_emulation.hpp"

namespace {

using namespace ds4;
namespace gt = ds4::kernels::gemm_tile;
using test::case_data;
using test::make_case;

constexpr std::int32_t bias_bits = 0x4b400000;  // gemm_q8_0.cuh: 1.5 * 2^23
constexpr float bias_value = 12582912.0f;

std::uint32_t word_at(const std::uint8_t* p) {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
float float_bits(std::int32_t i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}

// One stage's shared memory as one byte array, carved at gt::w_at / x_at / ws_at / xs_at as the
// kernel carves it, filled as gemm_detail::issue_tile_stage and the scale pairs fill it. Poisoned
// first (0xff: NaN scales), so a byte that no loader writes but the kernel reads shows up.
struct stage {
    std::vector<std::uint8_t> bytes = std::vector<std::uint8_t>(gt::stage_bytes, 0xff);
    const std::uint8_t* w() const { return bytes.data() + gt::w_at; }
    const std::uint8_t* x() const { return bytes.data() + gt::x_at; }
    float ws(int i) const { return float_at(gt::ws_at + 4 * i); }
    float xs(int i) const { return float_at(gt::xs_at + 4 * i); }
    void set_float(int byte, float v) { std::memcpy(bytes.data() + byte, &v, 4); }
    float float_at(int byte) const {
        float v;
        std::memcpy(&v, bytes.data() + byte, 4);
        return v;
    }
};

void fill_stage(const case_data& c, int tile0, int m0, int b0, stage& s) {
    const int nb = c.in / 32, tiles = c.L.tiles;
    std::fill(s.bytes.begin(), s.bytes.end(), std::uint8_t(0xff));  // the slot's previous k-stage: never read
    for (int tid = 0; tid < gt::threads; ++tid) {
        for (int i = 0; i < gt::w_chunks; ++i) {
            const gt::w_chunk k = gt::w_chunk_of(tid + i * gt::threads);
            const int b = b0 + k.j;
            const bool ok = tile0 + k.t < tiles && b < nb;
            std::uint8_t* dst = s.bytes.data() + gt::w_dst(k);
            if (ok) std::memcpy(dst, c.quants.data() + ((std::size_t(tile0 + k.t) * c.L.nb8 + b) * 2 + k.h) * 512 + k.l * 16, 16);
            else std::memset(dst, 0, 16);
        }
        for (int i = 0; i < gt::x_chunks; ++i) {
            const gt::x_chunk k = gt::x_chunk_of(tid + i * gt::threads);
            const bool ok = m0 + k.r < c.n_rows && b0 + k.j < nb;
            std::uint8_t* dst = s.bytes.data() + gt::x_dst(k);
            if (ok) std::memcpy(dst, c.act_qs.data() + std::size_t(m0 + k.r) * c.in + (b0 + k.j) * 32 + k.h * 16, 16);
            else std::memset(dst, 0, 16);
        }
        for (int i = 0; i < gt::xs_items; ++i) {
            const int it = tid + i * gt::threads, r = gt::xs_row(it), j = gt::xs_block(it);
            const bool ok = m0 + r < c.n_rows && b0 + j < nb;
            s.set_float(gt::xs_dst(j, r), ok ? c.act_d[std::size_t(m0 + r) * nb + b0 + j] : 0.0f);
        }
        const int row = gt::ws_row(tid), j = gt::ws_first_block(tid), t = row / tile_rows, l = row % tile_rows;
        for (int q = 0; q < 2; ++q) {
            const int b = b0 + j + q;
            const bool ok = tile0 + t < tiles && b < nb;
            const std::uint16_t h = ok ? c.scales[((std::size_t(tile0 + t) * (c.L.nb8 / 8) + b0 / 8) * 32 + l) * 8 + b % 8] : 0;
            s.set_float(gt::ws_dst(j + q, row), ok ? f16_to_f32(h) : 0.0f);
        }
    }
}

// y[r][o] for every live row and weight row, CTA by CTA, warp by warp, lane by lane.
// ldmatrix.x4 as the PTX ISA defines it: register q of a lane is row lane / 4 of matrix q, whose
// 8 rows lanes 8q .. 8q + 7 address, b16 elements 2 (lane % 4), + 1: bytes 4 (lane % 4) .. + 3.
template <class RowAddress>
std::uint32_t ldmatrix_reg(const std::uint8_t* base, RowAddress row_address, int lane, int q) {
    return word_at(base + row_address(8 * q + lane / 4) + 4 * (lane % 4));
}

std::vector<float> emulate(const case_data& c) {
    const int nb = c.in / 32, nk = (nb + gt::kb - 1) / gt::kb;
    std::vector<float> y(std::size_t(c.n_rows) * c.rows, -1.0f);
    stage s;
    for (int m0 = 0; m0 < c.n_rows; m0 += gt::bx)
        for (int tile0 = 0; tile0 < c.L.tiles; tile0 += gt::bw / tile_rows) {
            std::vector<float> acc(std::size_t(gt::threads) * gt::lane_outputs, 0.0f), seg(acc.size(), 0.0f);
            for (int kt = 0; kt < nk; ++kt) {
                fill_stage(c, tile0, m0, kt * gt::kb, s);
                for (int warp = 0; warp < gt::threads / 32; ++warp) {
                    const int wn = warp % 2, wm = warp / 2;
                    for (int j = 0; j < gt::kb; ++j)
                        for (int mi = 0; mi < 4; ++mi)
                            for (int ni = 0; ni < 4; ++ni) {
                                test::mma_s8_warp w;
                                for (int lane = 0; lane < 32; ++lane) {
                                    for (int q = 0; q < 4; ++q) {
                                        w.c[lane][q] = bias_bits;
                                        w.a[lane][q] = ldmatrix_reg(
                                            s.w(), [&](int l) { return gt::a_ldm_offset(j, wn, mi, l); }, lane, q);
                                    }
                                    const auto b_row = [&](int l) { return gt::b_ldm_offset(j, wm, ni / 2, l); };
                                    w.b[lane][0] = ldmatrix_reg(s.x(), b_row, lane, 2 * (ni % 2));
                                    w.b[lane][1] = ldmatrix_reg(s.x(), b_row, lane, 2 * (ni % 2) + 1);
                                }
                                test::mma_m16n8k32_s8(w);
                                for (int lane = 0; lane < 32; ++lane) {
                                    const int g = lane / 4, t = lane % 4;
                                    const int wd = gt::wd_index(j, wn, mi, g), xd = gt::xd_index(j, wm, ni, t);
                                    for (int h = 0; h < 2; ++h)
                                        for (int e = 0; e < 2; ++e) {
                                            const float isum = float_bits(w.c[lane][2 * h + e]) - bias_value;
                                            const float term = mul_rn(mul_rn(s.ws(wd + h), s.xs(xd + e)), isum);
                                            float& sg = seg[std::size_t((warp * 32 + lane) * gt::lane_outputs + gt::out_index(mi, h, ni, e))];
                                            sg = add_rn(sg, term);
                                        }
                                }
                            }
                }
                if (((kt + 1) * gt::kb) % q8_0_segment_blocks == 0 || kt + 1 == nk)
                    for (std::size_t i = 0; i < acc.size(); ++i) {
                        acc[i] = add_rn(acc[i], seg[i]);
                        seg[i] = 0.0f;
                    }
            }
            for (int warp = 0; warp < gt::threads / 32; ++warp)
                for (int lane = 0; lane < 32; ++lane) {
                    const int wn = warp % 2, wm = warp / 2, g = lane / 4, t = lane % 4;
                    for (int mi = 0; mi < 4; ++mi)
                        for (int h = 0; h < 2; ++h) {
                            const int o = tile0 * tile_rows + gt::out_weight_row(wn, mi, h, g);
                            if (o >= c.rows) continue;
                            for (int ni = 0; ni < 4; ++ni)
                                for (int e = 0; e < 2; ++e) {
                                    const int r = m0 + gt::out_act_row(wm, ni, e, t);
                                    if (r < c.n_rows)
                                        y[std::size_t(r) * c.rows + o] =
                                            acc[std::size_t((warp * 32 + lane) * gt::lane_outputs + gt::out_index(mi, h, ni, e))];
                                }
                        }
                }
        }
    return y;
}

std::size_t mismatches(const case_data& c) {
    const std::vector<float> y = emulate(c);
    const int nb = c.in / 32;
    std::size_t bad = 0;
    for (int r = 0; r < c.n_rows; ++r)
        for (int o = 0; o < c.rows; ++o) {
            const float want = q8_0_row_dot(c.w.data() + std::size_t(o) * nb, c.x.data() + std::size_t(r) * nb, nb);
            bad += std::memcmp(&want, &y[std::size_t(r) * c.rows + o], 4) != 0;
        }
    return bad;
}

}  // namespace

TEST_CASE("gemm_q8_0's pipelined tile kernel, emulated on the CPU, equals q8_0_row_dot bitwise") {
    std::mt19937_64 g(1201);
    CHECK(mismatches(make_case(g, 200, 21 * 32, 150)) == 0);  // partial tiles, padded last stage
    CHECK(mismatches(make_case(g, 96, 40 * 32, 1)) == 0);     // one row, two segment ends
}

TEST_CASE("the tile kernel's ldmatrix phases: every 8-row matrix hits 32 distinct banks and stays inside its array") {
    bool distinct = true, in_bounds = true, aligned = true;
    auto phase = [&](auto row_address, int bytes) {
        for (int q = 0; q < 4; ++q) {
            std::vector<int> bank_hits(32, 0);
            for (int r = 0; r < 8; ++r) {
                const int at = row_address(8 * q + r);
                in_bounds &= at >= 0 && at + 16 <= bytes;
                aligned &= at % 16 == 0;
                for (int w = 0; w < 4; ++w) ++bank_hits[std::size_t((at / 4 + w) % 32)];
            }
            distinct &= std::all_of(bank_hits.begin(), bank_hits.end(), [](int n) { return n == 1; });
        }
    };
    for (int j = 0; j < gt::kb; ++j) {
        for (int wn = 0; wn < 2; ++wn)
            for (int mi = 0; mi < 4; ++mi) phase([&](int l) { return gt::a_ldm_offset(j, wn, mi, l); }, gt::w_bytes);
        for (int wm = 0; wm < 4; ++wm)
            for (int p = 0; p < 2; ++p) phase([&](int l) { return gt::b_ldm_offset(j, wm, p, l); }, gt::x_bytes);
    }
    CHECK(distinct);
    CHECK(in_bounds);
    CHECK(aligned);
}

TEST_CASE("the tile layout's index maps are bijections onto their buffers") {
    std::vector<int> w(gt::w_bytes, 0), x(gt::x_bytes, 0), xs(gt::kb * gt::bx, 0), ws(gt::kb * gt::bw, 0);
    for (int c = 0; c < gt::w_bytes / 16; ++c) {
        const gt::w_chunk k = gt::w_chunk_of(c);
        for (int i = 0; i < 16; ++i) ++w[std::size_t(gt::w_offset(k.j, 32 * k.t + k.l, 16 * k.h + i))];
    }
    for (int c = 0; c < gt::x_bytes / 16; ++c) {
        const gt::x_chunk k = gt::x_chunk_of(c);
        for (int i = 0; i < 16; ++i) ++x[std::size_t(gt::x_offset(k.j, k.r, 16 * k.h + i))];
    }
    for (int i = 0; i < gt::kb * gt::bx; ++i) ++xs[std::size_t(gt::xs_index(gt::xs_block(i), gt::xs_row(i)))];
    for (int tid = 0; tid < gt::threads; ++tid)
        for (int q = 0; q < 2; ++q) ++ws[std::size_t(gt::ws_index(gt::ws_first_block(tid) + q, gt::ws_row(tid)))];
    auto all_once = [](const std::vector<int>& v) {
        for (int n : v)
            if (n != 1) return false;
        return true;
    };
    CHECK(all_once(w));
    CHECK(all_once(x));
    CHECK(all_once(xs));
    CHECK(all_once(ws));
}

TEST_CASE("the tile stage carve: four disjoint aligned arrays, every kernel read inside its own") {
    struct region {
        int at, bytes;
    };
    const region w{gt::w_at, gt::w_bytes}, x{gt::x_at, gt::x_bytes}, ws{gt::ws_at, gt::ws_bytes}, xs{gt::xs_at, gt::xs_bytes};
    // Hand sizes: kb blocks x 128 rows x 32 bytes of quants, x 4 bytes of F32 scales.
    CHECK(w.bytes == 4 * 128 * 32);
    CHECK(x.bytes == 4 * 128 * 32);
    CHECK(ws.bytes == 4 * 128 * 4);
    CHECK(xs.bytes == 4 * 128 * 4);
    CHECK(gt::stage_bytes == 36864);
    CHECK(gt::smem_bytes == 4 * 36864);
    const region all[] = {w, x, ws, xs};
    int end = 0;
    for (const region& r : all) {
        CHECK(r.at == end);  // in order, no gap, no overlap
        CHECK(r.at % 16 == 0);
        end = r.at + r.bytes;
    }
    CHECK(end == gt::stage_bytes);
    // The loaders' destinations (every item of every thread) write each byte of a stage once.
    std::vector<int> hits(gt::stage_bytes, 0);
    auto mark = [&](int at, int n) {
        for (int i = 0; i < n; ++i)
            if (at + i >= 0 && at + i < gt::stage_bytes) ++hits[std::size_t(at + i)];
    };
    for (int tid = 0; tid < gt::threads; ++tid) {
        for (int i = 0; i < gt::w_chunks; ++i) mark(gt::w_dst(gt::w_chunk_of(tid + i * gt::threads)), 16);
        for (int i = 0; i < gt::x_chunks; ++i) mark(gt::x_dst(gt::x_chunk_of(tid + i * gt::threads)), 16);
        for (int i = 0; i < gt::xs_items; ++i) {
            const int it = tid + i * gt::threads;
            mark(gt::xs_dst(gt::xs_block(it), gt::xs_row(it)), 4);
        }
        for (int q = 0; q < 2; ++q) mark(gt::ws_dst(gt::ws_first_block(tid) + q, gt::ws_row(tid)), 4);
    }
    CHECK(std::all_of(hits.begin(), hits.end(), [](int n) { return n == 1; }));
    // Every scale-pair load of every lane: aligned and inside its array (the ldmatrix rows: the
    // ldmatrix phases test).
    bool in_bounds = true, aligned = true;
    for (int j = 0; j < gt::kb; ++j)
        for (int wv = 0; wv < 4; ++wv)
            for (int i = 0; i < 4; ++i)
                for (int g = 0; g < 8; ++g)
                    for (int t = 0; t < 4; ++t) {
                        const int wn = wv % 2, wm = wv;  // wn 0..1, wm 0..3
                        const int wd = 4 * gt::wd_index(j, wn, i, g), xd = 4 * gt::xd_index(j, wm, i, t);
                        in_bounds &= wd >= 0 && wd + 8 <= ws.bytes && xd >= 0 && xd + 8 <= xs.bytes;
                        aligned &= wd % 8 == 0 && xd % 8 == 0;
                    }
    CHECK(in_bounds);
    CHECK(aligned);
}

// The cp.async ring as the kernel runs it (gemm_q8_0_tile_kernel's prologue, loop and epilogue,
// through gemm_tile::ring_slot / ring_refill / ring_pending), replayed for every k-stage count:
// commit groups complete in order; wait_group N leaves at most N of them outstanding.
TEST_CASE("the tile kernel's cp.async ring: every stage landed when read, no slot refilled while read") {
    for (int nk = 1; nk <= 4 * gt::stages + 3; ++nk) {
        CAPTURE(nk);
        std::vector<int> group_stage;           // the k-stage each commit group carries (-1: empty)
        std::vector<int> slot(gt::stages, -1);  // the k-stage whose bytes a slot holds
        std::vector<int> slot_scales(gt::stages, -1);
        std::vector<int> last_read(gt::stages, -1);  // the iteration that last read a slot
        int landed = 0;                         // groups known complete
        auto issue = [&](int s) {
            const int sl = gt::ring_slot(s);
            CHECK(sl >= 0);
            CHECK(sl < gt::stages);
            slot[std::size_t(sl)] = s;
        };
        for (int s = 0; s < gt::stages - 1; ++s) {
            if (s < nk) {
                issue(s);
                slot_scales[std::size_t(gt::ring_slot(s))] = s;  // stored before the first barrier
            }
            group_stage.push_back(s < nk ? s : -1);
        }
        bool ok = true;
        for (int kt = 0; kt < nk; ++kt) {
            landed = std::max(landed, int(group_stage.size()) - gt::ring_pending);  // wait_group
            // __syncthreads: iterations < kt are over for every thread.
            const int next = gt::ring_refill(kt);
            if (next < nk) {
                const int sl = gt::ring_slot(next);
                ok &= last_read[std::size_t(sl)] < kt;  // its last reader is behind this barrier
                ok &= sl != gt::ring_slot(kt);           // not the slot this iteration reads
                issue(next);
            }
            group_stage.push_back(next < nk ? next : -1);
            // Reads of slot kt: its group has landed and nothing overwrote it since.
            const int sl = gt::ring_slot(kt);
            const auto g = std::find(group_stage.begin(), group_stage.end(), kt) - group_stage.begin();
            ok &= g < landed;
            ok &= slot[std::size_t(sl)] == kt;
            ok &= slot_scales[std::size_t(sl)] == kt;  // stored at the end of an earlier iteration
            last_read[std::size_t(sl)] = kt;
            // End of the iteration: the refill's weight scales, plain stores into its slot.
            if (next < nk) {
                ok &= gt::ring_slot(next) != sl;
                slot_scales[std::size_t(gt::ring_slot(next))] = next;
            }
        }
        CHECK(ok);
        // Every k-stage was issued exactly once, in a group of its own.
        int issued = 0;
        for (int s : group_stage) issued += s >= 0;
        CHECK(issued == nk);
    }
}
