#pragma once
// Streaming GGUF v3 writer. Metadata and the tensor directory are declared first (they are small
// and buffered in memory); begin_data() writes them, then tensor data is streamed tensor by tensor
// in declaration order, in chunks of any size. The writer never holds tensor data: it copies
// small chunks into one 16 MiB buffer and hands large ones straight to write(2), which is what
// lets ds4-synth push ~81 GiB at disk speed (and well above 1 GB/s into /dev/null).
//
// Alignment: default 32. set_alignment(a) with a != 32 also writes general.alignment = a (u32)
// at begin_data, unless the caller added that key itself; add_u32("general.alignment", a) is the
// same as set_alignment(a). Every tensor's data, and the end of the file, is padded with zeros to
// the alignment.
//
// Misuse (a duplicate key or tensor, metadata after begin_data, a write before it, too many or
// too few bytes for a tensor) is a ds4::error naming the output path and the tensor or key. A
// writer destroyed before finish() leaves a truncated file, which the reader rejects.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/format/types.hpp"
#include "ds4/gguf/layout.hpp"

namespace ds4::gguf {

class writer {
public:
    // Creates (or truncates) the output at once, so a bad path fails before any work is done.
    // O_TRUNC on /dev/null is a no-op, which is what the throughput measurement relies on.
    explicit writer(const std::filesystem::path& out) : label_(out.string()) {
        fd_ = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd_ < 0) fail(label_ + ": cannot create: " + std::strerror(errno));
        buffer_ = std::make_unique<std::byte[]>(buffer_bytes);
    }
    // Movable so a generator can build one in a factory; the moved-from writer holds no fd.
    writer(writer&& o) noexcept { swap(o); }
    writer& operator=(writer&& o) noexcept {
        if (this != &o) {
            writer tmp(std::move(o));
            swap(tmp);
        }
        return *this;
    }
    writer(const writer&) = delete;
    writer& operator=(const writer&) = delete;
    // Closing without finish() is deliberate: a destructor cannot report a failed flush, and a
    // silently truncated file is better caught by the reader than hidden here.
    ~writer() {
        if (fd_ >= 0) ::close(fd_);
    }

    // Must precede begin_data; the reader accepts only nonzero powers of two, so the writer does too.
    void set_alignment(std::uint32_t alignment) {
        require_declaring("set_alignment");
        require(is_power_of_two(alignment),
                label_ + ": alignment " + std::to_string(alignment) + " is not a nonzero power of two");
        require(!alignment_key_added_ || alignment == alignment_,
                label_ + ": set_alignment(" + std::to_string(alignment) + ") disagrees with general.alignment = " +
                    std::to_string(alignment_) + " already added");
        alignment_ = alignment;
    }

    // One adder per GGUF scalar type: the caller picks the stored width explicitly, so a synthetic
    // file can mirror the widths of a real one.
    void add_u8(std::string key, std::uint8_t v) { add_scalar(std::move(key), value_type::u8, v); }
    void add_i8(std::string key, std::int8_t v) { add_scalar(std::move(key), value_type::i8, v); }
    void add_u16(std::string key, std::uint16_t v) { add_scalar(std::move(key), value_type::u16, v); }
    void add_i16(std::string key, std::int16_t v) { add_scalar(std::move(key), value_type::i16, v); }
    void add_u32(std::string key, std::uint32_t v) {
        if (key == alignment_key) {
            set_alignment(v);
            alignment_key_added_ = true;
        }
        add_scalar(std::move(key), value_type::u32, v);
    }
    void add_i32(std::string key, std::int32_t v) { add_scalar(std::move(key), value_type::i32, v); }
    void add_u64(std::string key, std::uint64_t v) { add_scalar(std::move(key), value_type::u64, v); }
    void add_i64(std::string key, std::int64_t v) { add_scalar(std::move(key), value_type::i64, v); }
    void add_f32(std::string key, float v) { add_scalar(std::move(key), value_type::f32, v); }
    void add_f64(std::string key, double v) { add_scalar(std::move(key), value_type::f64, v); }
    void add_bool(std::string key, bool v) { add_scalar(std::move(key), value_type::boolean, std::uint8_t{v}); }
    void add_string(std::string key, std::string v) {
        begin_key(std::move(key), value_type::string);
        put_string(v);
    }

    // String arrays (tokenizer.ggml.tokens, merges): u32 element type, u64 count, then strings.
    void add_array(std::string key, std::vector<std::string> v) {
        begin_key(std::move(key), value_type::array);
        put(static_cast<std::uint32_t>(value_type::string));
        put(static_cast<std::uint64_t>(v.size()));
        for (const std::string& s : v) put_string(s);
    }
    void add_array_u8(std::string key, std::vector<std::uint8_t> v) { add_fixed_array(std::move(key), value_type::u8, v); }
    void add_array_i8(std::string key, std::vector<std::int8_t> v) { add_fixed_array(std::move(key), value_type::i8, v); }
    void add_array_u16(std::string key, std::vector<std::uint16_t> v) { add_fixed_array(std::move(key), value_type::u16, v); }
    void add_array_i16(std::string key, std::vector<std::int16_t> v) { add_fixed_array(std::move(key), value_type::i16, v); }
    void add_array_u32(std::string key, std::vector<std::uint32_t> v) { add_fixed_array(std::move(key), value_type::u32, v); }
    void add_array_i32(std::string key, std::vector<std::int32_t> v) { add_fixed_array(std::move(key), value_type::i32, v); }
    void add_array_u64(std::string key, std::vector<std::uint64_t> v) { add_fixed_array(std::move(key), value_type::u64, v); }
    void add_array_i64(std::string key, std::vector<std::int64_t> v) { add_fixed_array(std::move(key), value_type::i64, v); }
    void add_array_f32(std::string key, std::vector<float> v) { add_fixed_array(std::move(key), value_type::f32, v); }
    void add_array_f64(std::string key, std::vector<double> v) { add_fixed_array(std::move(key), value_type::f64, v); }
    void add_array_bool(std::string key, std::vector<bool> v) {
        std::vector<std::uint8_t> bytes(v.begin(), v.end());  // std::vector<bool> is packed; GGUF is 1 byte each
        add_fixed_array(std::move(key), value_type::boolean, bytes);
    }

    // ne0 first. Checks the type, the dims and that ne0 holds whole blocks.
    void add_tensor(std::string name, ggml_type type, std::vector<std::uint64_t> dims) {
        require_declaring("add_tensor");
        tensor_shape shape;
        if (const std::string problem = shape_problem(static_cast<std::uint32_t>(type), dims, shape); !problem.empty())
            fail(label_ + ": tensor '" + name + "': " + problem);
        require(tensor_names_.insert(name).second, label_ + ": tensor '" + name + "': duplicate tensor name");
        tensors_.push_back({std::move(name), type, std::move(dims), shape.n_bytes, 0});
    }

    // Writes the header, the metadata, the directory (offsets follow from sizes and alignment)
    // and the padding up to the data section.
    void begin_data() {
        require_declaring("begin_data");
        if (alignment_ != default_alignment && !alignment_key_added_) {
            begin_key(std::string(alignment_key), value_type::u32);
            put(static_cast<std::uint32_t>(alignment_));
        }
        // The metadata was serialised as it was added; the header that precedes it needs n_kv, so
        // it is assembled now in front of it, followed by the directory, and emitted in one piece.
        std::vector<std::byte> kv = std::move(staging_);
        staging_.clear();

        put(file_magic);
        put(supported_version);
        put(static_cast<std::uint64_t>(tensors_.size()));
        put(n_kv_);
        put_bytes(kv);
        // Offsets follow the declaration order, each rounded up to the alignment; write() then
        // reproduces exactly this layout by padding after every tensor.
        std::uint64_t offset = 0;
        for (pending_tensor& t : tensors_) {
            t.offset = align_or_fail(offset, t.name);
            offset = add_or_fail(t.offset, t.n_bytes, t.name);
            put_string(t.name);
            put(static_cast<std::uint32_t>(t.dims.size()));
            for (std::uint64_t d : t.dims) put(d);
            put(static_cast<std::uint32_t>(t.type));
            put(t.offset);
        }
        declaring_ = false;
        emit(std::span<const std::byte>(staging_));
        staging_ = {};
        pad_to_alignment();
        data_start_ = pos_;
        skip_finished_tensors();
    }

    // Bytes of the current tensor; a chunk may not cross into the next tensor.
    void write(std::span<const std::byte> bytes) {
        require(!declaring_, label_ + ": write before begin_data");
        require(!finished_, label_ + ": write after finish");
        if (bytes.empty()) return;
        require(current_ < tensors_.size(), label_ + ": too many bytes: write of " + std::to_string(bytes.size()) +
                                                " bytes after all " + std::to_string(tensors_.size()) +
                                                " tensors are complete");
        const pending_tensor& t = tensors_[current_];
        const std::uint64_t left = t.n_bytes - written_in_current_;
        if (bytes.size() > left)
            fail(label_ + ": tensor '" + t.name + "': too many bytes: write of " + std::to_string(bytes.size()) +
                 " bytes with " + std::to_string(left) + " of its " + std::to_string(t.n_bytes) + " left");
        // Refusing a chunk that crosses a tensor boundary catches a producer whose idea of a
        // tensor's size disagrees with the declared type and dims, at the tensor where it happens.
        emit(bytes);
        written_in_current_ += bytes.size();
        if (written_in_current_ == t.n_bytes) {
            ++current_;
            written_in_current_ = 0;
            pad_to_alignment();
            skip_finished_tensors();
        }
    }

    // Checks that every tensor got exactly its bytes, flushes and closes.
    void finish() {
        require(!declaring_, label_ + ": finish before begin_data");
        require(!finished_, label_ + ": finish called twice");
        if (current_ < tensors_.size()) {
            const pending_tensor& t = tensors_[current_];
            fail(label_ + ": tensor '" + t.name + "': too few bytes: got " + std::to_string(written_in_current_) +
                 " of " + std::to_string(t.n_bytes) + " (" + std::to_string(tensors_.size() - current_ - 1) +
                 " later tensors not written)");
        }
        // No fsync: the generator's files are reproducible from their seed, and fsync of 81 GiB
        // would dominate the run; close() still reports deferred write errors (NFS, quota).
        flush();
        const int fd = std::exchange(fd_, -1);
        if (::close(fd) != 0) fail(label_ + ": close failed: " + std::strerror(errno));
        finished_ = true;
    }

    // Bytes of the file so far, including what still sits in the buffer.
    std::uint64_t bytes_written() const { return pos_; }
    // Where the data section starts; valid after begin_data.
    std::uint64_t data_offset() const { return data_start_; }

private:
    // 16 MiB: large enough that write(2) syscall overhead is negligible at >= 1 GB/s, small
    // enough to be irrelevant next to the model.
    static constexpr std::size_t buffer_bytes = std::size_t{16} << 20;

    struct pending_tensor {
        std::string name;
        ggml_type type;
        std::vector<std::uint64_t> dims;
        std::uint64_t n_bytes;
        std::uint64_t offset;
    };

    void swap(writer& o) noexcept {
        std::swap(label_, o.label_);
        std::swap(fd_, o.fd_);
        std::swap(buffer_, o.buffer_);
        std::swap(buffered_, o.buffered_);
        std::swap(pos_, o.pos_);
        std::swap(alignment_, o.alignment_);
        std::swap(alignment_key_added_, o.alignment_key_added_);
        std::swap(staging_, o.staging_);
        std::swap(n_kv_, o.n_kv_);
        std::swap(keys_, o.keys_);
        std::swap(tensor_names_, o.tensor_names_);
        std::swap(tensors_, o.tensors_);
        std::swap(declaring_, o.declaring_);
        std::swap(finished_, o.finished_);
        std::swap(current_, o.current_);
        std::swap(written_in_current_, o.written_in_current_);
        std::swap(data_start_, o.data_start_);
    }

    void require_declaring(std::string_view what) const {
        require(declaring_, label_ + ": " + std::string(what) + " after begin_data");
    }

    // Metadata is serialised into staging_ as it is added, so nothing but bytes is kept.
    void begin_key(std::string key, value_type type) {
        require_declaring("adding key '" + key + "'");
        if (key == alignment_key)
            require(type == value_type::u32, label_ + ": key '" + key + "' must be a u32 (the reader requires it)");
        require(keys_.insert(key).second, label_ + ": key '" + key + "': duplicate key");
        put_string(key);
        put(static_cast<std::uint32_t>(type));
        ++n_kv_;
    }
    template <class T>
    void add_scalar(std::string key, value_type type, T v) {
        begin_key(std::move(key), type);
        put(v);
    }
    template <class T>
    void add_fixed_array(std::string key, value_type type, const std::vector<T>& v) {
        begin_key(std::move(key), value_type::array);
        put(static_cast<std::uint32_t>(type));
        put(static_cast<std::uint64_t>(v.size()));
        put_bytes(std::as_bytes(std::span<const T>(v)));
    }

    template <class T>
    void put(T v) {
        const auto* p = reinterpret_cast<const std::byte*>(&v);
        staging_.insert(staging_.end(), p, p + sizeof v);
    }
    void put_bytes(std::span<const std::byte> b) { staging_.insert(staging_.end(), b.begin(), b.end()); }
    void put_string(std::string_view s) {
        put(static_cast<std::uint64_t>(s.size()));
        put_bytes(std::as_bytes(std::span<const char>(s.data(), s.size())));
    }

    std::uint64_t align_or_fail(std::uint64_t x, const std::string& name) const {
        const auto r = checked_align_up(x, alignment_);
        if (!r) fail(label_ + ": tensor '" + name + "': data offset overflows 64 bits");
        return *r;
    }
    std::uint64_t add_or_fail(std::uint64_t a, std::uint64_t b, const std::string& name) const {
        const auto r = checked_add(a, b);
        if (!r) fail(label_ + ": tensor '" + name + "': data end overflows 64 bits");
        return *r;
    }

    // Tensors are never empty (dims are nonzero), but keep the cursor honest if that changes.
    void skip_finished_tensors() {
        while (current_ < tensors_.size() && tensors_[current_].n_bytes == 0) ++current_;
    }

    // Zero padding from a small static block, so padding never allocates.
    void pad_to_alignment() {
        static constexpr std::byte zeros[256] = {};
        std::uint64_t pad = *checked_align_up(pos_, alignment_) - pos_;
        while (pad > 0) {
            const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(pad, sizeof zeros));
            emit(std::span<const std::byte>(zeros, n));
            pad -= n;
        }
    }

    // All output goes through here so that pos_ (and with it every offset) counts bytes in the
    // order they will land in the file, whether buffered or written directly.
    void emit(std::span<const std::byte> bytes) {
        pos_ += bytes.size();
        if (buffered_ + bytes.size() <= buffer_bytes) {
            std::memcpy(buffer_.get() + buffered_, bytes.data(), bytes.size());
            buffered_ += bytes.size();
            return;
        }
        flush();
        // A chunk at least as large as the buffer goes straight to the kernel: copying it first
        // would only halve the throughput.
        if (bytes.size() >= buffer_bytes) {
            write_all(bytes);
            return;
        }
        std::memcpy(buffer_.get(), bytes.data(), bytes.size());
        buffered_ = bytes.size();
    }

    void flush() {
        write_all(std::span<const std::byte>(buffer_.get(), buffered_));
        buffered_ = 0;
    }

    // write(2) may write less than asked (signals, pipes, quotas): loop until all is out.
    void write_all(std::span<const std::byte> bytes) {
        while (!bytes.empty()) {
            const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
            if (n < 0) {
                if (errno == EINTR) continue;
                fail(label_ + ": write failed at byte " + std::to_string(pos_) + ": " + std::strerror(errno));
            }
            bytes = bytes.subspan(static_cast<std::size_t>(n));
        }
    }

    std::string label_;
    int fd_ = -1;
    std::unique_ptr<std::byte[]> buffer_;
    std::size_t buffered_ = 0;
    std::uint64_t pos_ = 0;
    std::uint64_t alignment_ = default_alignment;
    bool alignment_key_added_ = false;
    std::vector<std::byte> staging_;  // metadata, then header + directory, before begin_data emits them
    std::uint64_t n_kv_ = 0;
    std::set<std::string, std::less<>> keys_;
    std::set<std::string, std::less<>> tensor_names_;
    std::vector<pending_tensor> tensors_;
    bool declaring_ = true;
    bool finished_ = false;
    std::size_t current_ = 0;
    std::uint64_t written_in_current_ = 0;
    std::uint64_t data_start_ = 0;
};

}  // namespace ds4::gguf
