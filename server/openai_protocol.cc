#include "server/openai_protocol.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>

#include "text/chat/chat_messages.h"

namespace llm {
namespace {

using json = nlohmann::ordered_json;

// A field's parser; returns an error message (empty on success).
using FieldParser = std::function<std::string(const json&, OpenAiRequest*)>;

std::string AsFloat(const json& v, std::optional<float>* out) {
  if (!v.is_number()) return "must be a number";
  *out = v.get<float>();
  return "";
}

std::string AsInt(const json& v, int64_t lo, int64_t hi, int64_t* out) {
  if (!v.is_number_integer() && !v.is_number_unsigned()) return "must be an integer";
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)
                        ? INT64_MAX
                        : v.get<int64_t>();
  if (x < lo || x > hi) {
    return "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  }
  *out = x;
  return "";
}

std::string AsOptInt(const json& v, std::optional<int>* out) {
  int64_t x = 0;
  std::string e = AsInt(v, std::numeric_limits<int>::min(), std::numeric_limits<int>::max(), &x);
  if (e.empty()) *out = static_cast<int>(x);
  return e;
}

std::string AsBool(const json& v, bool* out) {
  if (!v.is_boolean()) return "must be a boolean";
  *out = v.get<bool>();
  return "";
}

std::string AsOptBool(const json& v, std::optional<bool>* out) {
  bool b = false;
  std::string e = AsBool(v, &b);
  if (e.empty()) *out = b;
  return e;
}

std::string AsTokenIds(const json& v, std::vector<int32_t>* out) {
  if (!v.is_array()) return "must be a list of token ids";
  for (const json& t : v) {
    int64_t x = 0;
    if (!AsInt(t, 0, std::numeric_limits<int32_t>::max(), &x).empty()) {
      return "must be a list of non-negative integer token ids";
    }
    out->push_back(static_cast<int32_t>(x));
  }
  return "";
}

// A completions prompt: text, token ids, or a one-element list of either.
// One level of list is unwrapped at most: a loop, so no nesting recurses.
std::string ParsePrompt(const json& prompt, GenerateParams* p) {
  const json* v = &prompt;
  if (v->is_array() && v->size() == 1 && ((*v)[0].is_string() || (*v)[0].is_array())) {
    v = &(*v)[0];
  } else if (v->is_array() && !v->empty() && ((*v)[0].is_string() || (*v)[0].is_array())) {
    return "lists of more than one prompt are not supported";
  }
  if (v->is_string()) {
    p->prompt = v->get<std::string>();
    return "";
  }
  if (!v->is_array()) return "must be a string, a list of token ids, or a list of one of those";
  std::vector<int32_t> ids;
  std::string e = AsTokenIds(*v, &ids);
  if (e.empty()) p->prompt = std::move(ids);
  return e;
}

// OpenAI's logit_bias: {"<token id>": bias in [-100, 100]}. Ids beyond the vocabulary are
// refused by EngineCore::Validate, which knows its size.
std::string ParseLogitBias(const json& v, GenerateParams* p) {
  if (!v.is_object()) return "must be an object mapping token ids to biases";
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    const bool digits =
        !key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    const int64_t id = digits ? std::stoll(key) : -1;
    if (!digits || id > std::numeric_limits<int32_t>::max()) {
      return "logit_bias: key '" + key + "' is not a token id (a non-negative integer)";
    }
    if (!it->is_number()) return "logit_bias['" + key + "'] must be a number";
    const double b = it->get<double>();
    if (!(b >= -100.0 && b <= 100.0)) return "logit_bias['" + key + "'] must be in [-100, 100]";
    p->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
  std::sort(p->logit_bias.begin(), p->logit_bias.end());
  for (size_t i = 1; i < p->logit_bias.size(); ++i) {
    if (p->logit_bias[i].first == p->logit_bias[i - 1].first) {  // "7" and "07"
      return "logit_bias gives token " + std::to_string(p->logit_bias[i].first) + " twice";
    }
  }
  return "";
}

// Structured outputs: one constraint per request, whichever field carries it.
std::string SetConstraint(OpenAiRequest* r, const std::string& field, Constraint c) {
  if (!r->constraint_field.empty()) {
    return "only one constraint per request: '" + r->constraint_field + "' and '" + field +
           "' both set one";
  }
  r->constraint_field = field;
  r->params.constraint = std::move(c);
  return "";
}

// A JSON Schema given as an object (or a boolean schema), or as its text (vLLM's guided_json).
std::string SchemaText(const json& v, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return "";
  }
  if (!v.is_object() && !v.is_boolean()) return "must be a JSON Schema (an object or its text)";
  *out = v.dump();
  return "";
}

std::string StringList(const json& v, std::vector<std::string>* out) {
  if (!v.is_array() || v.empty()) return "must be a non-empty list of strings";
  for (const json& s : v) {
    if (!s.is_string()) return "must be a non-empty list of strings";
    out->push_back(s.get<std::string>());
  }
  return "";
}

// One constraint kind (vLLM's names: json, regex, choice, grammar, json_object) and its value.
std::string ParseConstraintValue(const std::string& kind, const json& v, Constraint* c) {
  if (kind == "json") {
    c->kind = Constraint::Kind::kJsonSchema;
    return SchemaText(v, &c->text);
  }
  if (kind == "regex" || kind == "grammar") {
    if (!v.is_string()) return "must be a string";
    c->kind = kind == "regex" ? Constraint::Kind::kRegex : Constraint::Kind::kGrammar;
    c->text = v.get<std::string>();
    return "";
  }
  if (kind == "choice") {
    c->kind = Constraint::Kind::kChoice;
    return StringList(v, &c->choices);
  }
  if (kind == "json_object") {
    if (v != true) return "must be true";
    c->kind = Constraint::Kind::kJsonObject;
    return "";
  }
  return "unsupported option '" + kind + "'";
}

// OpenAI's {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}.
std::string ParseResponseFormat(const json& v, OpenAiRequest* r) {
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string()) {
    return "'response_format' must be an object with a string 'type'";
  }
  const std::string type = v["type"].get<std::string>();
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key() != "type" && !(type == "json_schema" && it.key() == "json_schema")) {
      return "response_format: unsupported option '" + it.key() + "' for type '" + type + "'";
    }
  }
  if (type == "text") return "";
  Constraint c;
  if (type == "json_object") {
    c.kind = Constraint::Kind::kJsonObject;
    return SetConstraint(r, "response_format", std::move(c));
  }
  if (type != "json_schema") {
    return "response_format type '" + type +
           "' is not supported (text, json_object, json_schema are)";
  }
  if (!v.contains("json_schema") || !v["json_schema"].is_object()) {
    return "response_format: type 'json_schema' needs a 'json_schema' object";
  }
  const json& js = v["json_schema"];
  for (auto it = js.begin(); it != js.end(); ++it) {
    const std::string& k = it.key();
    if (k == "name" || k == "description") {
      if (!it->is_string()) return "response_format.json_schema." + k + " must be a string";
    } else if (k == "strict") {
      // strict true or false: the schema is enforced either way, as vLLM does.
      if (!it->is_boolean() && !it->is_null()) {
        return "response_format.json_schema.strict must be a boolean";
      }
    } else if (k != "schema") {
      return "response_format.json_schema: unsupported option '" + k + "'";
    }
  }
  if (!js.contains("schema")) return "response_format.json_schema needs a 'schema'";
  c.kind = Constraint::Kind::kJsonSchema;
  std::string e = SchemaText(js["schema"], &c.text);
  if (!e.empty()) return "response_format.json_schema.schema " + e;
  return SetConstraint(r, "response_format", std::move(c));
}

// vLLM's {"structured_outputs": {"json" | "regex" | "choice" | "grammar" | "json_object": ...}}.
std::string ParseStructuredOutputs(const json& v, OpenAiRequest* r) {
  if (!v.is_object()) return "'structured_outputs' must be an object";
  Constraint c;
  std::string first;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it->is_null()) continue;
    if (!first.empty()) {
      return "only one constraint per request: 'structured_outputs." + first +
             "' and 'structured_outputs." + it.key() + "' both set one";
    }
    std::string e = ParseConstraintValue(it.key(), *it, &c);
    if (!e.empty()) {
      return e.rfind("unsupported", 0) == 0 ? "structured_outputs: " + e
                                            : "'structured_outputs." + it.key() + "' " + e;
    }
    first = it.key();
  }
  if (first.empty()) return "'structured_outputs' sets no constraint";
  return SetConstraint(r, "structured_outputs", std::move(c));
}

// vLLM's older guided_json / guided_regex / guided_choice / guided_grammar fields.
FieldParser Guided(std::string kind) {
  return [kind](const json& v, OpenAiRequest* r) -> std::string {
    Constraint c;
    std::string e = ParseConstraintValue(kind, v, &c);
    if (!e.empty()) return e;
    return SetConstraint(r, "guided_" + kind, std::move(c));
  };
}

// Fields that change nothing unless set to a value other than the one given.
FieldParser OnlyDefault(json neutral, std::string why) {
  return [neutral, why](const json& v, OpenAiRequest*) -> std::string {
    return v == neutral ? "" : why;
  };
}

const std::map<std::string, FieldParser>& CommonFields() {
  static const std::map<std::string, FieldParser> kFields = {
      {"model",
       [](const json& v, OpenAiRequest* r) -> std::string {
         if (!v.is_string()) return "must be a string";
         r->model = v.get<std::string>();
         return "";
       }},
      {"stream", [](const json& v, OpenAiRequest* r) { return AsBool(v, &r->stream); }},
      {"stream_options",
       [](const json& v, OpenAiRequest* r) -> std::string {
         if (!v.is_object()) return "must be an object";
         for (auto it = v.begin(); it != v.end(); ++it) {
           if (it.key() == "include_usage") {
             if (!it->is_null() && !it->is_boolean()) return "include_usage must be a boolean";
             r->include_usage = it->is_boolean() && it->get<bool>();
           } else if (it.key() != "continuous_usage_stats" || *it != false) {
             return "unsupported option '" + it.key() + "'";
           }
         }
         return "";
       }},
      {"temperature",
       [](const json& v, OpenAiRequest* r) { return AsFloat(v, &r->params.temperature); }},
      {"top_p", [](const json& v, OpenAiRequest* r) { return AsFloat(v, &r->params.top_p); }},
      {"min_p", [](const json& v, OpenAiRequest* r) { return AsFloat(v, &r->params.min_p); }},
      {"top_k",
       [](const json& v, OpenAiRequest* r) -> std::string {
         std::string e = AsOptInt(v, &r->params.top_k);
         if (e.empty() && *r->params.top_k == -1) r->params.top_k = 0;  // vLLM's "off"
         return e;
       }},
      {"seed",
       [](const json& v, OpenAiRequest* r) -> std::string {
         int64_t x = 0;
         std::string e =
             AsInt(v, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &x);
         if (e.empty()) r->params.seed = static_cast<uint64_t>(x);
         return e;
       }},
      {"presence_penalty",
       [](const json& v, OpenAiRequest* r) { return AsFloat(v, &r->params.presence_penalty); }},
      {"frequency_penalty",
       [](const json& v, OpenAiRequest* r) { return AsFloat(v, &r->params.frequency_penalty); }},
      {"repetition_penalty",
       [](const json& v, OpenAiRequest* r) { return AsFloat(v, &r->params.repetition_penalty); }},
      {"max_tokens",
       [](const json& v, OpenAiRequest* r) { return AsOptInt(v, &r->params.max_tokens); }},
      {"min_tokens",
       [](const json& v, OpenAiRequest* r) { return AsOptInt(v, &r->params.min_tokens); }},
      {"ignore_eos",
       [](const json& v, OpenAiRequest* r) { return AsOptBool(v, &r->params.ignore_eos); }},
      {"skip_special_tokens",
       [](const json& v, OpenAiRequest* r) {
         return AsOptBool(v, &r->params.skip_special_tokens);
       }},
      {"add_special_tokens",
       [](const json& v, OpenAiRequest* r) { return AsBool(v, &r->params.add_special_tokens); }},
      {"priority",
       [](const json& v, OpenAiRequest* r) { return AsOptInt(v, &r->params.priority); }},
      // An extension: false opts the request out of the server's speculative decoding.
      {"speculative_decoding",
       [](const json& v, OpenAiRequest* r) {
         return AsOptBool(v, &r->params.speculative_decoding);
       }},
      {"stop_token_ids",
       [](const json& v, OpenAiRequest* r) { return AsTokenIds(v, &r->params.stop_token_ids); }},
      {"stop",
       [](const json& v, OpenAiRequest* r) -> std::string {
         if (v.is_string()) {
           r->params.stop.push_back(v.get<std::string>());
           return "";
         }
         if (!v.is_array()) return "must be a string or a list of strings";
         for (const json& s : v) {
           if (!s.is_string()) return "must be a string or a list of strings";
           r->params.stop.push_back(s.get<std::string>());
         }
         return "";
       }},
      {"n",
       [](const json& v, OpenAiRequest* r) -> std::string {
         int64_t x = 0;
         std::string e = AsInt(v, 1, std::numeric_limits<int>::max(), &x);  // --max-n: the engine
         if (e.empty()) r->params.n = static_cast<int>(x);
         return e;
       }},
      {"logit_bias", [](const json& v, OpenAiRequest* r) { return ParseLogitBias(v, &r->params); }},
      {"response_format", ParseResponseFormat},
      {"structured_outputs", ParseStructuredOutputs},
      {"guided_json", Guided("json")},
      {"guided_regex", Guided("regex")},
      {"guided_choice", Guided("choice")},
      {"guided_grammar", Guided("grammar")},
      {"include_stop_str_in_output",
       OnlyDefault(false, "include_stop_str_in_output is not supported")},
      {"prompt_logprobs", OnlyDefault(0, "prompt_logprobs is not supported")},
  };
  return kFields;
}

const std::map<std::string, FieldParser>& CompletionFields() {
  static const std::map<std::string, FieldParser> kFields = {
      {"prompt", [](const json& v, OpenAiRequest* r) { return ParsePrompt(v, &r->params); }},
      {"logprobs",
       [](const json& v, OpenAiRequest* r) -> std::string {
         int64_t x = 0;
         std::string e = AsInt(v, 0, 1 << 20, &x);  // the engine checks its own limit
         if (e.empty()) r->logprobs = static_cast<int>(x);
         return e;
       }},
      {"echo", OnlyDefault(false, "echo is not supported")},
      {"best_of",
       [](const json& v, OpenAiRequest* r) -> std::string {
         int64_t x = 0;
         std::string e = AsInt(v, 1, std::numeric_limits<int>::max(), &x);
         if (e.empty()) r->best_of = static_cast<int>(x);
         return e;
       }},
      {"suffix", OnlyDefault("", "suffix is not supported")},
  };
  return kFields;
}

const std::map<std::string, FieldParser>& ChatFields() {
  static const std::map<std::string, FieldParser> kFields = {
      {"messages",
       [](const json& v, OpenAiRequest* r) -> std::string {
         if (!v.is_array() || v.empty()) return "must be a non-empty list of messages";
         // content null / a list of parts, tool-call arguments as text: what OpenAI accepts.
         // Checked here; kept as sent, for the renderer to shape as its template expects.
         r->messages = v;
         json shaped = v;
         std::string bad_path;
         return NormalizeChatMessages(&shaped, &bad_path).message();
       }},
      {"tools",
       [](const json& v, OpenAiRequest* r) -> std::string {
         std::string e = CheckTools(v);
         if (e.empty()) r->tools = v;
         return e;
       }},
      {"tool_choice",
       [](const json& v, OpenAiRequest* r) { return ParseToolChoice(v, &r->tool_choice); }},
      {"parallel_tool_calls",
       [](const json& v, OpenAiRequest* r) { return AsBool(v, &r->parallel_tool_calls); }},
      {"chat_template_kwargs",
       [](const json& v, OpenAiRequest* r) -> std::string {
         if (!v.is_object()) return "must be an object";
         for (const char* k : {"messages", "tools", "documents", "add_generation_prompt"}) {
           if (v.contains(k)) return std::string("'chat_template_kwargs' cannot set '") + k + "'";
         }
         r->chat_template_kwargs = v;
         return "";
       }},
      {"reasoning_effort",
       [](const json& v, OpenAiRequest* r) -> std::string {
         if (v != "low" && v != "medium" && v != "high") {
           return "'reasoning_effort' must be \"low\", \"medium\" or \"high\"";
         }
         r->reasoning_effort = v.get<std::string>();
         return "";
       }},
      {"add_generation_prompt",
       [](const json& v, OpenAiRequest* r) { return AsBool(v, &r->add_generation_prompt); }},
      {"max_completion_tokens",
       [](const json& v, OpenAiRequest* r) { return AsOptInt(v, &r->params.max_tokens); }},
      {"logprobs",
       [](const json& v, OpenAiRequest* r) -> std::string { return AsBool(v, &r->chat_logprobs); }},
      {"top_logprobs",
       [](const json& v, OpenAiRequest* r) -> std::string {
         int64_t x = 0;
         std::string e = AsInt(v, 0, 20, &x);
         if (e.empty()) r->top_logprobs = static_cast<int>(x);
         return e;
       }},
  };
  return kFields;
}

}  // namespace

int HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kResourceExhausted:
      return 429;
    case StatusCode::kUnimplemented:
      return 501;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

OpenAiError OpenAiError::FromStatus(const Status& s, std::string param) {
  OpenAiError e;
  e.http_status = HttpStatusFor(s.code());
  e.message = s.message();
  e.param = std::move(param);
  return e;
}

std::string OpenAiError::type() const {
  switch (http_status) {
    case 400:
    case 404:
    case 413:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable";
    default:
      return "server_error";
  }
}

json OpenAiError::ToJson() const {
  json err = {{"message", message},
              {"type", type()},
              {"param", param.empty() ? json(nullptr) : json(param)},
              {"code", code.empty() ? json(nullptr) : json(code)}};
  return json{{"error", err}};
}

const std::vector<std::string>& IgnoredOpenAiFields() {
  // Bookkeeping fields: who asked, whether OpenAI should store the exchange, billing tier.
  static const std::vector<std::string> kIgnored = {"user", "store", "metadata", "service_tier"};
  return kIgnored;
}

Status ParseOpenAiRequest(const json& body, OpenAiEndpoint endpoint, OpenAiRequest* out,
                          std::string* bad_param) {
  if (!body.is_object()) return InvalidArgument("the request body must be a JSON object");
  out->endpoint = endpoint;
  const auto& own = endpoint == OpenAiEndpoint::kChat ? ChatFields() : CompletionFields();
  const auto& ignored = IgnoredOpenAiFields();
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& key = it.key();
    if (std::find(ignored.begin(), ignored.end(), key) != ignored.end()) continue;
    if (it->is_null()) continue;  // OpenAI clients send null for "not set"
    auto f = own.find(key);
    if (f == own.end()) f = CommonFields().find(key);
    if (f == CommonFields().end()) {
      *bad_param = key;
      return InvalidArgument("unsupported field '" + key + "'");
    }
    const std::string err = f->second(*it, out);
    if (!err.empty()) {
      *bad_param = key;
      return InvalidArgument(err.rfind("must", 0) == 0 ? "'" + key + "' " + err : err);
    }
  }
  if (out->best_of && *out->best_of != out->params.n) {
    *bad_param = "best_of";
    return InvalidArgument("best_of (" + std::to_string(*out->best_of) +
                           ") must equal n: returning the best of more choices than asked for "
                           "is not supported");
  }
  if (out->include_usage && !out->stream) {
    *bad_param = "stream_options";
    return InvalidArgument("'stream_options' needs 'stream': true");
  }
  if (endpoint == OpenAiEndpoint::kChat) {
    if (out->messages.is_null()) {
      *bad_param = "messages";
      return InvalidArgument("'messages' is required");
    }
    // A chat template writes its own BOS; vLLM's default is the same.
    if (!body.contains("add_special_tokens") || body["add_special_tokens"].is_null()) {
      out->params.add_special_tokens = false;
    }
    if (out->top_logprobs >= 0 && !out->chat_logprobs) {
      *bad_param = "top_logprobs";
      return InvalidArgument("'top_logprobs' needs 'logprobs': true");
    }
    out->logprobs = out->chat_logprobs ? std::max(out->top_logprobs, 0) : -1;
    // As vLLM: the template variable gpt-oss's template reads; chat_template_kwargs wins.
    if (!out->reasoning_effort.empty()) {
      if (out->chat_template_kwargs.is_null()) out->chat_template_kwargs = json::object();
      if (!out->chat_template_kwargs.contains("reasoning_effort")) {
        out->chat_template_kwargs["reasoning_effort"] = out->reasoning_effort;
      }
    }
  } else if (std::holds_alternative<std::monostate>(out->params.prompt)) {
    *bad_param = "prompt";
    return InvalidArgument("'prompt' is required");
  }
  // The engine reports the sampled token's logprob only when asked for at least one alternative.
  out->params.logprobs = out->logprobs < 0 ? 0 : std::max(out->logprobs, 1);
  return Status::Ok();
}

const char* OpenAiFinishReason(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAborted:
      return "abort";
    case FinishReason::kNone:
      break;
  }
  return nullptr;
}

json UsageJson(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json LogprobsJson(OpenAiEndpoint endpoint, const std::vector<SampledToken>& tokens, int top_n,
                  const Tokenizer* tokenizer, int text_offset) {
  auto piece = [tokenizer](int32_t id) {
    if (tokenizer == nullptr) return "token_id:" + std::to_string(id);
    const int32_t one[1] = {id};
    return tokenizer->Decode(one, /*skip_special_tokens=*/false);
  };
  auto bytes = [](const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
  };
  if (endpoint == OpenAiEndpoint::kChat) {
    json content = json::array();
    for (const SampledToken& t : tokens) {
      const std::string s = piece(t.token);
      json top = json::array();
      for (int i = 0; i < top_n && i < static_cast<int>(t.top.size()); ++i) {
        const std::string ts = piece(t.top[i].first);
        top.push_back({{"token", ts}, {"logprob", t.top[i].second}, {"bytes", bytes(ts)}});
      }
      content.push_back(
          {{"token", s}, {"logprob", t.logprob}, {"bytes", bytes(s)}, {"top_logprobs", top}});
    }
    return json{{"content", content}};
  }
  json toks = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const SampledToken& t : tokens) {
    const std::string s = piece(t.token);
    toks.push_back(s);
    lps.push_back(t.logprob);
    json top = json::object();
    for (int i = 0; i < top_n && i < static_cast<int>(t.top.size()); ++i) {
      top[piece(t.top[i].first)] = t.top[i].second;
    }
    tops.push_back(top);
    offs.push_back(text_offset);
    text_offset += static_cast<int>(s.size());
  }
  return json{
      {"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

}  // namespace llm
