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

disk_kv::disk_kv(std::filesystem::path dir, std::uint64_t budget, std::uint64_t model_id) : dir_(std::move(dir)), model_id_(model_id) {
    stats_.budget = budget;
    std::filesystem::create_directories(dir_);
    struct found {
        std::filesystem::path path;
        std::filesystem::file_time_type mtime;
    };
    std::vector<found> files;
    for (const auto& de : std::filesystem::directory_iterator(dir_)) {
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
    if (budget > 0) evict_until(0);
    std::fprintf(stderr, "ds4-server: disk KV: %s, %zu prefixes (%llu bytes) usable\n", dir_.c_str(), entries_.size(),
                 static_cast<unsigned long long>(stats_.bytes));
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
    if (get<std::uint64_t>(b, 16) != model_id_) return r.error = "written for another model (identity differs)", r;
    r.tokens.resize(n_tokens);
    std::memcpy(r.tokens.data(), b.data() + file_header, n_tokens * 4);
    if (p.filename() != file_name(model_id_, r.tokens)) return r.error = "name does not match its tokens", r;
    const auto* s = b.data() + file_header + n_tokens * 4;
    r.snapshot.assign(s, s + n_snap);
    return r;
}

bool disk_kv::contains(std::span<const std::int32_t> tokens) const {
    return std::any_of(entries_.begin(), entries_.end(), [&](const entry& e) { return std::ranges::equal(e.tokens, tokens); });
}

std::optional<std::pair<int, std::vector<std::byte>>> disk_kv::find(std::span<const std::int32_t> prompt, int min_len, int max_len) {
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

bool disk_kv::save(std::span<const std::int32_t> tokens, std::span<const std::byte> snapshot) {
    if (contains(tokens)) return true;
    std::vector<std::byte> b;
    b.reserve(file_header + tokens.size() * 4 + snapshot.size() + 8);
    b.insert(b.end(), reinterpret_cast<const std::byte*>(file_magic), reinterpret_cast<const std::byte*>(file_magic) + 8);
    put(b, file_version);
    put(b, std::uint32_t(0));
    put(b, model_id_);
    put(b, std::uint64_t(tokens.size()));
    put(b, std::uint64_t(snapshot.size()));
    for (std::int32_t t : tokens) put(b, t);
    b.insert(b.end(), snapshot.begin(), snapshot.end());
    put(b, fnv1a(b.data(), b.size()));
    if (stats_.budget > 0 && b.size() > stats_.budget) {
        ++stats_.save_errors;
        std::fprintf(stderr, "ds4-server: disk KV: not saving a %zu-token prefix: %zu bytes, over the whole budget of %llu\n",
                     tokens.size(), b.size(), static_cast<unsigned long long>(stats_.budget));
        return false;
    }
    if (stats_.budget > 0) evict_until(b.size());
    const std::filesystem::path final_path = dir_ / file_name(model_id_, tokens);
    const std::filesystem::path tmp = final_path.string() + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool ok = fd >= 0 && write_all(fd, b) && ::fsync(fd) == 0;
    const int err = errno;
    if (fd >= 0) ok = (::close(fd) == 0) && ok;
    if (ok) ok = ::rename(tmp.c_str(), final_path.c_str()) == 0;
    if (!ok) {
        ++stats_.save_errors;
        std::fprintf(stderr, "ds4-server: disk KV: saving %s failed: %s (the prefix stays in memory only)\n", final_path.c_str(),
                     std::strerror(err ? err : errno));
        ::unlink(tmp.c_str());
        return false;
    }
    if (const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
        ::fsync(dfd);  // the rename itself durable
        ::close(dfd);
    }
    entries_.push_back({std::vector<std::int32_t>(tokens.begin(), tokens.end()), final_path, b.size(), ++clock_});
    stats_.bytes += b.size();
    stats_.files = entries_.size();
    ++stats_.saves;
    return true;
}

}  // namespace ds4::server
