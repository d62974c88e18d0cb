#include "examples/server/disk_kv.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "ds4/engine/snapshot_format.hpp"
#include "ds4/gguf/reader.hpp"

namespace ds4::server {
namespace {

constexpr char file_magic[8] = {'D', 'S', '4', 'D', 'S', 'K', 'K', 'V'};
constexpr std::uint32_t file_version = 1;
constexpr std::size_t file_header = 8 + 4 + 4 + 8 + 8 + 8;

using engine::snapshot_format::fnv1a;

template <class T>
void put(std::vector<std::byte>& out, T v) {
    const auto* b = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), b, b + sizeof v);
}

template <class T>
T get(const std::vector<std::byte>& in, std::size_t at) {
    T v;
    std::memcpy(&v, in.data() + at, sizeof v);
    return v;
}

// Writes all of `bytes` to fd; false with errno set on a failure (ENOSPC, EIO, ...).
bool write_all(int fd, std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
        const ssize_t n = ::write(fd, bytes.data(), bytes.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        bytes = bytes.subspan(std::size_t(n));
    }
    return true;
}

}  // namespace

std::uint64_t model_identity(const std::filesystem::path& gguf_path) {
    const gguf::file f = gguf::file::open(gguf_path);
    const auto head = f.bytes().first(std::size_t(std::min<std::uint64_t>(f.data_offset(), f.size())));
    return fnv1a(head.data(), head.size());
}

std::string disk_kv::file_name(std::uint64_t model_id, std::span<const std::int32_t> tokens) {
    std::vector<std::byte> key;
    put(key, model_id);
    for (std::int32_t t : tokens) put(key, t);
    char name[32];
    std::snprintf(name, sizeof name, "%016llx.kv", static_cast<unsigned long long>(fnv1a(key.data(), key.size())));
    return name;
}

disk_kv::disk_kv(disk_kv_options options) : options_(std::move(options)) {
    const std::filesystem::path& dir = options_.dir;
    stats_.budget = options_.budget;
    std::filesystem::create_directories(dir);
    struct found {
        std::filesystem::path path;
        std::filesystem::file_time_type mtime;
    };
    std::vector<found> files;
    for (const auto& de : std::filesystem::directory_iterator(dir)) {
        if (!de.is_regular_file()) continue;
        const auto& p = de.path();
        if (p.extension() == ".tmp") {  // a write that never finished: the previous state stands
            std::fprintf(stderr, "ds4-server: disk KV: removing unfinished write %s\n", p.c_str());
            std::error_code ec;
            std::filesystem::remove(p, ec);
            continue;
        }
        if (p.extension() != ".kv") continue;
        files.push_back({p, de.last_write_time()});
    }
    std::sort(files.begin(), files.end(), [](const found& a, const found& b) { return a.mtime < b.mtime; });
    for (const found& f : files) {
        parsed r = read(f.path);
        if (!r.error.empty()) {
            reject(f.path, r.error);
            continue;
        }
        const std::uint64_t bytes = std::filesystem::file_size(f.path);
        entries_.push_back({std::move(r.tokens), f.path, bytes, ++clock_});
        stats_.bytes += bytes;
    }
    stats_.files = entries_.size();
    if (stats_.budget > 0) evict_until(0);
    std::fprintf(stderr, "ds4-server: disk KV: %s, %zu prefixes (%llu bytes) usable\n", dir.c_str(), entries_.size(),
                 static_cast<unsigned long long>(stats_.bytes));
    writer_ = std::thread([this] { writer_loop(); });
}

disk_kv::~disk_kv() { close(std::chrono::milliseconds(0)); }

disk_kv_stats disk_kv::stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
}

void disk_kv::reject(const std::filesystem::path& p, const std::string& why) {
    ++stats_.rejected;
    std::fprintf(stderr, "ds4-server: disk KV: ignoring %s: %s\n", p.c_str(), why.c_str());
}

disk_kv::parsed disk_kv::read(const std::filesystem::path& p) const {
    parsed r;
    std::ifstream in(p, std::ios::binary);
    if (!in) return r.error = "cannot open", r;
    std::vector<std::byte> b;
    in.seekg(0, std::ios::end);
    const auto size = std::streamoff(in.tellg());
    in.seekg(0);
    if (size < 0) return r.error = "cannot read", r;
    b.resize(std::size_t(size));
    if (!in.read(reinterpret_cast<char*>(b.data()), size)) return r.error = "read failed", r;
    if (b.size() < file_header + 8) return r.error = "truncated (" + std::to_string(b.size()) + " bytes, shorter than the header)", r;
    if (std::memcmp(b.data(), file_magic, 8) != 0) return r.error = "bad magic (not a ds4 disk KV file)", r;
    if (const auto v = get<std::uint32_t>(b, 8); v != file_version)
        return r.error = "format version " + std::to_string(v) + ", this build reads version " + std::to_string(file_version), r;
    const auto n_tokens = get<std::uint64_t>(b, 24);
    const auto n_snap = get<std::uint64_t>(b, 32);
    const std::uint64_t body = b.size() - file_header - 8;
    if (n_tokens > body / 4 || n_snap != body - n_tokens * 4)
        return r.error = "truncated or padded (" + std::to_string(b.size()) + " bytes, the header says " +
                         std::to_string(n_tokens) + " tokens and " + std::to_string(n_snap) + " snapshot bytes)", r;
    if (fnv1a(b.data(), b.size() - 8) != get<std::uint64_t>(b, b.size() - 8)) return r.error = "checksum mismatch (corrupted)", r;
    if (get<std::uint64_t>(b, 16) != options_.model_id) return r.error = "written for another model (identity differs)", r;
    r.tokens.resize(n_tokens);
    std::memcpy(r.tokens.data(), b.data() + file_header, n_tokens * 4);
    if (p.filename() != file_name(options_.model_id, r.tokens)) return r.error = "name does not match its tokens", r;
    const auto* s = b.data() + file_header + n_tokens * 4;
    r.snapshot.assign(s, s + n_snap);
    return r;
}

bool disk_kv::stored(std::span<const std::int32_t> tokens) const {
    return std::any_of(entries_.begin(), entries_.end(), [&](const entry& e) { return std::ranges::equal(e.tokens, tokens); });
}

bool disk_kv::queued(std::span<const std::int32_t> tokens) const {
    return (writing_ && std::ranges::equal(*writing_, tokens)) ||
           std::any_of(queue_.begin(), queue_.end(), [&](const pending& p) { return std::ranges::equal(p.tokens, tokens); });
}

bool disk_kv::contains(std::span<const std::int32_t> tokens) const {
    std::lock_guard lock(mutex_);
    return stored(tokens) || queued(tokens);
}

bool disk_kv::wants(std::span<const std::int32_t> tokens) {
    std::lock_guard lock(mutex_);
    if (closing_ || stored(tokens) || queued(tokens)) return false;
    return !queue_full(tokens.size());
}

bool disk_kv::queue_full(std::size_t n_tokens) {
    if (int(queue_.size()) < options_.queue) return false;
    ++stats_.dropped;
    std::fprintf(stderr, "ds4-server: disk KV: write queue full (%zu saves waiting), not saving a %zu-token prefix\n", queue_.size(),
                 n_tokens);
    return true;
}

std::optional<std::pair<int, std::vector<std::byte>>> disk_kv::find(std::span<const std::int32_t> prompt, int min_len, int max_len) {
    // Held while the file is read: the writer's eviction cannot remove it under the read.
    std::lock_guard lock(mutex_);
    for (;;) {
        entry* best = nullptr;
        for (entry& e : entries_) {
            const int n = int(e.tokens.size());
            if (n <= min_len || n > max_len || (best && n <= int(best->tokens.size()))) continue;
            if (std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin())) best = &e;
        }
        if (!best) return std::nullopt;
        parsed r = read(best->path);
        if (r.error.empty() && r.tokens == best->tokens) {
            best->last_used = ++clock_;
            ::utimensat(AT_FDCWD, best->path.c_str(), nullptr, 0);  // the LRU order survives a restart
            ++stats_.hits;
            return std::pair{int(best->tokens.size()), std::move(r.snapshot)};
        }
        reject(best->path, r.error.empty() ? "changed on disk" : r.error);
        stats_.bytes -= best->bytes;
        entries_.erase(entries_.begin() + (best - entries_.data()));
        stats_.files = entries_.size();
    }
}

void disk_kv::evict_until(std::uint64_t room) {
    while (!entries_.empty() && stats_.bytes + room > stats_.budget) {
        auto lru = std::min_element(entries_.begin(), entries_.end(), [](const entry& a, const entry& b) { return a.last_used < b.last_used; });
        std::error_code ec;
        std::filesystem::remove(lru->path, ec);
        stats_.bytes -= lru->bytes;
        ++stats_.evictions;
        entries_.erase(lru);
    }
    stats_.files = entries_.size();
}

bool disk_kv::save(std::span<const std::int32_t> tokens, std::vector<std::byte> snapshot) {
    const std::uint64_t size = file_header + tokens.size() * 4 + snapshot.size() + 8;
    {
        std::lock_guard lock(mutex_);
        if (closing_ || stored(tokens) || queued(tokens)) return false;
        if (stats_.budget > 0 && size > stats_.budget) {
            ++stats_.save_errors;
            std::fprintf(stderr, "ds4-server: disk KV: not saving a %zu-token prefix: %llu bytes, over the whole budget of %llu\n",
                         tokens.size(), static_cast<unsigned long long>(size), static_cast<unsigned long long>(stats_.budget));
            return false;
        }
        if (queue_full(tokens.size())) return false;
        ++stats_.pending;
        stats_.pending_bytes += snapshot.size();
        queue_.push_back({std::vector<std::int32_t>(tokens.begin(), tokens.end()), std::move(snapshot)});
    }
    wake_.notify_all();
    return true;
}

bool disk_kv::flush(std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex_);
    return wake_.wait_for(lock, limit, [&] { return stats_.pending == 0; });
}

void disk_kv::close(std::chrono::milliseconds limit) {
    {
        std::unique_lock lock(mutex_);
        if (!writer_.joinable()) return;
        closing_ = true;
        if (stats_.pending > 0)
            std::fprintf(stderr, "ds4-server: disk KV: finishing %llu queued saves (at most %lld ms)\n",
                         static_cast<unsigned long long>(stats_.pending), static_cast<long long>(limit.count()));
        wake_.notify_all();
        if (!wake_.wait_for(lock, limit, [&] { return writer_done_; })) abandon_ = true;
        wake_.notify_all();
    }
    writer_.join();
}

std::vector<std::byte> disk_kv::image(const pending& p) const {
    std::vector<std::byte> b;
    b.reserve(file_header + p.tokens.size() * 4 + p.snapshot.size() + 8);
    b.insert(b.end(), reinterpret_cast<const std::byte*>(file_magic), reinterpret_cast<const std::byte*>(file_magic) + 8);
    put(b, file_version);
    put(b, std::uint32_t(0));
    put(b, options_.model_id);
    put(b, std::uint64_t(p.tokens.size()));
    put(b, std::uint64_t(p.snapshot.size()));
    for (std::int32_t t : p.tokens) put(b, t);
    b.insert(b.end(), p.snapshot.begin(), p.snapshot.end());
    put(b, fnv1a(b.data(), b.size()));
    return b;
}

void disk_kv::writer_loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
        wake_.wait(lock, [&] { return closing_ || !queue_.empty(); });
        if (queue_.empty() || abandon_) break;
        pending p = std::move(queue_.front());
        queue_.pop_front();
        writing_ = p.tokens;
        const std::uint64_t snapshot_bytes = p.snapshot.size();
        if (options_.debug_write_delay_ms > 0)
            wake_.wait_for(lock, std::chrono::milliseconds(options_.debug_write_delay_ms), [&] { return abandon_.load(); });
        if (abandon_) {
            ++stats_.abandoned;
            std::fprintf(stderr, "ds4-server: disk KV: shutting down, a %zu-token save abandoned before its write\n", p.tokens.size());
        } else {
            lock.unlock();
            write(std::move(p));
            lock.lock();
        }
        writing_.reset();
        --stats_.pending;
        stats_.pending_bytes -= snapshot_bytes;
        wake_.notify_all();  // flush() and close() wait on this
    }
    // Abandoned at close: what never started.
    if (!queue_.empty())
        std::fprintf(stderr, "ds4-server: disk KV: shutting down, %zu queued saves abandoned\n", queue_.size());
    for (const pending& p : queue_) {
        ++stats_.abandoned;
        --stats_.pending;
        stats_.pending_bytes -= p.snapshot.size();
    }
    queue_.clear();
    writer_done_ = true;
    wake_.notify_all();
}

void disk_kv::write(pending p) {
    const std::vector<std::byte> b = image(p);
    p.snapshot = {};  // one copy of the bytes at a time
    {
        std::lock_guard lock(mutex_);
        if (stats_.budget > 0) evict_until(b.size());
    }
    const std::filesystem::path final_path = options_.dir / file_name(options_.model_id, p.tokens);
    const std::filesystem::path tmp = final_path.string() + ".tmp";
    // errno is taken where each call fails: a full disk shows as ENOSPC from write(), or only
    // from fsync() or close() on a file system that allocates late.
    int err = 0;
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool ok = fd >= 0, abandoned = false;
    if (!ok) err = errno;
    // Written in chunks so that an abandon at shutdown stops a large write within one chunk.
    constexpr std::size_t chunk = std::size_t(4) << 20;
    for (std::size_t at = 0; ok && at < b.size(); at += chunk) {
        if (abandon_) {
            abandoned = true;
            break;
        }
        if (!write_all(fd, std::span(b).subspan(at, std::min(chunk, b.size() - at)))) ok = false, err = errno;
    }
    if (ok && !abandoned && ::fsync(fd) != 0) ok = false, err = errno;
    if (fd >= 0 && ::close(fd) != 0 && ok && !abandoned) ok = false, err = errno;
    if (ok && !abandoned && ::rename(tmp.c_str(), final_path.c_str()) != 0) ok = false, err = errno;
    ok = ok && !abandoned;
    if (!ok) {
        ::unlink(tmp.c_str());
        std::lock_guard lock(mutex_);
        if (abandoned) {
            ++stats_.abandoned;
            std::fprintf(stderr, "ds4-server: disk KV: shutting down, the write of %s abandoned (its .tmp removed)\n", final_path.c_str());
            return;
        }
        ++stats_.save_errors;
        stats_.last_error = std::strerror(err);
        std::fprintf(stderr, "ds4-server: disk KV: saving %s failed: %s (the prefix stays in memory only)\n", final_path.c_str(),
                     stats_.last_error.c_str());
        return;
    }
    if (const int dfd = ::open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
        ::fsync(dfd);  // the rename itself durable
        ::close(dfd);
    }
    std::lock_guard lock(mutex_);
    entries_.push_back({std::move(p.tokens), final_path, b.size(), ++clock_});
    stats_.bytes += b.size();
    stats_.files = entries_.size();
    ++stats_.saves;
}

}  // namespace ds4::server
