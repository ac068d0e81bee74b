#include "text/tool_calls/family_parsers.h"

namespace llm::tool_parsers {

void CallWriter::Begin(ParsedDelta* d, std::string name) {
  ToolCallDelta c;
  c.index = next_index_++;
  c.id = new_id_();
  c.name = std::move(name);
  d->tool_calls.push_back(std::move(c));
}

void CallWriter::Arguments(ParsedDelta* d, std::string fragment) {
  if (fragment.empty() || next_index_ == 0) return;
  if (!d->tool_calls.empty() && d->tool_calls.back().index == next_index_ - 1) {
    d->tool_calls.back().arguments += fragment;
    return;
  }
  ToolCallDelta c;
  c.index = next_index_ - 1;
  c.arguments = std::move(fragment);
  d->tool_calls.push_back(std::move(c));
}

void CallWriter::Drain(tool_scan::JsonCallStreamer* s, ParsedDelta* d) {
  if (auto name = s->TakeName()) Begin(d, std::move(*name));
  Arguments(d, s->TakeArguments());
}

}  // namespace llm::tool_parsers
