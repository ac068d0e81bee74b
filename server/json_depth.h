// A pre-scan that bounds the nesting depth of a JSON text before it is parsed. Parsing, copying
// and walking a JSON value all recurse once per level, so a body nested 100,000 deep would
// overflow the stack in any of them; the scan itself is a loop and counts brackets outside
// strings only.
#pragma once

#include <string_view>

namespace llm {

// True when no array/object in `text` is nested deeper than `max_depth` (1: a flat object).
// Malformed text may pass; the parser rejects it afterwards.
bool JsonDepthWithin(std::string_view text, int max_depth);

}  // namespace llm
