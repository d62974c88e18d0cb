#pragma once
// A fixed thread pool for the CPU reference (issue item 5: use the cores without changing any
// result). parallel_for splits [0, n) into contiguous chunks, one per thread; each index is
// handled by exactly one thread running the same sequential code, so every output value is
// computed in the same order whatever the thread count. Nested calls run inline.
#include <cstdint>
#include <functional>

namespace ds4::ref {

// 0 selects std::thread::hardware_concurrency(). Takes effect on the next parallel_for.
void set_thread_count(int n);
int thread_count();

// body(begin, end) for disjoint chunks covering [0, n). Chunks smaller than min_chunk are not
// split further (a thread per 16 rows of a 24-row matvec is pure overhead).
void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body,
                  std::int64_t min_chunk = 1);

}  // namespace ds4::ref
