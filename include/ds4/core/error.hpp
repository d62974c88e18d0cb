#pragma once
// One error type for the whole library: what failed and why, with the tensor, key or byte
// offset in the message so a user can act on it without a debugger.
#include <stdexcept>
#include <string>

namespace ds4 {

class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string& what) { throw error(what); }

inline void require(bool ok, const std::string& what) {
    if (!ok) fail(what);
}

}  // namespace ds4
