#include "text/tokenizer/normalizer.h"

#include <nlohmann/json.hpp>

#include "text/tokenizer/json_fields.h"

namespace llm::tokenizer_internal {

using json = nlohmann::json;

std::string ReplaceAll(std::string_view text, const std::string& literal, const Regex* regex,
                       std::string_view content) {
  std::vector<std::pair<size_t, size_t>> matches;
  if (regex != nullptr) {
    regex->FindAll(text, &matches);
  } else if (!literal.empty()) {
    for (size_t pos = text.find(literal); pos != std::string_view::npos;
         pos = text.find(literal, pos + literal.size())) {
      matches.emplace_back(pos, pos + literal.size());
    }
  }
  if (matches.empty()) return std::string(text);
  std::string out;
  size_t last = 0;
  for (auto [b, e] : matches) {
    out.append(text.substr(last, b - last));
    out.append(content);
    last = e;
  }
  out.append(text.substr(last));
  return out;
}

StatusOr<std::unique_ptr<Normalizer>> Normalizer::FromJson(const json& j) {
  auto n = std::unique_ptr<Normalizer>(new Normalizer);
  LLM_RETURN_IF_ERROR(n->Parse(j));
  return n;
}

Status Normalizer::Parse(const json& j) {
  const std::string type = TypeOf(j);
  Step step;
  if (type == "Sequence") {
    for (const json& sub : j.at("normalizers")) LLM_RETURN_IF_ERROR(Parse(sub));
    return Status::Ok();
  } else if (type == "Prepend") {
    step.kind = Step::Kind::kPrepend;
    step.literal = j.at("prepend").get<std::string>();
  } else if (type == "Replace") {
    step.kind = Step::Kind::kReplace;
    const json& pattern = j.at("pattern");
    if (pattern.contains("String")) {
      step.literal = pattern["String"].get<std::string>();
    } else if (pattern.contains("Regex")) {
      LLM_ASSIGN_OR_RETURN(step.regex, Regex::Compile(pattern["Regex"].get<std::string>()));
    } else {
      return InvalidArgument("unsupported Replace normalizer pattern: " + pattern.dump());
    }
    step.content = j.at("content").get<std::string>();
  } else if (type == "Strip") {
    step.kind = Step::Kind::kStrip;
    step.strip_left = j.at("strip_left").get<bool>();
    step.strip_right = j.at("strip_right").get<bool>();
  } else if (type == "Lowercase") {
    step.kind = Step::Kind::kLowercase;
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.kind = Step::Kind::kUnicode;
    step.form = type == "NFC"    ? NormalizationForm::kNfc
                : type == "NFD"  ? NormalizationForm::kNfd
                : type == "NFKC" ? NormalizationForm::kNfkc
                                 : NormalizationForm::kNfkd;
  } else {
    return InvalidArgument("unsupported normalizer type: " + type);
  }
  steps_.push_back(std::move(step));
  return Status::Ok();
}

namespace {

std::string Strip(std::string_view s, bool left, bool right) {
  size_t b = 0, e = s.size();
  uint32_t cp = 0;
  while (left && b < e) {
    size_t len = DecodeUtf8At(s, b, &cp);
    if (!IsWhitespace(cp)) break;
    b += len;
  }
  while (right && e > b) {
    size_t start = DecodeUtf8Before(s, e, &cp);
    if (!IsWhitespace(cp)) break;
    e = start;
  }
  return std::string(s.substr(b, e - b));
}

}  // namespace

std::string Normalizer::Apply(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kPrepend:
        // HF prepends only to non-empty strings.
        if (!s.empty()) s = step.literal + s;
        break;
      case Step::Kind::kReplace:
        s = ReplaceAll(s, step.literal, step.regex.get(), step.content);
        break;
      case Step::Kind::kStrip:
        s = Strip(s, step.strip_left, step.strip_right);
        break;
      case Step::Kind::kLowercase:
        s = ToLowerUnicode(s);
        break;
      case Step::Kind::kUnicode:
        s = NormalizeUnicode(s, step.form);
        break;
    }
  }
  return s;
}

}  // namespace llm::tokenizer_internal
