#include "text/tokenizer/pre_tokenizer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "text/tokenizer/json_fields.h"

namespace llm {

const char* const kGpt2PretokenizerRegex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3PretokenizerRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2PretokenizerRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace llm

namespace llm::tokenizer_internal {

using json = nlohmann::json;

namespace {

StatusOr<SplitBehavior> ParseBehavior(const std::string& behavior) {
  if (behavior == "Isolated") return SplitBehavior::kIsolated;
  if (behavior == "Removed") return SplitBehavior::kRemoved;
  if (behavior == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (behavior == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (behavior == "Contiguous") return SplitBehavior::kContiguous;
  return InvalidArgument("unsupported Split behavior: " + behavior);
}

void FindLiteral(std::string_view text, std::string_view literal,
                 std::vector<std::pair<size_t, size_t>>* out) {
  for (size_t pos = text.find(literal); pos != std::string_view::npos;
       pos = text.find(literal, pos + literal.size())) {
    out->emplace_back(pos, pos + literal.size());
  }
}

}  // namespace

void SplitByMatches(std::string_view text, const std::vector<std::pair<size_t, size_t>>& matches,
                    SplitBehavior behavior, bool invert,
                    std::vector<std::pair<size_t, size_t>>* out) {
  // Cover the text with (begin, end, is_match) parts, gaps included.
  struct Part {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Part> parts;
  size_t last = 0;
  for (auto [b, e] : matches) {
    if (b > last) parts.push_back({last, b, invert});
    parts.push_back({b, e, !invert});
    last = e;
  }
  if (last < text.size()) parts.push_back({last, text.size(), invert});

  // The folds below are HF's (normalizer.rs `split`), part for part.
  std::vector<Part> acc;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      acc = parts;
      break;
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_match) acc.push_back(p);
      }
      break;
    case SplitBehavior::kContiguous:
      for (const Part& p : parts) {
        if (p.is_match == previous_match && !acc.empty()) {
          acc.back().end = p.end;
        } else {
          acc.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !acc.empty()) {
          acc.back().end = p.end;
        } else {
          acc.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !acc.empty()) {
          acc.back().begin = it->begin;
        } else {
          acc.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(acc.begin(), acc.end());
      break;
  }
  for (const Part& p : acc) {
    if (p.end > p.begin) out->emplace_back(p.begin, p.end);
  }
}

StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(const json& j) {
  auto p = std::unique_ptr<PreTokenizer>(new PreTokenizer);
  if (!j.is_null()) LLM_RETURN_IF_ERROR(p->Parse(j));
  return p;
}

Status PreTokenizer::Parse(const json& p) {
  const std::string type = TypeOf(p);
  if (type == "Sequence") {
    for (const json& sub : p.at("pretokenizers")) LLM_RETURN_IF_ERROR(Parse(sub));
    return Status::Ok();
  }
  Step step;
  if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
    // Defaults follow HF's serde defaults for a missing field. trim_offsets only moves offsets,
    // which are not exposed.
    step.add_prefix_space = BoolOr(p, "add_prefix_space", true);
    if (BoolOr(p, "use_regex", true)) {
      LLM_ASSIGN_OR_RETURN(step.regex, Regex::Compile(kGpt2PretokenizerRegex));
    }
  } else if (type == "Split") {
    const json& pattern = p.at("pattern");
    if (pattern.contains("Regex")) {
      LLM_ASSIGN_OR_RETURN(step.regex, Regex::Compile(pattern["Regex"].get<std::string>()));
    } else if (pattern.contains("String")) {
      step.literal = pattern["String"].get<std::string>();
      if (step.literal.empty()) return InvalidArgument("Split pre_tokenizer: empty String pattern");
    } else {
      return InvalidArgument("unsupported Split pattern: " + pattern.dump());
    }
    LLM_ASSIGN_OR_RETURN(step.behavior, ParseBehavior(p.at("behavior").get<std::string>()));
    step.invert = BoolOr(p, "invert", false);
  } else if (type == "Digits") {
    // Rust char::is_numeric is the N* general categories.
    LLM_ASSIGN_OR_RETURN(step.regex, Regex::Compile(R"(\p{N})"));
    step.behavior = BoolOr(p, "individual_digits", false) ? SplitBehavior::kIsolated
                                                          : SplitBehavior::kContiguous;
  } else if (type == "Metaspace") {
    step.kind = Step::Kind::kMetaspace;
    step.literal = StringOr(p, "replacement", "\xE2\x96\x81");
    if (!IsValidUtf8(step.literal) || step.literal.empty()) {
      return InvalidArgument("Metaspace replacement is not one character");
    }
    if (!IsNullOrMissing(p, "prepend_scheme")) {
      const std::string scheme = p["prepend_scheme"].get<std::string>();
      if (scheme == "always") {
        step.prepend = Step::Prepend::kAlways;
      } else if (scheme == "first") {
        step.prepend = Step::Prepend::kFirst;
      } else if (scheme == "never") {
        step.prepend = Step::Prepend::kNever;
      } else {
        return InvalidArgument("unsupported Metaspace prepend_scheme: " + scheme);
      }
    } else {
      // Files older than prepend_scheme say add_prefix_space.
      step.prepend =
          BoolOr(p, "add_prefix_space", true) ? Step::Prepend::kAlways : Step::Prepend::kNever;
    }
    step.split = BoolOr(p, "split", true);
  } else {
    return InvalidArgument("unsupported pre_tokenizer type: " + type);
  }
  steps_.push_back(std::move(step));
  return Status::Ok();
}

void PreTokenizer::Apply(const Step& step, const Piece& piece, std::vector<Piece>* out) const {
  std::string_view text = piece.text;
  std::string rewritten;
  std::vector<std::pair<size_t, size_t>> matches;
  SplitBehavior behavior = step.behavior;
  switch (step.kind) {
    case Step::Kind::kByteLevel:
      // HF prepends the space to every piece reaching this stage, not just the first.
      if (step.add_prefix_space && !text.starts_with(' ')) {
        rewritten = " " + piece.text;
        text = rewritten;
      }
      if (step.regex) step.regex->FindAll(text, &matches);
      behavior = SplitBehavior::kIsolated;
      break;
    case Step::Kind::kMetaspace: {
      for (char c : text) {
        if (c == ' ') {
          rewritten += step.literal;
        } else {
          rewritten.push_back(c);
        }
      }
      const bool prepend = !std::string_view(rewritten).starts_with(step.literal) &&
                           (step.prepend == Step::Prepend::kAlways ||
                            (step.prepend == Step::Prepend::kFirst && piece.at_origin));
      if (prepend) rewritten = step.literal + rewritten;
      text = rewritten;
      if (!step.split) {
        if (!text.empty()) out->push_back({std::string(text), piece.at_origin});
        return;
      }
      FindLiteral(text, step.literal, &matches);
      behavior = SplitBehavior::kMergedWithNext;
      break;
    }
    case Step::Kind::kSplit:
      if (step.regex) {
        step.regex->FindAll(text, &matches);
      } else {
        FindLiteral(text, step.literal, &matches);
      }
      break;
  }
  std::vector<std::pair<size_t, size_t>> parts;
  if (step.kind == Step::Kind::kByteLevel && !step.regex) {
    if (!text.empty()) parts.emplace_back(0, text.size());
  } else {
    SplitByMatches(text, matches, behavior, step.invert, &parts);
  }
  for (auto [b, e] : parts) {
    std::string_view sub = text.substr(b, e - b);
    Piece p{step.kind == Step::Kind::kByteLevel ? BytesToByteLevel(sub) : std::string(sub),
            piece.at_origin && b == 0};
    out->push_back(std::move(p));
  }
}

void PreTokenizer::Split(std::string_view text, bool at_origin,
                         std::vector<std::string>* out) const {
  if (text.empty()) return;
  std::vector<Piece> pieces{{std::string(text), at_origin}};
  std::vector<Piece> next;
  for (const Step& step : steps_) {
    next.clear();
    for (const Piece& piece : pieces) Apply(step, piece, &next);
    pieces.swap(next);
  }
  for (Piece& p : pieces) out->push_back(std::move(p.text));
}

}  // namespace llm::tokenizer_internal
