#pragma once
// The sequence snapshot format every backend writes and reads (backend::snapshot / restore), so
// a snapshot taken on one backend restores on another of the same model.
//
//   header   magic "DS4SEQKV", u32 version (1), u32 reserved (0), u64 payload bytes,
//            u64 FNV-1a 64 of the payload
//   payload  shape: i32 n_layer, head_dim, n_rot, n_swa, indexer_head_dim, attention row bytes,
//                   indexer row bytes, n_embd, n_vocab, then i32 ratio of every layer
//            i32 length L
//            per layer: the last min(L, n_swa) raw attention rows (oldest first, native row
//            format of ds4/model/kv_layout.hpp); compressed layers then i64 n_comp (== L / ratio),
//            n_comp compressed rows, the compressor frontier (kv then score, F32, rows x width of
//            reference/compressor.hpp's state); ratio-4 layers then n_comp indexer rows and the
//            indexer compressor frontier.
// All integers and floats little-endian as the host stores them (every supported target is).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/model/kv_layout.hpp"
#include "ds4/model/shape.hpp"

namespace ds4::engine::snapshot_format {

inline constexpr char magic[8] = {'D', 'S', '4', 'S', 'E', 'Q', 'K', 'V'};
inline constexpr std::uint32_t version = 1;
inline constexpr std::size_t header_bytes = 8 + 4 + 4 + 8 + 8;

// FNV-1a 64: every step is a bijection of the running state, so any single changed byte changes
// the checksum (a corrupted blob cannot pass by luck of a one-byte flip).
inline std::uint64_t fnv1a(const std::byte* p, std::size_t n) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (std::size_t i = 0; i < n; ++i) {
        h ^= std::uint64_t(p[i]);
        h *= 0x100000001b3ull;
    }
    return h;
}

class writer {
public:
    template <class T>
    void put(T v) {
        bytes(&v, sizeof v);
    }
    void bytes(const void* p, std::size_t n) {
        const auto* b = static_cast<const std::byte*>(p);
        out.insert(out.end(), b, b + n);
    }
    std::vector<std::byte> out;
};

class reader {
public:
    explicit reader(std::span<const std::byte> b) : b_(b) {}
    template <class T>
    T get(std::string_view what) {
        T v;
        bytes(&v, sizeof v, what);
        return v;
    }
    void bytes(void* p, std::size_t n, std::string_view what) {
        require(n <= b_.size() - at_, "snapshot: truncated while reading " + std::string(what) + " at payload byte " +
                                          std::to_string(at_));
        std::memcpy(p, b_.data() + at_, n);
        at_ += n;
    }
    bool done() const { return at_ == b_.size(); }

private:
    std::span<const std::byte> b_;
    std::size_t at_ = 0;
};

// The shape a snapshot must match: a blob of another model cannot be restored silently.
inline void put_shape(writer& w, const model::model_dims& d) {
    const model::attention_row_layout attn{d.head_dim, d.n_rot};
    const model::indexer_row_layout idx{d.indexer_head_dim};
    for (int v : {d.n_layer, d.head_dim, d.n_rot, d.n_swa, d.indexer_head_dim, attn.bytes(), idx.bytes(), d.n_embd,
                  d.n_vocab})
        w.put(std::int32_t(v));
    for (int il = 0; il < d.n_layer; ++il) w.put(std::int32_t(d.ratio_of(il)));
}

// Header + checksum around a payload.
inline std::vector<std::byte> seal(const std::vector<std::byte>& payload) {
    writer out;
    out.bytes(magic, sizeof magic);
    out.put(version);
    out.put(std::uint32_t(0));  // reserved
    out.put(std::uint64_t(payload.size()));
    out.put(fnv1a(payload.data(), payload.size()));
    out.bytes(payload.data(), payload.size());
    return std::move(out.out);
}

// Checks the header, size, checksum and shape; returns a reader positioned after the shape.
inline reader open(std::span<const std::byte> blob, const model::model_dims& d) {
    require(blob.size() >= header_bytes, "snapshot: " + std::to_string(blob.size()) + " bytes, shorter than the header");
    reader h(blob.first(header_bytes));
    char m[8];
    h.bytes(m, 8, "magic");
    require(std::memcmp(m, magic, 8) == 0, "snapshot: bad magic (not a ds4 sequence snapshot)");
    const auto v = h.get<std::uint32_t>("version");
    require(v == version, "snapshot: format version " + std::to_string(v) + ", this build reads version " +
                              std::to_string(version));
    h.get<std::uint32_t>("reserved");
    const auto payload_bytes = h.get<std::uint64_t>("payload size");
    const auto checksum = h.get<std::uint64_t>("checksum");
    const std::span<const std::byte> payload = blob.subspan(header_bytes);
    require(payload.size() == payload_bytes, "snapshot: payload is " + std::to_string(payload.size()) +
                                                 " bytes, the header says " + std::to_string(payload_bytes));
    require(fnv1a(payload.data(), payload.size()) == checksum, "snapshot: checksum mismatch (corrupted blob)");
    reader rd(payload);
    writer want;
    put_shape(want, d);
    std::vector<std::byte> shape(want.out.size());
    rd.bytes(shape.data(), shape.size(), "shape");
    require(shape == want.out, "snapshot: taken from a model of another shape");
    return rd;
}

}  // namespace ds4::engine::snapshot_format
