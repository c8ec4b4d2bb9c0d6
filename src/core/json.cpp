#include "core/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace ridge::json {

const char* typeName(Type t) {
  switch (t) {
    case Type::Null: return "null";
    case Type::Bool: return "boolean";
    case Type::Number: return "number";
    case Type::String: return "string";
    case Type::Array: return "array";
    case Type::Object: return "object";
  }
  return "?";
}

// Accessors of the wrong type return references to these rather than throwing: callers
// check the type first when it matters, and a wrong guess reads as "absent".
static const std::string kEmptyString;
static const std::vector<Value> kEmptyItems;
static const std::vector<Value::Member> kEmptyMembers;

const std::string& Value::asString() const {
  return type_ == Type::String ? string_ : kEmptyString;
}
const std::vector<Value>& Value::items() const {
  return type_ == Type::Array ? items_ : kEmptyItems;
}
const std::vector<Value::Member>& Value::members() const {
  return type_ == Type::Object ? members_ : kEmptyMembers;
}

size_t Value::size() const {
  if (type_ == Type::Array) return items_.size();
  if (type_ == Type::Object) return members_.size();
  return 0;
}

const Value* Value::get(const std::string& key) const {
  if (type_ != Type::Object) return nullptr;
  for (const Member& m : members_)
    if (m.first == key) return &m.second;
  return nullptr;
}

Value* Value::get(const std::string& key) {
  return const_cast<Value*>(static_cast<const Value*>(this)->get(key));
}

Value& Value::set(const std::string& key, Value v) {
  if (type_ == Type::Null) type_ = Type::Object;
  for (Member& m : members_)
    if (m.first == key) return m.second = std::move(v);
  members_.emplace_back(key, std::move(v));
  return members_.back().second;
}

Value& Value::push(Value v) {
  if (type_ == Type::Null) type_ = Type::Array;
  items_.push_back(std::move(v));
  return items_.back();
}

bool Value::operator==(const Value& o) const {
  if (type_ != o.type_) return false;
  switch (type_) {
    case Type::Null: return true;
    case Type::Bool: return bool_ == o.bool_;
    case Type::Number: return number_ == o.number_;
    case Type::String: return string_ == o.string_;
    case Type::Array: return items_ == o.items_;
    case Type::Object: return members_ == o.members_;
  }
  return false;
}

// ---- parser ---------------------------------------------------------------------------

class Parser {
 public:
  Parser(const std::string& text, const std::string& what) : s_(text), what_(what) {}

  Status document(Value* out) {
    skipSpace();
    RIDGE_TRY(value(out, 0));
    skipSpace();
    if (pos_ < s_.size()) return error("unexpected text after the JSON value");
    return Status::ok();
  }

 private:
  static constexpr int kMaxDepth = 256;
  const std::string& s_;
  const std::string& what_;
  size_t pos_ = 0;
  int line_ = 1;
  size_t lineStart_ = 0;

  int column() const { return static_cast<int>(pos_ - lineStart_) + 1; }

  Status error(const std::string& msg) const {
    return makeError(ridgeInvalidArgument, "%s:%d:%d: %s", what_.c_str(), line_, column(), msg.c_str());
  }

  // What is at the current position, for "expected X, found Y" messages.
  std::string found() const {
    if (pos_ >= s_.size()) return "end of input";
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c < 0x20 || c >= 0x7f) return format("byte 0x%02x", c);
    return format("'%c'", c);
  }

  void skipSpace() {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == '\n') {
        ++line_;
        lineStart_ = ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  bool consume(const char* word) {
    const size_t n = std::strlen(word);
    if (s_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }

  Status value(Value* out, int depth) {
    if (depth > kMaxDepth) return error("nesting deeper than 256 levels");
    *out = Value();
    out->line_ = line_;
    out->column_ = column();
    if (pos_ >= s_.size()) return error("expected a value, found end of input");
    switch (s_[pos_]) {
      case '{': return object(out, depth);
      case '[': return array(out, depth);
      case '"': out->type_ = Type::String; return string(&out->string_);
      case 't':
      case 'f':
      case 'n':
        if (consume("true")) {
          out->type_ = Type::Bool;
          out->bool_ = true;
        } else if (consume("false")) {
          out->type_ = Type::Bool;
        } else if (!consume("null")) {
          return error("expected a value, found " + found());
        }
        return Status::ok();
      default: return number(out);
    }
  }

  Status object(Value* out, int depth) {
    out->type_ = Type::Object;
    ++pos_;  // '{'
    skipSpace();
    if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, Status::ok();
    for (;;) {
      skipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"')
        return error("expected a member name in quotes, found " + found());
      const int keyLine = line_, keyCol = column();
      std::string key;
      RIDGE_TRY(string(&key));
      for (const Value::Member& m : out->members_)
        if (m.first == key)
          return makeError(ridgeInvalidArgument, "%s:%d:%d: duplicate member \"%s\"", what_.c_str(), keyLine,
                           keyCol, key.c_str());
      skipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ':')
        return error("expected ':' after member name, found " + found());
      ++pos_;
      skipSpace();
      out->members_.emplace_back(std::move(key), Value());
      RIDGE_TRY(value(&out->members_.back().second, depth + 1));
      skipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, Status::ok();
      return error("expected ',' or '}' in object, found " + found());
    }
  }

  Status array(Value* out, int depth) {
    out->type_ = Type::Array;
    ++pos_;  // '['
    skipSpace();
    if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, Status::ok();
    for (;;) {
      skipSpace();
      out->items_.emplace_back();
      RIDGE_TRY(value(&out->items_.back(), depth + 1));
      skipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, Status::ok();
      return error("expected ',' or ']' in array, found " + found());
    }
  }

  static int hexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  Status hex4(unsigned* out) {
    if (pos_ + 4 > s_.size()) return error("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const int d = hexDigit(s_[pos_ + static_cast<size_t>(i)]);
      if (d < 0) return error("bad hex digit in \\u escape");
      v = v * 16 + static_cast<unsigned>(d);
    }
    pos_ += 4;
    *out = v;
    return Status::ok();
  }

  static void appendUtf8(std::string* s, unsigned cp) {
    if (cp < 0x80) {
      *s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *s += static_cast<char>(0xc0 | (cp >> 6));
      *s += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      *s += static_cast<char>(0xe0 | (cp >> 12));
      *s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      *s += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      *s += static_cast<char>(0xf0 | (cp >> 18));
      *s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      *s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      *s += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  Status string(std::string* out) {
    ++pos_;  // opening quote
    out->clear();
    for (;;) {
      if (pos_ >= s_.size()) return error("unterminated string");
      const char c = s_[pos_];
      if (c == '"') return ++pos_, Status::ok();
      if (static_cast<unsigned char>(c) < 0x20)
        return error(c == '\n' ? "unterminated string (newline inside it)" : "control character in string");
      if (c != '\\') {
        *out += c;
        ++pos_;
        continue;
      }
      if (++pos_ >= s_.size()) return error("unterminated string");
      const char e = s_[pos_++];
      switch (e) {
        case '"': *out += '"'; break;
        case '\\': *out += '\\'; break;
        case '/': *out += '/'; break;
        case 'b': *out += '\b'; break;
        case 'f': *out += '\f'; break;
        case 'n': *out += '\n'; break;
        case 'r': *out += '\r'; break;
        case 't': *out += '\t'; break;
        case 'u': {
          unsigned cp = 0;
          RIDGE_TRY(hex4(&cp));
          if (cp >= 0xd800 && cp < 0xdc00) {  // high surrogate: a low one must follow
            unsigned lo = 0;
            if (!consume("\\u")) return error("unpaired surrogate in \\u escape");
            RIDGE_TRY(hex4(&lo));
            if (lo < 0xdc00 || lo >= 0xe000) return error("unpaired surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            return error("unpaired surrogate in \\u escape");
          }
          appendUtf8(out, cp);
          break;
        }
        default: --pos_; return error(format("bad escape '\\%c' in string", e));
      }
    }
  }

  Status number(Value* out) {
    // Validate JSON's grammar first (from_chars would accept "inf", leading '+', "01").
    const size_t start = pos_;
    size_t p = pos_;
    auto digits = [&] {
      const size_t from = p;
      while (p < s_.size() && s_[p] >= '0' && s_[p] <= '9') ++p;
      return p - from;
    };
    if (p < s_.size() && s_[p] == '-') ++p;
    const size_t intStart = p;
    const size_t intDigits = digits();
    if (intDigits == 0) return error("expected a value, found " + found());
    if (intDigits > 1 && s_[intStart] == '0') return error("leading zero in number");
    if (p < s_.size() && s_[p] == '.') {
      ++p;
      if (digits() == 0) {
        pos_ = p;
        return error("expected digits after '.' in number");
      }
    }
    bool negativeExponent = false;
    if (p < s_.size() && (s_[p] == 'e' || s_[p] == 'E')) {
      ++p;
      if (p < s_.size() && (s_[p] == '+' || s_[p] == '-')) negativeExponent = s_[p++] == '-';
      if (digits() == 0) {
        pos_ = p;
        return error("expected digits in exponent");
      }
    }
    double d = 0;
    const auto r = std::from_chars(s_.data() + start, s_.data() + p, d);
    if (r.ec == std::errc::result_out_of_range) {
      // Underflow reads as 0 as in every other parser; overflow is an error, not infinity.
      if (!negativeExponent) return error("number out of range");
      d = 0;
    } else if (r.ec != std::errc() || r.ptr != s_.data() + p) {
      return error("malformed number");
    }
    pos_ = p;
    out->type_ = Type::Number;
    out->number_ = d;
    return Status::ok();
  }
};

Status parse(const std::string& text, const std::string& what, Value* out) {
  Parser p(text, what);
  return p.document(out);
}

Status parseFile(const std::string& path, Value* out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return systemError(("cannot open " + path).c_str());
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return makeError(ridgeSystemError, "cannot read %s", path.c_str());
  return parse(text, path, out);
}

// ---- writer ---------------------------------------------------------------------------

std::string quote(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += format("\\u%04x", static_cast<unsigned char>(c));
        else
          out += c;
    }
  }
  out += '"';
  return out;
}

static void writeNumber(std::string* out, double d) {
  if (!std::isfinite(d)) {
    *out += "null";
    return;
  }
  // Shortest representation that reads back to the same double: "24", "0.5", "1e-07".
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d);
  out->append(buf, r.ptr);
}

static bool isScalar(const Value& v) {
  return !v.isArray() && !v.isObject();
}

// Arrays and objects made only of scalars go on one line when indenting, if that line stays
// short: matrices and per-link records then read one per line instead of one field per line.
constexpr size_t kOneLineLimit = 100;

static void writeValue(std::string* out, const Value& v, int indent, int level);

static bool writeOneLine(std::string* out, const Value& v) {
  for (const Value& e : v.items())
    if (!isScalar(e)) return false;
  for (const Value::Member& m : v.members())
    if (!isScalar(m.second)) return false;
  std::string line;
  line += v.isArray() ? '[' : '{';
  bool first = true;
  for (const Value& e : v.items()) {
    if (!first) line += ", ";
    first = false;
    writeValue(&line, e, 0, 0);
  }
  for (const Value::Member& m : v.members()) {
    if (!first) line += ", ";
    first = false;
    line += quote(m.first);
    line += ": ";
    writeValue(&line, m.second, 0, 0);
  }
  line += v.isArray() ? ']' : '}';
  if (line.size() > kOneLineLimit) return false;
  *out += line;
  return true;
}

static void writeValue(std::string* out, const Value& v, int indent, int level) {
  auto newline = [&](int lvl) {
    if (indent <= 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (v.type()) {
    case Type::Null: *out += "null"; return;
    case Type::Bool: *out += v.asBool() ? "true" : "false"; return;
    case Type::Number: writeNumber(out, v.asNumber()); return;
    case Type::String: *out += quote(v.asString()); return;
    case Type::Array:
    case Type::Object: {
      const bool isArray = v.isArray();
      if (v.size() == 0) {
        *out += isArray ? "[]" : "{}";
        return;
      }
      if (indent > 0 && writeOneLine(out, v)) return;
      *out += isArray ? '[' : '{';
      bool first = true;
      for (const Value& e : v.items()) {
        if (!first) *out += ',';
        first = false;
        newline(level + 1);
        writeValue(out, e, indent, level + 1);
      }
      for (const Value::Member& m : v.members()) {
        if (!first) *out += ',';
        first = false;
        newline(level + 1);
        *out += quote(m.first);
        *out += indent > 0 ? ": " : ":";
        writeValue(out, m.second, indent, level + 1);
      }
      newline(level);
      *out += isArray ? ']' : '}';
      return;
    }
  }
}

std::string write(const Value& v, int indent) {
  std::string out;
  writeValue(&out, v, indent, 0);
  return out;
}

std::string where(const std::string& what, const Value& v) {
  return v.line() > 0 ? what + ":" + std::to_string(v.line()) : what;
}

}  // namespace ridge::json
