#pragma once
// The tokenizer a model file carries (tokenizer.ggml.tokens / .merges).
#include <filesystem>

#include "text/tokenizer.hpp"

namespace ds4::server {

ref::tokenizer tokenizer_from_gguf(const std::filesystem::path& path);

}  // namespace ds4::server
