#pragma once
// Bounds-checked GGUF v3 reader. `file::open` maps the file read-only and validates the header,
// every metadata value and the whole tensor directory before returning, so that later accesses
// (values, tensor bytes) cannot read outside the mapping. Metadata values view the mapping; big
// arrays (the 129k-token vocabulary) are not copied. Every problem is a ds4::error whose message
// names the file, the key or tensor, and the byte offset of the offending field.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/format/types.hpp"
#include "ds4/gguf/layout.hpp"

namespace ds4::gguf {

// What the reader accepts at most (docs/gguf-limits.md states them with the cost they bound).
// Each is far above what a DeepSeek-V4-Flash file uses (in parentheses). With these, and every
// count also bounded by the bytes left, opening any file costs O(file size) time and memory
// proportional to the metadata and directory, never to what a header merely claims.
inline constexpr std::uint64_t max_kv_count = 1 << 16;         // key/value pairs (~60)
inline constexpr std::uint64_t max_tensor_count = 1 << 16;     // directory entries (~1.3k)
inline constexpr std::uint64_t max_key_length = 65535;         // the GGUF spec's key limit (< 64)
inline constexpr std::uint64_t max_name_length = 65535;        // tensor names (< 64)
inline constexpr std::uint64_t max_string_length = 1 << 24;    // a string value or element (chat template ~10 KB)
inline constexpr std::uint64_t max_array_length = 1 << 24;     // elements of one array (vocabulary 129280)

class file;
namespace detail {
class parser;
}

// One metadata value. Scalars and strings point into the file; arrays keep their element count,
// and arrays of strings or arrays also keep each element's offset (found while validating
// anyway) so that string_at(i) is O(1).
class value {
public:
    value_type type() const { return type_; }
    const std::string& key() const { return key_; }
    std::uint64_t file_offset() const { return key_offset_; }  // byte of the key's length field

    // Scalars. Integers convert between widths when the value fits, because writers may choose
    // different widths for the same key and the spec compares values, not encodings. as_f64 also takes integers for the same reason; as_bool and
    // as_string take only their own type, since a silent conversion there would hide a bad file.
    std::uint64_t as_u64() const {
        if (is_integer_type(type_)) return to_u64(type_, payload());
        wrong_type("an unsigned integer");
    }
    std::int64_t as_i64() const {
        if (is_integer_type(type_)) return to_i64(type_, payload());
        wrong_type("an integer");
    }
    double as_f64() const {
        if (type_ == value_type::f32 || type_ == value_type::f64 || is_integer_type(type_))
            return to_f64(type_, payload());
        wrong_type("a number");
    }
    bool as_bool() const {
        if (type_ != value_type::boolean) wrong_type("a bool");
        return *payload() != std::byte{0};
    }
    std::string_view as_string() const {
        if (type_ != value_type::string) wrong_type("a string");
        return {reinterpret_cast<const char*>(payload()), static_cast<std::size_t>(count_)};
    }

    // Arrays. The element accessors apply the same conversions as the scalar ones; the index is
    // checked against the count validated at open, so a caller's off-by-one is an error, not a read
    // past the array.
    value_type array_type() const {
        require_array();
        return elem_type_;
    }
    std::uint64_t size() const {
        require_array();
        return count_;
    }
    std::string_view string_at(std::uint64_t i) const {
        require_elements(value_type::string, "an array of strings", i);
        return string_at_unchecked(i);
    }
    std::int64_t int_at(std::uint64_t i) const {
        require_array();
        if (!is_integer_type(elem_type_)) wrong_elements("an array of integers");
        check_index(i);
        return to_i64(elem_type_, element_ptr(i), i);
    }
    double float_at(std::uint64_t i) const {
        require_array();
        if (elem_type_ != value_type::f32 && elem_type_ != value_type::f64 && !is_integer_type(elem_type_))
            wrong_elements("an array of numbers");
        check_index(i);
        return to_f64(elem_type_, element_ptr(i));
    }
    bool bool_at(std::uint64_t i) const {
        require_elements(value_type::boolean, "an array of bools", i);
        return *element_ptr(i) != std::byte{0};
    }
    // The whole string array as views into the mapping (the tokenizer's 129k tokens, no copies).
    std::vector<std::string_view> strings() const {
        require_elements(value_type::string, "an array of strings", 0, false);
        std::vector<std::string_view> out;
        out.reserve(static_cast<std::size_t>(count_));
        for (std::uint64_t i = 0; i < count_; ++i) out.push_back(string_at_unchecked(i));
        return out;
    }
    // Element i of an array of arrays, as a value of its own (key "key[i]").
    value element(std::uint64_t i) const;

private:
    friend class detail::parser;
    friend class file;

    // Accessor errors carry the same "<file>: key '<k>' at byte <n>: ..." shape as parse errors, so
    // a validator that calls as_u64() on a mistyped key reports something a user can act on.
    [[noreturn]] void fail_here(const std::string& what) const {
        fail(label_ + ": key '" + key_ + "' at byte " + std::to_string(key_offset_) + ": " + what);
    }
    std::string type_words() const {
        if (type_ != value_type::array) return std::string(value_type_name(type_));
        return "an array of " + std::to_string(count_) + " " + std::string(value_type_name(elem_type_));
    }
    [[noreturn]] void wrong_type(std::string_view wanted) const {
        fail_here("is " + type_words() + ", not " + std::string(wanted));
    }
    [[noreturn]] void wrong_elements(std::string_view wanted) const {
        fail_here("is " + type_words() + ", not " + std::string(wanted));
    }
    void require_array() const {
        if (type_ != value_type::array) wrong_type("an array");
    }
    void check_index(std::uint64_t i) const {
        if (i >= count_)
            fail_here("index " + std::to_string(i) + " is out of range (size " + std::to_string(count_) + ")");
    }
    void require_elements(value_type t, std::string_view wanted, std::uint64_t i, bool index = true) const {
        require_array();
        if (elem_type_ != t) wrong_elements(wanted);
        if (index) check_index(i);
    }
    // Offsets, not pointers, are stored so that a value never dangles into a temporary; base_ is
    // the mapping (or the owned buffer), which neither moves nor shrinks for the file's lifetime.
    const std::byte* payload() const { return base_ + payload_offset_; }
    const std::byte* element_ptr(std::uint64_t i) const {
        if (!element_offsets_.empty()) return payload() + element_offsets_[i];
        return payload() + i * fixed_size_of(elem_type_);
    }
    // Each string element is a u64 length followed by its bytes; both were bounds-checked at open.
    std::string_view string_at_unchecked(std::uint64_t i) const {
        const std::byte* p = element_ptr(i);
        std::uint64_t len;
        std::memcpy(&len, p, 8);
        return {reinterpret_cast<const char*>(p + 8), static_cast<std::size_t>(len)};
    }

    // memcpy rather than a cast: GGUF fields are packed, so most are misaligned for their type.
    template <class T>
    static T load(const std::byte* p) {
        T v;
        std::memcpy(&v, p, sizeof v);
        return v;
    }
    static std::int64_t signed_of(value_type t, const std::byte* p) {
        switch (t) {
            case value_type::i8: return load<std::int8_t>(p);
            case value_type::i16: return load<std::int16_t>(p);
            case value_type::i32: return load<std::int32_t>(p);
            case value_type::i64: return load<std::int64_t>(p);
            default: return 0;
        }
    }
    static std::uint64_t unsigned_of(value_type t, const std::byte* p) {
        switch (t) {
            case value_type::u8: return load<std::uint8_t>(p);
            case value_type::u16: return load<std::uint16_t>(p);
            case value_type::u32: return load<std::uint32_t>(p);
            case value_type::u64: return load<std::uint64_t>(p);
            default: return 0;
        }
    }
    static bool is_signed(value_type t) {
        return t == value_type::i8 || t == value_type::i16 || t == value_type::i32 || t == value_type::i64;
    }
    // Range checks on conversion: a negative count or a u64 above INT64_MAX must not wrap into a
    // plausible-looking value.
    std::uint64_t to_u64(value_type t, const std::byte* p) const {
        if (!is_signed(t)) return unsigned_of(t, p);
        const std::int64_t v = signed_of(t, p);
        if (v < 0) fail_here("is " + std::string(value_type_name(t)) + " " + std::to_string(v) +
                             ", which is negative, not an unsigned integer");
        return static_cast<std::uint64_t>(v);
    }
    std::int64_t to_i64(value_type t, const std::byte* p, std::uint64_t index = UINT64_MAX) const {
        if (is_signed(t)) return signed_of(t, p);
        const std::uint64_t v = unsigned_of(t, p);
        if (v > static_cast<std::uint64_t>(INT64_MAX))
            fail_here((index == UINT64_MAX ? std::string{} : "element " + std::to_string(index) + " ") + "is u64 " +
                      std::to_string(v) + ", which does not fit an i64");
        return static_cast<std::int64_t>(v);
    }
    static double to_f64(value_type t, const std::byte* p) {
        if (t == value_type::f32) return load<float>(p);
        if (t == value_type::f64) return load<double>(p);
        return is_signed(t) ? static_cast<double>(signed_of(t, p)) : static_cast<double>(unsigned_of(t, p));
    }

    // Each value carries its key, file label and offset so that accessor errors are self-contained;
    // a model has a few hundred keys, so the copies cost nothing that matters.
    std::string key_;
    std::string label_;                 // file label, for messages
    std::uint64_t key_offset_ = 0;      // where the key starts in the file
    value_type type_ = value_type::u8;
    const std::byte* base_ = nullptr;   // start of the file bytes
    std::uint64_t file_size_ = 0;
    std::uint64_t payload_offset_ = 0;  // scalar bytes, string bytes, or first array element
    std::uint64_t count_ = 0;           // string length or array element count
    value_type elem_type_ = value_type::u8;
    int depth_ = 0;                     // array nesting depth of this value (0 = top level)
    std::vector<std::uint64_t> element_offsets_;  // only for arrays of strings or arrays
};

// One directory entry, validated: n_elements and n_bytes follow from type and dims, and
// [file_offset, file_offset + n_bytes) lies inside the file and overlaps no other tensor.
struct tensor_info {
    std::string name;
    ggml_type type = ggml_type::f32;
    std::vector<std::uint64_t> dims;  // ne0 first
    std::uint64_t n_elements = 0;
    std::uint64_t n_bytes = 0;
    std::uint64_t offset = 0;       // relative to the data section
    std::uint64_t file_offset = 0;  // absolute
    const std::byte* data = nullptr;
};

namespace detail {

// A cursor over untrusted bytes: every take checks the bytes remaining first, and every failure
// names the file, the context (key or tensor) and the byte offset where the field starts.
class parser {
public:
    parser(const std::byte* base, std::uint64_t size, const std::string& label)
        : base_(base), size_(size), label_(label) {}

    std::uint64_t pos() const { return pos_; }
    void seek(std::uint64_t p) { pos_ = p; }
    std::uint64_t left() const { return size_ - pos_; }

    [[noreturn]] void fail_at(const std::string& context, std::uint64_t at, const std::string& what) const {
        fail(label_ + ": " + context + " at byte " + std::to_string(at) + ": " + what);
    }

    // `n > left()` rather than `pos + n > size`: the subtraction cannot overflow, the addition could.
    void need(std::uint64_t n, const std::string& context, std::string_view what) const {
        if (n > left())
            fail_at(context, pos_, std::string(what) + " runs past the end of the file (truncated): needs " +
                                       std::to_string(n) + " bytes, " + std::to_string(left()) + " left of " +
                                       std::to_string(size_));
    }

    template <class T>
    T take(const std::string& context, std::string_view what) {
        need(sizeof(T), context, what);
        T v;
        std::memcpy(&v, base_ + pos_, sizeof v);
        pos_ += sizeof v;
        return v;
    }

    // take without a context: for callers that build their context only on failure, after
    // checking left() themselves.
    template <class T>
    T load_at() {
        T v;
        std::memcpy(&v, base_ + pos_, sizeof v);
        pos_ += sizeof v;
        return v;
    }

    // A GGUF string: u64 length, then the bytes. The error points at the length field, which is
    // the byte that is wrong when a string runs past the end.
    std::string_view take_string(const std::string& context, std::string_view what,
                                 std::uint64_t max_len = max_string_length) {
        const std::uint64_t at = pos_;
        const auto len = take<std::uint64_t>(context, what);
        if (len > max_len) {
            pos_ = at;
            fail_at(context, at, std::string(what) + " of length " + std::to_string(len) + " exceeds the limit of " +
                                     std::to_string(max_len) + " bytes");
        }
        if (len > left()) {
            pos_ = at;
            fail_at(context, at, std::string(what) + " of length " + std::to_string(len) +
                                     " runs past the end of the file (" + std::to_string(left() - 8) +
                                     " bytes left after the length)");
        }
        std::string_view s(reinterpret_cast<const char*>(base_ + pos_), static_cast<std::size_t>(len));
        pos_ += len;
        return s;
    }

    // Parses the value of type `type_id` at the cursor into v (whose key and label are set). The
    // type id is checked here rather than by the caller so nested arrays share the one check.
    void parse_value(value& v, std::uint32_t type_id, int depth) {
        const std::string context = "key '" + v.key_ + "'";
        if (!is_known_value_type(type_id))
            fail_at(context, pos_ - 4, "unknown value type id " + std::to_string(type_id));
        v.type_ = static_cast<value_type>(type_id);
        v.base_ = base_;
        v.file_size_ = size_;
        v.depth_ = depth;
        if (v.type_ == value_type::string) {
            const std::string_view s = take_string(context, "string value");
            v.payload_offset_ = static_cast<std::uint64_t>(reinterpret_cast<const std::byte*>(s.data()) - base_);
            v.count_ = s.size();
            return;
        }
        if (v.type_ != value_type::array) {
            // Fixed-size scalar. A bool byte other than 0/1 is rejected: no writer produces one, so it
            // is corruption, not a value.
            const std::uint64_t at = pos_;
            const std::uint64_t n = fixed_size_of(v.type_);
            need(n, context, std::string(value_type_name(v.type_)) + " value");
            if (v.type_ == value_type::boolean && std::to_integer<unsigned>(base_[pos_]) > 1)
                fail_at(context, at, "bool value is " + std::to_string(std::to_integer<unsigned>(base_[pos_])) +
                                         " (must be 0 or 1)");
            v.payload_offset_ = at;
            pos_ += n;
            return;
        }
        parse_array_body(v, v.key_, nullptr, depth);
    }

    // Where a nested array element sits: a chain of indices on the parser's stack (depth <=
    // max_array_depth). Its text is built only for an error message; building "key[i]" per
    // element made a long key over many elements quadratic.
    struct element_path {
        const element_path* parent;
        std::uint64_t index;
    };
    static std::string context_of(std::string_view key, const element_path* path) {
        // Appends only (GCC 12 misreads "literal" + std::string&& as an overlapping memcpy).
        std::vector<std::uint64_t> indices;
        for (const element_path* p = path; p != nullptr; p = p->parent) indices.push_back(p->index);
        std::string s = "key '";
        s.append(key).append("'");
        if (!indices.empty()) s.append(" element ");
        for (auto it = indices.rbegin(); it != indices.rend(); ++it) s.append("[").append(std::to_string(*it)).append("]");
        return s;
    }

    // Array body: u32 element type, u64 count, elements. Fixed-size elements are skipped in one
    // step; strings and nested arrays are walked once, recording where each element starts. The
    // context text is built only on failure (ctx), so the walk costs O(bytes), whatever the key.
    void parse_array_body(value& v, std::string_view key, const element_path* path, int depth) {
        const auto ctx = [&] { return context_of(key, path); };
        const std::uint64_t at = pos_;
        if (left() < 4) need(4, ctx(), "array element type");
        const auto elem_id = load_at<std::uint32_t>();
        if (!is_known_value_type(elem_id))
            fail_at(ctx(), at, "unknown array element type id " + std::to_string(elem_id));
        const auto elem = static_cast<value_type>(elem_id);
        if (elem == value_type::array && depth + 1 >= max_array_depth)
            fail_at(ctx(), at, "arrays nested deeper than " + std::to_string(max_array_depth) +
                                   " levels are not supported");
        if (left() < 8) need(8, ctx(), "array length");
        const auto count = load_at<std::uint64_t>();
        v.elem_type_ = elem;
        v.count_ = count;
        v.payload_offset_ = pos_;
        // Nesting is capped above (depth + 1 counts the level about to be entered), which also bounds
        // the recursion of this function.
        // The smallest encoding of one element bounds the count before anything is allocated or
        // walked, so a hostile count cannot overflow, and element_offsets_ (8 bytes per element of
        // at least 8 bytes) never reserves more than the bytes that are left.
        const std::uint64_t fixed = fixed_size_of(elem);
        const std::uint64_t min_elem = fixed != 0 ? fixed : elem == value_type::string ? 8 : 12;
        if (count > left() / min_elem)
            fail_at(ctx(), at, "array of " + std::to_string(count) + " " + std::string(value_type_name(elem)) +
                                   " runs past the end of the file (" + std::to_string(left()) +
                                   " bytes left, each element needs at least " + std::to_string(min_elem) + ")");
        if (count > max_array_length)
            fail_at(ctx(), at, "array of " + std::to_string(count) + " " + std::string(value_type_name(elem)) +
                                   " exceeds the limit of " + std::to_string(max_array_length) + " elements");
        if (fixed != 0) {
            if (elem == value_type::boolean)
                for (std::uint64_t i = 0; i < count; ++i)
                    if (std::to_integer<unsigned>(base_[pos_ + i]) > 1)
                        fail_at(ctx(), pos_ + i, "bool element " + std::to_string(i) + " is " +
                                                     std::to_string(std::to_integer<unsigned>(base_[pos_ + i])) +
                                                     " (must be 0 or 1)");
            pos_ += count * fixed;
            return;
        }
        v.element_offsets_.reserve(static_cast<std::size_t>(count));
        for (std::uint64_t i = 0; i < count; ++i) {
            v.element_offsets_.push_back(pos_ - v.payload_offset_);
            if (elem == value_type::string) {
                // Fast path for the vocabulary's 129k strings: the checked routine (which builds the
                // message) runs only when this element is actually bad.
                std::uint64_t len = UINT64_MAX;
                if (left() >= 8) std::memcpy(&len, base_ + pos_, 8);
                if (left() >= 8 && len <= left() - 8 && len <= max_string_length)
                    pos_ += 8 + len;
                else
                    take_string(ctx(), "string element " + std::to_string(i));
            } else {
                // The inner value only indexes its elements; value::element names it when asked.
                value inner;
                const element_path here{path, i};
                parse_array_body(inner, key, &here, depth + 1);
            }
        }
    }

private:
    const std::byte* base_;
    std::uint64_t size_;
    std::uint64_t pos_ = 0;
    const std::string& label_;
};

}  // namespace detail

inline value value::element(std::uint64_t i) const {
    require_elements(value_type::array, "an array of arrays", i);
    value inner;
    inner.key_ = key_ + "[" + std::to_string(i) + "]";
    inner.label_ = label_;
    inner.key_offset_ = key_offset_;
    inner.type_ = value_type::array;
    inner.base_ = base_;
    inner.file_size_ = file_size_;
    inner.depth_ = depth_ + 1;
    // Already validated at open; re-walking builds the inner element index.
    detail::parser p(base_, file_size_, label_);
    p.seek(payload_offset_ + element_offsets_[i]);
    p.parse_array_body(inner, inner.key_, nullptr, depth_ + 1);
    return inner;
}

// A validated GGUF file: either a read-only private mapping (open) or an owned buffer
// (from_bytes). Metadata values and tensor_info::data point into it, so they live as long as the
// file object; moving the file keeps them valid (the mapping and the buffer do not move).
class file {
public:
    // Maps the file read-only and validates it completely; throws ds4::error.
    static file open(const std::filesystem::path& path) {
        file f;
        f.label_ = path.string();
        f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (f.fd_ < 0) fail(f.label_ + ": cannot open: " + std::strerror(errno));
        struct stat st {};
        if (::fstat(f.fd_, &st) != 0) fail(f.label_ + ": cannot stat: " + std::strerror(errno));
        // mmap of a pipe or a device would fail or report a meaningless size.
        if (!S_ISREG(st.st_mode)) fail(f.label_ + ": not a regular file");
        f.size_ = static_cast<std::uint64_t>(st.st_size);
        // An empty file cannot be mapped; it is left to parse() to report as truncated. The fd stays
        // open for release()'s posix_fadvise.
        if (f.size_ > 0) {
            void* p = ::mmap(nullptr, static_cast<std::size_t>(f.size_), PROT_READ, MAP_PRIVATE, f.fd_, 0);
            if (p == MAP_FAILED) fail(f.label_ + ": cannot mmap " + std::to_string(f.size_) + " bytes: " + std::strerror(errno));
            f.map_ = p;
            f.base_ = static_cast<const std::byte*>(p);
        }
        f.parse_guarded();
        return f;
    }

    // The same validation over bytes in memory (tests, embedded files); label stands for the path.
    static file from_bytes(std::vector<std::byte> bytes, std::string label) {
        file f;
        f.label_ = std::move(label);
        f.owned_ = std::move(bytes);
        f.base_ = f.owned_.data();
        f.size_ = f.owned_.size();
        f.parse_guarded();
        return f;
    }

    // Move by swap: the moved-from object ends up empty (no mapping, fd -1), so its destructor is a
    // no-op and exactly one owner unmaps.
    file(file&& o) noexcept { swap(o); }
    file& operator=(file&& o) noexcept {
        if (this != &o) {
            file tmp(std::move(o));
            swap(tmp);
        }
        return *this;
    }
    file(const file&) = delete;
    file& operator=(const file&) = delete;
    ~file() {
        if (map_ != nullptr) ::munmap(map_, static_cast<std::size_t>(size_));
        if (fd_ >= 0) ::close(fd_);
    }

    // Lookups are by exact name (ds4.c scans linearly; a map gives the same answers in log time).
    const value* find(std::string_view key) const {
        const auto it = key_index_.find(key);
        return it == key_index_.end() ? nullptr : &metadata_[it->second];
    }
    const value& at(std::string_view key) const {
        if (const value* v = find(key)) return *v;
        fail(label_ + ": missing key '" + std::string(key) + "'");
    }
    const std::vector<value>& metadata() const { return metadata_; }

    const tensor_info* find_tensor(std::string_view name) const {
        const auto it = tensor_index_.find(name);
        return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
    }
    const tensor_info& tensor(std::string_view name) const {
        if (const tensor_info* t = find_tensor(name)) return *t;
        fail(label_ + ": missing tensor '" + std::string(name) + "'");
    }
    const std::vector<tensor_info>& tensors() const { return tensors_; }

    std::uint32_t version() const { return version_; }
    std::uint64_t alignment() const { return alignment_; }
    std::uint64_t data_offset() const { return data_offset_; }
    std::uint64_t size() const { return size_; }
    const std::string& path() const { return label_; }
    // The whole file, for checksums and tools that need raw access.
    std::span<const std::byte> bytes() const { return {base_, static_cast<std::size_t>(size_)}; }

    // Drops the tensor's pages from this process (docs/README.md decision 5: the loader releases each host
    // tensor once it is on the device, so two copies are never resident). The range is widened to
    // whole pages: for a read-only private file mapping that only drops clean pages, which the
    // kernel re-reads from the file if a neighbour tensor touches them again. No-op for from_bytes.
    void release(const tensor_info& t) const {
        if (map_ == nullptr) return;
        require(t.data == base_ + t.file_offset && t.file_offset + t.n_bytes <= size_,
                label_ + ": release of tensor '" + t.name + "', which does not belong to this file");
        const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
        const std::uint64_t begin = t.file_offset & ~(page - 1);
        const std::uint64_t end = std::min(size_, (t.file_offset + t.n_bytes + page - 1) & ~(page - 1));
        if (::madvise(static_cast<std::byte*>(map_) + begin, static_cast<std::size_t>(end - begin), MADV_DONTNEED) != 0)
            fail(label_ + ": madvise(DONTNEED) of tensor '" + t.name + "' failed: " + std::strerror(errno));
        // Also hint the page cache; failure here only costs memory, so it is not an error.
        ::posix_fadvise(fd_, static_cast<off_t>(begin), static_cast<off_t>(end - begin), POSIX_FADV_DONTNEED);
    }

private:
    file() = default;

    void swap(file& o) noexcept {
        std::swap(label_, o.label_);
        std::swap(fd_, o.fd_);
        std::swap(map_, o.map_);
        std::swap(owned_, o.owned_);
        std::swap(base_, o.base_);
        std::swap(size_, o.size_);
        std::swap(version_, o.version_);
        std::swap(alignment_, o.alignment_);
        std::swap(data_offset_, o.data_offset_);
        std::swap(metadata_, o.metadata_);
        std::swap(tensors_, o.tensors_);
        std::swap(key_index_, o.key_index_);
        std::swap(tensor_index_, o.tensor_index_);
    }

    // The limits above keep parsing within memory proportional to the metadata and directory; if
    // even that is not available, the caller still gets a ds4::error naming the file, never a
    // std::bad_alloc from deep inside the parser.
    void parse_guarded() {
        try {
            parse();
        } catch (const std::bad_alloc&) {
            fail(label_ + ": out of memory while reading the metadata and tensor directory (file of " +
                 std::to_string(size_) + " bytes)");
        } catch (const std::length_error&) {
            fail(label_ + ": a count in the metadata or tensor directory is too large to hold in memory");
        }
    }

    // Header, then every key/value, then general.alignment (it may appear anywhere among the keys
    // but governs the directory), then the directory and the data section.
    void parse() {
        detail::parser p(base_, size_, label_);
        const std::string header = "header";
        // Magic first, so a file that is not GGUF at all says so instead of "version 1179993927".
        if (size_ >= 4) {
            std::uint32_t magic;
            std::memcpy(&magic, base_, 4);
            if (magic != file_magic) p.fail_at(header, 0, "bad magic " + hex_bytes(0, 4) + " (expected \"GGUF\")");
        }
        p.take<std::uint32_t>(header, "magic");
        version_ = p.take<std::uint32_t>(header, "version");
        if (version_ != supported_version)
            p.fail_at(header, 4, "unsupported GGUF version " + std::to_string(version_) + " (only version " +
                                     std::to_string(supported_version) + " is accepted)");
        const auto n_tensors = p.take<std::uint64_t>(header, "tensor count");
        const auto n_kv = p.take<std::uint64_t>(header, "key/value count");
        // Minimal encodings: a key/value is 8 (key length) + 4 (type) + 1 byte; a tensor entry is
        // 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset). Counts above what the
        // rest of the file could hold are rejected before anything is reserved.
        if (n_kv > p.left() / 13)
            p.fail_at(header, 16, "key/value count " + std::to_string(n_kv) + " cannot fit in the " +
                                      std::to_string(p.left()) + " bytes left (count overflow)");
        if (n_tensors > p.left() / 32)
            p.fail_at(header, 8, "tensor count " + std::to_string(n_tensors) + " cannot fit in the " +
                                     std::to_string(p.left()) + " bytes left (count overflow)");
        // A count the bytes could hold may still ask for ~11x their size in parsed entries (a value
        // is ~150 bytes in memory, 13 in the file), so the counts are also capped outright.
        if (n_kv > max_kv_count)
            p.fail_at(header, 16, "key/value count " + std::to_string(n_kv) + " exceeds the limit of " +
                                      std::to_string(max_kv_count));
        if (n_tensors > max_tensor_count)
            p.fail_at(header, 8, "tensor count " + std::to_string(n_tensors) + " exceeds the limit of " +
                                     std::to_string(max_tensor_count));

        // Reserved for what a model file has, then grown as entries actually parse: memory follows
        // the bytes read, not the header's claim.
        metadata_.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(n_kv, initial_reserve)));
        for (std::uint64_t i = 0; i < n_kv; ++i) {
            const std::uint64_t at = p.pos();
            const std::string where = "key #" + std::to_string(i);
            value v;
            v.key_ = std::string(p.take_string(where, "key", max_key_length));
            v.label_ = label_;
            v.key_offset_ = at;
            const std::string context = "key '" + v.key_ + "'";
            // Duplicates are ambiguous (which value wins differs between readers), so they are fatal.
            if (key_index_.contains(v.key_))
                p.fail_at(context, at, "duplicate key (first at byte " +
                                           std::to_string(metadata_[key_index_.find(v.key_)->second].key_offset_) + ")");
            const auto type_id = p.take<std::uint32_t>(context, "value type");
            p.parse_value(v, type_id, 0);
            key_index_.emplace(v.key_, metadata_.size());
            metadata_.push_back(std::move(v));
        }

        // general.alignment must be a u32 (the type the GGUF spec gives it); a power of two keeps
        // align_up a mask and is what GGML assumes.
        alignment_ = default_alignment;
        if (const value* a = find(alignment_key)) {
            const std::string context = "key '" + std::string(alignment_key) + "'";
            if (a->type() != value_type::u32)
                p.fail_at(context, a->key_offset_, "alignment must be a u32, found " + a->type_words());
            alignment_ = a->as_u64();
            if (!is_power_of_two(alignment_))
                p.fail_at(context, a->key_offset_, "alignment " + std::to_string(alignment_) +
                                                       " is not a nonzero power of two");
        }

        parse_directory(p, n_tensors);
    }

    // The tensor directory. Every entry is checked completely here (shape, type, alignment, range,
    // overlap) so that a loader can trust tensor_info and never re-check before touching data.
    void parse_directory(detail::parser& p, std::uint64_t n_tensors) {
        std::vector<std::uint64_t> entry_offsets;  // where each entry starts, for error messages
        tensors_.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(n_tensors, initial_reserve)));
        entry_offsets.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(n_tensors, initial_reserve)));
        for (std::uint64_t i = 0; i < n_tensors; ++i) {
            const std::uint64_t at = p.pos();
            tensor_info t;
            t.name = std::string(p.take_string("tensor #" + std::to_string(i), "tensor name", max_name_length));
            const std::string context = "tensor '" + t.name + "'";
            if (tensor_index_.contains(t.name))
                p.fail_at(context, at, "duplicate tensor name (first at byte " +
                                           std::to_string(entry_offsets[tensor_index_.find(t.name)->second]) + ")");
            const auto n_dims = p.take<std::uint32_t>(context, "n_dims");
            // n_dims is checked before the dims are read so that a huge n_dims cannot drive the loop.
            if (n_dims == 0 || n_dims > max_dims)
                p.fail_at(context, at, "n_dims = " + std::to_string(n_dims) + " (must be 1.." +
                                           std::to_string(max_dims) + ")");
            for (std::uint32_t d = 0; d < n_dims; ++d) t.dims.push_back(p.take<std::uint64_t>(context, "dimension"));
            const auto type_id = p.take<std::uint32_t>(context, "type");
            t.offset = p.take<std::uint64_t>(context, "data offset");
            tensor_shape shape;
            if (const std::string problem = shape_problem(type_id, t.dims, shape); !problem.empty())
                p.fail_at(context, at, problem);
            t.type = static_cast<ggml_type>(type_id);
            t.n_elements = shape.n_elements;
            t.n_bytes = shape.n_bytes;
            // The loader and GGML assume tensor data starts on an alignment boundary.
            if (t.offset % alignment_ != 0)
                p.fail_at(context, at, "data offset " + std::to_string(t.offset) + " is not aligned to " +
                                           std::to_string(alignment_));
            tensor_index_.emplace(t.name, tensors_.size());
            entry_offsets.push_back(at);
            tensors_.push_back(std::move(t));
        }

        // The data section starts at the next alignment boundary after the directory (ds4.c
        // model_open); a file without tensors may end before it.
        data_offset_ = *checked_align_up(p.pos(), alignment_);  // pos <= size and alignment < 2^32
        for (std::size_t i = 0; i < tensors_.size(); ++i) {
            tensor_info& t = tensors_[i];
            const std::string context = "tensor '" + t.name + "'";
            // Offsets are relative and unsigned, so the start cannot precede the data section; the
            // end is checked against the file size with overflow-safe arithmetic.
            const auto begin = checked_add(data_offset_, t.offset);
            const auto end = begin ? checked_add(*begin, t.n_bytes) : std::nullopt;
            if (!end || *end > size_)
                p.fail_at(context, entry_offsets[i],
                          "data [" + (begin ? std::to_string(*begin) : "data offset + " + std::to_string(t.offset)) +
                              ", " + (end ? std::to_string(*end) : std::string("overflow")) +
                              ") runs past the end of the file (" + std::to_string(size_) + " bytes)");
            t.file_offset = *begin;
            t.data = base_ + t.file_offset;
        }

        // Overlap is checked on the sorted order because files need not list tensors in data order.
        // Overlap: sorted by start, each tensor must begin at or after the previous one's end.
        std::vector<std::size_t> order(tensors_.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::sort(order.begin(), order.end(),
                  [&](std::size_t a, std::size_t b) { return tensors_[a].offset < tensors_[b].offset; });
        for (std::size_t k = 1; k < order.size(); ++k) {
            const tensor_info& prev = tensors_[order[k - 1]];
            const tensor_info& cur = tensors_[order[k]];
            if (cur.file_offset < prev.file_offset + prev.n_bytes)
                p.fail_at("tensor '" + cur.name + "'", entry_offsets[order[k]],
                          "data [" + std::to_string(cur.file_offset) + ", " + std::to_string(cur.file_offset + cur.n_bytes) +
                              ") overlaps tensor '" + prev.name + "' data [" + std::to_string(prev.file_offset) + ", " +
                              std::to_string(prev.file_offset + prev.n_bytes) + ")");
        }
    }

    // The offending bytes in hex, for the bad-magic message (they are often printable garbage).
    std::string hex_bytes(std::uint64_t at, std::uint64_t n) const {
        static constexpr char digits[] = "0123456789abcdef";
        std::string s;
        for (std::uint64_t i = 0; i < n && at + i < size_; ++i) {
            const auto b = std::to_integer<unsigned>(base_[at + i]);
            if (i) s += ' ';
            s += digits[b >> 4];
            s += digits[b & 15];
        }
        return s;
    }

    // Up-front reservation for the key/value and tensor vectors; more grows as parsed.
    static constexpr std::uint64_t initial_reserve = 2048;

    // Ownership: exactly one of map_ (open) or owned_ (from_bytes) backs base_.
    std::string label_;
    int fd_ = -1;
    void* map_ = nullptr;
    std::vector<std::byte> owned_;
    const std::byte* base_ = nullptr;
    std::uint64_t size_ = 0;
    std::uint32_t version_ = 0;
    std::uint64_t alignment_ = default_alignment;
    std::uint64_t data_offset_ = 0;
    std::vector<value> metadata_;
    std::vector<tensor_info> tensors_;
    // std::less<> makes lookups by string_view work without building a std::string per call.
    std::map<std::string, std::size_t, std::less<>> key_index_;
    std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

}  // namespace ds4::gguf
