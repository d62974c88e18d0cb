#pragma once
// Per-device host state of the kernel launchers: what a device can run (a capability probe) and
// which shared-memory limits were raised on it. Keyed by the current device, shared by every
// thread: a server thread that captures a graph sees what another thread prepared, and two
// devices in one process never see each other's answers (a thread_local cache did both wrong).
//
// Probes and opt-ins run before capture (a family's prepare_*(device), or an eager launch); a
// launch recorded into a CUDA graph finds them done. A probe may allocate, launch and copy, none
// of which a stream capture allows, so a launch made during capture on an unprepared device
// fails with a ds4::error naming the kernel instead of invalidating the capture.
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <string>

#include "ds4/core/cuda_check.hpp"

namespace ds4 {

inline constexpr int max_devices = 64;

inline int current_device() {
    int dev = 0;
    cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    require(dev >= 0 && dev < max_devices, "device " + std::to_string(dev) + " beyond the " +
                                               std::to_string(max_devices) + " devices ds4 keeps state for");
    return dev;
}

// Whether `stream` is recording a graph (cudaStreamIsCapturing is legal during capture).
inline bool stream_capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cuda_check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
}

// Runs `device`'s body with it as the current device, restoring the caller's.
template <class Body>
void with_device(int device, Body&& body) {
    require(device >= 0 && device < max_devices, "device " + std::to_string(device) + " out of range");
    int prev = 0;
    cuda_check(cudaGetDevice(&prev), "cudaGetDevice");
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    try {
        body();
    } catch (...) {
        (void)cudaSetDevice(prev);
        throw;
    }
    cuda_check(cudaSetDevice(prev), "cudaSetDevice");
}

// A value computed once per device by a probe, thread-safe; `ready` tells without probing.
template <class T>
class per_device_once {
public:
    template <class Probe>
    const T& get(int device, Probe&& probe) {
        std::call_once(once_[device], [&] {
            value_[device] = probe(device);
            done_[device].store(true, std::memory_order_release);
        });
        return value_[device];
    }
    bool ready(int device) const { return done_[device].load(std::memory_order_acquire); }

private:
    std::once_flag once_[max_devices];
    T value_[max_devices]{};
    std::atomic<bool> done_[max_devices]{};
};

// Fails when a launch recorded into a graph would have to probe: `kernel` names the launcher.
inline void require_prepared(bool prepared, cudaStream_t stream, const char* kernel, const char* prepare) {
    if (prepared || !stream_capturing(stream)) return;
    fail(std::string(kernel) + ": launched during stream capture on a device that was not prepared; call " + prepare +
         " (or ds4::kernels::prepare_device) before capturing");
}

}  // namespace ds4
