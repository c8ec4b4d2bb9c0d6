// A small JSON document model, parser and writer for Ridge's own files: topology
// descriptions, plan dumps, tool output.
//
// Why not a library: Ridge needs a few hundred lines, errors that name the file and line
// (users hand-edit these files), object members kept in file order (so written files diff
// cleanly and read back the same), and no dependency for the core layer.
//
//   json::Value doc;
//   RIDGE_TRY(json::parse(text, "plan.json", &doc));         // "plan.json:12:5: expected ','"
//   const json::Value* ranks = doc.get("ranks");              // nullptr when absent
//   if (!ranks || !ranks->isNumber())
//     return makeError(ridgeInvalidArgument, "%s: 'ranks' must be a number",
//                      json::where("plan.json", ranks ? *ranks : doc).c_str());
//
//   json::Value out = json::Value::object();
//   out.set("version", 1);
//   out.set("links", json::Value::array()).push(json::Value(24.0));
//   std::string text = json::write(out);                      // 2-space indented
//
// Numbers are doubles (every integer up to 2^53 is exact); the writer prints the shortest
// text that reads back to the same double, so write-then-parse is lossless. Strings are
// UTF-8; \u escapes (surrogate pairs included) are decoded on input, and the writer escapes
// only what JSON requires.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace ridge::json {

enum class Type : uint8_t { Null, Bool, Number, String, Array, Object };

/// Name of a type for error messages: "null", "boolean", "number", "string", "array", "object".
const char* typeName(Type t);

class Value {
 public:
  using Member = std::pair<std::string, Value>;

  Value() = default;  ///< null
  Value(std::nullptr_t) {}
  Value(bool b) : type_(Type::Bool), bool_(b) {}
  Value(double d) : type_(Type::Number), number_(d) {}
  Value(int i) : type_(Type::Number), number_(i) {}
  Value(int64_t i) : type_(Type::Number), number_(static_cast<double>(i)) {}
  Value(uint64_t i) : type_(Type::Number), number_(static_cast<double>(i)) {}
  Value(unsigned i) : type_(Type::Number), number_(i) {}
  Value(const char* s) : type_(Type::String), string_(s) {}
  Value(std::string s) : type_(Type::String), string_(std::move(s)) {}

  static Value array() { return Value(Type::Array); }
  static Value object() { return Value(Type::Object); }

  Type type() const { return type_; }
  bool isNull() const { return type_ == Type::Null; }
  bool isBool() const { return type_ == Type::Bool; }
  bool isNumber() const { return type_ == Type::Number; }
  bool isString() const { return type_ == Type::String; }
  bool isArray() const { return type_ == Type::Array; }
  bool isObject() const { return type_ == Type::Object; }

  /// The value itself; calling the accessor of another type returns false / 0 / "" / empty.
  bool asBool() const { return type_ == Type::Bool && bool_; }
  double asNumber() const { return type_ == Type::Number ? number_ : 0; }
  const std::string& asString() const;

  /// Array elements (empty for non-arrays).
  const std::vector<Value>& items() const;
  /// Object members in insertion (file) order (empty for non-objects).
  const std::vector<Member>& members() const;
  /// Elements of an array or members of an object; 0 otherwise.
  size_t size() const;

  /// Member `key` of an object, nullptr when absent or when this is not an object.
  const Value* get(const std::string& key) const;
  Value* get(const std::string& key);

  /// Sets member `key` of an object (replacing an existing one, else appending) and returns
  /// the stored value. Turns a null value into an empty object first.
  Value& set(const std::string& key, Value v);
  /// Appends to an array and returns the stored element. Turns null into an empty array.
  Value& push(Value v);

  /// 1-based line of the value's first character in the parsed text; 0 for built values.
  int line() const { return line_; }
  int column() const { return column_; }

  /// Deep equality (line numbers ignored; object members compared in order).
  bool operator==(const Value& o) const;

 private:
  explicit Value(Type t) : type_(t) {}
  friend class Parser;

  Type type_ = Type::Null;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<Value> items_;
  std::vector<Member> members_;
  int line_ = 0, column_ = 0;
};

/// Parses one JSON document (RFC 8259; no comments, no trailing commas). `what` names the
/// source in errors: "file.json:LINE:COL: message". Duplicate object keys are an error,
/// because a hand-edited file with two "bandwidth" keys is a mistake worth reporting.
/// Nesting deeper than 256 levels is refused.
Status parse(const std::string& text, const std::string& what, Value* out);

/// Reads and parses a file (errors name `path`).
Status parseFile(const std::string& path, Value* out);

/// Serializes `v`. indent > 0: one member/element per line with that many spaces per
/// level, except that an array or object holding only scalars stays on one line when that
/// line is at most 100 characters (matrix rows and small records read better that way).
/// indent == 0: compact, no whitespace. Non-finite numbers become null
/// (JSON has no NaN). Output ends without a newline.
std::string write(const Value& v, int indent = 2);

/// "what:LINE" for a parsed value, "what" for a built one: the prefix of a field error.
std::string where(const std::string& what, const Value& v);

/// Escapes `s` as a JSON string literal, quotes included.
std::string quote(const std::string& s);

}  // namespace ridge::json
