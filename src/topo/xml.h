// A small, non-validating XML reader for topology files (NCCL topology and graph files,
// hwloc XML). It keeps elements, attributes and text content, drops comments, processing instructions and the DOCTYPE, and decodes the five predefined
// entities and numeric character references. Enough for machine descriptions of a few
// thousand elements; not a general XML library (no namespaces, no DTD entities).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace ridge::topo {

struct XmlElement {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attributes;
  std::vector<XmlElement> children;
  /// Character data directly inside the element (all its pieces joined, entities decoded,
  /// whitespace kept): hwloc writes distance matrices as text.
  std::string text;
  int line = 0;  ///< Line of the start tag, for error messages.

  /// Value of an attribute, or nullptr when absent.
  const std::string* attribute(const char* key) const;
};

/// Parses `text` and stores its root element in `root`. A truncated or malformed document
/// (unclosed element, bad attribute) is ridgeInvalidArgument naming `what` and the line.
Status parseXml(const std::string& text, const std::string& what, XmlElement* root);

/// Reads a whole file into `text` (ridgeSystemError naming the path when it cannot).
Status readTextFile(const std::string& path, std::string* text);

}  // namespace ridge::topo
