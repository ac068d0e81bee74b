// The states several tool-call families share: a name up to a marker, a JSON call object, a JSON
// arguments value (family_parsers.h).
#include "text/tool_calls/family_parsers.h"

namespace llm::tool_parsers {

StateResult TakeHead(std::string& buf, std::string_view marker, size_t max_len, bool final,
                     std::string* head) {
  const size_t at = buf.find(marker);
  if (at == std::string::npos || at > max_len) {
    if (at != std::string::npos || buf.size() > max_len + marker.size()) {
      return StateResult::kBroken;
    }
    if (final) buf.clear();
    return StateResult::kWait;
  }
  *head = buf.substr(0, at);
  buf.erase(0, at + marker.size());
  return StateResult::kDone;
}

StateResult StreamJsonCall(tool_scan::JsonCallStreamer& call, std::string& buf, CallWriter& calls,
                           ParsedDelta* d) {
  call.Feed(buf);
  buf.clear();
  if (!call.Advance()) {
    if (call.name_known()) calls.Drain(&call, d);
    return StateResult::kBroken;
  }
  calls.Drain(&call, d);
  if (!call.done()) return StateResult::kWait;
  buf = call.Leftover();
  return StateResult::kDone;
}

StateResult StreamArguments(tool_scan::JsonValueStreamer& args, std::string& buf, CallWriter& calls,
                            ParsedDelta* d) {
  calls.Arguments(d, args.Feed(buf));
  buf.clear();
  if (args.invalid()) return StateResult::kBroken;
  if (!args.done()) return StateResult::kWait;
  buf = args.Leftover();
  return StateResult::kDone;
}

}  // namespace llm::tool_parsers
