#include "text/chat/chat_messages.h"

#include <regex>

namespace llm {
namespace {

using json = nlohmann::ordered_json;

// Text of a content-part list, or an error naming the first part that is not text.
Status PartsText(const json& parts, const std::string& where, std::string* text,
                 std::string* bad_path) {
  std::string out;
  bool first = true;
  for (size_t i = 0; i < parts.size(); ++i) {
    const json& p = parts[i];
    const std::string path = where + "[" + std::to_string(i) + "]";
    if (p.is_string()) {  // vLLM accepts bare strings in the list as text
      out += (first ? "" : "\n") + p.get<std::string>();
      first = false;
      continue;
    }
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
      *bad_path = path;
      return InvalidArgument(path + " must be an object with a string 'type'");
    }
    const std::string type = p["type"].get<std::string>();
    if (type == "text" || type == "refusal") {
      const json& t = p.contains(type) ? p[type] : json();
      if (!t.is_string()) {
        *bad_path = path;
        return InvalidArgument(path + " of type '" + type + "' needs a string '" + type + "'");
      }
      out += (first ? "" : "\n") + t.get<std::string>();
      first = false;
      continue;
    }
    *bad_path = path;
    if (type == "image_url" || type == "input_image" || type == "image" || type == "input_audio" ||
        type == "audio_url" || type == "video_url" || type == "file" || type == "image_embeds" ||
        type == "audio_embeds") {
      return InvalidArgument(path + ": content parts of type '" + type +
                             "' are not supported (this server takes text only)");
    }
    return InvalidArgument(path + ": unknown content part type '" + type +
                           "' (supported: 'text', 'refusal')");
  }
  *text = std::move(out);
  return Status::Ok();
}

Status NormalizeToolCalls(json* calls, const std::string& where, bool as_text,
                          std::string* bad_path) {
  if (calls->is_null()) return Status::Ok();
  if (!calls->is_array()) {
    *bad_path = where;
    return InvalidArgument(where + " must be a list");
  }
  for (size_t i = 0; i < calls->size(); ++i) {
    json& c = (*calls)[i];
    const std::string path = where + "[" + std::to_string(i) + "]";
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) {
      *bad_path = path;
      return InvalidArgument(path + " must be an object with a 'function' object");
    }
    json& f = c["function"];
    auto it = f.find("arguments");
    if (it == f.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty())) {
      f["arguments"] = as_text ? json("{}") : json::object();
    } else if (it->is_string()) {
      json parsed = json::parse(it->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) {
        *bad_path = path + ".function.arguments";
        return InvalidArgument(*bad_path + " is not valid JSON");
      }
      if (!as_text) *it = std::move(parsed);
    } else if (as_text) {
      *it = it->dump();
    }
  }
  return Status::Ok();
}

}  // namespace

ToolCallMessageShape DetectToolCallMessageShape(const std::string& template_text) {
  // `message['content'] is none` / `message.content is not none`, not `reasoning_content`.
  static const std::regex kTestsNull(
      R"((^|[^\w.])message(\['content'\]|\["content"\]|\.content)\s+is\s+(not\s+)?none\b)");
  return std::regex_search(template_text, kTestsNull) ? ToolCallMessageShape::kOpenAiNative
                                                      : ToolCallMessageShape::kTemplateValues;
}

Status NormalizeChatMessages(json* messages, std::string* bad_path, ToolCallMessageShape shape) {
  const bool native = shape == ToolCallMessageShape::kOpenAiNative;
  if (!messages->is_array()) {
    *bad_path = "messages";
    return InvalidArgument("'messages' must be a list of messages");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    json& m = (*messages)[i];
    const std::string path = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      *bad_path = path;
      return InvalidArgument(path + " must be an object with a string 'role'");
    }
    auto content = m.find("content");
    const bool calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
    if ((content == m.end() || content->is_null()) && native && calls) {
      m["content"] = nullptr;  // the template renders the calls on a null content
    } else if (content == m.end() || content->is_null()) {
      m["content"] = "";
    } else if (content->is_array()) {
      std::string text;
      LLM_RETURN_IF_ERROR(PartsText(*content, path + ".content", &text, bad_path));
      *content = std::move(text);
    } else if (!content->is_string()) {
      *bad_path = path + ".content";
      return InvalidArgument(*bad_path + " must be a string, a list of content parts, or null");
    }
    if (m.contains("tool_calls")) {
      LLM_RETURN_IF_ERROR(
          NormalizeToolCalls(&m["tool_calls"], path + ".tool_calls", native, bad_path));
    }
  }
  return Status::Ok();
}

}  // namespace llm
