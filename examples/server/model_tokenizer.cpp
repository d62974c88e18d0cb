#include "examples/server/model_tokenizer.hpp"

#include "ds4/gguf/reader.hpp"
#include "ds4/model/metadata.hpp"

namespace ds4::server {

ref::tokenizer tokenizer_from_gguf(const std::filesystem::path& path) {
    const gguf::file f = gguf::file::open(path);
    std::vector<std::string> tokens, merges;
    for (std::string_view t : f.at(model::tokens_key).strings()) tokens.emplace_back(t);
    for (std::string_view m : f.at(model::merges_key).strings()) merges.emplace_back(m);
    return ref::tokenizer(std::move(tokens), std::move(merges));
}

}  // namespace ds4::server
