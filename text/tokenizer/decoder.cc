#include "text/tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/normalizer.h"

namespace llm::tokenizer_internal {

using json = nlohmann::json;

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Strips up to `start` leading and `stop` trailing copies of the character `c` (UTF-8).
std::string StripChar(std::string_view s, std::string_view c, int start, int stop) {
  for (int i = 0; i < start && s.starts_with(c); ++i) s.remove_prefix(c.size());
  for (int i = 0; i < stop && s.ends_with(c); ++i) s.remove_suffix(c.size());
  return std::string(s);
}

}  // namespace

int ByteFallbackValue(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return -1;
  const int hi = HexDigit(token[3]), lo = HexDigit(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

StatusOr<std::unique_ptr<Decoder>> Decoder::FromJson(const json& j) {
  auto d = std::unique_ptr<Decoder>(new Decoder);
  if (j.is_null()) {
    d->none_ = true;
    return d;
  }
  LLM_RETURN_IF_ERROR(d->Parse(j));
  LLM_RETURN_IF_ERROR(d->Validate());
  return d;
}

Status Decoder::Parse(const json& j) {
  const std::string type = TypeOf(j);
  Step step;
  if (type == "Sequence") {
    for (const json& sub : j.at("decoders")) LLM_RETURN_IF_ERROR(Parse(sub));
    return Status::Ok();
  } else if (type == "Replace") {
    step.kind = Step::Kind::kReplace;
    const json& pattern = j.at("pattern");
    if (pattern.contains("String")) {
      step.pattern = pattern["String"].get<std::string>();
    } else if (pattern.contains("Regex")) {
      LLM_ASSIGN_OR_RETURN(step.regex, Regex::Compile(pattern["Regex"].get<std::string>()));
    } else {
      return InvalidArgument("unsupported Replace decoder pattern: " + pattern.dump());
    }
    step.content = j.at("content").get<std::string>();
  } else if (type == "ByteFallback") {
    step.kind = Step::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Step::Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = Step::Kind::kStrip;
    step.pattern = j.at("content").get<std::string>();
    step.start = j.at("start").get<int>();
    step.stop = j.at("stop").get<int>();
    if (step.start < 0 || step.stop < 0) return InvalidArgument("Strip decoder: negative count");
  } else if (type == "Metaspace") {
    step.kind = Step::Kind::kMetaspace;
    step.pattern = StringOr(j, "replacement", "\xE2\x96\x81");
    if (!IsNullOrMissing(j, "prepend_scheme")) {
      const std::string scheme = j["prepend_scheme"].get<std::string>();
      if (scheme != "always" && scheme != "first" && scheme != "never") {
        return InvalidArgument("unsupported Metaspace prepend_scheme: " + scheme);
      }
      step.metaspace_prepend = scheme != "never";
    } else {
      step.metaspace_prepend = BoolOr(j, "add_prefix_space", true);
    }
  } else if (type == "ByteLevel") {
    // add_prefix_space / trim_offsets / use_regex do not change what ByteLevel decodes.
    step.kind = Step::Kind::kByteLevel;
  } else {
    return InvalidArgument("unsupported decoder type: " + type);
  }
  steps_.push_back(std::move(step));
  return Status::Ok();
}

Status Decoder::Validate() {
  bool fused = false;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& s = steps_[i];
    if (s.kind == Step::Kind::kByteFallback) has_byte_fallback_ = true;
    if (s.kind == Step::Kind::kByteLevel) {
      if (i + 1 != steps_.size()) {
        return InvalidArgument("unsupported decoder chain: ByteLevel must be the last decoder");
      }
    } else if (s.kind == Step::Kind::kFuse) {
      fused = true;
    } else if (fused && s.kind == Step::Kind::kStrip) {
      fused_strip_ = &s;
    } else if (fused) {
      return InvalidArgument(
          "unsupported decoder chain: only Strip may follow Fuse (streaming needs per-token "
          "decoders before it)");
    }
  }
  return Status::Ok();
}

std::vector<std::string> Decoder::Run(std::span<const std::string> in, bool at_start,
                                      bool at_end) const {
  std::vector<std::string> toks(in.begin(), in.end());
  bool fused = false;
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Step::Kind::kReplace:
        for (std::string& t : toks) t = ReplaceAll(t, s.pattern, s.regex.get(), s.content);
        break;
      case Step::Kind::kByteFallback: {
        // Runs of <0xNN> tokens become their bytes when those form valid UTF-8, else one
        // U+FFFD per byte (HF's rule, not the maximal-subpart rule).
        std::vector<std::string> out;
        std::string bytes;
        auto flush = [&] {
          if (bytes.empty()) return;
          if (IsValidUtf8(bytes)) {
            out.push_back(bytes);
          } else {
            for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back(kReplacementChar);
          }
          bytes.clear();
        };
        for (std::string& t : toks) {
          const int b = ByteFallbackValue(t);
          if (b >= 0) {
            bytes.push_back(static_cast<char>(b));
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        toks.swap(out);
        break;
      }
      case Step::Kind::kStrip:
        if (!fused) {
          for (std::string& t : toks) t = StripChar(t, s.pattern, s.start, s.stop);
        } else if (!toks.empty()) {
          toks[0] = StripChar(toks[0], s.pattern, at_start ? s.start : 0, at_end ? s.stop : 0);
        }
        break;
      case Step::Kind::kMetaspace:
        for (size_t i = 0; i < toks.size(); ++i) {
          const bool drop = i == 0 && at_start && s.metaspace_prepend;
          toks[i] = ReplaceAll(toks[i], s.pattern, nullptr, drop ? "" : " ");
        }
        break;
      case Step::Kind::kFuse: {
        std::string all;
        for (const std::string& t : toks) all += t;
        toks.assign(1, std::move(all));
        fused = true;
        break;
      }
      case Step::Kind::kByteLevel: {
        std::string all;
        for (const std::string& t : toks) all += ByteLevelToBytes(t);
        toks.assign(1, std::move(all));
        break;
      }
    }
  }
  return toks;
}

std::string Decoder::Decode(std::span<const std::string> tokens, bool at_start, bool at_end,
                            size_t* stable) const {
  std::string out;
  if (none_) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0 || !at_start) out += ' ';
      out += tokens[i];
    }
    if (stable) *stable = out.size();
    return out;
  }
  for (const std::string& t : Run(tokens, at_start, at_end)) out += t;
  if (stable == nullptr) return out;
  *stable = out.size();
  if (has_byte_fallback_) {
    // A trailing run of byte tokens may still grow, and one bad byte changes the whole run.
    size_t g = tokens.size();
    while (g > 0 && ByteFallbackValue(tokens[g - 1]) >= 0) --g;
    if (g < tokens.size()) {
      std::string head;
      for (const std::string& t : Run(tokens.first(g), at_start, at_end)) head += t;
      *stable = std::min(*stable, head.size());
    }
  }
  if (fused_strip_ != nullptr && fused_strip_->stop > 0 && !at_end) {
    // Trailing copies of the stripped character vanish if the text ends there.
    std::string_view s(out);
    s = s.substr(0, *stable);
    for (int i = 0; i < fused_strip_->stop && s.ends_with(fused_strip_->pattern); ++i) {
      s.remove_suffix(fused_strip_->pattern.size());
    }
    *stable = s.size();
  }
  return out;
}

}  // namespace llm::tokenizer_internal
