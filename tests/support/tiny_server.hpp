#pragma once
// The server's request layer in-process: ds4-synth's tiny model (written to a temporary file,
// removed once loaded), its tokenizer, the CPU backend, an idle scheduler and the context every
// API handler takes. Shared by tests/server/tool_roundtrip_test.cpp and fuzz/http_fuzzer.cpp.
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "backends/open_backend.hpp"
#include "ds4/model/shape.hpp"
#include "examples/server/api/context.hpp"
#include "examples/server/model_tokenizer.hpp"
#include "harness/synth/generator.hpp"

namespace ds4::server {

struct tiny_server {
    std::filesystem::path path = std::filesystem::temp_directory_path() / ("ds4_tiny_server_" + std::to_string(::getpid()) + ".gguf");
    std::unique_ptr<engine::backend> backend;
    ref::tokenizer tok;
    scheduler sched;
    server_context ctx;

    static std::filesystem::path written(const std::filesystem::path& p) {
        synth::write_options opt;
        opt.seed = 1;
        synth::write_model(p, model::dims_of<model::tiny_shape>(), opt);
        return p;
    }
    tiny_server()
        : backend(backends::open_backend({written(path), {}, backends::backend_kind::cpu, 1, false, 0})),
          tok(tokenizer_from_gguf(path)), sched(*backend, tok, {}), ctx(*backend, tok, sched, "deepseek-v4-flash") {
        ctx.context_length = backend->dims().context_length;
        std::filesystem::remove(path);
    }
};

}  // namespace ds4::server
