// The JSON reader/writer (src/core/json.h) and Ridge's topology JSON (src/topo/topo_json.h).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/json.h"

namespace ridge::json {
namespace {

Value parseOk(const std::string& text) {
  Value v;
  Status st = parse(text, "t.json", &v);
  EXPECT_TRUE(st.isOk()) << st.message();
  return v;
}

std::string parseError(const std::string& text) {
  Value v;
  Status st = parse(text, "bad.json", &v);
  EXPECT_FALSE(st.isOk()) << "accepted: " << text;
  return st.message();
}

TEST(Json, ParsesEveryType) {
  Value v = parseOk(R"({"n": null, "t": true, "f": false, "i": -12, "d": 2.5e3,
                        "s": "a\"b\\c\n\u00e9\ud83d\ude00", "a": [1, [2], {}], "o": {"x": 1}})");
  ASSERT_TRUE(v.isObject());
  EXPECT_EQ(v.size(), 8u);
  EXPECT_TRUE(v.get("n")->isNull());
  EXPECT_TRUE(v.get("t")->asBool());
  EXPECT_FALSE(v.get("f")->asBool());
  EXPECT_TRUE(v.get("f")->isBool());
  EXPECT_EQ(v.get("i")->asNumber(), -12);
  EXPECT_EQ(v.get("d")->asNumber(), 2500);
  EXPECT_EQ(v.get("s")->asString(), "a\"b\\c\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(v.get("a")->items().size(), 3u);
  EXPECT_EQ(v.get("a")->items()[1].items()[0].asNumber(), 2);
  EXPECT_EQ(v.get("o")->get("x")->asNumber(), 1);
  EXPECT_EQ(v.get("missing"), nullptr);
  EXPECT_EQ(v.get("i")->get("x"), nullptr);  // not an object
  // Members keep file order.
  EXPECT_EQ(v.members()[0].first, "n");
  EXPECT_EQ(v.members()[7].first, "o");
}

TEST(Json, RecordsLines) {
  Value v = parseOk("{\n  \"a\": 1,\n\n  \"b\": [\n    true\n  ]\n}");
  EXPECT_EQ(v.line(), 1);
  EXPECT_EQ(v.get("a")->line(), 2);
  EXPECT_EQ(v.get("a")->column(), 8);
  EXPECT_EQ(v.get("b")->line(), 4);
  EXPECT_EQ(v.get("b")->items()[0].line(), 5);
  EXPECT_EQ(where("f.json", *v.get("b")), "f.json:4");
  EXPECT_EQ(where("f.json", Value(1)), "f.json");
}

TEST(Json, ErrorsNameFileLineAndColumn) {
  EXPECT_EQ(parseError("{\n  \"a\": 1\n  \"b\": 2\n}"),
            "bad.json:3:3: expected ',' or '}' in object, found '\"'");
  EXPECT_EQ(parseError("[1, 2,]"), "bad.json:1:7: expected a value, found ']'");
  EXPECT_EQ(parseError("{\"a\": 1, \"a\": 2}"), "bad.json:1:10: duplicate member \"a\"");
  EXPECT_EQ(parseError("\n\n  tru"), "bad.json:3:3: expected a value, found 't'");
  EXPECT_EQ(parseError("{\"a\": 1} x"), "bad.json:1:10: unexpected text after the JSON value");
  EXPECT_EQ(parseError(""), "bad.json:1:1: expected a value, found end of input");
  EXPECT_EQ(parseError("[1,\n2"), "bad.json:2:2: expected ',' or ']' in array, found end of input");
  EXPECT_EQ(parseError("\"abc"), "bad.json:1:5: unterminated string");
  EXPECT_NE(parseError("\"a\nb\"").find("newline"), std::string::npos);
}

TEST(Json, RejectsWhatJsonForbids) {
  for (const char* bad :
       {"01",           "1.",   ".5",       "+1",      "-",        "1e",           "1e+",       "NaN",
        "Infinity",     "-inf", "[1 2]",    "{a: 1}",  "{'a': 1}", "\"\\x\"",      "\"\\u12\"", "\"\\ud800\"",
        "\"\\udc00x\"", "[1,]", "{\"a\":}", "// c\n1", "1e999",    "\"tab\there\""})
    parseError(bad);
  std::string deep(300, '[');
  EXPECT_NE(parseError(deep).find("nesting"), std::string::npos);
  // Tiny numbers underflow to zero rather than failing, as in other parsers.
  EXPECT_EQ(parseOk("1e-999").asNumber(), 0);
}

TEST(Json, WriteReadsBackExactly) {
  Value v = Value::object();
  v.set("version", 1);
  v.set("pi", 3.141592653589793);
  v.set("third", 1.0 / 3.0);
  v.set("tiny", 1e-300);
  v.set("big", 9007199254740992.0);  // 2^53
  v.set("neg", -0.1);
  v.set("text", "quote \" backslash \\ newline \n control \x01 utf8 \xc3\xa9");
  v.set("empty", "");
  Value& arr = v.set("matrix", Value::array());
  arr.push(Value::array()).push(1);
  Value row = Value::array();
  row.push(2.5);
  row.push(true);
  row.push(nullptr);
  arr.push(row);
  v.set("emptyArray", Value::array());
  v.set("emptyObject", Value::object());
  for (int indent : {0, 2, 4}) {
    const std::string text = write(v, indent);
    Value back = parseOk(text);
    EXPECT_EQ(back, v) << text;
    EXPECT_EQ(write(back, indent), text);
  }
  EXPECT_EQ(write(Value(24.0)), "24");
  EXPECT_EQ(write(Value(0.5)), "0.5");
  EXPECT_EQ(write(Value(std::nan(""))), "null");
  EXPECT_EQ(write(Value(std::numeric_limits<double>::infinity())), "null");
  // Compact output has no whitespace; numeric arrays stay on one line when indented.
  Value small = Value::object();
  small.set("a", Value::array()).push(1);
  small.get("a")->push(2);
  EXPECT_EQ(write(small, 0), "{\"a\":[1,2]}");
  EXPECT_EQ(write(small, 2), "{\n  \"a\": [1, 2]\n}");
}

TEST(Json, SetReplacesAndKeepsOrder) {
  Value v;
  v.set("a", 1);
  v.set("b", 2);
  v.set("a", 3);
  ASSERT_TRUE(v.isObject());
  EXPECT_EQ(v.size(), 2u);
  EXPECT_EQ(v.members()[0].first, "a");
  EXPECT_EQ(v.get("a")->asNumber(), 3);
  Value a;
  a.push("x");
  EXPECT_TRUE(a.isArray());
  EXPECT_EQ(a.items()[0].asString(), "x");
  // Accessors of the wrong type read as empty.
  EXPECT_EQ(Value(1).asString(), "");
  EXPECT_EQ(Value("1").asNumber(), 0);
  EXPECT_TRUE(Value(1).items().empty());
}

TEST(Json, MissingFileIsAnError) {
  Value v;
  Status st = parseFile("/nonexistent/dir/x.json", &v);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("/nonexistent/dir/x.json"), std::string::npos);
}

}  // namespace
}  // namespace ridge::json
