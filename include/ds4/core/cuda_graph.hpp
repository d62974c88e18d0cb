#pragma once
// An instantiated CUDA graph: the launches a callable makes on a stream, recorded once and
// replayed with launch(stream). Owns the cudaGraph_t and its cudaGraphExec_t; move-only.
// Capture is thread-local (another thread's unrelated CUDA calls do not invalidate it) and on the
// caller's stream, which must be a created stream: the legacy default stream cannot capture.
// A body that throws ends the capture before the error propagates, so the stream stays usable.
#include <cuda_runtime.h>

#include <utility>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/launch.hpp"

namespace ds4 {

// An owned non-blocking stream (it does not wait on the legacy default stream, so pageable
// cudaMemcpy is not ordered with it: copy with cudaMemcpyAsync on it, as the harness does).
class cuda_stream {
public:
    cuda_stream() { cuda_check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }
    cuda_stream(cuda_stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    cuda_stream& operator=(cuda_stream&& o) noexcept {
        if (this != &o) {
            if (s_) cudaStreamDestroy(s_);
            s_ = std::exchange(o.s_, nullptr);
        }
        return *this;
    }
    cuda_stream(const cuda_stream&) = delete;
    cuda_stream& operator=(const cuda_stream&) = delete;
    ~cuda_stream() {
        if (s_) cudaStreamDestroy(s_);
    }
    cudaStream_t get() const { return s_; }
    operator cudaStream_t() const { return s_; }
    void synchronize(const char* what = "cudaStreamSynchronize") const { cuda_check(cudaStreamSynchronize(s_), what); }

private:
    cudaStream_t s_ = nullptr;
};

class cuda_graph {
public:
    cuda_graph() = default;

    template <class Body>
    cuda_graph(cudaStream_t stream, Body&& body) {
        require(stream != nullptr, "cuda_graph: capture needs a created stream, not the legacy default stream");
        cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
        try {
            body();
        } catch (...) {
            cudaGraph_t partial = nullptr;
            if (cudaStreamEndCapture(stream, &partial) == cudaSuccess && partial) cudaGraphDestroy(partial);
            (void)cudaGetLastError();
            throw;
        }
        cuda_check(cudaStreamEndCapture(stream, &graph_), "cudaStreamEndCapture");
        // Node priorities only once a stream of non-default priority exists (launch.hpp): a launch
        // on it keeps its priority in the graph. Otherwise the plain instantiation.
        const cudaError_t e = cudaGraphInstantiate(
            &exec_, graph_, stream_priorities_marked() ? cudaGraphInstantiateFlagUseNodePriority : 0);
        if (e != cudaSuccess) {
            exec_ = nullptr;
            reset();
            cuda_check(e, "cudaGraphInstantiate");
        }
    }

    cuda_graph(cuda_graph&& o) noexcept
        : graph_(std::exchange(o.graph_, nullptr)), exec_(std::exchange(o.exec_, nullptr)) {}
    cuda_graph& operator=(cuda_graph&& o) noexcept {
        if (this != &o) {
            reset();
            graph_ = std::exchange(o.graph_, nullptr);
            exec_ = std::exchange(o.exec_, nullptr);
        }
        return *this;
    }
    cuda_graph(const cuda_graph&) = delete;
    cuda_graph& operator=(const cuda_graph&) = delete;
    ~cuda_graph() { reset(); }

    // Enqueues one replay on `stream`; asynchronous like any launch.
    void launch(cudaStream_t stream) const {
        require(exec_ != nullptr, "cuda_graph::launch: no graph was captured");
        cuda_check(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
    }

    explicit operator bool() const { return exec_ != nullptr; }
    cudaGraph_t graph() const { return graph_; }
    cudaGraphExec_t exec() const { return exec_; }

private:
    void reset() noexcept {
        if (exec_) cudaGraphExecDestroy(exec_);
        if (graph_) cudaGraphDestroy(graph_);
        exec_ = nullptr;
        graph_ = nullptr;
    }
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t exec_ = nullptr;
};

}  // namespace ds4
