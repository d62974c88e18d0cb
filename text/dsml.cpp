#include "text/dsml.hpp"

#include <algorithm>
#include <cctype>

#include "ds4/core/error.hpp"
#include "text/tokenizer.hpp"

namespace ds4::ref {
namespace {

constexpr std::string_view open_block = "<\uFF5CDSML\uFF5Ctool_calls>";
constexpr std::string_view close_block = "</\uFF5CDSML\uFF5Ctool_calls>";
constexpr std::string_view open_invoke = "<\uFF5CDSML\uFF5Cinvoke name=\"";
constexpr std::string_view close_invoke = "</\uFF5CDSML\uFF5Cinvoke>";
constexpr std::string_view open_param = "<\uFF5CDSML\uFF5Cparameter name=\"";
constexpr std::string_view close_param = "</\uFF5CDSML\uFF5Cparameter>";
constexpr std::string_view string_true = "\" string=\"true\">";
constexpr std::string_view string_false = "\" string=\"false\">";
// A tool or parameter name longer than this is not DSML; bounding it bounds what is held back.
constexpr std::size_t max_name = 256;
constexpr int max_json_depth = 256;

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// JSON-escape bytes; byte-wise, so escaping a split string piecewise equals escaping it whole.
void append_escaped(std::string& out, std::string_view raw) {
    static constexpr char hex[] = "0123456789abcdef";
    for (const char ch : raw) {
        const auto c = static_cast<unsigned char>(ch);
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            default:
                if (c < 0x20) {
                    out += "\\u00";
                    out += hex[c >> 4];
                    out += hex[c & 15];
                } else {
                    out += ch;
                }
        }
    }
}

class json_reader {
public:
    explicit json_reader(std::string_view s) : s_(s) {}

    std::vector<json_member> object() {
        std::vector<json_member> members;
        skip_ws();
        if (i_ == s_.size()) return members;  // empty arguments mean no arguments
        expect('{');
        skip_ws();
        if (peek() == '}') {
            ++i_;
        } else {
            for (;;) {
                skip_ws();
                json_member m;
                m.key = string();
                skip_ws();
                expect(':');
                skip_ws();
                m.is_string = peek() == '"';
                if (m.is_string) m.value = string();
                else m.value = std::string(value(1));
                members.push_back(std::move(m));
                skip_ws();
                if (peek() == ',') {
                    ++i_;
                    continue;
                }
                expect('}');
                break;
            }
        }
        skip_ws();
        if (i_ != s_.size()) error("trailing text after the object");
        return members;
    }

private:
    [[noreturn]] void error(const std::string& what) const {
        fail("JSON: " + what + " at byte " + std::to_string(i_));
    }
    char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
    void skip_ws() {
        while (i_ < s_.size() && is_ws(s_[i_])) ++i_;
    }
    void expect(char c) {
        if (peek() != c) error(std::string("expected '") + c + "'");
        ++i_;
    }

    unsigned hex4() {
        if (i_ + 4 > s_.size()) error("truncated \\u escape");
        unsigned v = 0;
        for (int k = 0; k < 4; ++k) {
            const char c = s_[i_++];
            v <<= 4;
            if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
            else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
            else error("bad hex digit in \\u escape");
        }
        return v;
    }

    std::string string() {
        expect('"');
        std::string out;
        for (;;) {
            if (i_ >= s_.size()) error("unterminated string");
            const char c = s_[i_++];
            if (c == '"') return out;
            if (static_cast<unsigned char>(c) < 0x20) error("control character in string");
            if (c != '\\') {
                out += c;
                continue;
            }
            if (i_ >= s_.size()) error("unterminated escape");
            switch (s_[i_++]) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    char32_t cp = hex4();
                    if (cp >= 0xD800 && cp < 0xDC00) {
                        if (s_.substr(i_, 2) != "\\u") error("lone high surrogate");
                        i_ += 2;
                        const unsigned lo = hex4();
                        if (lo < 0xDC00 || lo >= 0xE000) error("bad low surrogate");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    } else if (cp >= 0xDC00 && cp < 0xE000) {
                        error("lone low surrogate");
                    }
                    append_utf8(out, cp);
                    break;
                }
                default: --i_; error("bad escape");
            }
        }
    }

    void digits() {
        if (!std::isdigit(static_cast<unsigned char>(peek()))) error("expected a digit");
        while (std::isdigit(static_cast<unsigned char>(peek()))) ++i_;
    }

    // Validates one value and returns its exact text.
    std::string_view value(int depth) {
        if (depth > max_json_depth) error("nesting too deep");
        const std::size_t start = i_;
        const char c = peek();
        if (c == '"') {
            string();
        } else if (c == '{' || c == '[') {
            const char close = c == '{' ? '}' : ']';
            ++i_;
            skip_ws();
            if (peek() == close) {
                ++i_;
            } else {
                for (;;) {
                    skip_ws();
                    if (c == '{') {
                        string();
                        skip_ws();
                        expect(':');
                        skip_ws();
                    }
                    value(depth + 1);
                    skip_ws();
                    if (peek() == ',') {
                        ++i_;
                        continue;
                    }
                    expect(close);
                    break;
                }
            }
        } else if (c == 't' || c == 'f' || c == 'n') {
            const std::string_view lit = c == 't' ? "true" : c == 'f' ? "false" : "null";
            if (s_.substr(i_, lit.size()) != lit) error("bad literal");
            i_ += lit.size();
        } else if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
            if (c == '-') ++i_;
            if (peek() == '0') ++i_;
            else digits();
            if (peek() == '.') {
                ++i_;
                digits();
            }
            if (peek() == 'e' || peek() == 'E') {
                ++i_;
                if (peek() == '+' || peek() == '-') ++i_;
                digits();
            }
        } else {
            error("expected a value");
        }
        return s_.substr(start, i_ - start);
    }

    std::string_view s_;
    std::size_t i_ = 0;
};

enum class match { yes, maybe, no };

// Whether `s` starts with `lit`, or could once more bytes arrive.
match starts(std::string_view s, std::string_view lit) {
    const std::size_t n = std::min(s.size(), lit.size());
    if (s.substr(0, n) != lit.substr(0, n)) return match::no;
    return s.size() >= lit.size() ? match::yes : match::maybe;
}

// Longest proper prefix of `tag` that `s` ends with.
std::size_t tag_prefix_suffix(std::string_view s, std::string_view tag) {
    for (std::size_t k = std::min(s.size(), tag.size() - 1); k > 0; --k)
        if (s.substr(s.size() - k) == tag.substr(0, k)) return k;
    return 0;
}

// Bytes at the end of `s` that begin a UTF-8 sequence not yet complete.
std::size_t incomplete_utf8(std::string_view s) {
    for (std::size_t k = 1; k <= std::min<std::size_t>(3, s.size()); ++k) {
        const auto c = static_cast<unsigned char>(s[s.size() - k]);
        if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
        const std::size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > k ? k : 0;
    }
    return 0;
}

void emit(std::vector<dsml_event>& out, dsml_event::kind type, std::string_view data) {
    const bool mergeable = type == dsml_event::kind::text || type == dsml_event::kind::arguments;
    if (mergeable && data.empty()) return;
    if (mergeable && !out.empty() && out.back().type == type) out.back().data += data;
    else out.push_back(dsml_event{type, std::string(data)});
}

}  // namespace

std::string json_quote(std::string_view raw) {
    std::string out = "\"";
    append_escaped(out, raw);
    out += '"';
    return out;
}

std::vector<json_member> parse_json_object(std::string_view json) { return json_reader(json).object(); }

std::string render_dsml_tool_calls(std::span<const tool_call> calls) {
    if (calls.empty()) return {};
    std::string out = "\n\n";
    out += open_block;
    out += '\n';
    for (const tool_call& call : calls) {
        std::vector<json_member> args;
        try {
            args = parse_json_object(call.arguments);
        } catch (const ds4::error& e) {
            fail("tool call \"" + call.name + "\" (id \"" + call.id + "\"): arguments are not a JSON object: " +
                 e.what());
        }
        out += open_invoke;
        out += call.name;
        out += "\">\n";
        for (const json_member& m : args) {
            out += open_param;
            out += m.key;
            out += m.is_string ? string_true : string_false;
            out += m.value;
            out += close_param;
            out += '\n';
        }
        out += close_invoke;
        out += '\n';
    }
    out += close_block;
    return out;
}

void dsml_stream_parser::consume(std::size_t n) {
    if (state_ != state::text) raw_block_.append(pending_, 0, n);
    pending_.erase(0, n);
}

bool dsml_stream_parser::fail(std::vector<dsml_event>& out, std::string_view why) {
    if (!call_started_) {
        // Nothing irrevocable went out: the opener was ordinary text after all. Give it back and
        // rescan what followed it, which may hold a real block.
        emit(out, dsml_event::kind::text, std::string_view(raw_block_).substr(0, opener_size_));
        pending_.insert(0, raw_block_, opener_size_);
        raw_block_.clear();
        state_ = state::text;
        return true;
    }
    status_ = dsml_status::malformed;
    state_ = state::failed;
    emit(out, dsml_event::kind::error, "malformed DSML tool call: " + std::string(why));
    return false;
}

// Consumes what it can from pending_; false when it needs more input.
bool dsml_stream_parser::step(std::vector<dsml_event>& out) {
    using kind = dsml_event::kind;
    switch (state_) {
        case state::text: {
            const std::size_t at = pending_.find(open_block);
            if (at != std::string::npos) {
                // The "\n\n" the renderer puts before a block belongs to the block, not the content.
                const std::size_t sep = at >= 2 && pending_.compare(at - 2, 2, "\n\n") == 0 ? 2 : 0;
                emit(out, kind::text, std::string_view(pending_).substr(0, at - sep));
                raw_block_ = pending_.substr(at - sep, sep + open_block.size());
                opener_size_ = raw_block_.size();
                pending_.erase(0, at + open_block.size());
                state_ = state::block;
                call_started_ = false;
                return true;
            }
            std::size_t hold = tag_prefix_suffix(pending_, open_block);
            for (int k = 0; k < 2 && hold < pending_.size() && pending_[pending_.size() - hold - 1] == '\n'; ++k) ++hold;
            if (hold == 0) hold = incomplete_utf8(pending_);
            emit(out, kind::text, std::string_view(pending_).substr(0, pending_.size() - hold));
            pending_.erase(0, pending_.size() - hold);
            return false;
        }
        case state::block:
        case state::invoke_body: {
            std::size_t ws = 0;
            while (ws < pending_.size() && is_ws(pending_[ws])) ++ws;
            consume(ws);
            if (pending_.empty()) return false;
            const bool in_block = state_ == state::block;
            const match open = starts(pending_, in_block ? open_invoke : open_param);
            const match close = starts(pending_, in_block ? close_block : close_invoke);
            if (open == match::yes) {
                consume((in_block ? open_invoke : open_param).size());
                state_ = in_block ? state::invoke_name : state::param_name;
                return true;
            }
            if (close == match::yes) {
                consume((in_block ? close_block : close_invoke).size());
                if (in_block) {
                    raw_block_.clear();
                    state_ = state::text;
                } else {
                    emit(out, kind::arguments, "}");
                    emit(out, kind::tool_call_end, "");
                    state_ = state::block;
                }
                return true;
            }
            if (open == match::maybe || close == match::maybe) return false;
            return fail(out, in_block ? "expected an invoke or the end of the block"
                                      : "expected a parameter or the end of the invoke");
        }
        case state::invoke_name:
        case state::param_name: {
            const std::size_t quote = pending_.find('"');
            const std::string_view known = std::string_view(pending_).substr(0, std::min(quote, pending_.size()));
            if (known.size() > max_name || known.find_first_of("<>\n") != std::string_view::npos)
                return fail(out, "bad name");
            if (quote == std::string::npos) return false;
            const std::string name(known);
            if (name.empty()) return fail(out, "empty name");
            const std::string_view rest = std::string_view(pending_).substr(quote);
            if (state_ == state::invoke_name) {
                const match m = starts(rest, "\">");
                if (m == match::maybe) return false;
                if (m == match::no) return fail(out, "bad invoke tag");
                consume(quote + 2);
                call_started_ = true;
                emit(out, kind::tool_call_begin, name);
                emit(out, kind::arguments, "{");
                first_param_ = true;
                state_ = state::invoke_body;
                return true;
            }
            const match t = starts(rest, string_true);
            const match f = starts(rest, string_false);
            if (t == match::maybe || f == match::maybe) return false;
            if (t == match::no && f == match::no) return fail(out, "bad parameter tag");
            string_value_ = t == match::yes;
            consume(quote + (string_value_ ? string_true : string_false).size());
            std::string head = first_param_ ? "" : ",";
            head += json_quote(name);
            head += ':';
            if (string_value_) head += '"';
            emit(out, kind::arguments, head);
            first_param_ = false;
            state_ = state::param_value;
            return true;
        }
        case state::param_value: {
            const std::size_t at = pending_.find(close_param);
            std::size_t take = at;
            if (at == std::string::npos) {
                const std::size_t hold = tag_prefix_suffix(pending_, close_param);
                take = pending_.size() - (hold != 0 ? hold : incomplete_utf8(pending_));
            }
            const std::string_view value = std::string_view(pending_).substr(0, take);
            std::string delta;
            if (string_value_) append_escaped(delta, value);
            else delta = value;
            if (at != std::string::npos && string_value_) delta += '"';
            emit(out, kind::arguments, delta);
            consume(take);
            if (at == std::string::npos) return false;
            consume(close_param.size());
            state_ = state::invoke_body;
            return true;
        }
        case state::failed:
            pending_.clear();
            return false;
    }
    return false;
}

std::vector<dsml_event> dsml_stream_parser::feed(std::string_view chunk) {
    std::vector<dsml_event> out;
    pending_ += chunk;
    while (step(out)) {
    }
    return out;
}

std::vector<dsml_event> dsml_stream_parser::finish() {
    std::vector<dsml_event> out;
    if (state_ == state::text) {
        emit(out, dsml_event::kind::text, pending_);
        pending_.clear();
    } else if (state_ != state::failed) {
        status_ = dsml_status::unterminated;
        state_ = state::failed;
        emit(out, dsml_event::kind::error, "unterminated DSML tool-call block");
    }
    return out;
}

dsml_result parse_dsml(std::string_view assistant_text) {
    dsml_stream_parser parser;
    std::vector<dsml_event> events = parser.feed(assistant_text);
    for (dsml_event& e : parser.finish()) events.push_back(std::move(e));

    dsml_result r;
    r.status = parser.status();
    if (r.status == dsml_status::malformed) {
        r.content = std::string(assistant_text);
        r.error = events.back().data;
        return r;
    }
    bool open = false;
    for (const dsml_event& e : events) {
        switch (e.type) {
            case dsml_event::kind::text: r.content += e.data; break;
            case dsml_event::kind::tool_call_begin:
                r.calls.push_back(tool_call{{}, e.data, {}});
                open = true;
                break;
            case dsml_event::kind::arguments: r.calls.back().arguments += e.data; break;
            case dsml_event::kind::tool_call_end: open = false; break;
            case dsml_event::kind::error: r.error = e.data; break;
        }
    }
    if (open) r.calls.pop_back();  // unterminated inside an invoke: that call is incomplete
    return r;
}

}  // namespace ds4::ref
