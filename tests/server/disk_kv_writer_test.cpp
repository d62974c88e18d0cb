// The disk KV writer thread in-process (examples/server/disk_kv.hpp): saves are queued and written
// off the caller's thread; a real ENOSPC (the kernel's, from /dev/full) costs only that save; close()
// drains the queue within its limit, and abandons a write between chunks without leaving a file
// under its final name. The snapshot bytes are opaque to disk_kv, so any bytes stand in for one.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "examples/server/disk_kv.hpp"

namespace ds4::server {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr std::uint64_t model = 0x5eed;

struct temp_dir {
    fs::path path = fs::temp_directory_path() / ("ds4_disk_kv_writer_" + std::to_string(::getpid()));
    temp_dir() {
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~temp_dir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

std::vector<std::int32_t> tokens(int n, int first) {
    std::vector<std::int32_t> t(std::size_t(n), 0);
    for (int i = 0; i < n; ++i) t[std::size_t(i)] = first + 7 * i;
    return t;
}

std::vector<std::byte> bytes(std::size_t n, unsigned seed) {
    std::vector<std::byte> b(n);
    for (std::size_t i = 0; i < n; ++i) b[i] = std::byte((i * 131 + seed) & 0xff);
    return b;
}

std::vector<fs::path> with_extension(const fs::path& dir, const char* ext) {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ext) out.push_back(e.path());
    return out;
}

TEST_CASE("saves are written by the writer thread and restored by a new index") {
    temp_dir d;
    const auto a = tokens(12, 3);
    const auto snap = bytes(5000, 1);
    {
        disk_kv kv({d.path, 0, model, 4, 0});
        CHECK(kv.wants(a));
        CHECK(kv.save(a, snap));
        CHECK(kv.contains(a));       // queued counts as stored: no second snapshot is taken
        CHECK_FALSE(kv.wants(a));
        REQUIRE(kv.flush(10s));
        const disk_kv_stats s = kv.stats();
        CHECK(s.saves == 1);
        CHECK(s.pending == 0);
        CHECK(s.files == 1);
        CHECK(fs::exists(d.path / disk_kv::file_name(model, a)));
    }
    disk_kv again({d.path, 0, model, 4, 0});
    auto prompt = a;
    prompt.push_back(99);
    const auto hit = again.find(prompt, 0, int(prompt.size()));
    REQUIRE(hit);
    CHECK(hit->first == int(a.size()));
    CHECK(hit->second == snap);
}

TEST_CASE("ENOSPC from the kernel costs only the save: counted, the reason kept, earlier files intact") {
    temp_dir d;
    const auto a = tokens(10, 1), b = tokens(10, 2);
    disk_kv kv({d.path, 0, model, 4, 0});
    REQUIRE(kv.save(a, bytes(3000, 2)));
    REQUIRE(kv.flush(10s));
    const fs::path a_file = d.path / disk_kv::file_name(model, a);
    const auto a_size = fs::file_size(a_file);
    // The save's temporary name leads to /dev/full: its write() fails with ENOSPC, as on a full disk.
    const fs::path tmp = d.path / (disk_kv::file_name(model, b) + ".tmp");
    fs::create_symlink("/dev/full", tmp);
    REQUIRE(kv.save(b, bytes(3000, 3)));
    REQUIRE(kv.flush(10s));
    const disk_kv_stats s = kv.stats();
    CHECK(s.save_errors == 1);
    CHECK(s.saves == 1);
    CHECK(s.files == 1);
    CHECK(s.last_error == std::strerror(ENOSPC));
    CHECK_FALSE(fs::exists(fs::symlink_status(tmp)));  // the temporary name removed
    CHECK_FALSE(fs::exists(d.path / disk_kv::file_name(model, b)));
    CHECK(fs::file_size(a_file) == a_size);
    auto prompt = a;
    prompt.push_back(5);
    const auto hit = kv.find(prompt, 0, int(prompt.size()));
    REQUIRE(hit);
    CHECK(hit->second == bytes(3000, 2));
}

TEST_CASE("close drains the queue within its limit") {
    temp_dir d;
    {
        disk_kv kv({d.path, 0, model, 4, 30});  // each write waits 30 ms: all three are queued at close
        for (int i = 0; i < 3; ++i) REQUIRE(kv.save(tokens(9, 100 + i), bytes(2000, unsigned(i))));
        kv.close(20s);
        CHECK(kv.stats().saves == 3);
        CHECK(kv.stats().abandoned == 0);
        CHECK_FALSE(kv.save(tokens(9, 200), bytes(10, 0)));  // closed: refused
    }
    CHECK(with_extension(d.path, ".kv").size() == 3);
    CHECK(with_extension(d.path, ".tmp").empty());
    disk_kv again({d.path, 0, model, 4, 0});
    CHECK(again.stats().files == 3);
    CHECK(again.stats().rejected == 0);
}

TEST_CASE("close past its limit abandons a write between chunks: no file under the final name, no .tmp") {
    temp_dir d;
    const auto t = tokens(16, 5);
    disk_kv kv({d.path, 0, model, 4, 0});
    // The temporary name is a FIFO that a reader drains slowly (a pipe buffer per 10 ms), so the
    // 48 MiB write is still going when close() gives up on it.
    const fs::path tmp = d.path / (disk_kv::file_name(model, t) + ".tmp");
    REQUIRE(::mkfifo(tmp.c_str(), 0600) == 0);
    std::atomic<std::size_t> read_bytes{0};
    std::thread reader([&] {
        const int fd = ::open(tmp.c_str(), O_RDONLY);
        if (fd < 0) return;
        std::vector<char> buf(1 << 20);
        for (int i = 0; i < 2000; ++i) {  // bounded: at most 2000 MiB or 20 s
            const ssize_t n = ::read(fd, buf.data(), buf.size());
            if (n <= 0) break;
            read_bytes += std::size_t(n);  // a pipe read gives at most its 64 KiB buffer
            std::this_thread::sleep_for(10ms);
        }
        ::close(fd);
    });
    const std::size_t total = std::size_t(48) << 20;
    REQUIRE(kv.save(t, bytes(total, 9)));
    for (int i = 0; i < 1000 && read_bytes == 0; ++i) std::this_thread::sleep_for(10ms);  // the write has begun
    kv.close(0ms);
    reader.join();
    const disk_kv_stats s = kv.stats();
    CHECK(s.abandoned == 1);
    CHECK(s.saves == 0);
    CHECK(s.save_errors == 0);
    CHECK(s.pending == 0);
    CHECK(read_bytes > 0);
    CHECK(read_bytes < total);  // stopped partway
    CHECK_FALSE(fs::exists(d.path / disk_kv::file_name(model, t)));
    CHECK_FALSE(fs::exists(fs::symlink_status(tmp)));
}

}  // namespace
}  // namespace ds4::server
