#include "reference/parallel.hpp"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ds4::ref {
namespace {

int default_threads() {
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : static_cast<int>(hw);
}

thread_local bool inside_pool_job = false;

// Workers sleep on a generation counter; the caller publishes a job, runs chunk 0 itself and
// waits until every worker has reported. One job at a time (the reference is single-caller).
class pool {
public:
    explicit pool(int n_threads) {
        for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { run(i); });
    }
    ~pool() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
            ++generation_;
        }
        wake_.notify_all();
        for (auto& t : workers_) t.join();
    }
    int size() const { return static_cast<int>(workers_.size()) + 1; }

    void execute(int n_chunks, const std::function<void(int)>& chunk) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            job_ = &chunk;
            n_chunks_ = n_chunks;
            pending_ = size() - 1;
            error_ = nullptr;
            ++generation_;
        }
        wake_.notify_all();
        std::exception_ptr mine;
        try {
            run_chunks(0, chunk);
        } catch (...) {
            mine = std::current_exception();
        }
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, [this] { return pending_ == 0; });
        job_ = nullptr;
        if (mine) std::rethrow_exception(mine);
        if (error_) std::rethrow_exception(error_);
    }

private:
    // Thread t runs chunks t, t + size, ... (chunks never outnumber threads in parallel_for).
    void run_chunks(int t, const std::function<void(int)>& chunk) {
        struct flag {
            flag() { inside_pool_job = true; }
            ~flag() { inside_pool_job = false; }
        } guard;
        for (int c = t; c < n_chunks_; c += size()) chunk(c);
    }

    void run(int index) {
        std::uint64_t seen = 0;
        for (;;) {
            const std::function<void(int)>* job;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                wake_.wait(lock, [&] { return generation_ != seen; });
                seen = generation_;
                if (stop_) return;
                job = job_;
            }
            std::exception_ptr err;
            try {
                run_chunks(index, *job);
            } catch (...) {
                err = std::current_exception();
            }
            std::lock_guard<std::mutex> lock(mutex_);
            if (err && !error_) error_ = err;
            if (--pending_ == 0) done_.notify_one();
        }
    }

    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    const std::function<void(int)>* job_ = nullptr;
    int n_chunks_ = 0;
    int pending_ = 0;
    std::uint64_t generation_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

std::mutex config_mutex;
int requested_threads = 0;
std::unique_ptr<pool> the_pool;

pool& get_pool() {
    std::lock_guard<std::mutex> lock(config_mutex);
    const int want = requested_threads > 0 ? requested_threads : default_threads();
    if (!the_pool || the_pool->size() != want) {
        the_pool.reset();
        the_pool = std::make_unique<pool>(want);
    }
    return *the_pool;
}

}  // namespace

void set_thread_count(int n) {
    std::lock_guard<std::mutex> lock(config_mutex);
    requested_threads = n < 0 ? 0 : n;
}

int thread_count() {
    std::lock_guard<std::mutex> lock(config_mutex);
    return requested_threads > 0 ? requested_threads : default_threads();
}

void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body,
                  std::int64_t min_chunk) {
    if (n <= 0) return;
    if (min_chunk < 1) min_chunk = 1;
    if (inside_pool_job || n <= min_chunk) {
        body(0, n);
        return;
    }
    pool& p = get_pool();
    const std::int64_t by_size = (n + min_chunk - 1) / min_chunk;
    const int n_chunks = static_cast<int>(std::min<std::int64_t>(p.size(), by_size));
    if (n_chunks <= 1) {
        body(0, n);
        return;
    }
    const std::function<void(int)> chunk = [&](int c) {
        const std::int64_t begin = n * c / n_chunks, end = n * (c + 1) / n_chunks;
        if (begin < end) body(begin, end);
    };
    p.execute(n_chunks, chunk);
}

}  // namespace ds4::ref
