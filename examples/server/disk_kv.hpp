#pragma once
// Disk KV: prefix snapshots (backend::snapshot bytes) kept in a directory so that a restarted
// server restores a conversation's prefix instead of prefilling it again.
//
// One file per prefix, named by a content hash of the model's identity and the prefix's tokens
// (<16 hex>.kv). A file:
//   magic "DS4DSKKV", u32 version (1), u32 reserved (0), u64 model identity, u64 token count,
//   u64 snapshot bytes, the tokens (i32 each), the snapshot, then u64 FNV-1a 64 of every byte
//   before it.
// Written to a temporary name, fsynced, renamed over the final name, the directory fsynced: a
// crash mid-write leaves the previous state (a stray .tmp, removed at the next start). Every file
// is checked when the directory is scanned and again when it is read (magic, version, model
// identity, sizes, checksum, name == hash of its content): a file that fails is logged and
// ignored, never trusted. The directory is held under a byte budget, least recently used first
// (a hit touches the file, so the order survives restarts). A failed write (a full disk) is
// logged and costs only that save.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ds4::server {

// The model's identity for disk KV: FNV-1a 64 of the GGUF header, metadata and tensor directory
// (everything before the data section), read once at start.
std::uint64_t model_identity(const std::filesystem::path& gguf_path);

struct disk_kv_stats {
    std::uint64_t files = 0, bytes = 0, budget = 0;
    std::uint64_t hits = 0, saves = 0, save_errors = 0, evictions = 0, rejected = 0;
};

class disk_kv {
public:
    // Creates the directory when missing and indexes the valid files in it; budget 0 = no limit.
    disk_kv(std::filesystem::path dir, std::uint64_t budget, std::uint64_t model_id);

    // The longest stored prefix of `prompt` of at most `max_len` tokens and longer than
    // `min_len`: its length and snapshot bytes, checked again as read. A file that fails the
    // check is dropped from the index (logged).
    std::optional<std::pair<int, std::vector<std::byte>>> find(std::span<const std::int32_t> prompt, int min_len, int max_len);
    bool contains(std::span<const std::int32_t> tokens) const;
    // Stores the snapshot of `tokens`; false (logged) when it cannot: over the budget on its own,
    // or a write error. Never throws.
    bool save(std::span<const std::int32_t> tokens, std::span<const std::byte> snapshot);
    disk_kv_stats stats() const { return stats_; }

    // The file name of a prefix (exposed for tests and tools).
    static std::string file_name(std::uint64_t model_id, std::span<const std::int32_t> tokens);

private:
    struct entry {
        std::vector<std::int32_t> tokens;
        std::filesystem::path path;
        std::uint64_t bytes;
        std::uint64_t last_used;
    };
    // The tokens and snapshot of a file, or the reason it is not trusted.
    struct parsed {
        std::vector<std::int32_t> tokens;
        std::vector<std::byte> snapshot;
        std::string error;
    };
    parsed read(const std::filesystem::path& p) const;
    void evict_until(std::uint64_t room);
    void reject(const std::filesystem::path& p, const std::string& why);

    std::filesystem::path dir_;
    std::uint64_t model_id_;
    std::vector<entry> entries_;
    std::uint64_t clock_ = 0;
    disk_kv_stats stats_;
};

}  // namespace ds4::server
