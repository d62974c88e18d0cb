// The launch rule of core/launch.hpp, checked on the sources: every launch of the library and the
// CUDA backend goes through launch_kernel (which may carry the PDL attribute), and every kernel
// reaches pdl_wait (or pdl_enter) before any `return`, so that no CTA exits before the grids it
// depends on have completed. A kernel that broke it would read stale inputs only under PDL and
// only at some timings; the GPU tests cannot be relied on to catch that.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string read_text(const std::filesystem::path& p) {
    std::ifstream f(p);
    REQUIRE_MESSAGE(f.good(), "cannot read " << p.string());
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

// The source with // comments blanked (kernel contracts mention __global__ and return).
std::string strip_line_comments(const std::string& src) {
    std::string out;
    out.reserve(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) {
        if (src[i] == '/' && i + 1 < src.size() && src[i + 1] == '/') {
            while (i < src.size() && src[i] != '\n') ++i;
            if (i < src.size()) out += '\n';
            continue;
        }
        out += src[i];
    }
    return out;
}

// `body` with the bodies of its capturing lambdas ([&] or [=] ...) blanked: their `return`s
// leave the lambda, not the kernel.
std::string blank_lambda_bodies(std::string body) {
    for (std::size_t at = body.find('['); at != std::string::npos; at = body.find('[', at + 1)) {
        if (at + 1 >= body.size() || (body[at + 1] != '&' && body[at + 1] != '=')) continue;
        const std::size_t open = body.find('{', at), semi = body.find(';', at);
        if (open == std::string::npos || (semi != std::string::npos && semi < open)) continue;
        int depth = 0;
        for (std::size_t i = open; i < body.size(); ++i) {
            if (body[i] == '{') ++depth;
            if (body[i] == '}' && --depth == 0) break;
            if (depth > 0 && i > open) body[i] = ' ';
        }
    }
    return body;
}

// Names of the __global__ functions in `src` whose body has a `return` before its first
// pdl_wait()/pdl_enter(), or none at all; a one-line body with neither is reported too.
std::vector<std::string> kernels_breaking_rule(const std::string& raw, const std::vector<std::string>& exempt) {
    const std::string src = strip_line_comments(raw);
    std::vector<std::string> bad;
    for (std::size_t at = src.find("__global__"); at != std::string::npos; at = src.find("__global__", at + 1)) {
        // The kernel's name: the identifier before the parameter list (after __launch_bounds__(..)).
        std::size_t name_end = src.find('(', at);
        const std::size_t lb = src.find("__launch_bounds__", at);
        if (lb != std::string::npos && lb < src.find('{', at)) {
            int depth = 0;
            std::size_t i = src.find('(', lb);
            for (; i < src.size(); ++i) {
                if (src[i] == '(') ++depth;
                if (src[i] == ')' && --depth == 0) break;
            }
            name_end = src.find('(', i + 1);
        }
        std::size_t name_begin = name_end;
        while (name_begin > 0 && (std::isalnum(static_cast<unsigned char>(src[name_begin - 1])) || src[name_begin - 1] == '_'))
            --name_begin;
        const std::string name = src.substr(name_begin, name_end - name_begin);
        bool skip = false;
        for (const auto& e : exempt) skip |= e == name;
        if (skip) continue;
        const std::size_t open = src.find('{', name_end);
        int depth = 0;
        std::size_t close = open;
        for (; close < src.size(); ++close) {
            if (src[close] == '{') ++depth;
            if (src[close] == '}' && --depth == 0) break;
        }
        const std::string body = blank_lambda_bodies(src.substr(open, close - open));
        std::size_t wait = std::min(body.find("pdl_wait()"), body.find("pdl_enter()"));
        const std::size_t ret = body.find("return");
        if (wait == std::string::npos || (ret != std::string::npos && ret < wait)) bad.push_back(name);
    }
    return bad;
}

const std::filesystem::path root{DS4_SOURCE_DIR};

std::vector<std::filesystem::path> launching_sources() {
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(root / "include/ds4/kernels"))
        if (e.path().extension() == ".cuh") files.push_back(e.path());
    for (const char* f : {"backends/cuda/cuda_ops.cu", "backends/cuda/cuda_backend.cu"}) files.push_back(root / f);
    return files;
}

}  // namespace

TEST_CASE("the rule checker flags a return before the wait and a kernel without one") {
    const std::string good = "__global__ void __launch_bounds__(256) k1(int* p) {\n  pdl_enter();\n  if (!p) return;\n}\n";
    const std::string early = "template <int R>\n__global__ void k2(int* p) {\n  if (!p) return;\n  pdl_wait();\n}\n";
    const std::string none = "__global__ void k3(int* p) { *p = 1; }\n";
    const std::string commented = "// a __global__ function cannot be inline; return\n" + good;
    const std::string lambda =
        "__global__ void k4(int* p) {\n  auto f = [&](int i) { return p[i]; };\n  pdl_enter();\n  *p = f(1);\n}\n";
    const std::string lambda_then_return = "__global__ void k5(int* p) {\n  auto f = [&](int i) { return p[i]; };\n"
                                           "  if (f(0)) return;\n  pdl_enter();\n}\n";
    CHECK(kernels_breaking_rule(good, {}).empty());
    CHECK(kernels_breaking_rule(early, {}) == std::vector<std::string>{"k2"});
    CHECK(kernels_breaking_rule(none, {}) == std::vector<std::string>{"k3"});
    CHECK(kernels_breaking_rule(none, {"k3"}).empty());
    CHECK(kernels_breaking_rule(commented, {}).empty());
    CHECK(kernels_breaking_rule(lambda, {}).empty());
    CHECK(kernels_breaking_rule(lambda_then_return, {}) == std::vector<std::string>{"k5"});
}

TEST_CASE("every library and backend kernel waits on earlier grids before it can exit") {
    const auto files = launching_sources();
    REQUIRE(files.size() > 10);
    int kernels = 0;
    for (const auto& f : files) {
        const std::string src = read_text(f);
        // attention_wgmma.cuh's capability probe runs alone, before any capture, without the attribute.
        const auto bad = kernels_breaking_rule(src, {"probe_kernel"});
        for (const auto& k : bad) FAIL_CHECK(f.filename().string() << ": " << k << " can exit before pdl_wait");
        const std::string code = strip_line_comments(src);
        for (std::size_t at = code.find("__global__"); at != std::string::npos; at = code.find("__global__", at + 1))
            ++kernels;
    }
    CHECK(kernels >= 40);  // the library's kernels are all scanned (46 when this was written)
}

TEST_CASE("every launch goes through launch_kernel") {
    for (const auto& f : launching_sources()) {
        const std::string src = strip_line_comments(read_text(f));
        for (std::size_t at = src.find("<<<"); at != std::string::npos; at = src.find("<<<", at + 1)) {
            const std::size_t line_start = src.rfind('\n', at) + 1;
            const std::string line = src.substr(line_start, src.find('\n', at) - line_start);
            if (line.find("probe_kernel") != std::string::npos) continue;
            FAIL_CHECK(f.filename().string() << ": a <<<>>> launch bypasses launch_kernel: " << line);
        }
    }
}
