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
//
// Threads: the scheduler thread takes the snapshot bytes (a backend call) and queues them; one
// writer thread builds, checksums, writes, fsyncs and renames the file, so a slow or full disk
// never delays a step. The queue is bounded (saves waiting, not counting the one being written):
// a save that finds it full is dropped with a log line and a counter. close() drains the queue
// within a time limit and abandons the rest (an unfinished write stops between chunks and its
// .tmp is removed), so no file under a final name is ever partial.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace ds4::server {

// The model's identity for disk KV: FNV-1a 64 of the GGUF header, metadata and tensor directory
// (everything before the data section), read once at start.
std::uint64_t model_identity(const std::filesystem::path& gguf_path);

struct disk_kv_stats {
    std::uint64_t files = 0, bytes = 0, budget = 0;
    std::uint64_t hits = 0, saves = 0, save_errors = 0, evictions = 0, rejected = 0;
    std::uint64_t pending = 0, pending_bytes = 0;  // saves queued or being written, and their snapshot bytes
    std::uint64_t dropped = 0;    // saves not queued because the queue was full
    std::uint64_t abandoned = 0;  // saves given up at shutdown
    std::string last_error;       // the last failed write's reason (strerror), empty while none failed
};

struct disk_kv_options {
    std::filesystem::path dir;
    std::uint64_t budget = 0;  // bytes the directory may hold; 0 = no limit
    std::uint64_t model_id = 0;
    int queue = 4;             // saves that may wait for the writer; beyond that a save is dropped
    int debug_write_delay_ms = 0;  // test hook: the writer waits this long before each write
};

class disk_kv {
public:
    // Creates the directory when missing, indexes the valid files in it and starts the writer.
    explicit disk_kv(disk_kv_options options);
    // close(0): what is still queued is abandoned.
    ~disk_kv();
    disk_kv(const disk_kv&) = delete;
    disk_kv& operator=(const disk_kv&) = delete;

    // The longest stored prefix of `prompt` of at most `max_len` tokens and longer than
    // `min_len`: its length and snapshot bytes, checked again as read. A file that fails the
    // check is dropped from the index (logged).
    std::optional<std::pair<int, std::vector<std::byte>>> find(std::span<const std::int32_t> prompt, int min_len, int max_len);
    // Stored, or queued to be.
    bool contains(std::span<const std::int32_t> tokens) const;
    // Whether a save of `tokens` should be made (asked before the snapshot is taken): false when
    // it is stored or queued already, or when the queue is full (then counted and logged as
    // dropped).
    bool wants(std::span<const std::int32_t> tokens);
    // Queues the snapshot of `tokens` for the writer; false (logged) when it cannot be saved: over
    // the budget on its own, the queue full, or closed. Never throws; the write's own errors
    // are counted and logged by the writer.
    bool save(std::span<const std::int32_t> tokens, std::vector<std::byte> snapshot);
    // Waits until nothing is queued or being written, at most `limit`; true when idle.
    bool flush(std::chrono::milliseconds limit);
    // Stops the writer: queued saves are written for at most `limit`, then the rest abandoned
    // (logged). Later saves are refused. Idempotent.
    void close(std::chrono::milliseconds limit);
    disk_kv_stats stats() const;

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
    struct pending {
        std::vector<std::int32_t> tokens;
        std::vector<std::byte> snapshot;
    };
    parsed read(const std::filesystem::path& p) const;
    void evict_until(std::uint64_t room);  // mutex_ held
    void reject(const std::filesystem::path& p, const std::string& why);  // mutex_ held
    bool stored(std::span<const std::int32_t> tokens) const;              // mutex_ held
    bool queued(std::span<const std::int32_t> tokens) const;              // mutex_ held
    bool queue_full(std::size_t n_tokens);  // mutex_ held; a full queue counts and logs the drop
    void writer_loop();
    void write(pending p);  // writer thread
    // The file image of a save: header, tokens, snapshot, checksum.
    std::vector<std::byte> image(const pending& p) const;

    const disk_kv_options options_;
    mutable std::mutex mutex_;  // everything below but writer_
    std::condition_variable wake_;
    std::vector<entry> entries_;
    std::uint64_t clock_ = 0;
    disk_kv_stats stats_;
    std::deque<pending> queue_;
    std::optional<std::vector<std::int32_t>> writing_;  // the tokens of the save being written
    bool closing_ = false, writer_done_ = false;
    std::atomic<bool> abandon_{false};  // read by the writer between chunks, without the mutex
    std::thread writer_;
};

}  // namespace ds4::server
