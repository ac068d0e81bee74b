#include "server/openai_responses.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <string_view>

namespace llm {
namespace {

using json = nlohmann::ordered_json;

// Fields that go to the chat body under the same name and meaning (the sampling extras and
// structured_outputs are vLLM's, as on its chat API).
constexpr const char* kSameFields[] = {"model",
                                       "stream",
                                       "temperature",
                                       "top_p",
                                       "parallel_tool_calls",
                                       "top_k",
                                       "min_p",
                                       "seed",
                                       "stop",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "repetition_penalty",
                                       "structured_outputs"};

// Bookkeeping fields that cannot change the output.
constexpr const char* kIgnoredFields[] = {"user", "metadata", "service_tier", "safety_identifier",
                                          "prompt_cache_key"};

std::string NewId(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%llx%06llx", prefix,
                static_cast<unsigned long long>(std::time(nullptr)),
                static_cast<unsigned long long>(counter.fetch_add(1) & 0xffffff));
  return buf;
}

bool Blank(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

// A message item's content: a string, or parts of type input_text / output_text.
Status MessageContent(const json& content, const std::string& where, json* out) {
  if (content.is_string()) {
    *out = content;
    return Status::Ok();
  }
  if (!content.is_array()) return InvalidArgument(where + " must be a string or a list of parts");
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    const std::string pw = where + "[" + std::to_string(j) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return InvalidArgument(pw + " must be an object with a string 'type'");
    }
    const std::string type = part["type"].get<std::string>();
    if (type != "input_text" && type != "output_text") {
      return InvalidArgument(pw + ": content type '" + type +
                             "' is not supported (input_text, output_text are)");
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return InvalidArgument(pw + " needs a string 'text'");
    }
    text += part["text"].get<std::string>();
  }
  *out = text;
  return Status::Ok();
}

// `input` (a string or a list of items) -> chat messages, appended to *messages.
Status InputMessages(const json& input, json* messages) {
  if (input.is_string()) {
    messages->push_back({{"role", "user"}, {"content", input}});
    return Status::Ok();
  }
  if (!input.is_array() || input.empty()) {
    return InvalidArgument("'input' must be a string or a non-empty list of items");
  }
  std::string reasoning;  // a reasoning item's text, for the assistant message that follows
  // The assistant message the last function_call item went into: calls in a row share one.
  json* calls_message = nullptr;
  for (size_t i = 0; i < input.size(); ++i) {
    const json& item = input[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) return InvalidArgument(where + " must be an object");
    const std::string type = item.contains("type") && item["type"].is_string()
                                 ? item["type"].get<std::string>()
                             : item.contains("role") ? "message"
                                                     : "";
    auto str = [&](const char* key, std::string* out) -> Status {
      if (!item.contains(key) || !item[key].is_string()) {
        return InvalidArgument(where + " (" + type + ") needs a string '" + key + "'");
      }
      *out = item[key].get<std::string>();
      return Status::Ok();
    };
    if (type == "message") {
      std::string role;
      if (Status s = str("role", &role); !s.ok()) return s;
      if (role != "user" && role != "system" && role != "developer" && role != "assistant") {
        return InvalidArgument(where + ": role '" + role + "' is not supported");
      }
      json m = {{"role", role == "developer" ? "system" : role}};
      if (!item.contains("content")) return InvalidArgument(where + " needs 'content'");
      if (Status s = MessageContent(item["content"], where + ".content", &m["content"]); !s.ok()) {
        return s;
      }
      if (role == "assistant" && !reasoning.empty()) m["reasoning_content"] = std::move(reasoning);
      reasoning.clear();
      messages->push_back(std::move(m));
      calls_message = nullptr;
    } else if (type == "function_call") {
      std::string call_id, name, arguments;
      for (auto [k, v] :
           {std::pair{"call_id", &call_id}, {"name", &name}, {"arguments", &arguments}}) {
        if (Status s = str(k, v); !s.ok()) return s;
      }
      json call = {{"id", call_id},
                   {"type", "function"},
                   {"function", {{"name", name}, {"arguments", arguments}}}};
      if (calls_message == nullptr) {
        json m = {{"role", "assistant"}, {"content", nullptr}};
        if (!reasoning.empty()) m["reasoning_content"] = std::move(reasoning);
        reasoning.clear();
        m["tool_calls"] = json::array();
        messages->push_back(std::move(m));
        calls_message = &messages->back();
      }
      (*calls_message)["tool_calls"].push_back(std::move(call));
    } else if (type == "function_call_output") {
      std::string call_id;
      if (Status s = str("call_id", &call_id); !s.ok()) return s;
      if (!item.contains("output")) return InvalidArgument(where + " needs 'output'");
      json content;
      if (Status s = MessageContent(item["output"], where + ".output", &content); !s.ok()) {
        return s;
      }
      messages->push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", content}});
      calls_message = nullptr;
    } else if (type == "reasoning") {
      // Given back from an earlier response: the next assistant turn's reasoning_content, which
      // the chat template keeps or drops as the model was trained.
      if (item.contains("content") && item["content"].is_array()) {
        for (const json& part : item["content"]) {
          if (part.is_object() && part.contains("text") && part["text"].is_string()) {
            reasoning += part["text"].get<std::string>();
          }
        }
      }
    } else {
      return InvalidArgument(where + ": input item type '" + type +
                             "' is not supported (message, function_call, "
                             "function_call_output, reasoning are)");
    }
  }
  return Status::Ok();
}

// Responses tools {type: "function", name, description, parameters, strict} -> chat tools.
Status ChatTools(const json& tools, json* out) {
  if (!tools.is_array()) return InvalidArgument("'tools' must be a list");
  *out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string()) {
      return InvalidArgument(where + " must be an object with a string 'type'");
    }
    if (t["type"] != "function") {
      return InvalidArgument(where + ": tool type '" + t["type"].get<std::string>() +
                             "' is not supported (built-in tools run on OpenAI's side; only "
                             "'function' tools are)");
    }
    json fn = json::object();
    for (auto it = t.begin(); it != t.end(); ++it) {
      if (it.key() == "type" || it->is_null()) continue;
      if (it.key() != "name" && it.key() != "description" && it.key() != "parameters" &&
          it.key() != "strict") {
        return InvalidArgument(where + ": unsupported option '" + it.key() + "'");
      }
      fn[it.key()] = *it;
    }
    out->push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return Status::Ok();
}

// "none" | "auto" | "required" | {type: "function", name} -> the chat tool_choice.
Status ChatToolChoice(const json& v, json* out) {
  if (v.is_string()) {
    *out = v;
    return Status::Ok();
  }
  if (v.is_object() && v.value("type", json()) == "function" && v.contains("name") &&
      v["name"].is_string() && v.size() == 2) {
    *out = {{"type", "function"}, {"function", {{"name", v["name"]}}}};
    return Status::Ok();
  }
  return InvalidArgument(
      "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
      "\"name\": ...}");
}

// text: {format: {type: "text" | "json_object" | "json_schema", name, schema, strict,
// description}} -> response_format.
Status ChatResponseFormat(const json& text, json* out) {
  if (!text.is_object()) return InvalidArgument("'text' must be an object");
  for (auto it = text.begin(); it != text.end(); ++it) {
    if (it.key() != "format" && !it->is_null()) {
      return InvalidArgument("text: unsupported option '" + it.key() + "'");
    }
  }
  if (!text.contains("format") || text["format"].is_null()) return Status::Ok();
  const json& f = text["format"];
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string()) {
    return InvalidArgument("'text.format' must be an object with a string 'type'");
  }
  if (f["type"] != "json_schema") {
    for (auto it = f.begin(); it != f.end(); ++it) {
      if (it.key() != "type") {
        return InvalidArgument("text.format: unsupported option '" + it.key() + "'");
      }
    }
    *out = f;  // text / json_object; others are refused by the chat parser
    return Status::Ok();
  }
  json schema = json::object();
  for (auto it = f.begin(); it != f.end(); ++it) {
    if (it.key() != "type") schema[it.key()] = *it;
  }
  *out = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
  return Status::Ok();
}

}  // namespace

Status ResponsesToChatBody(const json& body, json* chat, json* echo, std::string* bad_param) {
  *chat = json::object();
  *echo = {{"instructions", nullptr},    {"max_output_tokens", nullptr},
           {"metadata", json::object()}, {"parallel_tool_calls", true},
           {"temperature", nullptr},     {"text", {{"format", {{"type", "text"}}}}},
           {"tool_choice", "auto"},      {"tools", json::array()},
           {"top_p", nullptr},           {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
           {"truncation", "disabled"}};
  json messages = json::array();
  auto refuse = [&](const std::string& key, const std::string& why) {
    *bad_param = key;
    return InvalidArgument(why);
  };
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& key = it.key();
    const json& v = *it;
    if (v.is_null()) continue;
    auto in = [&key](const auto& list) {
      for (const char* k : list) {
        if (key == k) return true;
      }
      return false;
    };
    if (in(kIgnoredFields)) {
      if (key == "metadata") (*echo)[key] = v;  // repeated, as OpenAI does
      continue;
    }
    if (in(kSameFields)) {
      (*chat)[key] = v;
      if (echo->contains(key)) (*echo)[key] = v;
    } else if (key == "input" || key == "instructions") {
      // Read below, in order: instructions first.
    } else if (key == "max_output_tokens") {
      (*chat)["max_tokens"] = v;
      (*echo)[key] = v;
    } else if (key == "tools") {
      json tools;
      if (Status s = ChatTools(v, &tools); !s.ok()) return refuse(key, s.message());
      if (!tools.empty()) (*chat)["tools"] = std::move(tools);
      (*echo)[key] = v;
    } else if (key == "tool_choice") {
      if (Status s = ChatToolChoice(v, &(*chat)["tool_choice"]); !s.ok()) {
        return refuse(key, s.message());
      }
      (*echo)[key] = v;
    } else if (key == "text") {
      json format;
      if (Status s = ChatResponseFormat(v, &format); !s.ok()) return refuse(key, s.message());
      if (!format.is_null()) (*chat)["response_format"] = std::move(format);
      (*echo)[key] = v;
    } else if (key == "reasoning") {
      if (!v.is_object()) return refuse(key, "'reasoning' must be an object");
      for (auto r = v.begin(); r != v.end(); ++r) {
        if (r->is_null()) continue;
        if (r.key() != "effort") {
          return refuse(key, "reasoning: unsupported option '" + r.key() + "'");
        }
        (*chat)["reasoning_effort"] = *r;
        (*echo)["reasoning"]["effort"] = *r;
      }
    } else if (key == "store") {
      if (v != false) {
        return refuse(key,
                      "'store': true is not supported: this server keeps no responses "
                      "(send \"store\": false)");
      }
    } else if (key == "background") {
      if (v != false) return refuse(key, "'background': true is not supported");
    } else if (key == "truncation") {
      if (v != "disabled") return refuse(key, "'truncation' must be \"disabled\"");
    } else if (key == "include") {
      if (!v.is_array() || !v.empty()) return refuse(key, "'include' values are not supported");
    } else if (key == "top_logprobs") {
      if (v != 0) return refuse(key, "'top_logprobs' is not supported");
    } else if (key == "previous_response_id" || key == "conversation") {
      return refuse(key, "'" + key +
                             "' is not supported: this server keeps no state between requests; "
                             "send the whole conversation in 'input'");
    } else {
      return refuse(key, "unsupported field '" + key + "'");
    }
  }
  if (body.contains("instructions") && !body["instructions"].is_null()) {
    if (!body["instructions"].is_string()) {
      return refuse("instructions", "'instructions' must be a string");
    }
    messages.push_back({{"role", "system"}, {"content", body["instructions"]}});
    (*echo)["instructions"] = body["instructions"];
  }
  if (!body.contains("input") || body["input"].is_null())
    return refuse("input", "'input' is required");
  if (Status s = InputMessages(body["input"], &messages); !s.ok())
    return refuse("input", s.message());
  (*chat)["messages"] = std::move(messages);
  return Status::Ok();
}

std::string ResponsesParamFor(const std::string& chat_param) {
  if (chat_param == "max_tokens") return "max_output_tokens";
  if (chat_param == "response_format") return "text";
  if (chat_param == "messages") return "input";
  if (chat_param == "reasoning_effort") return "reasoning";
  return chat_param;
}

ResponsesWriter::ResponsesWriter(std::string id, int64_t created_at, std::string model, json echo)
    : id_(std::move(id)),
      created_at_(created_at),
      model_(std::move(model)),
      echo_(std::move(echo)) {}

json ResponsesWriter::Response(const char* status, json output, FinishReason finish,
                               const Usage* usage) const {
  json r = {
      {"id", id_},
      {"object", "response"},
      {"created_at", created_at_},
      {"status", status},
      {"error", nullptr},
      {"incomplete_details",
       finish == FinishReason::kLength ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
      {"model", model_},
      {"output", std::move(output)},
      {"previous_response_id", nullptr},
      {"store", false}};
  for (auto it = echo_.begin(); it != echo_.end(); ++it) r[it.key()] = *it;
  if (usage != nullptr) {
    r["usage"] = {{"input_tokens", usage->prompt_tokens},
                  {"input_tokens_details", {{"cached_tokens", usage->cached_tokens}}},
                  {"output_tokens", usage->completion_tokens},
                  {"total_tokens", usage->prompt_tokens + usage->completion_tokens}};
  } else {
    r["usage"] = nullptr;
  }
  return r;
}

namespace {

const char* StatusOf(FinishReason finish) {
  return finish == FinishReason::kLength    ? "incomplete"
         : finish == FinishReason::kAborted ? "cancelled"
                                            : "completed";
}

json MessageItem(const std::string& id, const char* status, const std::string& text) {
  return {{"id", id},
          {"type", "message"},
          {"status", status},
          {"role", "assistant"},
          {"content", json::array({{{"type", "output_text"},
                                    {"text", text},
                                    {"annotations", json::array()},
                                    {"logprobs", json::array()}}})}};
}

json ReasoningItem(const std::string& id, const char* status, const std::string& text) {
  return {{"id", id},
          {"type", "reasoning"},
          {"status", status},
          {"summary", json::array()},
          {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}

json CallItem(const std::string& id, const char* status, const std::string& call_id,
              const std::string& name, const std::string& arguments) {
  return {{"id", id},     {"type", "function_call"}, {"status", status}, {"call_id", call_id},
          {"name", name}, {"arguments", arguments}};
}

}  // namespace

json ResponsesWriter::Whole(const ParsedMessage& m, FinishReason finish, const Usage& usage) const {
  json output = json::array();
  if (!m.reasoning.empty()) output.push_back(ReasoningItem(NewId("rs_"), "completed", m.reasoning));
  // Whitespace beside calls or reasoning (between calls, after </think>) is no message; a reply
  // of nothing else still is one.
  if (!Blank(m.content) || (m.tool_calls.empty() && m.reasoning.empty())) {
    output.push_back(MessageItem(NewId("msg_"), "completed", m.content));
  }
  for (const ParsedToolCall& c : m.tool_calls) {
    output.push_back(CallItem(NewId("fc_"), "completed", c.id, c.name, c.arguments));
  }
  if (finish == FinishReason::kLength) output.back()["status"] = "incomplete";
  return Response(StatusOf(finish), std::move(output), finish, &usage);
}

std::string ResponsesWriter::Event(const char* type, json fields) {
  json e = {{"type", type}};
  for (auto it = fields.begin(); it != fields.end(); ++it) e[it.key()] = std::move(*it);
  e["sequence_number"] = sequence_++;
  return std::string("event: ") + type +
         "\ndata: " + e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string ResponsesWriter::Begin() {
  const json r = Response("in_progress", json::array(), FinishReason::kNone, nullptr);
  std::string events = Event("response.created", {{"response", r}});
  return events + Event("response.in_progress", {{"response", r}});
}

std::string ResponsesWriter::Open(Item kind, const ToolCallDelta* call) {
  std::string events = Close();
  open_ = kind;
  open_text_.clear();
  const int index = static_cast<int>(output_.size());
  if (kind == Item::kMessage) {
    output_.push_back(MessageItem(NewId("msg_"), "in_progress", ""));
    output_.back()["content"] = json::array();
  } else if (kind == Item::kReasoning) {
    output_.push_back(ReasoningItem(NewId("rs_"), "in_progress", ""));
    output_.back()["content"] = json::array();
  } else {
    open_call_ = call->index;
    output_.push_back(CallItem(NewId("fc_"), "in_progress", call->id, call->name, ""));
  }
  events +=
      Event("response.output_item.added", {{"output_index", index}, {"item", output_.back()}});
  if (kind != Item::kFunctionCall) {
    const json part =
        kind == Item::kMessage
            ? json{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}
            : json{{"type", "reasoning_text"}, {"text", ""}};
    events += Event("response.content_part.added", {{"item_id", output_.back()["id"]},
                                                    {"output_index", index},
                                                    {"content_index", 0},
                                                    {"part", part}});
  }
  return events;
}

std::string ResponsesWriter::Close(const char* status) {
  if (open_ == Item::kNone) return "";
  const int index = static_cast<int>(output_.size()) - 1;
  json& item = output_.back();
  const json item_id = item["id"];
  std::string events;
  if (open_ == Item::kFunctionCall) {
    item["arguments"] = open_text_;
    events += Event("response.function_call_arguments.done", {{"item_id", item_id},
                                                              {"output_index", index},
                                                              {"name", item["name"]},
                                                              {"arguments", open_text_}});
    item["status"] = status;
  } else {
    const bool message = open_ == Item::kMessage;
    const json whole = message ? MessageItem(item_id, status, open_text_)
                               : ReasoningItem(item_id, status, open_text_);
    const json fields = {
        {"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"text", open_text_}};
    events += Event(message ? "response.output_text.done" : "response.reasoning_text.done",
                    message ? json{{"item_id", item_id},
                                   {"output_index", index},
                                   {"content_index", 0},
                                   {"text", open_text_},
                                   {"logprobs", json::array()}}
                            : fields);
    events += Event("response.content_part.done", {{"item_id", item_id},
                                                   {"output_index", index},
                                                   {"content_index", 0},
                                                   {"part", whole["content"][0]}});
    item = whole;
  }
  events += Event("response.output_item.done", {{"output_index", index}, {"item", item}});
  open_ = Item::kNone;
  return events;
}

std::string ResponsesWriter::Text(Item kind, const std::string& text) {
  std::string events;
  if (open_ != kind) events += Open(kind, nullptr);
  open_text_ += text;
  const int index = static_cast<int>(output_.size()) - 1;
  json fields = {{"item_id", output_.back()["id"]},
                 {"output_index", index},
                 {"content_index", 0},
                 {"delta", text}};
  if (kind == Item::kMessage) fields["logprobs"] = json::array();
  events +=
      Event(kind == Item::kMessage ? "response.output_text.delta" : "response.reasoning_text.delta",
            std::move(fields));
  return events;
}

std::string ResponsesWriter::Delta(const ParsedDelta& d) {
  std::string events;
  if (!d.reasoning.empty()) events += Text(Item::kReasoning, d.reasoning);
  if (!d.content.empty()) {
    // Whitespace waits: between tool calls it is no message of its own.
    if (open_ != Item::kMessage && Blank(d.content)) {
      blank_ += d.content;
    } else {
      events += Text(Item::kMessage, blank_ + d.content);
      blank_.clear();
    }
  }
  for (const ToolCallDelta& c : d.tool_calls) {
    if (open_ != Item::kFunctionCall || open_call_ != c.index) {
      events += Open(Item::kFunctionCall, &c);
    }
    if (c.arguments.empty()) continue;
    open_text_ += c.arguments;
    events += Event("response.function_call_arguments.delta",
                    {{"item_id", output_.back()["id"]},
                     {"output_index", static_cast<int>(output_.size()) - 1},
                     {"delta", c.arguments}});
  }
  return events;
}

std::string ResponsesWriter::Finish(FinishReason finish, const Usage& usage) {
  std::string events;
  // A reply of only whitespace (or nothing) is still a message, as in Whole().
  if (output_.empty()) {
    events += Open(Item::kMessage, nullptr);
    if (!blank_.empty()) events += Text(Item::kMessage, blank_);
  }
  blank_.clear();
  const char* status = StatusOf(finish);
  // An item cut off by max_output_tokens is incomplete, as the response is.
  events += Close(finish == FinishReason::kLength ? "incomplete" : "completed");
  // No event is named for a cancelled response (the server aborted it): it did not complete.
  const char* type =
      std::string_view(status) == "completed" ? "response.completed" : "response.incomplete";
  return events + Event(type, {{"response", Response(status, output_, finish, &usage)}});
}

std::string ResponsesWriter::Failed(const Status& error) {
  json r = Response("failed", output_, FinishReason::kNone, nullptr);
  r["error"] = {{"code", "server_error"}, {"message", error.message()}};
  return Event("response.failed", {{"response", r}});
}

}  // namespace llm
