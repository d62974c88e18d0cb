// The engine contract's conformance suite (tests/conformance/) on the CPU reference backend and
// the tiny synthetic model.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <memory>

#include "harness/synth/generator.hpp"
#include "reference/cpu_backend.hpp"
#include "reference/parallel.hpp"
#include "tests/conformance/backend_conformance.hpp"

namespace {

struct cpu_fixture {
    static ds4::engine::backend& backend() {
        static std::unique_ptr<ds4::engine::backend> b = [] {
            const auto path = std::filesystem::temp_directory_path() /
                              ("ds4_conformance_" + std::to_string(::getpid()) + ".gguf");
            ds4::synth::write_options opt;
            opt.seed = 1;
            ds4::synth::write_model(path, ds4::model::dims_of<ds4::model::tiny_shape>(), opt);
            auto made = ds4::ref::make_cpu_backend(path);
            std::filesystem::remove(path);  // the mapping stays valid after unlink
            return made;
        }();
        return *b;
    }
    static void set_parallelism(int workers) { ds4::ref::set_thread_count(workers); }
};

}  // namespace

namespace ds4::conformance {
TEST_CASE_TEMPLATE_INVOKE(backend_conformance, cpu_fixture);
}
