#pragma once
// The native KV cache formats (docs/README.md decision 6, docs/model.md §2.4 steps 5-6, §2.6, §3) and the paged
// storage that holds them.
//
// Attention rows (raw window and compressed), head_dim = nope + n_rot values:
//   [nope E4M3 codes][n_rot F16 RoPE dims][nope/64 int8 block exponents][pad to 16 B]
// Indexer keys, 128 values:
//   [64 bytes of E2M1 code pairs (element 2k in the low nibble)][4 int8 block exponents][pad]
//
// Contract: exact. decode(encode(x)) equals the reference's simulated stored row bit for bit:
// the attention row is ref::kv_row_as_stored(x) (E4M3 round trip of the nope dims, then the F16
// round of every value), the indexer key is f16_round(E2M1 round trip(x)). The F16 round is
// applied in decode on purpose: a decoded E4M3 value times 2^e can lie below F16's subnormal
// range (or above its max), where the F16 round changes it, so code * 2^e alone is not what the
// reference attends over. RoPE dims are F16 already, and f16_to_f32(f32_to_f16(x)) is the F16
// round by definition.
//
// Re-encoding a row that is already in stored form (the compressor emits rows that way) gives
// it back unchanged for every finite row whose magnitudes stay within F16 range (the block
// exponent may drop by one when the block max rounded down to half the grid max, but the codes
// then double exactly); kv_layout_test checks this on random and edge rows.
//
// Flash: attention row 448 + 128 + 7 = 583 -> 592 B, indexer key 64 + 4 = 68 -> 80 B, so a context
// token costs 21 x (592 + 80) / 4 + 20 x 592 / 128 = 3620.5 B (3.54 KiB) beyond the fixed raw
// window, against 13,760 B for ds4's F32 rows (§3.2).
//
// Pages hold kv_page_rows rows of one format; a sequence's rows of one stream (one layer's raw,
// compressed or indexer rows) are addressed through its page table, so sequences forked from a
// common prefix share that prefix's pages (reference-counted, copied on the first write).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/host_device.hpp"
#include "ds4/format/e2m1.hpp"
#include "ds4/format/e4m3.hpp"
#include "ds4/model/shape.hpp"

namespace ds4::model {

// 16 B rows keep every row start aligned for 128-bit loads on the GPU.
inline constexpr int kv_row_align = 16;
// Rows per page: 64 raw tokens, 256 tokens of ratio-4 rows, 8192 of ratio-128 rows. Small enough
// that a forked prefix wastes little on its partial last page.
inline constexpr int kv_page_rows = 64;

DS4_HD_INLINE constexpr int kv_align_up(int n, int a) { return (n + a - 1) / a * a; }

struct attention_row_layout {
    int head_dim = 0;
    int n_rot = 0;

    DS4_HD constexpr int n_nope() const { return head_dim - n_rot; }
    DS4_HD constexpr int n_blocks() const { return n_nope() / e4m3_block_size; }
    // The F16 tail starts at an even offset (nope is a multiple of 64), so it is 2-byte aligned.
    DS4_HD constexpr int rope_offset() const { return n_nope(); }
    DS4_HD constexpr int exponent_offset() const { return n_nope() + 2 * n_rot; }
    DS4_HD constexpr int bytes() const { return kv_align_up(exponent_offset() + n_blocks(), kv_row_align); }
};

struct indexer_row_layout {
    int dim = 0;

    DS4_HD constexpr int n_blocks() const { return dim / e2m1_block_size; }
    DS4_HD constexpr int exponent_offset() const { return dim / 2; }
    DS4_HD constexpr int bytes() const { return kv_align_up(exponent_offset() + n_blocks(), kv_row_align); }
};

// Finite blocks give exponents -22..120 (E4M3) and -126..126 (E2M1); the clamp only matters for
// non-finite rows, which the reference would have turned into Inf/NaN anyway.
DS4_HD_INLINE std::int8_t kv_exponent_byte(int e) {
    return static_cast<std::int8_t>(e < -128 ? -128 : (e > 127 ? 127 : e));
}

// x: head_dim floats after RoPE, before any rounding.
DS4_HD_INLINE void encode_attention_row(const attention_row_layout& l, const float* x, std::uint8_t* dst) {
    const int nope = l.n_nope();
    for (int b = 0; b < l.n_blocks(); ++b) {
        const int e = e4m3_block_encode(x + b * e4m3_block_size, e4m3_block_size, dst + b * e4m3_block_size);
        dst[l.exponent_offset() + b] = static_cast<std::uint8_t>(kv_exponent_byte(e));
    }
    for (int i = 0; i < l.n_rot; ++i) {
        const std::uint16_t h = f32_to_f16(x[nope + i]);
        dst[l.rope_offset() + 2 * i] = static_cast<std::uint8_t>(h & 0xffu);
        dst[l.rope_offset() + 2 * i + 1] = static_cast<std::uint8_t>(h >> 8);
    }
    for (int i = l.exponent_offset() + l.n_blocks(); i < l.bytes(); ++i) dst[i] = 0;  // stable blob bytes
}

DS4_HD_INLINE void decode_attention_row(const attention_row_layout& l, const std::uint8_t* src, float* out) {
    const int nope = l.n_nope();
    for (int b = 0; b < l.n_blocks(); ++b) {
        const int e = static_cast<std::int8_t>(src[l.exponent_offset() + b]);
        float* o = out + b * e4m3_block_size;
        e4m3_block_decode(src + b * e4m3_block_size, e, e4m3_block_size, o);
        for (int i = 0; i < e4m3_block_size; ++i) o[i] = f16_round(o[i]);
    }
    for (int i = 0; i < l.n_rot; ++i) {
        const auto h = static_cast<std::uint16_t>(src[l.rope_offset() + 2 * i] | (src[l.rope_offset() + 2 * i + 1] << 8));
        out[nope + i] = f16_to_f32(h);
    }
}

// x: dim floats after Hadamard-128 (the E2M1 round trip is this encode).
DS4_HD_INLINE void encode_indexer_row(const indexer_row_layout& l, const float* x, std::uint8_t* dst) {
    for (int b = 0; b < l.n_blocks(); ++b) {
        const int e = e2m1_block_encode(x + b * e2m1_block_size, e2m1_block_size, dst + b * e2m1_block_size / 2);
        dst[l.exponent_offset() + b] = static_cast<std::uint8_t>(kv_exponent_byte(e));
    }
    for (int i = l.exponent_offset() + l.n_blocks(); i < l.bytes(); ++i) dst[i] = 0;
}

DS4_HD_INLINE void decode_indexer_row(const indexer_row_layout& l, const std::uint8_t* src, float* out) {
    for (int b = 0; b < l.n_blocks(); ++b) {
        const int e = static_cast<std::int8_t>(src[l.exponent_offset() + b]);
        float* o = out + b * e2m1_block_size;
        e2m1_block_decode(src + b * e2m1_block_size / 2, e, e2m1_block_size, o);
        for (int i = 0; i < e2m1_block_size; ++i) o[i] = f16_round(o[i]);
    }
}

// Bytes of KV per context token beyond the fixed raw window (§3.2 with the native formats).
inline double kv_bytes_per_token(const model_dims& d) {
    const double attn = attention_row_layout{d.head_dim, d.n_rot}.bytes();
    const double idx = indexer_row_layout{d.indexer_head_dim}.bytes();
    double total = 0;
    for (int il = 0; il < d.n_layer; ++il) {
        const int r = d.ratio_of(il);
        if (r == 4) total += (attn + idx) / 4;
        else if (r != 0) total += attn / r;
    }
    return total;
}

// Fixed-size pages of rows of one format. Page ids are stable; a page is reference-counted so
// that page tables of forked sequences can point at it, and returns to the free list at zero.
class kv_page_pool {
public:
    kv_page_pool(int row_bytes, int rows_per_page = kv_page_rows)
        : row_bytes_(row_bytes), rows_per_page_(rows_per_page) {
        require(row_bytes > 0 && row_bytes % kv_row_align == 0 && rows_per_page > 0,
                "kv_page_pool: row bytes " + std::to_string(row_bytes) + " must be a positive multiple of 16");
    }

    int row_bytes() const { return row_bytes_; }
    int rows_per_page() const { return rows_per_page_; }
    std::size_t page_bytes() const { return std::size_t(row_bytes_) * std::size_t(rows_per_page_); }
    std::size_t pages_in_use() const { return in_use_; }

    std::int32_t allocate() {
        std::int32_t id;
        if (!free_.empty()) {
            id = free_.back();
            free_.pop_back();
        } else {
            id = static_cast<std::int32_t>(pages_.size());
            pages_.push_back(std::make_unique<std::uint8_t[]>(page_bytes()));
            refs_.push_back(0);
        }
        std::memset(pages_[std::size_t(id)].get(), 0, page_bytes());
        refs_[std::size_t(id)] = 1;
        ++in_use_;
        return id;
    }
    void retain(std::int32_t id) { ++refs_.at(std::size_t(id)); }
    void release(std::int32_t id) {
        int& r = refs_.at(std::size_t(id));
        require(r > 0, "kv_page_pool: page " + std::to_string(id) + " released more often than retained");
        if (--r == 0) {
            free_.push_back(id);
            --in_use_;
        }
    }
    int refcount(std::int32_t id) const { return refs_.at(std::size_t(id)); }
    std::uint8_t* data(std::int32_t id) { return pages_.at(std::size_t(id)).get(); }
    const std::uint8_t* data(std::int32_t id) const { return pages_.at(std::size_t(id)).get(); }

private:
    int row_bytes_, rows_per_page_;
    std::vector<std::unique_ptr<std::uint8_t[]>> pages_;
    std::vector<int> refs_;
    std::vector<std::int32_t> free_;
    std::size_t in_use_ = 0;
};

// One sequence's rows of one stream: row i lives in page table[i / rows_per_page]. Entries are
// -1 for pages never written or already dropped (raw rows that left the window).
class kv_page_table {
public:
    kv_page_table() = default;
    explicit kv_page_table(kv_page_pool& pool) : pool_(&pool) {}
    kv_page_table(const kv_page_table&) = delete;
    kv_page_table& operator=(const kv_page_table&) = delete;
    kv_page_table(kv_page_table&& o) noexcept : pool_(o.pool_), pages_(std::move(o.pages_)) { o.pages_.clear(); }
    kv_page_table& operator=(kv_page_table&& o) noexcept {
        if (this != &o) {
            clear();
            pool_ = o.pool_;
            pages_ = std::move(o.pages_);
            o.pages_.clear();
        }
        return *this;
    }
    ~kv_page_table() { clear(); }

    // Another table over the same pages (prefix sharing); writes to either copy the page first.
    kv_page_table share() const {
        kv_page_table t;
        t.pool_ = pool_;
        t.pages_ = pages_;
        for (std::int32_t id : pages_)
            if (id >= 0) pool_->retain(id);
        return t;
    }

    const std::vector<std::int32_t>& pages() const { return pages_; }

    const std::uint8_t* row(std::int64_t i) const {
        const std::int32_t id = page_of(i);
        require(id >= 0, "kv_page_table: row " + std::to_string(i) + " is not stored");
        return pool_->data(id) + offset_of(i);
    }

    // Allocates the page on first use and copies a shared page before writing into it.
    std::uint8_t* row_for_write(std::int64_t i) {
        const std::size_t p = std::size_t(i / pool_->rows_per_page());
        if (pages_.size() <= p) pages_.resize(p + 1, -1);
        std::int32_t& id = pages_[p];
        if (id < 0) {
            id = pool_->allocate();
        } else if (pool_->refcount(id) > 1) {
            const std::int32_t copy = pool_->allocate();
            std::memcpy(pool_->data(copy), pool_->data(id), pool_->page_bytes());
            pool_->release(id);
            id = copy;
        }
        return pool_->data(id) + offset_of(i);
    }

    // Releases every page whose rows all lie before `first_kept`.
    void drop_before(std::int64_t first_kept) {
        const std::int64_t n = first_kept / pool_->rows_per_page();
        for (std::int64_t p = 0; p < n && p < std::int64_t(pages_.size()); ++p)
            if (pages_[std::size_t(p)] >= 0) {
                pool_->release(pages_[std::size_t(p)]);
                pages_[std::size_t(p)] = -1;
            }
    }

    void clear() {
        if (pool_)
            for (std::int32_t id : pages_)
                if (id >= 0) pool_->release(id);
        pages_.clear();
    }

private:
    std::int32_t page_of(std::int64_t i) const {
        const std::size_t p = std::size_t(i / pool_->rows_per_page());
        return i >= 0 && p < pages_.size() ? pages_[p] : -1;
    }
    std::size_t offset_of(std::int64_t i) const {
        return std::size_t(i % pool_->rows_per_page()) * std::size_t(pool_->row_bytes());
    }

    kv_page_pool* pool_ = nullptr;
    std::vector<std::int32_t> pages_;
};

}  // namespace ds4::model
