#include "text/tokenizer/post_processor.h"

#include <nlohmann/json.hpp>

#include "text/tokenizer/json_fields.h"

namespace llm::tokenizer_internal {

using json = nlohmann::json;

StatusOr<PostProcessor> PostProcessor::FromJson(const json& j) {
  PostProcessor p;
  if (!j.is_null()) LLM_RETURN_IF_ERROR(p.Parse(j));
  return p;
}

Status PostProcessor::Parse(const json& j) {
  const std::string type = TypeOf(j);
  if (type == "ByteLevel") return Status::Ok();  // only adjusts offsets, which are not exposed
  if (type == "TemplateProcessing") return ParseTemplate(j);
  if (type == "Sequence") {
    // Each processor wraps the output of the previous one.
    for (const json& sub : j.at("processors")) LLM_RETURN_IF_ERROR(Parse(sub));
    return Status::Ok();
  }
  return InvalidArgument("unsupported post_processor type: " + type);
}

Status PostProcessor::ParseTemplate(const json& j) {
  const json specials = j.contains("special_tokens") ? j["special_tokens"] : json::object();
  auto resolve = [&](const std::string& name, std::vector<int32_t>* ids) -> Status {
    if (specials.contains(name)) {
      *ids = specials[name].at("ids").get<std::vector<int32_t>>();
      return Status::Ok();
    }
    // HF requires every SpecialToken of a template to be listed in special_tokens.
    return InvalidArgument("TemplateProcessing: special token '" + name +
                           "' is missing from special_tokens");
  };
  auto parse = [&](const json& items, const char* which, int max_sequences,
                   std::vector<int32_t>* before, std::vector<int32_t>* after) -> Status {
    int sequences = 0;
    for (const json& item : items) {
      if (item.contains("Sequence")) {
        ++sequences;
        continue;
      }
      if (!item.contains("SpecialToken")) {
        return InvalidArgument(std::string("unsupported TemplateProcessing ") + which +
                               " item: " + item.dump());
      }
      std::vector<int32_t> ids;
      LLM_RETURN_IF_ERROR(resolve(item["SpecialToken"].at("id").get<std::string>(), &ids));
      if (before != nullptr) {
        auto& dst = sequences == 0 ? *before : *after;
        dst.insert(dst.end(), ids.begin(), ids.end());
      }
    }
    if (sequences != max_sequences) {
      return InvalidArgument(std::string("TemplateProcessing: '") + which + "' must name " +
                             std::to_string(max_sequences) + " sequence(s)");
    }
    return Status::Ok();
  };
  std::vector<int32_t> before, after;
  LLM_RETURN_IF_ERROR(parse(j.at("single"), "single", 1, &before, &after));
  // An empty pair template is what files without pair support carry.
  if (j.contains("pair") && !j["pair"].is_null() && !j["pair"].empty()) {
    LLM_RETURN_IF_ERROR(parse(j["pair"], "pair", 2, nullptr, nullptr));
  }
  for (int32_t id : before) {
    if (id < 0) return InvalidArgument("TemplateProcessing: negative token id");
  }
  prefix_.insert(prefix_.begin(), before.begin(), before.end());
  suffix_.insert(suffix_.end(), after.begin(), after.end());
  return Status::Ok();
}

}  // namespace llm::tokenizer_internal
