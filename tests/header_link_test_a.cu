// Every public header in two CUDA translation units of one program (this file and
// header_link_test_b.cu, plus header_link_test_c.cpp for the C++ compiler): a namespace-scope
// definition in a header that is neither inline nor a template (a __global__ kernel, which cannot
// be inline, a host or device function, a variable) is then defined twice and the link fails with
// "multiple definition". Built with nvcc and run without a device, so it is a CPU test.
// The include list is written out: a new header belongs here.
#include <doctest/doctest.h>

#include "ds4/core/byte_perm.hpp"
#include "ds4/core/copy_words.cuh"
#include "ds4/core/cuda_check.hpp"
#include "ds4/core/cuda_graph.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/host_device.hpp"
#include "ds4/core/hyper_connection.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/per_device.hpp"
#include "ds4/core/reduce.hpp"
#include "ds4/core/rng.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/core/smem_limit.hpp"
#include "ds4/format/e2m1.hpp"
#include "ds4/format/e4m3.hpp"
#include "ds4/format/formats.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/iq2_xxs_tables.hpp"
#include "ds4/format/minifloat.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q4_k.hpp"
#include "ds4/format/q8_0.hpp"
#include "ds4/format/q8_k.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/format/types.hpp"
#include "ds4/gguf/layout.hpp"
#include "ds4/gguf/reader.hpp"
#include "ds4/gguf/writer.hpp"
#include "ds4/kernels/attention_decode.cuh"
#include "ds4/kernels/attention_decode_mma.cuh"
#include "ds4/kernels/attention_mma.cuh"
#include "ds4/kernels/attention_prefill.cuh"
#include "ds4/kernels/attention_split_plan.hpp"
#include "ds4/kernels/attention_wgmma.cuh"
#include "ds4/kernels/check_in.cuh"
#include "ds4/kernels/compressor.cuh"
#include "ds4/kernels/embedding.cuh"
#include "ds4/kernels/gemm_f16.cuh"
#include "ds4/kernels/gemm_f16_tc.cuh"
#include "ds4/kernels/gemm_q8_0.cuh"
#include "ds4/kernels/gemm_q8_0_launch.hpp"
#include "ds4/kernels/gemm_q8_0_wgmma.cuh"
#include "ds4/kernels/gemm_q8_0_wgmma_tile.hpp"
#include "ds4/kernels/hyper_connection.cuh"
#include "ds4/kernels/hyper_connection_chunk.cuh"
#include "ds4/kernels/hyper_connection_chunk_layout.hpp"
#include "ds4/kernels/hyper_connection_grid.hpp"
#include "ds4/kernels/indexer.cuh"
#include "ds4/kernels/indexer_int8.hpp"
#include "ds4/kernels/kv_store.cuh"
#include "ds4/kernels/matvec.cuh"
#include "ds4/kernels/matvec_f16_tc.cuh"
#include "ds4/kernels/moe.cuh"
#include "ds4/kernels/moe_block_dot.hpp"
#include "ds4/kernels/moe_gemm.cuh"
#include "ds4/kernels/moe_gemm_wgmma.cuh"
#include "ds4/kernels/moe_gemm_launch.cuh"
#include "ds4/kernels/moe_gemm_wgmma_layout.hpp"
#include "ds4/kernels/norm_rope.cuh"
#include "ds4/kernels/prepare.cuh"
#include "ds4/kernels/quantize_act.cuh"
#include "ds4/kernels/sampling.cuh"
#include "ds4/kernels/warp_halving.cuh"
#include "ds4/kernels/wgmma.cuh"
#include "ds4/kernels/wgmma_desc.hpp"
#include "ds4/kernels/wgmma_operand.hpp"
#include "ds4/kernels/wgmma_s8.cuh"
#include "ds4/model/kv_layout.hpp"
#include "ds4/model/metadata.hpp"
#include "ds4/model/shape.hpp"
#include "ds4/model/tensors.hpp"
#include "ds4/model/validate.hpp"

// One in each .cu unit, so that both instantiate and take the address of the same kernel template.
using kv_store_kernel_ptr = void (*)(ds4::kernels::kv_store_launch);
kv_store_kernel_ptr header_link_kernel_a();
kv_store_kernel_ptr header_link_kernel_b();

kv_store_kernel_ptr header_link_kernel_a() { return &ds4::kernels::kv_store_kernel<>; }

// The test is that this program links. The two addresses are not compared: without -rdc nvcc
// gives a kernel template's host stub internal linkage, one per unit (nm: local `t` symbols).
TEST_CASE("header_link: every public header, two translation units, one program") {
    const bool both_taken = header_link_kernel_a() != nullptr && header_link_kernel_b() != nullptr;
    CHECK(both_taken);  // a bool: doctest cannot print a function pointer
}
