#pragma once
// Every per-device probe and shared-memory opt-in of the kernel families that have one (matvec,
// MoE, flash decode exact and tensor-core, prefill attention, the prefill GEMMs), for one device: call once per
// device before capturing CUDA graphs. A launch recorded into a graph on a device that was not
// prepared (and that no eager launch prepared) fails with a ds4::error naming the kernel, rather
// than probing inside the capture. Families without probes or opt-ins (kv_store, compressor,
// indexer) need nothing. Each family's own prepare_* is in its header, for programs that use one.
#include "ds4/kernels/attention_decode_mma.cuh"
#include "ds4/kernels/attention_prefill.cuh"
#include "ds4/kernels/gemm_q8_0.cuh"
#include "ds4/kernels/matvec.cuh"
#include "ds4/kernels/moe.cuh"
#include "ds4/kernels/moe_gemm.cuh"

namespace ds4::kernels {

inline void prepare_device(int device) {
    prepare_matvec(device);
    prepare_moe(device);
    prepare_attention_decode_mma(device);  // and attention_decode's
    prepare_attention_prefill(device);
    prepare_gemm_q8_0(device);
    prepare_moe_gemm(device);
}

}  // namespace ds4::kernels
