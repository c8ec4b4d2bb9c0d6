#include "topo/xml.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ridge::topo {

const std::string* XmlElement::attribute(const char* key) const {
  for (const auto& kv : attributes) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

namespace {

class Parser {
 public:
  Parser(const std::string& text, const std::string& what) : s_(text), what_(what) {}

  Status parseDocument(XmlElement* root) {
    bool haveRoot = false;
    while (true) {
      skipMisc();
      if (pos_ >= s_.size()) break;
      if (s_[pos_] != '<') return error("text outside the root element");
      if (haveRoot) return error("a second root element");
      RIDGE_TRY(parseElement(root, 0));
      haveRoot = true;
    }
    if (!haveRoot) return error("no root element");
    return Status::ok();
  }

 private:
  static constexpr int kMaxDepth = 256;
  // hwloc writes an n x n distance matrix as text; 4096 GPUs and switches of u64 values
  // would be ~300 MiB, far beyond any machine. 64 MiB of text per element bounds a hostile file.
  static constexpr size_t kMaxTextBytes = size_t{64} << 20;

  Status error(const char* msg) const {
    return makeError(ridgeInvalidArgument, "%s: malformed XML at line %d: %s", what_.c_str(), line(), msg);
  }
  // Line of pos_; counts incrementally because pos_ only moves forward.
  int line() const {
    size_t end = pos_ < s_.size() ? pos_ : s_.size();
    for (; lineScan_ < end; ++lineScan_) lineNo_ += s_[lineScan_] == '\n';
    return lineNo_;
  }
  bool startsWith(const char* p) const { return s_.compare(pos_, std::strlen(p), p) == 0; }
  bool skipPast(const char* terminator) {
    size_t e = s_.find(terminator, pos_);
    if (e == std::string::npos) {
      pos_ = s_.size();
      return false;
    }
    pos_ = e + std::strlen(terminator);
    return true;
  }
  void skipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  // Whitespace, comments, processing instructions and <!DOCTYPE ...> between elements.
  bool skipMisc() {
    while (true) {
      skipSpace();
      if (startsWith("<!--")) {
        if (!skipPast("-->")) return false;
      } else if (startsWith("<?")) {
        if (!skipPast("?>")) return false;
      } else if (startsWith("<!DOCTYPE")) {
        if (!skipDoctype()) return false;
      } else {
        return true;
      }
    }
  }
  bool skipDoctype() {
    int bracket = 0;
    for (; pos_ < s_.size(); ++pos_) {
      char c = s_[pos_];
      if (c == '[') ++bracket;
      if (c == ']') --bracket;
      if (c == '>' && bracket <= 0) {
        ++pos_;
        return true;
      }
    }
    return false;
  }
  static bool isNameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.' || c == ':';
  }
  std::string readName() {
    size_t b = pos_;
    while (pos_ < s_.size() && isNameChar(s_[pos_])) ++pos_;
    return s_.substr(b, pos_ - b);
  }
  static void appendUtf8(std::string* out, unsigned long cp) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  static std::string decode(const std::string& raw) {
    std::string out;
    out.reserve(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '&') {
        out.push_back(raw[i]);
        continue;
      }
      size_t semi = raw.find(';', i);
      if (semi == std::string::npos) {
        out.push_back('&');
        continue;
      }
      std::string ent = raw.substr(i + 1, semi - i - 1);
      if (ent == "amp")
        out.push_back('&');
      else if (ent == "lt")
        out.push_back('<');
      else if (ent == "gt")
        out.push_back('>');
      else if (ent == "quot")
        out.push_back('"');
      else if (ent == "apos")
        out.push_back('\'');
      else if (!ent.empty() && ent[0] == '#') {
        bool hex = ent.size() > 1 && (ent[1] == 'x' || ent[1] == 'X');
        appendUtf8(&out, std::strtoul(ent.c_str() + (hex ? 2 : 1), nullptr, hex ? 16 : 10));
      } else {
        out.append(raw, i, semi - i + 1);  // unknown entity: keep it as written
      }
      i = semi;
    }
    return out;
  }

  Status parseElement(XmlElement* el, int depth) {
    if (depth > kMaxDepth) return error("elements nested too deeply");
    el->line = line();
    ++pos_;  // '<'
    el->name = readName();
    if (el->name.empty()) return error("expected an element name after '<'");
    // Attributes, then '>' or '/>'.
    while (true) {
      skipSpace();
      if (pos_ >= s_.size()) return error(("file ends inside the tag <" + el->name).c_str());
      if (startsWith("/>")) {
        pos_ += 2;
        return Status::ok();
      }
      if (s_[pos_] == '>') {
        ++pos_;
        break;
      }
      std::string key = readName();
      if (key.empty()) return error(("bad attribute in <" + el->name + ">").c_str());
      skipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '=') return error(("attribute " + key + " has no value").c_str());
      ++pos_;
      skipSpace();
      if (pos_ >= s_.size() || (s_[pos_] != '"' && s_[pos_] != '\''))
        return error(("attribute " + key + " is not quoted").c_str());
      char quote = s_[pos_++];
      size_t end = s_.find(quote, pos_);
      if (end == std::string::npos) return error(("file ends inside attribute " + key).c_str());
      el->attributes.emplace_back(std::move(key), decode(s_.substr(pos_, end - pos_)));
      pos_ = end + 1;
    }
    // Content: children, text (kept, entities decoded: hwloc's distance matrices are text),
    // comments, CDATA (dropped).
    while (true) {
      size_t lt = s_.find('<', pos_);
      if (lt == std::string::npos) {
        pos_ = s_.size();
        return error(("file ends before </" + el->name + "> (truncated?)").c_str());
      }
      const size_t firstNonSpace = s_.find_first_not_of(" \t\r\n", pos_);
      if (firstNonSpace < lt) {  // whitespace between elements is layout, not content
        if (el->text.size() + (lt - pos_) > kMaxTextBytes)
          return error(("text of <" + el->name + "> is larger than any topology needs").c_str());
        el->text += decode(s_.substr(pos_, lt - pos_));
      }
      pos_ = lt;
      if (startsWith("</")) {
        pos_ += 2;
        std::string closing = readName();
        if (closing != el->name) return error(("</" + closing + "> closes <" + el->name + ">").c_str());
        skipSpace();
        if (pos_ >= s_.size() || s_[pos_] != '>') return error("bad closing tag");
        ++pos_;
        return Status::ok();
      }
      if (startsWith("<!--")) {
        if (!skipPast("-->")) return error("unterminated comment");
      } else if (startsWith("<![CDATA[")) {
        if (!skipPast("]]>")) return error("unterminated CDATA section");
      } else if (startsWith("<?")) {
        if (!skipPast("?>")) return error("unterminated processing instruction");
      } else {
        el->children.emplace_back();
        RIDGE_TRY(parseElement(&el->children.back(), depth + 1));
      }
    }
  }

  const std::string& s_;
  const std::string& what_;
  size_t pos_ = 0;
  mutable size_t lineScan_ = 0;
  mutable int lineNo_ = 1;
};

}  // namespace

Status parseXml(const std::string& text, const std::string& what, XmlElement* root) {
  *root = XmlElement();
  return Parser(text, what).parseDocument(root);
}

Status readTextFile(const std::string& path, std::string* text) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return systemError(("cannot open " + path).c_str());
  text->clear();
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text->append(buf, n);
  bool bad = std::ferror(f);
  std::fclose(f);
  if (bad) return makeError(ridgeSystemError, "error reading %s", path.c_str());
  return Status::ok();
}

}  // namespace ridge::topo
