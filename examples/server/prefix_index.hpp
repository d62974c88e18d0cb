#pragma once
// The prefix cache's index: a radix tree over token ids (edges carry runs of tokens, split where
// two cached prefixes diverge). A lookup walks the prompt once, however many prefixes are cached,
// and finds the deepest cached prefix it can fork: one whose tokens share the walked path and end
// within `max_rollback` tokens past the point where it leaves the prompt (truncate's reach).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace ds4::server {

template <class Id>
class prefix_index {
public:
    struct match {
        Id id;
        int length;  // prompt tokens the entry shares (the entry is truncated to this)
    };

    void insert(std::span<const std::int32_t> tokens, Id id) {
        node* n = &root_;
        std::vector<node*> path{n};
        std::size_t at = 0;
        while (at < tokens.size()) {
            auto it = n->children.find(tokens[at]);
            if (it == n->children.end()) {
                auto leaf = std::make_unique<node>();
                leaf->edge.assign(tokens.begin() + std::ptrdiff_t(at), tokens.end());
                leaf->depth = int(tokens.size());
                node* l = leaf.get();
                n->children.emplace(tokens[at], std::move(leaf));
                n = l;
                at = tokens.size();
                path.push_back(n);
                break;
            }
            node* c = it->second.get();
            std::size_t k = 0;
            while (k < c->edge.size() && at + k < tokens.size() && c->edge[k] == tokens[at + k]) ++k;
            if (k < c->edge.size()) {  // split c's edge at k
                auto mid = std::make_unique<node>();
                mid->edge.assign(c->edge.begin(), c->edge.begin() + std::ptrdiff_t(k));
                mid->depth = n->depth + int(k);
                std::unique_ptr<node> old = std::move(it->second);
                old->edge.erase(old->edge.begin(), old->edge.begin() + std::ptrdiff_t(k));
                const std::int32_t key = old->edge.front();
                mid->children.emplace(key, std::move(old));
                c = mid.get();
                it->second = std::move(mid);
            }
            n = c;
            at += k;
            path.push_back(n);
        }
        n->ends.push_back({id, int(tokens.size())});
        refresh(path);
    }

    // Removes the entry `id` stored under `tokens`; false when it is not there.
    bool erase(std::span<const std::int32_t> tokens, Id id) {
        std::vector<node*> path{&root_};
        node* n = &root_;
        std::size_t at = 0;
        while (at < tokens.size()) {
            auto it = n->children.find(tokens[at]);
            if (it == n->children.end()) return false;
            node* c = it->second.get();
            if (c->edge.size() > tokens.size() - at || !std::equal(c->edge.begin(), c->edge.end(), tokens.begin() + std::ptrdiff_t(at)))
                return false;
            at += c->edge.size();
            n = c;
            path.push_back(n);
        }
        auto e = std::find_if(n->ends.begin(), n->ends.end(), [&](const end& x) { return x.id == id; });
        if (e == n->ends.end()) return false;
        n->ends.erase(e);
        // Empty leaves go; the path's minimum lengths are recomputed.
        for (std::size_t i = path.size() - 1; i > 0; --i) {
            node* c = path[i];
            if (!c->ends.empty() || !c->children.empty()) break;
            path[i - 1]->children.erase(c->edge.front());
            path.pop_back();
        }
        refresh(path);
        return true;
    }

    // The deepest usable entry for `prompt`, sharing at most `limit` tokens.
    std::optional<match> find(std::span<const std::int32_t> prompt, int limit, int max_rollback) const {
        limit = std::min<int>(limit, int(prompt.size()));
        std::vector<const node*> path{&root_};
        const node* n = &root_;
        int at = 0;
        // The deepest point: inside the edge of `partial` (at depth `at`) or at node n.
        while (at < limit) {
            auto it = n->children.find(prompt[std::size_t(at)]);
            if (it == n->children.end()) break;
            const node* c = it->second.get();
            int k = 0;
            while (k < int(c->edge.size()) && at + k < limit && c->edge[std::size_t(k)] == prompt[std::size_t(at + k)]) ++k;
            if (k < int(c->edge.size())) {  // stopped inside c's edge: c's entries share `at + k` tokens
                if (c->min_len - (at + k) <= max_rollback) return match{c->min_id, at + k};
                break;
            }
            at += k;
            n = c;
            path.push_back(n);
        }
        // Walking back up: every entry below a node at depth d shares at least d tokens.
        for (auto p = path.rbegin(); p != path.rend(); ++p) {
            const node* x = *p;
            if (x->min_len != none && x->min_len - x->depth <= max_rollback) return match{x->min_id, x->depth};
        }
        return std::nullopt;
    }

    bool empty() const { return root_.children.empty() && root_.ends.empty(); }

private:
    static constexpr int none = std::numeric_limits<int>::max() / 2;
    struct end {
        Id id;
        int length;
    };
    struct node {
        std::vector<std::int32_t> edge;  // tokens from the parent to here
        int depth = 0;                   // tokens from the root to here
        std::vector<end> ends;           // entries whose tokens end here
        std::map<std::int32_t, std::unique_ptr<node>> children;
        int min_len = none;  // the shortest entry at or below here, and its id
        Id min_id{};
    };
    static void refresh(const std::vector<node*>& path) {
        for (auto p = path.rbegin(); p != path.rend(); ++p) {
            node* x = *p;
            x->min_len = none;
            for (const end& e : x->ends)
                if (e.length < x->min_len) x->min_len = e.length, x->min_id = e.id;
            for (const auto& [k, c] : x->children)
                if (c->min_len < x->min_len) x->min_len = c->min_len, x->min_id = c->min_id;
        }
    }
    node root_;
};

}  // namespace ds4::server
