#pragma once
// The checks ds4-validate runs, one function per kernel family. Each draws fresh random inputs
// from `seed`, poisons the outputs, runs the kernel and the reference, and returns table rows.
// `quick` picks small and odd shapes only (the GPU tests under ctest); the full run adds the
// real DeepSeek-V4-Flash shapes.
#include <cstdint>
#include <vector>

#include "harness/validate/compare.hpp"

namespace ds4::validate {

std::vector<check_row> check_matvec(std::uint64_t seed, bool quick);
std::vector<check_row> check_moe(std::uint64_t seed, bool quick);
std::vector<check_row> check_compressor(std::uint64_t seed, bool quick);
std::vector<check_row> check_indexer(std::uint64_t seed, bool quick);
std::vector<check_row> check_attention(std::uint64_t seed, bool quick);
std::vector<check_row> check_attention_prefill(std::uint64_t seed, bool quick);
std::vector<check_row> check_embedding(std::uint64_t seed, bool quick);
std::vector<check_row> check_norm_rope(std::uint64_t seed, bool quick);
std::vector<check_row> check_quantize_act(std::uint64_t seed, bool quick);
std::vector<check_row> check_hyper_connection(std::uint64_t seed, bool quick);
std::vector<check_row> check_sampling(std::uint64_t seed, bool quick);
std::vector<check_row> check_gemm(std::uint64_t seed, bool quick);
std::vector<check_row> check_gemm_f16(std::uint64_t seed, bool quick);
std::vector<check_row> check_moe_gemm(std::uint64_t seed, bool quick);

}  // namespace ds4::validate
