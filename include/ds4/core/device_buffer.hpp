#pragma once
// Owning device allocation. Scratch on the decode path is allocated once by the caller and
// passed to kernels as raw pointers (graph contract): this type lives in hosts and tests.
#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "ds4/core/cuda_check.hpp"

namespace ds4 {

template <class T>
class device_buffer {
public:
    device_buffer() = default;
    explicit device_buffer(std::size_t n) : n_(n) {
        if (n) cuda_check(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMalloc");
    }
    explicit device_buffer(std::span<const T> host) : device_buffer(host.size()) { upload(host); }
    device_buffer(device_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
    device_buffer& operator=(device_buffer&& o) noexcept {
        if (this != &o) {
            reset();
            p_ = std::exchange(o.p_, nullptr);
            n_ = std::exchange(o.n_, 0);
        }
        return *this;
    }
    device_buffer(const device_buffer&) = delete;
    device_buffer& operator=(const device_buffer&) = delete;
    ~device_buffer() { reset(); }

    T* data() const { return p_; }
    std::size_t size() const { return n_; }
    std::size_t bytes() const { return n_ * sizeof(T); }

    void upload(std::span<const T> host) {
        require(host.size() <= n_, "device_buffer::upload: host span larger than the buffer");
        cuda_check(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    }
    std::vector<T> download() const {
        std::vector<T> h(n_);
        if (n_) cuda_check(cudaMemcpy(h.data(), p_, bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
        return h;
    }
    // Fills every byte with `byte`: tests poison outputs so an unwritten element shows up.
    void fill_bytes(int byte) {
        if (n_) cuda_check(cudaMemset(p_, byte, bytes()), "cudaMemset");
    }

private:
    void reset() {
        if (p_) cudaFree(p_);
        p_ = nullptr;
        n_ = 0;
    }
    T* p_ = nullptr;
    std::size_t n_ = 0;
};

}  // namespace ds4
