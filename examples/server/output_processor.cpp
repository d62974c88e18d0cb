#include "examples/server/output_processor.hpp"

#include <algorithm>
#include <random>
#include <utility>

namespace ds4::server {

namespace {
constexpr std::string_view replacement = "\xEF\xBF\xBD";  // U+FFFD
}

std::size_t utf8_sequence_length(std::string_view s, std::size_t i, bool& complete) {
    complete = true;
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) return 1;
    std::size_t n;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte (RFC 3629 table)
    if (b0 >= 0xC2 && b0 <= 0xDF) n = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF) {
        n = 3;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        n = 4;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else
        return 0;
    for (std::size_t k = 1; k < n; ++k) {
        if (i + k >= s.size()) {
            complete = false;
            return n;
        }
        const auto b = static_cast<unsigned char>(s[i + k]);
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    }
    return n;
}

std::size_t first_invalid_utf8(std::string_view s) {
    for (std::size_t i = 0; i < s.size();) {
        bool complete;
        const std::size_t n = utf8_sequence_length(s, i, complete);
        if (n == 0 || !complete) return i;
        i += n;
    }
    return std::string_view::npos;
}

std::string utf8_assembler::feed(std::string_view bytes) {
    pending_.append(bytes);
    std::string out;
    std::size_t i = 0;
    while (i < pending_.size()) {
        bool complete;
        const std::size_t n = utf8_sequence_length(pending_, i, complete);
        if (n == 0) {
            out.append(replacement);  // one U+FFFD per invalid byte
            ++i;
        } else if (!complete) {
            break;
        } else {
            out.append(pending_, i, n);
            i += n;
        }
    }
    pending_.erase(0, i);
    return out;
}

std::string utf8_assembler::finish() {
    std::string out;
    for (std::size_t i = 0; i < pending_.size(); ++i) out.append(replacement);
    pending_.clear();
    return out;
}

output_processor::output_processor(const ref::tokenizer& tok, output_options options)
    : tok_(tok), options_(std::move(options)), in_reasoning_(options_.thinking && !options_.raw_text) {}

void output_processor::emit(delta::kind kind, std::string text, gen_event& ev) {
    if (text.empty() && (kind == delta::kind::content || kind == delta::kind::reasoning ||
                         kind == delta::kind::tool_arguments))
        return;
    // Consecutive text of one kind merges, so a client sees one delta per token at most.
    if (!ev.deltas.empty() && ev.deltas.back().type == kind &&
        (kind == delta::kind::content || kind == delta::kind::reasoning ||
         (kind == delta::kind::tool_arguments && ev.deltas.back().tool_index == n_tool_calls_ - 1))) {
        ev.deltas.back().text += text;
        return;
    }
    delta d;
    d.type = kind;
    d.text = std::move(text);
    d.tool_index = n_tool_calls_ - 1;
    ev.deltas.push_back(std::move(d));
}

bool output_processor::on_token(std::int32_t token, gen_event& ev) {
    if (done_) return true;
    if (token == tok_.eos_id()) {
        done_ = !options_.ignore_eos;
        return done_;
    }
    if (in_reasoning_) {
        ++reasoning_tokens_;
        if (token == tok_.think_end_id()) {
            emit(delta::kind::reasoning, reasoning_utf8_.finish(), ev);
            in_reasoning_ = false;
            return false;
        }
        const std::string& piece = tok_.token_to_piece(token);
        raw_reasoning_ += piece;
        emit(delta::kind::reasoning, reasoning_utf8_.feed(piece), ev);
        return false;
    }
    const std::string& piece = tok_.token_to_piece(token);
    raw_content_ += piece;
    content_text(content_utf8_.feed(piece), ev);
    return done_;
}

void output_processor::content_text(std::string text, gen_event& ev) {
    if (text.empty() || done_) return;
    if (options_.raw_text || !options_.parse_tools) {
        visible_text(text, ev);
        return;
    }
    for (ref::dsml_event& e : dsml_.feed(text)) {
        if (done_) break;
        switch (e.type) {
        case ref::dsml_event::kind::text: visible_text(e.data, ev); break;
        case ref::dsml_event::kind::tool_call_begin: {
            // Text held for a stop string goes out before the call: it came first.
            emit(delta::kind::content, std::exchange(stop_held_, {}), ev);
            ++n_tool_calls_;
            delta d;
            d.type = delta::kind::tool_begin;
            d.text = std::move(e.data);
            d.tool_index = n_tool_calls_ - 1;
            d.tool_id = current_tool_id_ = new_tool_call_id();
            ev.deltas.push_back(std::move(d));
            break;
        }
        case ref::dsml_event::kind::arguments: emit(delta::kind::tool_arguments, std::move(e.data), ev); break;
        case ref::dsml_event::kind::tool_call_end: {
            delta d;
            d.type = delta::kind::tool_end;
            d.tool_index = n_tool_calls_ - 1;
            d.tool_id = current_tool_id_;
            ev.deltas.push_back(std::move(d));
            break;
        }
        case ref::dsml_event::kind::error: break;  // the parser gives the text back as text events
        }
    }
}

void output_processor::visible_text(std::string_view text, gen_event& ev) {
    if (options_.stop.empty()) {
        emit(delta::kind::content, std::string(text), ev);
        return;
    }
    stop_held_.append(text);
    std::size_t cut = std::string::npos;
    for (const std::string& s : options_.stop) {
        const std::size_t at = stop_held_.find(s);
        if (at != std::string::npos && at < cut) cut = at, matched_stop_ = s;
    }
    if (cut != std::string::npos) {
        emit(delta::kind::content, stop_held_.substr(0, cut), ev);
        stop_held_.clear();
        done_ = true;
        return;
    }
    // Hold back the longest suffix that is a proper prefix of some stop string.
    std::size_t keep = 0;
    for (const std::string& s : options_.stop)
        for (std::size_t k = std::min(s.size() - 1, stop_held_.size()); k > keep; --k)
            if (stop_held_.compare(stop_held_.size() - k, k, s, 0, k) == 0) {
                keep = k;
                break;
            }
    emit(delta::kind::content, stop_held_.substr(0, stop_held_.size() - keep), ev);
    stop_held_.erase(0, stop_held_.size() - keep);
}

void output_processor::finish(gen_event& ev) {
    if (in_reasoning_) emit(delta::kind::reasoning, reasoning_utf8_.finish(), ev);
    if (!done_) {
        content_text(content_utf8_.finish(), ev);
        if (!options_.raw_text && options_.parse_tools && !done_)
            for (ref::dsml_event& e : dsml_.finish())
                if (e.type == ref::dsml_event::kind::text) visible_text(e.data, ev);
    }
    if (!done_) emit(delta::kind::content, std::exchange(stop_held_, {}), ev);
    done_ = true;
}

std::string new_tool_call_id() {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    static constexpr char hex[] = "0123456789abcdef";
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id += hex[rng() & 15];
    return id;
}

}  // namespace ds4::server
