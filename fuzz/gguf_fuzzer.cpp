// libFuzzer target over the model-file path: the reader (from memory, the same validation as a
// mapped file), every metadata value, the tensor directory, dims_from_gguf, expected_dims, the
// validator against the tiny, small and flash shapes and against what the file declares, and the
// tokenizer build with one encode/decode (tests/support/gguf_exercise.hpp, shared with the
// deterministic mutation test). Every input must end in success or a ds4::error; anything else
// (a sanitizer report, another exception, a leak) is a finding. Seeds: fuzz/run.sh.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ds4/core/error.hpp"
#include "tests/support/gguf_exercise.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto* p = reinterpret_cast<const std::byte*>(data);
    try {
        (void)ds4::gguf_exercise::run_one(std::vector<std::byte>(p, p + size));
    } catch (const ds4::error&) {
        // the reader's answer for a malformed file
    }
    return 0;
}
