#include "backends/cuda/cuda_backend.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <compare>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "backends/cuda/cuda_ops.hpp"
#include "backends/cuda/device_weights.hpp"
#include "backends/cuda/switch_option.hpp"
#include "ds4/core/copy_words.cuh"
#include "ds4/core/cuda_check.hpp"
#include "ds4/core/cuda_graph.hpp"
#include "ds4/core/error.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/engine/snapshot_format.hpp"
#include "ds4/engine/step_plan.hpp"
#include "ds4/graph/layer_program.hpp"
#include "ds4/kernels/sampling.cuh"
#include "ds4/model/kv_layout.hpp"
#include "ds4/model/metadata.hpp"
#include "ds4/model/validate.hpp"
#include "reference/compressor.hpp"
#include "reference/sampling.hpp"

namespace ds4::cuda_backend {
namespace {

using engine::sequence_id;
namespace snap = engine::snapshot_format;

constexpr std::size_t sz(int v) { return static_cast<std::size_t>(v); }
constexpr int page_rows = model::kv_page_rows;

// Device pages of one row kind with host bookkeeping: ids, reference counts, a free list.
class page_pool {
public:
    page_pool(int row_bytes, std::int64_t pages) : row_bytes_(row_bytes), refs_(std::size_t(pages), 0) {
        require(pages > 0 && pages < INT32_MAX, "cuda backend: KV pool of " + std::to_string(pages) + " pages");
        cuda_check(cudaMalloc(&arena_, std::size_t(pages) * page_bytes()), "cudaMalloc KV pages");
        for (std::int64_t p = pages - 1; p >= 0; --p) free_.push_back(std::int32_t(p));
    }
    ~page_pool() { cudaFree(arena_); }
    page_pool(const page_pool&) = delete;
    page_pool& operator=(const page_pool&) = delete;

    std::uint8_t* arena() const { return static_cast<std::uint8_t*>(arena_); }
    std::size_t page_bytes() const { return std::size_t(row_bytes_) * page_rows; }
    int row_bytes() const { return row_bytes_; }
    std::size_t free_pages() const { return free_.size(); }
    std::size_t in_use() const { return refs_.size() - free_.size(); }
    std::size_t capacity() const { return refs_.size(); }
    std::uint8_t* row(std::int32_t page, std::int64_t r) const {
        return arena() + std::size_t(page) * page_bytes() + std::size_t(r % page_rows) * std::size_t(row_bytes_);
    }

    std::int32_t allocate() {
        require(!free_.empty(), "cuda backend: KV pool exhausted");
        const std::int32_t id = free_.back();
        free_.pop_back();
        refs_[std::size_t(id)] = 1;
        return id;
    }
    void retain(std::int32_t id) { ++refs_[std::size_t(id)]; }
    void release(std::int32_t id) {
        if (--refs_[std::size_t(id)] == 0) free_.push_back(id);
    }
    bool shared(std::int32_t id) const { return refs_[std::size_t(id)] > 1; }

private:
    void* arena_ = nullptr;
    int row_bytes_;
    std::vector<int> refs_;
    std::vector<std::int32_t> free_;
};

// One layer's page tables (page ids by row / 64; -1 = no page).
struct layer_tables {
    std::vector<std::int32_t> raw, comp, idx;
};

struct sequence {
    std::int32_t length = 0;
    std::vector<layer_tables> layers;
    compressor_slots state;
    float* state_block = nullptr;   // every layer's frontiers and rings, one allocation
    std::size_t state_floats = 0;
    std::vector<std::int32_t> ring_pos;  // position whose frontier ring slot k holds, -1 none
};

// Per-step host inputs of one sub-batch, laid out in a pinned region and copied in one transfer.
struct sub_layout {
    std::size_t off = 0, bytes = 0;
    std::size_t n_live, tokens, pos, upos, row_slot, one, iota, n_comp, raw, comp, idx, row_state, run_rows, save_slot,
        params, saves, adjust_off;
    std::size_t n_saves = 0;
    std::size_t save_entries = 0;  // the save table's entries: n_saves, or padded (bucketed steps)
};

// One frontier save of a sub-batch's pre-save launch: n words from src to dst.
struct frontier_copy {
    const std::uint32_t* src;
    std::uint32_t* dst;
    std::uint64_t n;
};

// Every frontier save of a sub-batch whose run saves from its first row, in one launch (they
// would otherwise be one copy per sequence and compressed layer, between the layer's launches).
// A save is up to 512 KB (a ratio-128 layer's compressor state): the grid's CTAs copy it through
// core/copy_words.cuh (one 4-byte load and store at a time over 8 CTAs a save waited an L2 round
// trip per word: 26 us of a decode step at 2K on the H200, the graph's first node).
constexpr int frontier_copy_threads = 256;
constexpr int frontier_copy_pieces = 4;
constexpr std::uint64_t frontier_copy_words_per_cta = std::uint64_t(frontier_copy_threads) * frontier_copy_pieces * 4;

__global__ void __launch_bounds__(frontier_copy_threads) copy_frontiers(const frontier_copy* copies) {
    pdl_enter();
    const frontier_copy c = copies[blockIdx.y];
    copy_words<frontier_copy_pieces>(c.src, c.dst, c.n, std::uint64_t(blockIdx.x) * frontier_copy_threads + threadIdx.x,
                                     std::uint64_t(gridDim.x) * frontier_copy_threads);
}

// The sampler adjustments (engine::sampler::adjust) of a sub-batch's rows, added to the output
// head's logits before the sampling launch: row r's entries are [off[r], off[r + 1]) of `entries`
// (each token at most once in a row, so the threads' adds never meet; one float add each, as
// engine::apply_adjust).
__global__ void __launch_bounds__(256)
    add_logit_adjust(const std::int32_t* off, const engine::logit_adjust* entries, float* logits, std::int64_t stride) {
    pdl_enter();
    const int r = int(blockIdx.x);
    float* row = logits + std::int64_t(r) * stride;
    for (std::int32_t i = off[r] + std::int32_t(threadIdx.x); i < off[r + 1]; i += std::int32_t(blockDim.x)) {
        const engine::logit_adjust a = entries[i];
        row[a.token] = row[a.token] + a.delta;
    }
}

class cuda_engine final : public engine::backend {
public:
    cuda_engine(const std::filesystem::path& path, const options& o) : opts_(o) {
        require(o.max_rollback >= 0 && o.max_rows_per_step > 0,
                "cuda backend: max_rollback must be >= 0 and max_rows_per_step > 0");
        int n = 0;
        cuda_check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
        require(o.device >= 0 && o.device < n, "cuda backend: device " + std::to_string(o.device) + " of " +
                                                   std::to_string(n));
        cuda_check(cudaSetDevice(o.device), "cudaSetDevice");
        cudaDeviceProp prop{};
        cuda_check(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
        name_ = "cuda:" + std::to_string(o.device) + " (" + prop.name + ")";
        file_.emplace(gguf::file::open(path));
        d_ = model::expected_dims(*file_);
        model::require_valid(*file_, d_);
        require(d_.n_hc <= 8 && d_.indexer_head_dim == 128,
                "cuda backend: the kernels need n_hc <= 8 and 128-wide indexer rows");
        weights_.emplace(*file_, d_, std::uint64_t(1) << 30);
        cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");

        const model::attention_row_layout attn_row{d_.head_dim, d_.n_rot};
        const model::indexer_row_layout idx_row{d_.indexer_head_dim};
        std::size_t free_b = 0, total_b = 0;
        // The op set's workspace (the chunk's activations, the MoE GEMM's, ~3.2 GiB for
        // 2048-row chunks of flash) first, the KV pools from what it leaves: sized the other way
        // round, the default pools took 90% of the memory after the weights and the workspace's
        // allocation failed (a 36-layer flash on an 80 GB card).
        cuda_check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
        try {
            ops_.emplace(d_, weights_->weights(), cuda_ops::kv_arenas{}, stream_, o.device, o.exact, o.chunk_rows);
            cuda_check(cudaStreamSynchronize(stream_), "cuda backend: op set workspace");
        } catch (const std::exception& e) {
            fail(std::string(e.what()) + "\ncuda backend: the op set's workspace for " + std::to_string(o.chunk_rows) +
                 "-row prefill chunks did not fit the " + std::to_string(free_b) +
                 " bytes free after the weights; a smaller chunk (--chunk-rows) needs less");
        }
        cuda_check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
        std::uint64_t kv = o.kv_capacity_bytes;
        if (kv == 0) {
            const std::uint64_t left = free_b > (std::uint64_t(1) << 30) ? free_b - (std::uint64_t(1) << 30) : 0;
            kv = std::min<std::uint64_t>(std::uint64_t(16) << 30, left / 10 * 9);
        }
        const std::uint64_t attn_page = std::uint64_t(attn_row.bytes()) * page_rows;
        const std::uint64_t idx_page = std::uint64_t(idx_row.bytes()) * page_rows;
        attn_pool_.emplace(attn_row.bytes(), std::int64_t(kv / 100 * 88 / attn_page));
        idx_pool_.emplace(idx_row.bytes(), std::max<std::int64_t>(1, std::int64_t(kv / 100 * 12 / idx_page)));
        ops_->set_kv(cuda_ops::kv_arenas{attn_pool_->arena(), idx_pool_->arena()});
        for (int il = 0; il < d_.n_layer; ++il) {
            const int r = d_.ratio_of(il);
            init_attn_.push_back(r != 0 ? ref::make_compressor_state(r, d_.head_dim) : ref::compressor_state{});
            init_idx_.push_back(r == 4 ? ref::make_compressor_state(4, d_.indexer_head_dim) : ref::compressor_state{});
        }
        for (step_buffers& B : bufs_)
            cuda_check(cudaEventCreateWithFlags(&B.done, cudaEventDisableTiming), "cudaEventCreate");
        if (const char* t = std::getenv("DS4_OP_TIMING"); t != nullptr && std::string_view(t) == "1")
            ops_->profiler().enable(true);
        if (const char* g = std::getenv("DS4_CUDA_GRAPHS"); g != nullptr && std::string_view(g) == "0") graphs_on_ = false;
        // DS4_VERIFY_RUNS=0: a run of several rows of one sequence takes the chunk path in the
        // compressors (a launch per row) and its step is not captured (A/B).
        verify_runs_ = switch_option("DS4_VERIFY_RUNS", std::getenv("DS4_VERIFY_RUNS"), true);
        // DS4_COMPRESSOR_TAIL=0: a chunk's rows that save their frontiers take a compressor
        // launch and one or two copies each instead of one run-form launch (A/B).
        tail_runs_ = switch_option("DS4_COMPRESSOR_TAIL", std::getenv("DS4_COMPRESSOR_TAIL"), true);
        // DS4_GRAPH_BUCKETS=0: a captured step is keyed by its row count (A/B).
        buckets_on_ = switch_option("DS4_GRAPH_BUCKETS", std::getenv("DS4_GRAPH_BUCKETS"), true);
        sequence init = new_sequence();
        upload_initial_state(init);
        init_block_ = init.state_block;
        cuda_check(cudaStreamSynchronize(stream_), "cuda backend setup");
    }

    ~cuda_engine() override {
        cudaSetDevice(opts_.device);
        cudaStreamSynchronize(stream_);
        graphs_.clear();
        for (auto& [id, s] : seqs_) drop(s);
        seqs_.clear();
        ops_.reset();
        if (init_block_) cudaFreeAsync(init_block_, stream_);
        release_step_buffers();
        cudaStreamSynchronize(stream_);
        cudaStreamDestroy(stream_);
    }

    const model::model_dims& dims() const override { return d_; }

    engine::capabilities caps() const override {
        engine::capabilities c;
        c.name = name_;
        c.max_rows_per_step = opts_.max_rows_per_step;
        c.max_in_flight = max_in_flight;
        c.page_rows = page_rows;
        c.max_rollback = opts_.max_rollback;
        c.max_draft = 0;
        c.exact = opts_.exact;
        c.logit_adjust = true;
        c.prefill_rows = ops_->chunk_rows();
        return c;
    }

    engine::memory_ledger memory() const override {
        engine::memory_ledger m;
        m.weights = weights_->bytes();
        m.kv_used = attn_pool_->in_use() * attn_pool_->page_bytes() + idx_pool_->in_use() * idx_pool_->page_bytes();
        m.kv_capacity = attn_pool_->capacity() * attn_pool_->page_bytes() + idx_pool_->capacity() * idx_pool_->page_bytes();
        m.kv_pages_used = std::int64_t(attn_pool_->in_use() + idx_pool_->in_use());
        m.sequences = std::int32_t(seqs_.size());
        for (const auto& [id, s] : seqs_) m.sequence_state += s.state_floats * sizeof(float);
        m.scratch = ops_->scratch_bytes();
        for (const step_buffers& B : bufs_) m.scratch += B.dev_in_bytes + B.dev_out_bytes + B.dev_logits_bytes;
        cudaSetDevice(opts_.device);
        std::size_t f = 0, t = 0;
        if (cudaMemGetInfo(&f, &t) == cudaSuccess) {
            m.device_free = f;
            m.device_total = t;
        }
        return m;
    }

    std::uint64_t sequence_bytes(std::int32_t length) const override {
        require(length >= 0, "sequence_bytes: negative length " + std::to_string(length));
        auto pages = [](std::int64_t rows) { return (rows + page_rows - 1) / page_rows; };
        std::uint64_t b = 0;
        const std::int64_t raw = std::min<std::int64_t>(length, d_.n_swa + opts_.max_rollback) + page_rows;
        for (int il = 0; il < d_.n_layer; ++il) {
            b += std::uint64_t(pages(raw)) * attn_pool_->page_bytes();
            const int r = d_.ratio_of(il);
            if (r == 0) continue;
            b += std::uint64_t(pages(length / r)) * attn_pool_->page_bytes();
            if (r == 4) b += std::uint64_t(pages(length / r)) * idx_pool_->page_bytes();
        }
        return b + state_floats() * sizeof(float);
    }

    sequence_id create() override {
        on_device();
        sequence s = new_sequence();
        init_state(s);
        const sequence_id id = next_id_++;
        seqs_.emplace(id, std::move(s));
        return id;
    }

    sequence_id fork(sequence_id source) override {
        on_device();
        const sequence& src = get(source, "fork");
        sequence s = new_sequence();
        s.length = src.length;
        s.layers = src.layers;
        s.ring_pos = src.ring_pos;
        for (const layer_tables& t : s.layers) {
            for (std::int32_t p : t.raw)
                if (p >= 0) attn_pool_->retain(p);
            for (std::int32_t p : t.comp)
                if (p >= 0) attn_pool_->retain(p);
            for (std::int32_t p : t.idx)
                if (p >= 0) idx_pool_->retain(p);
        }
        cuda_check(cudaMemcpyAsync(s.state_block, src.state_block, s.state_floats * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream_),
                   "fork: compressor state copy");
        const sequence_id id = next_id_++;
        seqs_.emplace(id, std::move(s));
        return id;
    }

    void free(sequence_id id) override {
        on_device();
        sequence& s = get(id, "free");
        drop(s);
        seqs_.erase(id);
    }

    std::int32_t length(sequence_id id) const override { return get(id, "length").length; }

    void truncate(sequence_id id, std::int32_t length) override {
        on_device();
        sequence& s = get(id, "truncate");
        require(length >= 0 && length <= s.length, "truncate: " + engine::sequence_name(id) + " has length " +
                                                       std::to_string(s.length) + "; cannot truncate to " +
                                                       std::to_string(length));
        if (length == s.length) return;
        require(s.length - length <= opts_.max_rollback,
                "truncate: " + engine::sequence_name(id) + " from " + std::to_string(s.length) + " to " +
                    std::to_string(length) + " is beyond the rollback reach of " + std::to_string(opts_.max_rollback) +
                    " positions");
        const int k = length % ring();
        const bool any_compressed = std::any_of(s.state.layers.begin(), s.state.layers.end(),
                                                [](const compressor_slots::layer& l) { return l.attn != nullptr; });
        require(!any_compressed || s.ring_pos[std::size_t(k)] == length,
                "truncate: " + engine::sequence_name(id) + " has no compressor frontier at position " +
                    std::to_string(length) + " (positions before a restore cannot be rolled back to)");
        for (const compressor_slots::layer& l : s.state.layers) {
            auto back = [&](float* base, std::size_t floats) {
                if (base == nullptr) return;
                cuda_check(cudaMemcpyAsync(base, base + std::size_t(1 + k) * 2 * floats, 2 * floats * sizeof(float),
                                           cudaMemcpyDeviceToDevice, stream_),
                           "truncate: frontier restore");
            };
            back(l.attn, l.attn_floats);
            back(l.idx, l.idx_floats);
        }
        for (std::int32_t& p : s.ring_pos)
            if (p >= length) p = -1;
        s.length = length;
    }

    std::vector<std::byte> snapshot(sequence_id id) const override {
        on_device();
        const sequence& s = get(id, "snapshot");
        cuda_check(cudaStreamSynchronize(stream_), "snapshot: pending work");
        snap::writer w;
        snap::put_shape(w, d_);
        w.put(s.length);
        const std::size_t ab = sz(attn_pool_->row_bytes()), ib = sz(idx_pool_->row_bytes());
        std::vector<std::byte> run(std::max(ab, ib) * page_rows);
        // Rows [first, first + n) of a table, one copy per page.
        auto put_rows = [&](const page_pool& pool, const std::vector<std::int32_t>& table, std::int64_t first,
                            std::int64_t n) {
            for_page_runs(first, n, [&](std::int64_t r0, std::int64_t count) {
                const std::int32_t page = table.at(std::size_t(r0 / page_rows));
                require(page >= 0, "snapshot: internal error, row " + std::to_string(r0) + " has no page");
                const std::size_t bytes = std::size_t(count) * sz(pool.row_bytes());
                cuda_check(cudaMemcpy(run.data(), pool.row(page, r0), bytes, cudaMemcpyDeviceToHost), "snapshot: rows");
                w.bytes(run.data(), bytes);
            });
        };
        auto put_state = [&](const float* base, std::size_t floats) {
            std::vector<float> h(2 * floats);
            cuda_check(cudaMemcpy(h.data(), base, h.size() * sizeof(float), cudaMemcpyDeviceToHost),
                       "snapshot: frontier copy");
            w.bytes(h.data(), h.size() * sizeof(float));
        };
        for (int il = 0; il < d_.n_layer; ++il) {
            const layer_tables& t = s.layers[sz(il)];
            const std::int32_t n_raw = std::min(s.length, d_.n_swa);
            put_rows(*attn_pool_, t.raw, s.length - n_raw, n_raw);
            const int r = d_.ratio_of(il);
            if (r == 0) continue;
            const std::int64_t n_comp = s.length / r;
            w.put(n_comp);
            put_rows(*attn_pool_, t.comp, 0, n_comp);
            const compressor_slots::layer& l = s.state.layers[sz(il)];
            put_state(l.attn, l.attn_floats);
            if (r != 4) continue;
            put_rows(*idx_pool_, t.idx, 0, n_comp);
            put_state(l.idx, l.idx_floats);
        }
        return snap::seal(w.out);
    }

    void restore(sequence_id id, std::span<const std::byte> blob) override {
        on_device();
        get(id, "restore");
        // Parsed completely on the host first: a bad blob throws before anything changes.
        snap::reader rd = snap::open(blob, d_);
        const std::int32_t length = rd.get<std::int32_t>("length");
        require(length >= 0, "snapshot: negative length");
        require(d_.context_length == 0 || length <= d_.context_length,
                "snapshot: length " + std::to_string(length) + " exceeds the context length");
        const std::size_t ab = sz(attn_pool_->row_bytes()), ib = sz(idx_pool_->row_bytes());
        struct layer_blob {
            std::vector<std::byte> raw, comp, idx;
            std::vector<float> attn_state, idx_state;
        };
        std::vector<layer_blob> layers(sz(d_.n_layer));
        std::size_t attn_pages = 0, idx_pages = 0;
        const std::int32_t n_raw = std::min(length, d_.n_swa);
        for (int il = 0; il < d_.n_layer; ++il) {
            layer_blob& L = layers[sz(il)];
            L.raw.resize(sz(n_raw) * ab);
            rd.bytes(L.raw.data(), L.raw.size(), "raw row");
            attn_pages += n_raw > 0 ? std::size_t((length - 1) / page_rows - (length - n_raw) / page_rows + 1) : 0;
            const int r = d_.ratio_of(il);
            if (r == 0) continue;
            const auto n_comp = rd.get<std::int64_t>("compressed row count");
            require(n_comp == std::int64_t(length) / r, "snapshot: layer " + std::to_string(il) + " has " +
                                                            std::to_string(n_comp) + " compressed rows for length " +
                                                            std::to_string(length));
            L.comp.resize(std::size_t(n_comp) * ab);
            rd.bytes(L.comp.data(), L.comp.size(), "compressed row");
            attn_pages += std::size_t((n_comp + page_rows - 1) / page_rows);
            L.attn_state.resize(2 * init_attn_[sz(il)].kv.size());
            rd.bytes(L.attn_state.data(), L.attn_state.size() * sizeof(float), "compressor state");
            if (r != 4) continue;
            L.idx.resize(std::size_t(n_comp) * ib);
            rd.bytes(L.idx.data(), L.idx.size(), "indexer row");
            idx_pages += std::size_t((n_comp + page_rows - 1) / page_rows);
            L.idx_state.resize(2 * init_idx_[sz(il)].kv.size());
            rd.bytes(L.idx_state.data(), L.idx_state.size() * sizeof(float), "indexer compressor state");
        }
        require(rd.done(), "snapshot: trailing bytes after the last layer");
        require(attn_pages <= attn_pool_->free_pages() && idx_pages <= idx_pool_->free_pages(),
                "restore: the KV pools have " + std::to_string(attn_pool_->free_pages()) + " + " +
                    std::to_string(idx_pool_->free_pages()) + " free pages; the snapshot needs " +
                    std::to_string(attn_pages) + " + " + std::to_string(idx_pages));

        sequence s = new_sequence();
        s.length = length;
        auto write_rows = [&](page_pool& pool, std::vector<std::int32_t>& table, std::int64_t first, std::int64_t n,
                              const std::vector<std::byte>& bytes, std::size_t rb) {
            for_page_runs(first, n, [&](std::int64_t r0, std::int64_t count) {
                const std::size_t e = std::size_t(r0 / page_rows);
                if (table.size() <= e) table.resize(e + 1, -1);
                if (table[e] < 0) table[e] = pool.allocate();
                cuda_check(cudaMemcpy(pool.row(table[e], r0), bytes.data() + std::size_t(r0 - first) * rb,
                                      std::size_t(count) * rb, cudaMemcpyHostToDevice),
                           "restore: rows");
            });
        };
        cuda_check(cudaStreamSynchronize(stream_), "restore: pending work");
        for (int il = 0; il < d_.n_layer; ++il) {
            layer_blob& L = layers[sz(il)];
            layer_tables& t = s.layers[sz(il)];
            write_rows(*attn_pool_, t.raw, length - n_raw, n_raw, L.raw, ab);
            const int r = d_.ratio_of(il);
            if (r == 0) continue;
            const std::int64_t n_comp = length / r;
            write_rows(*attn_pool_, t.comp, 0, n_comp, L.comp, ab);
            const compressor_slots::layer& l = s.state.layers[sz(il)];
            cuda_check(cudaMemcpy(l.attn, L.attn_state.data(), L.attn_state.size() * sizeof(float),
                                  cudaMemcpyHostToDevice),
                       "restore: frontier copy");
            if (r != 4) continue;
            write_rows(*idx_pool_, t.idx, 0, n_comp, L.idx, ib);
            cuda_check(cudaMemcpy(l.idx, L.idx_state.data(), L.idx_state.size() * sizeof(float),
                                  cudaMemcpyHostToDevice),
                       "restore: frontier copy");
        }
        sequence& old = seqs_.at(id);
        drop(old);
        old = std::move(s);
    }

    engine::step_ticket submit(const engine::step_request& step) override {
        on_device();
        const engine::step_plan p = engine::plan_step(
            step, d_, opts_.max_rows_per_step,
            [&](sequence_id s, const std::string& who) { return get(s, who).length; }, true);
        check_pages(step, p);
        // At most max_in_flight steps own buffer sets; past that the oldest is finished first
        // (its result waits in done_).
        if (int(flights_.size()) >= max_in_flight) settle(flights_.front().ticket);
        step_buffers& B = bufs_[0].busy ? bufs_[1] : bufs_[0];
        pending_step ps = run_step(step, p, B);
        cuda_check(cudaEventRecord(B.done, stream_), "step event");
        B.busy = true;
        flights_.push_back({next_ticket_, std::move(ps), &B});
        return {next_ticket_++};
    }

    engine::step_result wait(engine::step_ticket t) override {
        on_device();
        settle(t.id);
        const auto it = done_.find(t.id);
        require(it != done_.end(), "wait: ticket " + std::to_string(t.id) + " is unknown or was already waited for");
        engine::step_result r = std::move(it->second);
        done_.erase(it);
        return r;
    }

    bool set_profiling(bool on) override {
        // Steps in flight finish under the old setting.
        while (!flights_.empty()) settle(flights_.front().ticket);
        ops_->profiler().enable(on);
        return true;
    }

    std::string profile_report() const override { return ops_->profiler().report(); }

    std::vector<std::int32_t> draft(sequence_id id, std::int32_t) override {
        get(id, "draft");
        fail("draft: no MTP head is loaded (the CUDA backend has no drafter yet)");
    }

private:
    static constexpr int max_in_flight = 2;

    // The engine thread need not be the one that opened the backend: every call that touches the
    // device makes it current first.
    void on_device() const { cuda_check(cudaSetDevice(opts_.device), "cudaSetDevice"); }

    // One step's inputs (pinned, then device) and outputs (device, then pinned), and the event
    // that says the step is done with them.
    struct step_buffers {
        std::uint8_t* host_in = nullptr;
        std::uint8_t* host_out = nullptr;
        std::uint8_t* dev_in = nullptr;
        std::uint8_t* dev_out = nullptr;
        std::uint8_t* dev_logits = nullptr;
        std::size_t host_in_bytes = 0, host_out_bytes = 0, dev_in_bytes = 0, dev_out_bytes = 0, dev_logits_bytes = 0;
        cudaEvent_t done = nullptr;
        bool busy = false;
    };

    // What wait() needs to assemble a step's result from the pinned outputs.
    struct pending_step {
        std::size_t n_rows = 0;
        std::vector<std::size_t> out_rows;     // step row of each output, in row order
        std::vector<std::size_t> out_slot;     // its index in the step's device result arrays
        std::vector<std::int32_t> out_pos;
        std::vector<engine::sampler> samplers;
        std::vector<bool> wants_logits;
        std::size_t results_off = 0;           // the result arrays' stride in rows (>= the step's rows)
    };

    // Waits for step `ticket` if it is in flight and turns its outputs into its result.
    void settle(std::uint64_t ticket) {
        const auto it = std::find_if(flights_.begin(), flights_.end(), [&](const flight& f) { return f.ticket == ticket; });
        if (it == flights_.end()) return;
        cuda_check(cudaEventSynchronize(it->buf->done), "step");
        engine::step_result r = finish(it->ps, *it->buf);
        it->buf->busy = false;
        flights_.erase(it);
        done_.emplace(ticket, std::move(r));
    }

    // Rows [first, first + n) as runs inside one page each (rows of a page are contiguous).
    template <class F>
    static void for_page_runs(std::int64_t first, std::int64_t n, F&& f) {
        for (std::int64_t r = first; r < first + n;) {
            const std::int64_t end = std::min(first + n, (r / page_rows + 1) * page_rows);
            f(r, end - r);
            r = end;
        }
    }

    int ring() const { return std::max(opts_.max_rollback, 1); }

    // CTAs a save's launch gives each save: enough for the largest at one pass of its pieces.
    unsigned frontier_copy_ctas() const {
        std::uint64_t words = 1;
        for (int il = 0; il < d_.n_layer; ++il)
            words = std::max<std::uint64_t>(words, 2 * std::max(init_attn_[sz(il)].kv.size(), init_idx_[sz(il)].kv.size()));
        return unsigned((words + frontier_copy_words_per_cta - 1) / frontier_copy_words_per_cta);
    }

    std::size_t state_floats() const {
        std::size_t f = 0;
        for (int il = 0; il < d_.n_layer; ++il)
            f += std::size_t(1 + ring()) * 2 * (init_attn_[sz(il)].kv.size() + init_idx_[sz(il)].kv.size());
        return f;
    }

    sequence& get(sequence_id id, std::string_view who) {
        const auto it = seqs_.find(id);
        require(it != seqs_.end(), std::string(who) + ": no " + engine::sequence_name(id));
        return it->second;
    }
    const sequence& get(sequence_id id, std::string_view who) const {
        const auto it = seqs_.find(id);
        require(it != seqs_.end(), std::string(who) + ": no " + engine::sequence_name(id));
        return it->second;
    }

    // Tables empty, the frontier block allocated (stream-ordered) but not initialised.
    sequence new_sequence() {
        sequence s;
        s.layers.resize(sz(d_.n_layer));
        s.ring_pos.assign(sz(ring()), -1);
        s.state_floats = state_floats();
        s.state.ring = ring();
        s.state.layers.resize(sz(d_.n_layer));
        cuda_check(cudaMallocAsync(reinterpret_cast<void**>(&s.state_block), std::max<std::size_t>(s.state_floats, 1) *
                                                                                 sizeof(float), stream_),
                   "cudaMallocAsync compressor state");
        float* at = s.state_block;
        s.state.block = s.state_block;
        for (int il = 0; il < d_.n_layer; ++il) {
            compressor_slots::layer& l = s.state.layers[sz(il)];
            l.attn_floats = init_attn_[sz(il)].kv.size();
            l.idx_floats = init_idx_[sz(il)].kv.size();
            if (l.attn_floats) {
                l.attn = at;
                at += std::size_t(1 + ring()) * 2 * l.attn_floats;
            }
            if (l.idx_floats) {
                l.idx = at;
                at += std::size_t(1 + ring()) * 2 * l.idx_floats;
            }
        }
        return s;
    }

    // A new sequence's frontiers: a device copy of the initial block, stream-ordered (no wait
    // for a step in flight).
    void init_state(sequence& s) {
        cuda_check(cudaMemcpyAsync(s.state_block, init_block_, s.state_floats * sizeof(float), cudaMemcpyDeviceToDevice,
                                   stream_),
                   "compressor state init");
    }

    // The initial block itself, built once: every layer's live frontier at its initial state.
    void upload_initial_state(sequence& s) {
        cuda_check(cudaStreamSynchronize(stream_), "compressor state allocation");
        for (int il = 0; il < d_.n_layer; ++il) {
            const compressor_slots::layer& l = s.state.layers[sz(il)];
            auto up = [&](float* dst, const ref::compressor_state& st) {
                if (dst == nullptr) return;
                cuda_check(cudaMemcpy(dst, st.kv.data(), st.kv.size() * sizeof(float), cudaMemcpyHostToDevice),
                           "compressor state init");
                cuda_check(cudaMemcpy(dst + st.kv.size(), st.score.data(), st.score.size() * sizeof(float),
                                      cudaMemcpyHostToDevice),
                           "compressor state init");
            };
            up(l.attn, init_attn_[sz(il)]);
            up(l.idx, init_idx_[sz(il)]);
        }
    }

    void drop(sequence& s) {
        for (layer_tables& t : s.layers) {
            for (std::int32_t p : t.raw)
                if (p >= 0) attn_pool_->release(p);
            for (std::int32_t p : t.comp)
                if (p >= 0) attn_pool_->release(p);
            for (std::int32_t p : t.idx)
                if (p >= 0) idx_pool_->release(p);
            t = {};
        }
        if (s.state_block) cudaFreeAsync(s.state_block, stream_);
        s.state_block = nullptr;
    }

    // The pages a step writes: raw rows at its positions, compressed and indexer rows it emits.
    template <class F>
    void each_written_page(const engine::step_request& step, const engine::step_plan& p, F&& f) {
        for (sequence_id id : p.order) {
            sequence& s = seqs_.at(id);
            const std::int32_t len = s.length, end = len + std::int32_t(p.rows.at(id).size());
            for (int il = 0; il < d_.n_layer; ++il) {
                layer_tables& t = s.layers[sz(il)];
                for (std::int64_t e = len / page_rows; e <= (end - 1) / page_rows; ++e) f(*attn_pool_, t.raw, e);
                const int r = d_.ratio_of(il);
                if (r == 0 || end / r == len / r) continue;
                for (std::int64_t e = (len / r) / page_rows; e <= (end / r - 1) / page_rows; ++e) {
                    f(*attn_pool_, t.comp, e);
                    if (r == 4) f(*idx_pool_, t.idx, e);
                }
            }
        }
        (void)step;
    }

    // Refuses a step the pools cannot hold before anything changes.
    void check_pages(const engine::step_request& step, const engine::step_plan& p) {
        std::size_t attn = 0, idx = 0;
        each_written_page(step, p, [&](page_pool& pool, std::vector<std::int32_t>& table, std::int64_t e) {
            const bool fresh = std::size_t(e) >= table.size() || table[std::size_t(e)] < 0 ||
                               pool.shared(table[std::size_t(e)]);
            if (fresh) (&pool == &*attn_pool_ ? attn : idx) += 1;
        });
        require(attn <= attn_pool_->free_pages() && idx <= idx_pool_->free_pages(),
                "step: the KV pools have " + std::to_string(attn_pool_->free_pages()) + " + " +
                    std::to_string(idx_pool_->free_pages()) + " free pages; the step needs " + std::to_string(attn) +
                    " + " + std::to_string(idx));
    }

    // Gives every written page an exclusive owner: a missing page is allocated, a shared one is
    // copied on the device first (copy on write).
    void own_pages(const engine::step_request& step, const engine::step_plan& p) {
        each_written_page(step, p, [&](page_pool& pool, std::vector<std::int32_t>& table, std::int64_t e) {
            if (table.size() <= std::size_t(e)) table.resize(std::size_t(e) + 1, -1);
            std::int32_t& id = table[std::size_t(e)];
            if (id < 0) {
                id = pool.allocate();
            } else if (pool.shared(id)) {
                const std::int32_t copy = pool.allocate();
                cuda_check(cudaMemcpyAsync(pool.row(copy, 0), pool.row(id, 0), pool.page_bytes(),
                                           cudaMemcpyDeviceToDevice, stream_),
                           "copy on write");
                pool.release(id);
                id = copy;
            }
        });
    }

    template <class T>
    static void grow(T*& p, std::size_t& have, std::size_t want, bool pinned, cudaStream_t s) {
        if (want <= have) return;
        want = std::max(want, have * 2);
        if (pinned) {
            if (p) cudaFreeHost(p);
            cuda_check(cudaMallocHost(reinterpret_cast<void**>(&p), want), "cudaMallocHost step buffer");
        } else {
            if (p) cudaFreeAsync(p, s);
            cuda_check(cudaMallocAsync(reinterpret_cast<void**>(&p), want, s), "cudaMallocAsync step buffer");
        }
        have = want;
    }

    void release_step_buffers() {
        for (step_buffers& B : bufs_) {
            if (B.host_in) cudaFreeHost(B.host_in);
            if (B.host_out) cudaFreeHost(B.host_out);
            if (B.dev_in) cudaFree(B.dev_in);
            if (B.dev_out) cudaFree(B.dev_out);
            if (B.dev_logits) cudaFree(B.dev_logits);
            if (B.done) cudaEventDestroy(B.done);
        }
    }

    // Page-table strides rounded up to a power of two (at least 8 entries): a captured decode
    // graph replays until the context crosses the next one.
    static int stride_bucket(int entries) {
        int s = 8;
        while (s < entries) s *= 2;
        return s;
    }

    pending_step run_step(const engine::step_request& step, const engine::step_plan& p, step_buffers& B) {
        op_profiler& prof = ops_->profiler();
        prof.step_begin(stream_);
        own_pages(step, p);
        // The rows in execution order: each sequence's rows contiguous, by position.
        std::vector<std::size_t> order;
        std::vector<sequence_id> seq_of;
        for (sequence_id id : p.order)
            for (std::size_t i : p.rows.at(id)) {
                order.push_back(i);
                seq_of.push_back(id);
            }
        const int L = d_.n_layer;
        // A decode step (every sequence at most max_run_rows() rows: a decode row, maybe with
        // verify rows behind it; every row an output) is captured and replayed
        // (see graph_key): its table strides are rounded up to a power of two and its raw tables
        // start at entry 0. Any other step sizes its tables exactly and starts its raw tables at
        // the step's lowest window page (kernels read raw entries only inside a row's window),
        // so a long prompt's chunks do not carry every row's whole raw history.
        const bool decode_shape =
            graphs_on_ && !prof.on() && !order.empty() &&
            std::all_of(p.order.begin(), p.order.end(),
                        [&](sequence_id id) { return p.rows.at(id).size() <= std::size_t(max_run_rows()); }) &&
            std::all_of(order.begin(), order.end(), [&](std::size_t i) { return p.sampler_of[i] != SIZE_MAX; });
        int raw_base = INT32_MAX;
        for (std::size_t i : order) raw_base = std::min(raw_base, std::max(0, step.rows[i].pos - d_.n_swa + 1) / page_rows);
        if (decode_shape || order.empty()) raw_base = 0;
        int raw_stride = 1, comp_stride = 1, max_comp = 0;
        for (std::size_t i : order) {
            const std::int32_t pos = step.rows[i].pos;
            raw_stride = std::max(raw_stride, pos / page_rows + 1 - raw_base);
            for (int il = 0; il < L; ++il) {
                const int r = d_.ratio_of(il);
                if (r == 0) continue;
                max_comp = std::max(max_comp, (pos + 1) / r);
                comp_stride = std::max(comp_stride, ((pos + 1) / r) / page_rows + 1);
            }
        }
        if (decode_shape) {
            raw_stride = stride_bucket(raw_stride);
            comp_stride = stride_bucket(comp_stride);
        }
        ops_->reserve(max_comp);

        // Each sequence's history threshold, before lengths move.
        std::map<sequence_id, std::int32_t> save_from;
        for (sequence_id id : p.order) {
            const sequence& s = seqs_.at(id);
            const std::int32_t end = s.length + std::int32_t(p.rows.at(id).size());
            save_from[id] = opts_.max_rollback > 0 ? end - opts_.max_rollback : INT32_MAX;
        }
        // The runs of sequences in the sub-batch of rows [j0, j0 + rows). A run whose first row
        // saves its frontier (every decode row when max_rollback > 0) has that save done for all
        // layers by one launch before the sub-batch's forward: the live frontiers then are the
        // ones its first row starts from (earlier sub-batches are enqueued before it).
        auto runs_of = [&](std::size_t j0, int rows) {
            std::vector<sequence_run> runs;
            for (int r = 0; r < rows;) {
                const sequence_id id = seq_of[j0 + std::size_t(r)];
                int e = r;
                while (e < rows && seq_of[j0 + std::size_t(e)] == id) ++e;
                const std::int32_t pos0 = step.rows[order[j0 + std::size_t(r)]].pos;
                runs.push_back({r, e - r, pos0, save_from[id], &seqs_.at(id).state, pos0 >= save_from[id]});
                r = e;
            }
            return runs;
        };
        std::size_t frontiers = 0;  // live frontier blocks per sequence
        for (int il = 0; il < L; ++il) frontiers += (d_.ratio_of(il) != 0) + (d_.ratio_of(il) == 4);

        // Host inputs of every sub-batch, one pinned region, one device region.
        // Sub-batches: a run of more than max_sub_rows rows that want no output (prefill) is a
        // chunk of up to chunk_rows rows; so is a run of at least options.chunk_output_rows rows of
        // any kind (a large decode batch reads each weight once); anything else goes max_sub_rows
        // rows at a time.
        const std::size_t n = order.size();
        const std::size_t chunk = std::size_t(ops_->chunk_rows());
        const bool outputs_chunk = ops_->chunk_outputs() && opts_.chunk_output_rows > 0;
        std::vector<std::pair<std::size_t, int>> spans;  // first row, rows
        for (std::size_t j = 0; j < n;) {
            std::size_t e = j;
            while (e < n && e - j < chunk && p.sampler_of[order[e]] == SIZE_MAX) ++e;
            if (outputs_chunk && std::min(n - j, chunk) >= std::size_t(opts_.chunk_output_rows)) e = std::min(n, j + chunk);
            if (e - j <= std::size_t(max_sub_rows)) e = std::min(n, j + std::size_t(max_sub_rows));
            spans.emplace_back(j, int(e - j));
            j = e;
        }
        const std::size_t n_sub = spans.size();
        std::vector<sub_layout> lay(n_sub);
        std::vector<sub_batch> subs(n_sub);
        const int run_limit = max_run_rows();
        for (std::size_t k = 0; k < n_sub; ++k) {
            sub_batch& b = subs[k];
            b.runs = runs_of(spans[k].first, spans[k].second);
            b.decode = std::all_of(b.runs.begin(), b.runs.end(),
                                   [&](const sequence_run& run) { return run.n_rows <= run_limit; });
            b.multi_row_runs = std::any_of(b.runs.begin(), b.runs.end(), [](const sequence_run& run) { return run.n_rows > 1; });
            b.tail_runs = !b.decode && tail_runs_;
        }
        const bool graphable =
            decode_shape && std::all_of(subs.begin(), subs.end(), [](const sub_batch& b) { return b.decode; });
        // A captured step of small sub-batches is keyed by their capacities, not its row count (see
        // graph_key): every launch that takes a host row count gets the capacity (sub_batch::
        // bucketed), the frontier-save table is padded to capacity x frontiers entries (empty ones
        // copy nothing), and the result arrays' stride is the last sub-batch's end at capacity.
        const bool bucketed = graphable && buckets_on_ &&
                              std::all_of(spans.begin(), spans.end(), [](const std::pair<std::size_t, int>& sp) {
                                  return kernels_capacity(sp.second) <= max_sub_rows;
                              });
        const std::size_t n_res = bucketed ? spans.back().first + std::size_t(kernels_capacity(spans.back().second)) : n;
        std::size_t total = 0;
        auto take = [&](std::size_t bytes) {
            const std::size_t o = total;
            total += (bytes + 15) / 16 * 16;
            return o;
        };
        for (std::size_t k = 0; k < n_sub; ++k) {
            const int rows = spans[k].second;
            const std::size_t cap = std::size_t(kernels_capacity(rows));
            sub_layout& s = lay[k];
            subs[k].bucketed = bucketed;
            s.off = total;
            s.n_live = take(4);
            s.tokens = take(cap * 4);
            s.pos = take(cap * 4);
            s.upos = take(cap * 4);
            s.row_slot = take(cap * 4);
            s.one = take(cap * 4);
            s.iota = take(cap * 4);
            s.n_comp = take(sz(L) * cap * 4);
            s.raw = take(sz(L) * cap * sz(raw_stride) * 4);
            s.comp = take(sz(L) * cap * sz(comp_stride) * 4);
            s.idx = take(sz(L) * cap * sz(comp_stride) * 4);
            s.row_state = take(cap * sizeof(float*));
            s.run_rows = take(cap * 4);
            s.save_slot = take(cap * 4);
            s.params = take(cap * sizeof(kernels::sampling_row));
            for (const sequence_run& run : subs[k].runs) s.n_saves += run.first_saved ? frontiers : 0;
            s.save_entries = bucketed && opts_.max_rollback > 0 ? cap * frontiers : s.n_saves;
            s.saves = take(s.save_entries * sizeof(frontier_copy));
            s.adjust_off = take((cap + 1) * 4);
            s.bytes = total - s.off;
        }
        // Every output row's logit adjustments, after the sub-batches (their offsets above do not
        // move with the count); a step with any takes one more launch per sub-batch (graph_key).
        std::size_t n_adjust = 0;
        for (std::size_t i : order)
            if (p.sampler_of[i] != SIZE_MAX) n_adjust += step.samplers[p.sampler_of[i]].adjust.size();
        const std::size_t adjust_at = take(n_adjust * sizeof(engine::logit_adjust));
        grow(B.host_in, B.host_in_bytes, total, true, stream_);
        grow(B.dev_in, B.dev_in_bytes, total, false, stream_);

        // Results: token, status, logprob, top per row of the step (device, then pinned).
        const std::size_t res_tok = 0, res_status = n_res * 4, res_lp = 2 * n_res * 4, res_top = 3 * n_res * 4;
        const std::size_t res_bytes = res_top + n_res * kernels::sampling_max_logprobs * sizeof(kernels::sampled_logprob);
        grow(B.dev_out, B.dev_out_bytes, res_bytes, false, stream_);
        grow(B.host_out, B.host_out_bytes, res_bytes, true, stream_);
        pending_step ps;
        ps.n_rows = step.rows.size();
        for (std::size_t j = 0; j < n; ++j) {
            const std::size_t i = order[j];
            if (p.sampler_of[i] == SIZE_MAX) continue;
            ps.out_rows.push_back(i);
            ps.out_slot.push_back(j);
            ps.out_pos.push_back(step.rows[i].pos);
            ps.samplers.push_back(step.samplers[p.sampler_of[i]]);
            ps.wants_logits.push_back(step.rows[i].out == engine::output::logits);
        }
        grow(B.dev_logits, B.dev_logits_bytes, std::max<std::size_t>({ps.out_rows.size(), n_res, 1}) * sz(d_.n_vocab) * 4, false,
             stream_);

        std::size_t adjust_next = 0;  // entries written so far (rows in slot order)
        for (std::size_t k = 0; k < n_sub; ++k) {
            const auto [j0, rows] = spans[k];
            const int cap = kernels_capacity(rows);
            const sub_layout& s = lay[k];
            std::uint8_t* h = B.host_in + s.off;
            std::memset(h, 0, s.bytes);
            auto i32 = [&](std::size_t off) { return reinterpret_cast<std::int32_t*>(h + (off - s.off)); };
            *i32(s.n_live) = rows;
            std::fill(i32(s.raw), i32(s.raw) + sz(L) * sz(cap) * sz(raw_stride), -1);
            std::fill(i32(s.comp), i32(s.comp) + sz(L) * sz(cap) * sz(comp_stride), -1);
            std::fill(i32(s.idx), i32(s.idx) + sz(L) * sz(cap) * sz(comp_stride), -1);
            auto* params = reinterpret_cast<kernels::sampling_row*>(h + (s.params - s.off));
            auto* row_state = reinterpret_cast<float**>(h + (s.row_state - s.off));
            sub_batch& b = subs[k];
            b.n = rows;
            b.capacity = cap;
            for (int r = 0; r < cap; ++r) {
                params[r] = kernels::sampling_row{};
                i32(s.adjust_off)[r] = std::int32_t(adjust_next);
                if (r >= rows) {
                    i32(s.upos)[r] = std::int32_t(compressor_idle_position());
                    i32(s.row_slot)[r] = -1;
                    i32(s.iota)[r] = r;
                    continue;
                }
                const std::size_t i = order[j0 + std::size_t(r)];
                const engine::row& row = step.rows[i];
                const sequence& sq = seqs_.at(seq_of[j0 + std::size_t(r)]);
                i32(s.tokens)[r] = row.token;
                i32(s.pos)[r] = row.pos;
                i32(s.upos)[r] = row.pos;
                i32(s.row_slot)[r] = r;
                i32(s.one)[r] = 1;
                i32(s.iota)[r] = r;
                row_state[r] = sq.state_block;
                for (int il = 0; il < L; ++il) {
                    const int ratio = d_.ratio_of(il);
                    i32(s.n_comp)[sz(il) * sz(cap) + sz(r)] = ratio != 0 ? (row.pos + 1) / ratio : 0;
                    const layer_tables& t = sq.layers[sz(il)];
                    auto fill = [&](std::size_t off, const std::vector<std::int32_t>& table, int stride, int from) {
                        std::int32_t* dst = i32(off) + (sz(il) * sz(cap) + sz(r)) * sz(stride);
                        if (table.size() > sz(from))
                            std::copy_n(table.begin() + from, std::min(table.size() - sz(from), sz(stride)), dst);
                    };
                    fill(s.raw, t.raw, raw_stride, raw_base);
                    fill(s.comp, t.comp, comp_stride, 0);
                    fill(s.idx, t.idx, comp_stride, 0);
                }
                if (p.sampler_of[i] != SIZE_MAX) {
                    const engine::sampler& sp = step.samplers[p.sampler_of[i]];
                    params[r] = {sp.temperature, sp.top_p, sp.min_p, sp.top_k, sp.seed, std::uint64_t(row.pos),
                                 sp.n_logprobs};
                    std::copy(sp.adjust.begin(), sp.adjust.end(),
                              reinterpret_cast<engine::logit_adjust*>(B.host_in + adjust_at) + adjust_next);
                    adjust_next += sp.adjust.size();
                } else {
                    params[r].n_logprobs = -1;
                }
            }
            i32(s.adjust_off)[cap] = std::int32_t(adjust_next);
            auto* saves = reinterpret_cast<frontier_copy*>(h + (s.saves - s.off));
            std::size_t n_saves = 0;
            for (const sequence_run& run : b.runs) {
                if (!run.first_saved) continue;
                const std::size_t slot = 1 + std::size_t(run.first_pos % run.state->ring);
                for (const compressor_slots::layer& l : run.state->layers)
                    for (auto [base, floats] : {std::pair{l.attn, l.attn_floats}, std::pair{l.idx, l.idx_floats}})
                        if (base != nullptr)
                            saves[n_saves++] = {reinterpret_cast<const std::uint32_t*>(base),
                                                reinterpret_cast<std::uint32_t*>(base + slot * 2 * floats), 2 * floats};
            }
            require(n_saves == s.n_saves, "cuda backend: internal error, frontier save count");
            // A run's later rows (verify rows, a chunk's last max_rollback rows) save the frontier
            // they start from inside the compressor launch, where it is that layer's live state;
            // a chunk's run form starts where its chunk launch ends.
            std::fill(i32(s.save_slot), i32(s.save_slot) + cap, -1);
            for (const sequence_run& run : b.runs) {
                const int from = b.decode ? 0 : run.plain_rows();
                if (from < run.n_rows) i32(s.run_rows)[run.first_row + from] = run.n_rows - from;
                for (int t = 1; t < run.n_rows; ++t)
                    if (run.first_pos + t >= run.save_from)
                        i32(s.save_slot)[run.first_row + t] = 1 + (run.first_pos + t) % run.state->ring;
            }
            auto dev = [&](std::size_t off) { return reinterpret_cast<std::int32_t*>(B.dev_in + off); };
            b.n_live = dev(s.n_live);
            b.tokens = dev(s.tokens);
            b.pos = dev(s.pos);
            b.upos = reinterpret_cast<const std::uint32_t*>(dev(s.upos));
            b.row_slot = dev(s.row_slot);
            b.one = dev(s.one);
            b.iota = dev(s.iota);
            b.n_comp = dev(s.n_comp);
            // Entry e of a row's raw table is at e - raw_base (every read is at e >= raw_base).
            b.raw_tables = dev(s.raw) - raw_base;
            b.comp_tables = dev(s.comp);
            b.idx_tables = dev(s.idx);
            b.row_state = reinterpret_cast<float* const*>(B.dev_in + s.row_state);
            b.run_rows = dev(s.run_rows);
            b.save_slot = dev(s.save_slot);
            b.raw_stride = raw_stride;
            b.comp_stride = comp_stride;
            b.max_comp = max_comp;
            b.any_output = false;
            for (int r = 0; r < rows; ++r) b.any_output |= p.sampler_of[order[j0 + std::size_t(r)]] != SIZE_MAX;
        }
        {
            op_scope inputs_scope(prof, stream_, op_family::inputs, 0);
            cuda_check(cudaMemcpyAsync(B.dev_in, B.host_in, total, cudaMemcpyHostToDevice, stream_), "step inputs");
            prof.count();
        }

        // Everything the step computes reads its per-step values from device memory, so a
        // decode step is captured once per shape and replayed (see graph_key).
        auto compute = [&] {
            for (std::size_t k = 0; k < n_sub; ++k) {
                sub_batch& b = subs[k];
                const sub_layout& s = lay[k];
                const std::size_t j0 = spans[k].first;
                if (s.save_entries > 0) {
                    op_scope save_scope(prof, stream_, op_family::compressor, 0);
                    launch_kernel("copy_frontiers", copy_frontiers, dim3(frontier_copy_ctas(), unsigned(s.save_entries)),
                                  frontier_copy_threads, 0, stream_,
                                  reinterpret_cast<const frontier_copy*>(B.dev_in + s.saves));
                    cuda_check(cudaGetLastError(), "frontier saves");
                    prof.count();
                }
                ops_->bind(b);
                graph::forward(graph::base_layer_rules{d_}, *ops_, b);
                if (!b.any_output) continue;  // nothing to sample; the results of its rows are never read
                op_scope sampling_scope(prof, stream_, op_family::sampling, 0);
                if (n_adjust > 0) {
                    launch_kernel("add_logit_adjust", add_logit_adjust, dim3(unsigned(b.capacity)), 256, 0, stream_,
                                  reinterpret_cast<const std::int32_t*>(B.dev_in + s.adjust_off),
                                  reinterpret_cast<const engine::logit_adjust*>(B.dev_in + adjust_at), ops_->logits(),
                                  std::int64_t(d_.n_vocab));
                    cuda_check(cudaGetLastError(), "logit adjustments");
                    prof.count();
                }
                kernels::sampling_launch sl;
                sl.logits = ops_->logits();
                sl.logits_stride = d_.n_vocab;
                sl.n_vocab = d_.n_vocab;
                sl.params = reinterpret_cast<const kernels::sampling_row*>(B.dev_in + s.params);
                sl.token = reinterpret_cast<std::int32_t*>(B.dev_out + res_tok) + j0;
                sl.status = reinterpret_cast<std::int32_t*>(B.dev_out + res_status) + j0;
                sl.logprob = reinterpret_cast<float*>(B.dev_out + res_lp) + j0;
                sl.top = reinterpret_cast<kernels::sampled_logprob*>(B.dev_out + res_top) +
                         j0 * kernels::sampling_max_logprobs;
                sl.n_rows = b.n_live;
                sl.work = ops_->sampling_work();
                kernels::launch_sampling(sl, b.capacity, stream_);
                prof.count();
                // The output rows' logits, kept on the device for logits rows and host fallbacks.
                // With several sub-batches the logits buffer is reused, so the copies stay in order.
                if (n_sub > 1 && bucketed) {
                    // Every row is an output, in slot order: the sub-batch's capacity rows, idle ones
                    // included, so that the copy does not depend on the row count.
                    const std::size_t row_bytes = sz(d_.n_vocab) * 4;
                    cuda_check(cudaMemcpyAsync(B.dev_logits + j0 * row_bytes, ops_->logits(),
                                               std::size_t(b.capacity) * row_bytes, cudaMemcpyDeviceToDevice, stream_),
                               "logits copy");
                    prof.count();
                } else if (n_sub > 1) {
                    copy_logits(ps, B, j0, b.n);
                }
            }
        };
        if (graphable) {
            graph_key key{B.dev_in, B.dev_out, B.dev_logits, bucketed, n_adjust > 0, bucketed ? n_res : n, raw_stride,
                          comp_stride, ops_->comp_capacity(), {}, {}};
            for (const sub_layout& s : lay) key.saves.push_back(s.save_entries);
            for (const sub_batch& b : subs) key.runs.push_back(b.multi_row_runs);
            auto it = graphs_.find(key);
            if (it == graphs_.end()) {
                if (graphs_.size() >= max_graphs) graphs_.clear();
                it = graphs_.emplace(key, cuda_graph(stream_, compute)).first;
            }
            it->second.launch(stream_);
        } else {
            compute();
        }
        if (n_sub == 1) copy_logits(ps, B, 0, int(n));
        if (n > 0) {
            op_scope results_scope(prof, stream_, op_family::sampling, 0);
            cuda_check(cudaMemcpyAsync(B.host_out, B.dev_out, res_bytes, cudaMemcpyDeviceToHost, stream_), "step results");
            prof.count();
        }
        ps.results_off = n_res;  // the result arrays' stride (their layout is by execution slot)

        // Host bookkeeping after the enqueue: lengths, saved frontiers, raw pages out of reach.
        for (sequence_id id : p.order) {
            sequence& s = seqs_.at(id);
            const std::int32_t end = s.length + std::int32_t(p.rows.at(id).size());
            for (std::int32_t pos = std::max(s.length, save_from[id]); pos < end; ++pos)
                s.ring_pos[sz(pos % ring())] = pos;
            s.length = end;
            const std::int64_t first_kept = std::int64_t(end) - d_.n_swa - opts_.max_rollback;
            for (layer_tables& t : s.layers)
                for (std::int64_t e = 0; e < first_kept / page_rows && e < std::int64_t(t.raw.size()); ++e)
                    if (t.raw[std::size_t(e)] >= 0) {
                        attn_pool_->release(t.raw[std::size_t(e)]);
                        t.raw[std::size_t(e)] = -1;
                    }
        }
        prof.step_end(stream_);
        return ps;
    }

    // The logits of the output rows in execution slots [j0, j0 + rows) (the op set's logits
    // buffer holds that sub-batch) to the step's own buffer, one copy per run of consecutive slots.
    void copy_logits(const pending_step& ps, step_buffers& B, std::size_t j0, int rows) {
        const std::size_t row_bytes = sz(d_.n_vocab) * 4;
        const auto first = std::lower_bound(ps.out_slot.begin(), ps.out_slot.end(), j0);
        std::size_t k = std::size_t(first - ps.out_slot.begin());
        while (k < ps.out_slot.size() && ps.out_slot[k] < j0 + std::size_t(rows)) {
            std::size_t e = k + 1;
            while (e < ps.out_slot.size() && ps.out_slot[e] == ps.out_slot[e - 1] + 1 &&
                   ps.out_slot[e] < j0 + std::size_t(rows))
                ++e;
            cuda_check(cudaMemcpyAsync(B.dev_logits + k * row_bytes,
                                       ops_->logits() + (ps.out_slot[k] - j0) * sz(d_.n_vocab), (e - k) * row_bytes,
                                       cudaMemcpyDeviceToDevice, stream_),
                       "logits copy");
            ops_->profiler().count();
            k = e;
        }
    }

    static int kernels_capacity(int rows) {
        int c = 1;
        while (c < rows) c *= 2;
        return c;
    }

    engine::step_result finish(const pending_step& ps, const step_buffers& B) {
        const std::size_t n = ps.results_off;
        const auto* tok = reinterpret_cast<const std::int32_t*>(B.host_out);
        const auto* status = tok + n;
        const auto* lp = reinterpret_cast<const float*>(B.host_out + 2 * n * 4);
        const auto* top = reinterpret_cast<const kernels::sampled_logprob*>(B.host_out + 3 * n * 4);
        engine::step_result res;
        res.n_vocab = d_.n_vocab;
        // Outputs in step row order.
        std::vector<std::size_t> by_row(ps.out_rows.size());
        for (std::size_t k = 0; k < by_row.size(); ++k) by_row[k] = k;
        std::sort(by_row.begin(), by_row.end(), [&](std::size_t a, std::size_t b) { return ps.out_rows[a] < ps.out_rows[b]; });
        std::vector<float> logits;
        for (std::size_t k : by_row) {
            const std::size_t j = ps.out_slot[k];
            const engine::sampler& sp = ps.samplers[k];
            engine::sampled out;
            out.row = ps.out_rows[k];
            const bool need_logits = ps.wants_logits[k] || status[j] != 0;
            if (need_logits) {
                logits.resize(sz(d_.n_vocab));
                cuda_check(cudaMemcpy(logits.data(), B.dev_logits + k * sz(d_.n_vocab) * 4, sz(d_.n_vocab) * 4,
                                      cudaMemcpyDeviceToHost),
                           "logits row");
            }
            if (status[j] != 0) {
                // The device sampler's candidate prefix could not decide: the reference sampler
                // draws from the same logits with the same (seed, position).
                const ref::sampling_params params{sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.seed};
                out.token = ref::sample(logits.data(), d_.n_vocab, params, std::uint64_t(ps.out_pos[k]));
                out.logprob = ref::logprob_of(logits.data(), d_.n_vocab, out.token);
            } else {
                out.token = tok[j];
                out.logprob = lp[j];
            }
            if (status[j] != 0)
                for (const ref::token_logprob& e : ref::top_logprobs(logits.data(), d_.n_vocab, sp.n_logprobs))
                    out.top.push_back({e.token, e.logprob});
            else
                for (int t = 0; t < sp.n_logprobs; ++t) {
                    const kernels::sampled_logprob& e = top[j * kernels::sampling_max_logprobs + sz(t)];
                    out.top.push_back({e.token, e.logprob});
                }
            res.outputs.push_back(std::move(out));
            if (ps.wants_logits[k]) {
                res.logits_rows.push_back(ps.out_rows[k]);
                res.logits.insert(res.logits.end(), logits.begin(), logits.end());
            }
        }
        return res;
    }

    // What a captured step depends on besides device memory: the buffers it reads and writes,
    // its row count (and so its sub-batches and input layout; a bucketed step's capacities
    // instead: the row-capacity bucket, 1, 2, 4, 8, 16, then 16 + each of those, ...), the table
    // strides, the scratch capacity, each sub-batch's frontier-save table and whether it has
    // runs of several rows. Every other per-step value is read on the device (tokens, positions,
    // live row counts, page tables, state blocks, run layout, sampler parameters).
    struct graph_key {
        const void* in;
        const void* out;
        const void* logits;
        bool bucketed;
        bool adjust;       // the sampler adjustments' launch before each sampling
        std::size_t rows;  // bucketed: the result stride (the last sub-batch's end at capacity)
        int raw_stride, comp_stride, comp_cap;
        std::vector<std::size_t> saves;
        std::vector<char> runs;  // per sub-batch: a run of several rows (the compressors' run form)
        auto operator<=>(const graph_key&) const = default;
    };
    static constexpr std::size_t max_graphs = 64;

    options opts_;
    std::string name_;
    bool graphs_on_ = true;
    bool verify_runs_ = true;  // DS4_VERIFY_RUNS
    bool tail_runs_ = true;    // DS4_COMPRESSOR_TAIL
    bool buckets_on_ = true;   // DS4_GRAPH_BUCKETS
    // The longest run of one sequence's rows that takes the decode path (one compressor launch
    // for the sub-batch, a captured step): verify rows; longer runs are prompt chunks.
    int max_run_rows() const { return verify_runs_ ? max_sub_rows : 1; }
    std::map<graph_key, cuda_graph> graphs_;
    std::optional<gguf::file> file_;
    model::model_dims d_;
    std::optional<device_weights> weights_;
    cudaStream_t stream_ = nullptr;
    std::optional<page_pool> attn_pool_, idx_pool_;
    std::optional<cuda_ops> ops_;
    std::vector<ref::compressor_state> init_attn_, init_idx_;
    float* init_block_ = nullptr;  // one sequence's state block at the initial frontiers
    std::map<sequence_id, sequence> seqs_;
    sequence_id next_id_ = 0;
    // Two sets of step buffers: a step is built and enqueued while the previous one runs.
    std::array<step_buffers, max_in_flight> bufs_;
    struct flight {
        std::uint64_t ticket;
        pending_step ps;
        step_buffers* buf;
    };
    std::deque<flight> flights_;
    std::map<std::uint64_t, engine::step_result> done_;
    std::uint64_t next_ticket_ = 1;
};

}  // namespace

std::unique_ptr<engine::backend> make_cuda_backend(const std::filesystem::path& model, const options& o) {
    return std::make_unique<cuda_engine>(model, o);
}

}  // namespace ds4::cuda_backend
