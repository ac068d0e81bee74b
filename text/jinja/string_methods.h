// Python str semantics the templates rely on: strip with Unicode whitespace, split, replace,
// splitlines, Unicode case mapping (ICU), capitalize/title, number parsing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace llm::jinja {

// str.lower() / str.upper(): full Unicode case mapping.
std::string PyLower(const std::string& s);
std::string PyUpper(const std::string& s);
std::string PyCapitalize(const std::string& s);
std::string PyTitle(const std::string& s);     // str.title()
std::string JinjaTitle(const std::string& s);  // the |title filter (splits on -, space, brackets)
// str.strip / lstrip / rstrip; chars null means Python's whitespace set.
std::string PyStrip(const std::string& s, const std::string* chars, bool left, bool right);
std::string PyReplace(const std::string& s, const std::string& old, const std::string& repl,
                      int64_t count);
// str.split / str.rsplit; sep null splits on whitespace runs.
std::vector<std::string> PySplit(const std::string& s, const std::string* sep, int64_t maxsplit,
                                 bool from_right);
std::vector<std::string> PySplitLines(const std::string& s);
std::optional<double> PyParseFloat(const std::string& s);
std::optional<int64_t> PyParseInt(const std::string& s, int64_t base);
std::string HtmlEscape(const std::string& s);
int64_t WordCount(const std::string& s);

}  // namespace llm::jinja
