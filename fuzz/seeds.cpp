// Writes the GGUF seed corpus of fuzz/gguf_fuzzer into a folder: ds4-synth's tiny shape declared
// as each preset (custom, tiny, small, flash) with the small tensors of its inventory, a file
// truncated inside its tensor data the way ds4-synth --limit leaves one, the raw builder's file
// with every value type, and cuts of one seed inside its header, its metadata and its directory.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "ds4/model/metadata.hpp"
#include "tests/support/gguf_exercise.hpp"

namespace {

void put(const std::filesystem::path& p, const std::vector<std::byte>& bytes, std::size_t n) {
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(std::min(n, bytes.size())));
    if (!out) throw std::runtime_error("cannot write " + p.string());
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
        return 2;
    }
    try {
        using namespace ds4::gguf_exercise;
        const std::filesystem::path dir = argv[1];
        std::filesystem::create_directories(dir);
        const std::filesystem::path tmp = dir / "tmp.gguf";
        std::vector<std::byte> tiny;
        for (const std::string& preset : {std::string(ds4::model::custom_preset), std::string("tiny"), std::string("small"),
                                         std::string("flash")}) {
            const std::vector<std::byte> b = model_seed(tmp, preset);
            put(dir / ("synth_" + preset + ".gguf"), b, b.size());
            if (preset == "tiny") tiny = b;
        }
        const std::vector<std::byte> cut = model_seed(tmp, "tiny", 1000);
        put(dir / "synth_tiny_limit.gguf", cut, cut.size());
        const std::vector<std::byte> raw = raw_seed();
        put(dir / "raw_all_types.gguf", raw, raw.size());
        const ds4::gguf::file f = ds4::gguf::file::from_bytes(tiny, "tiny");
        const std::size_t data = static_cast<std::size_t>(f.data_offset());
        for (std::size_t n : {std::size_t{24}, std::size_t{1000}, data / 2, data - 100, data + 10})
            put(dir / ("synth_tiny_cut_" + std::to_string(n) + ".gguf"), tiny, n);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fuzz_seeds: %s\n", e.what());
        return 1;
    }
    return 0;
}
