// The engine contract's conformance suite (tests/conformance/) on the CUDA backend and the tiny
// synthetic model, in exact mode (CUDA-core attention) and in the default mode (tensor-core
// attention): every case compares a backend with itself, so batch invariance, prefill == steps,
// fork, truncate and snapshots must hold bitwise in both. Skipped (exit 77) without a CUDA device.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "backends/cuda/cuda_backend.hpp"
#include "ds4/core/cuda_check.hpp"
#include "harness/synth/generator.hpp"
#include "tests/conformance/backend_conformance.hpp"

namespace {

template <bool Exact>
struct cuda_fixture {
    static ds4::engine::backend& backend() {
        static std::unique_ptr<ds4::engine::backend> b = [] {
            if (!ds4::cuda_device_present()) {
                std::fprintf(stderr, "engine_conformance_test_gpu: no CUDA device, skipped\n");
                std::exit(77);
            }
            const auto path = std::filesystem::temp_directory_path() /
                              ("ds4_cuda_conformance_" + std::to_string(::getpid()) + ".gguf");
            ds4::synth::write_options opt;
            opt.seed = 1;
            ds4::synth::write_model(path, ds4::model::dims_of<ds4::model::tiny_shape>(), opt);
            ds4::cuda_backend::options o;
            o.exact = Exact;
            o.kv_capacity_bytes = std::uint64_t(1) << 30;
            o.chunk_rows = 256;  // the suite's 300-row prompt crosses a chunk
            o.chunk_output_rows = 17;  // every run past a sub-batch is a chunk, output rows included
            auto made = ds4::cuda_backend::make_cuda_backend(path, o);
            std::filesystem::remove(path);
            return made;
        }();
        return *b;
    }
    // One stream; sub-batch sizes and split plans are constants, so there is nothing to vary.
    static void set_parallelism(int) {}
};
using cuda_exact = cuda_fixture<true>;
using cuda_tensor_cores = cuda_fixture<false>;

}  // namespace

namespace ds4::conformance {
TEST_CASE_TEMPLATE_INVOKE(backend_conformance, cuda_exact, cuda_tensor_cores);
}
