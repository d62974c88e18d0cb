// A graph-mode kernel timeline without nsys (the GPU machine has only ncu): a CUPTI injection
// library. CUDA_INJECTION64_PATH=<build>/bench/libds4_timeline.so makes the driver load it into
// any CUDA process (ds4-bench, a server); it records every kernel's start and end (concurrent
// kernel records, so graph nodes of a replayed step each get their own record with the graph's
// id and the node's id) and writes them at exit to $DS4_TIMELINE (default timeline.csv) as
// start,end,stream,corr,graph,node,gx,gy,bx,smem,name. bench/timeline_summary.py reads it.
// Cost: decode at 2K ran 113.6 -> 109.7 tok/s with it (H200): read it as a shape, not a figure.
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct kernel_record {
    std::uint64_t start, end;
    std::uint32_t stream, correlation, graph;
    std::uint64_t node;
    int grid_x, grid_y, block_x, smem;
    std::string name;
};

// Leaked on purpose: the exit handler runs after static destructors may have begun.
std::vector<kernel_record>* records = new std::vector<kernel_record>;
std::mutex records_mutex;

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
    *size = std::size_t(4) << 20;
    *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, *size));
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
    CUpti_Activity* r = nullptr;
    std::lock_guard<std::mutex> lock(records_mutex);
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
        records->push_back({k->start, k->end, k->streamId, k->correlationId, k->graphId, k->graphNodeId, k->gridX,
                            k->gridY, k->blockX, k->dynamicSharedMemory + k->staticSharedMemory,
                            k->name != nullptr ? k->name : "?"});
    }
    std::free(buffer);
}

// The records still in CUPTI's buffers when a context goes away would otherwise be lost.
void CUPTIAPI on_resource(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void*) {
    if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING)
        cuptiActivityFlushAll(1);
}

void write_timeline() {
    cuptiActivityFlushAll(1);
    const char* path = std::getenv("DS4_TIMELINE");
    if (path == nullptr) path = "timeline.csv";
    FILE* f = std::fopen(path, "w");
    if (f == nullptr) {
        std::fprintf(stderr, "timeline: cannot write %s\n", path);
        return;
    }
    std::fprintf(f, "start,end,stream,corr,graph,node,gx,gy,bx,smem,name\n");
    std::lock_guard<std::mutex> lock(records_mutex);
    for (const kernel_record& k : *records)
        std::fprintf(f, "%llu,%llu,%u,%u,%u,%llu,%d,%d,%d,%d,%s\n", static_cast<unsigned long long>(k.start),
                     static_cast<unsigned long long>(k.end), k.stream, k.correlation, k.graph,
                     static_cast<unsigned long long>(k.node), k.grid_x, k.grid_y, k.block_x, k.smem, k.name.c_str());
    std::fclose(f);
    std::fprintf(stderr, "timeline: %zu kernels in %s\n", records->size(), path);
}

}  // namespace

extern "C" int InitializeInjection(void) {
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        std::fprintf(stderr, "timeline: CUPTI activity tracing unavailable; no timeline\n");
        return 0;
    }
    CUpti_SubscriberHandle subscriber;
    if (cuptiSubscribe(&subscriber, on_resource, nullptr) == CUPTI_SUCCESS)
        cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING);
    std::atexit(write_timeline);
    std::fprintf(stderr, "timeline: recording kernels\n");
    return 1;
}
