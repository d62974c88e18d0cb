// ds4-validate: every CUDA kernel against the CPU reference under its numerics contract, on
// fresh random inputs (the seed is printed; --seed replays a run), at odd sizes and at the real
// DeepSeek-V4-Flash shapes. Prints a table; exits non-zero on any FAIL. --only a,b runs the named
// families (matvec, moe, compressor, indexer, attention, prefill, embedding, norm_rope,
// quantize_act, hc, sampling) and nothing else.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "harness/validate/checks.hpp"

int main(int argc, char** argv) {
    std::uint64_t seed = std::random_device{}() | (std::uint64_t(std::random_device{}()) << 32);
    bool quick = false;
    std::string only;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--quick") {
            quick = true;
        } else if (a == "--seed" && i + 1 < argc) {
            char* end = nullptr;
            seed = std::strtoull(argv[++i], &end, 10);
            if (!end || *end) {
                std::fprintf(stderr, "ds4-validate: --seed needs an unsigned integer, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (a == "--only" && i + 1 < argc) {
            only.assign(1, ',');
            only.append(argv[++i]);
            only.push_back(',');
        } else {
            std::fprintf(stderr, "usage: ds4-validate [--quick] [--seed N] [--only family,...]\n");
            return 2;
        }
    }
    if (!ds4::cuda_device_present()) {
        std::fprintf(stderr, "ds4-validate: no CUDA device\n");
        return 77;
    }
    std::printf("ds4-validate seed %llu%s\n", static_cast<unsigned long long>(seed), quick ? " (quick)" : "");
    using namespace ds4::validate;
    std::vector<check_row> rows;
    try {
        const auto want = [&](const char* family) {
            std::string key(1, ',');
            key.append(family);
            key.push_back(',');
            return only.empty() || only.find(key) != std::string::npos;
        };
        if (want("matvec")) for (auto& r : check_matvec(seed, quick)) rows.push_back(r);
        if (want("moe")) for (auto& r : check_moe(seed, quick)) rows.push_back(r);
        if (want("compressor")) for (auto& r : check_compressor(seed, quick)) rows.push_back(r);
        if (want("indexer")) for (auto& r : check_indexer(seed, quick)) rows.push_back(r);
        if (want("attention")) for (auto& r : check_attention(seed, quick)) rows.push_back(r);
        if (want("prefill")) for (auto& r : check_attention_prefill(seed, quick)) rows.push_back(r);
        if (want("embedding")) for (auto& r : check_embedding(seed, quick)) rows.push_back(r);
        if (want("norm_rope")) for (auto& r : check_norm_rope(seed, quick)) rows.push_back(r);
        if (want("quantize_act")) for (auto& r : check_quantize_act(seed, quick)) rows.push_back(r);
        if (want("hc")) for (auto& r : check_hyper_connection(seed, quick)) rows.push_back(r);
        if (want("sampling")) for (auto& r : check_sampling(seed, quick)) rows.push_back(r);
        if (want("gemm")) for (auto& r : check_gemm(seed, quick)) rows.push_back(r);
        if (want("gemm_f16")) for (auto& r : check_gemm_f16(seed, quick)) rows.push_back(r);
        if (want("moe_gemm")) for (auto& r : check_moe_gemm(seed, quick)) rows.push_back(r);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ds4-validate: %s\n", e.what());
        return 1;
    }
    int fails = 0;
    std::printf("%-16s %-44s %-8s %12s %8s %9s %-5s %s\n", "kernel", "shape", "contract", "max|diff|", "max ulp",
                "nan/inf", "", "note");
    for (const auto& r : rows) {
        fails += !r.pass;
        std::printf("%-16s %-44s %-8s %12.3g %8llu %9s %-5s %s\n", r.kernel.c_str(), r.shape.c_str(), r.contract.c_str(),
                    r.cmp.max_abs, static_cast<unsigned long long>(r.cmp.max_ulp),
                    r.cmp.special_mismatches ? "MISMATCH" : "ok", r.pass ? "PASS" : "FAIL", r.note.c_str());
    }
    std::printf("%zu checks, %d failed\n", rows.size(), fails);
    return fails ? 1 : 0;
}
