#pragma once
// The last-CTA-done count of a split reduction: every CTA of a group stores its part, counts in,
// and the one that completes the count reads every part and finishes. Shared by the MoE decode
// launches, the sampling normaliser and hc pre (its groups' blocks). The split-K matvec counts
// per warp and by segments, so it keeps its own.
#include <cuda/atomic>
#include <cuda_runtime.h>

namespace ds4::kernels {

// After the CTA's stores: counts the CTA in at `counter`; true (on every thread) for the one
// that makes it `total`, which resets it for the next launch and may read the others' stores
// (through L2: ld.cg). The barrier orders the CTA's stores before thread 0's device-scope acq_rel
// add, and the barrier after it orders the CTA's later reads after that acquire (CUTLASS's
// semaphore pattern; a fence.sc on every thread made each wait on its own stores).
__device__ __forceinline__ bool check_in(unsigned* counter, unsigned total, bool* last) {
    __syncthreads();
    if (threadIdx.x == 0) {
        cuda::atomic_ref<unsigned, cuda::thread_scope_device> c(*counter);
        *last = c.fetch_add(1u, cuda::memory_order_acq_rel) == total - 1u;
        if (*last) c.store(0u, cuda::memory_order_relaxed);
    }
    __syncthreads();
    return *last;
}

}  // namespace ds4::kernels
