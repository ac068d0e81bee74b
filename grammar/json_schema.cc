// JSON Schema (draft 7 semantics, plus $defs and prefixItems) to a grammar. Every keyword that
// constrains instances is either compiled exactly or refused by name with its location; only
// annotations are ignored. Objects are generated with their declared properties in schema order,
// then any additional properties.
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/json_escape.h"
#include "grammar/grammar.h"
#include "grammar/json_pieces.h"
#include "grammar/regex.h"

namespace llm::grammar {

namespace {

using Json = nlohmann::ordered_json;

const std::set<std::string> kAnnotations = {
    "title",    "description", "$schema",   "$id",        "examples",         "default",
    "$comment", "readOnly",    "writeOnly", "deprecated", "contentMediaType", "contentEncoding"};
const std::set<std::string> kSupported = {"type",
                                          "enum",
                                          "const",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "definitions",
                                          "$defs",
                                          "items",
                                          "prefixItems",
                                          "additionalItems",
                                          "minItems",
                                          "maxItems",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "uniqueItems"};
const std::vector<std::string> kTypes = {"null",   "boolean", "object", "array",
                                         "number", "string",  "integer"};

[[noreturn]] void Refuse(const std::string& what, const std::string& path) {
  throw CompileError{what + " at " + (path.empty() ? "/" : path)};
}

class SchemaCompiler {
 public:
  // Rules go into `b`, which several compilers may share (CompileTaggedJsonSchemas).
  SchemaCompiler(const Json& root, const JsonSchemaOptions& opt, GrammarBuilder& b)
      : root_(root), opt_(opt), b_(b) {
    ByteSet ws;
    for (char c : std::string(" \t\n\r")) ws.Add(static_cast<uint8_t>(c));
    ws_ = Repeat(Set(ws), 0, opt.max_whitespace);
    string_char_ = JsonStringChar();
    any_string_ = Seq({Lit("\""), Star(string_char_), Lit("\"")});
  }

  // The whole schema's value, as an expression over the builder's rules.
  ExprPtr Value() { return Compile(root_, ""); }

  std::shared_ptr<const Grammar> Run() {
    int root = b_.AddRule("root");
    b_.Define(root, Compile(root_, ""));
    auto g = Grammar::Build(b_, root);
    if (!g.ok()) throw CompileError{g.error()};
    return g.value();
  }

 private:
  // --- any JSON value -----------------------------------------------------------------------
  ExprPtr AnyValue() {
    if (any_value_ >= 0) return Ref(any_value_);
    any_value_ = b_.AddRule("value");
    ExprPtr v = Ref(any_value_);
    ExprPtr member = Seq({any_string_, ws_, Lit(":"), ws_, v});
    ExprPtr sep = Seq({ws_, Lit(","), ws_});
    ExprPtr object =
        Seq({Lit("{"), ws_, Optional(Seq({member, Star(Seq({sep, member}))})), ws_, Lit("}")});
    ExprPtr array = Seq({Lit("["), ws_, Optional(Seq({v, Star(Seq({sep, v}))})), ws_, Lit("]")});
    b_.Define(any_value_, Alt({object, array, any_string_, AnyNumber(), Lit("true"), Lit("false"),
                               Lit("null")}));
    return v;
  }

  // --- $ref -----------------------------------------------------------------------------------
  const Json& Resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') Refuse("unsupported remote $ref \"" + ref + "\"", path);
    std::string pointer;
    for (size_t i = 1; i < ref.size(); ++i) {  // percent-decoding
      if (ref[i] == '%' && i + 2 < ref.size()) {
        pointer += static_cast<char>(std::stoi(ref.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        pointer += ref[i];
      }
    }
    if (!pointer.empty() && pointer[0] != '/') Refuse("unsupported $ref \"" + ref + "\"", path);
    const Json* node = &root_;
    size_t i = 1;
    while (i <= pointer.size() && !pointer.empty()) {
      size_t j = pointer.find('/', i);
      if (j == std::string::npos) j = pointer.size();
      std::string tok = pointer.substr(i, j - i);
      for (size_t k; (k = tok.find("~1")) != std::string::npos;) tok.replace(k, 2, "/");
      for (size_t k; (k = tok.find("~0")) != std::string::npos;) tok.replace(k, 2, "~");
      if (node->is_object() && node->contains(tok)) {
        node = &(*node)[tok];
      } else if (node->is_array() && !tok.empty() &&
                 tok.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoul(tok) < node->size()) {
        node = &(*node)[std::stoul(tok)];
      } else {
        Refuse("unresolvable $ref \"" + ref + "\"", path);
      }
      i = j + 1;
    }
    return *node;
  }

  ExprPtr CompileRef(const std::string& ref, const std::string& path) {
    auto it = ref_rules_.find(ref);
    if (it != ref_rules_.end()) return Ref(it->second);
    const Json& target = Resolve(ref, path);
    int rule = b_.AddRule("ref");
    ref_rules_[ref] = rule;
    b_.Define(rule, Compile(target, ref.substr(1)));
    return Ref(rule);
  }

  // --- keyword checks and merging -------------------------------------------------------------
  void CheckKeywords(const Json& s, const std::string& path) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (kAnnotations.count(k)) {
        if (k == "$id" && !path.empty() && &s != &root_)
          Refuse("unsupported keyword \"$id\" in a subschema", path);
        continue;
      }
      if (!kSupported.count(k)) Refuse("unsupported JSON Schema keyword \"" + k + "\"", path);
    }
    if (s.contains("uniqueItems") && s["uniqueItems"] != false)
      Refuse("unsupported JSON Schema keyword \"uniqueItems\"", path);
  }

  // The schema a $ref (possibly chained) stands for, for merging.
  const Json& Deref(const Json& s, const std::string& path) {
    const Json* cur = &s;
    for (int depth = 0; cur->is_object() && cur->contains("$ref"); ++depth) {
      if (depth > 32) Refuse("$ref chain too long", path);
      cur = &Resolve((*cur)["$ref"].get<std::string>(), path);
    }
    return *cur;
  }

  std::set<std::string> TypeSet(const Json& s) {
    std::set<std::string> out;
    if (s.is_boolean()) {
      if (s.get<bool>()) out.insert(kTypes.begin(), kTypes.end());
      return out;
    }
    if (s.contains("type")) {
      if (s["type"].is_string())
        out.insert(s["type"].get<std::string>());
      else
        for (const auto& t : s["type"]) out.insert(t.get<std::string>());
    } else {
      out.insert(kTypes.begin(), kTypes.end());
    }
    if (out.count("number")) out.insert("integer");
    return out;
  }

  // allOf (and anyOf/oneOf siblings): one schema with both sets of keywords, or a refusal.
  Json Merge(Json a, const Json& b, const std::string& path) {
    if (b.is_boolean()) {
      if (b.get<bool>()) return a;
      return Json(false);
    }
    if (a.is_boolean()) {
      if (!a.get<bool>()) return a;
      a = Json::object();
    }
    for (auto it = b.begin(); it != b.end(); ++it) {
      const std::string& k = it.key();
      const Json& v = it.value();
      if (kAnnotations.count(k) || k == "definitions" || k == "$defs") continue;
      if (!a.contains(k)) {
        if ((k == "additionalProperties" && a.contains("properties")) ||
            (k == "properties" && a.contains("additionalProperties")))
          Refuse("allOf combining additionalProperties with other properties", path);
        a[k] = v;
        continue;
      }
      Json& av = a[k];
      if (av == v) continue;
      if (k == "type") {
        std::set<std::string> ta = TypeSet(Json{{"type", av}}), tb = TypeSet(Json{{"type", v}});
        Json both = Json::array();
        for (const auto& t : kTypes) {
          if (!ta.count(t) || !tb.count(t)) continue;
          // "integer" is implied by "number" in TypeSet; keep it only when neither side has number.
          if (t == "integer" && ta.count("number") && tb.count("number")) continue;
          both.push_back(t);
        }
        av = both;
      } else if (k == "required") {
        for (const auto& r : v)
          if (std::find(av.begin(), av.end(), r) == av.end()) av.push_back(r);
      } else if (k == "properties") {
        for (auto p = v.begin(); p != v.end(); ++p) {
          if (av.contains(p.key()))
            av[p.key()] = Json{{"allOf", Json::array({av[p.key()], p.value()})}};
          else
            av[p.key()] = p.value();
        }
      } else if (k == "minimum" || k == "minLength" || k == "minItems" || k == "exclusiveMinimum") {
        if (v > av) av = v;
      } else if (k == "maximum" || k == "maxLength" || k == "maxItems" || k == "exclusiveMaximum") {
        if (v < av) av = v;
      } else {
        Refuse("allOf with two different \"" + k + "\"", path);
      }
    }
    return a;
  }

  // --- the schema itself ----------------------------------------------------------------------
  ExprPtr Compile(const Json& s, const std::string& path) {
    if (s.is_boolean()) return s.get<bool>() ? AnyValue() : Nothing();
    if (!s.is_object()) Refuse("a schema must be an object or a boolean", path);
    // Draft 7: $ref replaces every sibling keyword.
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) Refuse("$ref must be a string", path);
      return CompileRef(s["$ref"].get<std::string>(), path);
    }
    CheckKeywords(s, path);
    if (s.contains("allOf")) {
      Json merged = s;
      merged.erase("allOf");
      int i = 0;
      for (const auto& branch : s["allOf"]) {
        std::string bp = path + "/allOf/" + std::to_string(i++);
        const Json& d = Deref(branch, bp);
        if (d.is_object()) CheckKeywords(d, bp);
        merged = Merge(merged, d, bp);
      }
      return Compile(merged, path);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      Json siblings = s;
      siblings.erase(key);
      if (std::string(key) == "anyOf" && s.contains("oneOf"))
        Refuse("anyOf together with oneOf", path);
      std::vector<ExprPtr> alts;
      std::vector<std::set<std::string>> types;
      int i = 0;
      for (const auto& branch : s[key]) {
        std::string bp = path + "/" + key + "/" + std::to_string(i++);
        bool plain = siblings.empty();
        if (plain) {
          alts.push_back(Compile(branch, bp));
          types.push_back(TypeSet(Deref(branch, bp)));
        } else {
          const Json& d = Deref(branch, bp);
          if (d.is_object()) CheckKeywords(d, bp);
          Json m = Merge(siblings, d, bp);
          alts.push_back(Compile(m, bp));
          types.push_back(TypeSet(m));
        }
      }
      // oneOf is a union only when at most one branch can match any instance: require branches
      // of pairwise disjoint types.
      if (std::string(key) == "oneOf") {
        for (size_t x = 0; x < types.size(); ++x)
          for (size_t y = x + 1; y < types.size(); ++y)
            for (const auto& t : types[x])
              if (types[y].count(t))
                Refuse("oneOf whose branches may overlap (both allow " + t + ")", path);
      }
      return Alt(std::move(alts));
    }
    std::set<std::string> types = TypeSet(s);
    if (s.contains("type")) {
      for (const auto& t : types)
        if (std::find(kTypes.begin(), kTypes.end(), t) == kTypes.end())
          Refuse("unknown type \"" + t + "\"", path);
    }
    if (s.contains("enum") || s.contains("const")) return CompileEnum(s, types, path);
    std::vector<ExprPtr> alts;
    if (types.count("null")) alts.push_back(Lit("null"));
    if (types.count("boolean")) alts.push_back(Alt({Lit("true"), Lit("false")}));
    if (types.count("number"))
      alts.push_back(CompileNumber(s, false, path));
    else if (types.count("integer"))
      alts.push_back(CompileNumber(s, true, path));
    if (types.count("string")) alts.push_back(CompileString(s, path));
    if (types.count("array")) alts.push_back(CompileArray(s, path));
    if (types.count("object")) alts.push_back(CompileObject(s, path));
    return Alt(std::move(alts));
  }

  ExprPtr CompileEnum(const Json& s, const std::set<std::string>& types, const std::string& path) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (k != "enum" && k != "const" && k != "type" && k != "definitions" && k != "$defs" &&
          !kAnnotations.count(k))
        Refuse("enum/const together with \"" + k + "\"", path);
    }
    std::vector<Json> values;
    if (s.contains("const")) values.push_back(s["const"]);
    if (s.contains("enum")) {
      if (!s["enum"].is_array()) Refuse("enum must be an array", path);
      if (s.contains("const")) Refuse("enum together with const", path);
      for (const auto& v : s["enum"]) values.push_back(v);
    }
    std::vector<ExprPtr> alts;
    for (const auto& v : values) {
      std::string t = v.is_null()      ? "null"
                      : v.is_boolean() ? "boolean"
                      : v.is_number_integer() || (v.is_number_float() &&
                                                  std::floor(v.get<double>()) == v.get<double>())
                          ? "integer"
                      : v.is_number() ? "number"
                      : v.is_string() ? "string"
                      : v.is_array()  ? "array"
                                      : "object";
      if (types.count(t)) alts.push_back(Literal(v));
    }
    return Alt(std::move(alts));
  }

  // The value with the grammar's whitespace between its tokens.
  ExprPtr Literal(const Json& v) {
    if (v.is_object()) {
      std::vector<ExprPtr> seq{Lit("{"), ws_};
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) seq.insert(seq.end(), {ws_, Lit(","), ws_});
        first = false;
        seq.insert(seq.end(), {Lit(JsonQuoted(it.key(), JsonNonAscii::kRaw)), ws_, Lit(":"), ws_,
                               Literal(it.value())});
      }
      seq.insert(seq.end(), {ws_, Lit("}")});
      return Seq(std::move(seq));
    }
    if (v.is_array()) {
      std::vector<ExprPtr> seq{Lit("["), ws_};
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) seq.insert(seq.end(), {ws_, Lit(","), ws_});
        seq.push_back(Literal(v[i]));
      }
      seq.insert(seq.end(), {ws_, Lit("]")});
      return Seq(std::move(seq));
    }
    if (v.is_string()) return Lit(JsonQuoted(v.get<std::string>(), JsonNonAscii::kRaw));
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::floor(d) == d && std::fabs(d) < 1e18) {  // 1.0 is written 1, as integers are
        return Lit(std::to_string(static_cast<int64_t>(d)));
      }
    }
    return Lit(v.dump());
  }

  // Integer bound from a schema number: for integers any bound rounds inward; for numbers only
  // integer bounds are supported exactly.
  std::optional<int64_t> Bound(const Json& s, const char* key, bool integer, bool lower,
                               const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    const Json& v = s[key];
    if (!v.is_number()) Refuse(std::string("\"") + key + "\" must be a number", path);
    double d = v.get<double>();
    if (std::fabs(d) > 1e18) Refuse(std::string("\"") + key + "\" beyond 1e18", path);
    if (v.is_number_integer()) return v.get<int64_t>();
    if (std::floor(d) == d) return static_cast<int64_t>(d);
    return static_cast<int64_t>(lower ? std::floor(d) : std::ceil(d));
  }

  ExprPtr CompileNumber(const Json& s, bool integer, const std::string& path) {
    auto lo = Bound(s, "minimum", integer, true, path);
    auto hi = Bound(s, "maximum", integer, false, path);
    auto xlo = Bound(s, "exclusiveMinimum", integer, true, path);
    auto xhi = Bound(s, "exclusiveMaximum", integer, false, path);
    if (integer) {
      // Non-integer bounds were rounded outward above: minimum 1.5 -> floor 1 is wrong for an
      // inclusive bound, so recompute with the real value.
      auto ceil_of = [&](const char* k) {
        return static_cast<int64_t>(std::ceil(s[k].get<double>()));
      };
      auto floor_of = [&](const char* k) {
        return static_cast<int64_t>(std::floor(s[k].get<double>()));
      };
      std::optional<int64_t> l, h;
      if (lo) l = ceil_of("minimum");
      if (xlo) l = std::max(l.value_or(INT64_MIN), floor_of("exclusiveMinimum") + 1);
      if (hi) h = floor_of("maximum");
      if (xhi) h = std::min(h.value_or(INT64_MAX), ceil_of("exclusiveMaximum") - 1);
      if (l && h && *l > *h) return Nothing();
      return IntegerRange(l, h);
    }
    if (!lo && !hi && !xlo && !xhi) return AnyNumber();
    // Tightest lower and upper bound, each inclusive or exclusive, as exact decimals.
    auto dec = [&](const char* k) {
      std::optional<Decimal> d;
      if (s.contains(k)) d = ParseDecimal(s[k].dump());
      return d;
    };
    auto value = [&](const char* k) { return s[k].get<double>(); };
    std::optional<Decimal> l = dec("minimum"), h = dec("maximum");
    bool lx = false, hx = false;
    if (xlo && (!lo || value("exclusiveMinimum") >= value("minimum")))
      l = dec("exclusiveMinimum"), lx = true;
    if (xhi && (!hi || value("exclusiveMaximum") <= value("maximum")))
      h = dec("exclusiveMaximum"), hx = true;
    return NumberRange(b_, l, lx, h, hx);
  }

  int Count(const Json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return -1;
    const Json& v = s[key];
    if (!v.is_number() || v.get<double>() < 0 || std::floor(v.get<double>()) != v.get<double>())
      Refuse(std::string("\"") + key + "\" must be a non-negative integer", path);
    double d = v.get<double>();
    return d > 1e9 ? 1'000'000'000 : static_cast<int>(d);
  }

  ExprPtr CompileString(const Json& s, const std::string& path) {
    int min = std::max(0, Count(s, "minLength", path)), max = Count(s, "maxLength", path);
    bool lengths = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("pattern") + s.contains("format") + lengths > 1)
      Refuse("pattern, format and minLength/maxLength combined", path);
    if (s.contains("pattern")) {
      try {
        return Seq({Lit("\""),
                    RegexToExpr(s["pattern"].get<std::string>(), RegexFlavor::kJsonStringPattern),
                    Lit("\"")});
      } catch (const CompileError& e) {
        Refuse("pattern: " + e.message, path);
      }
    }
    if (s.contains("format")) {
      std::string f = s["format"].get<std::string>();
      ExprPtr content = FormatContent(f);
      if (!content) Refuse("unsupported format \"" + f + "\"", path);
      return Seq({Lit("\""), content, Lit("\"")});
    }
    if (!lengths) return any_string_;
    if (max >= 0 && max < min) return Nothing();
    if (min > opt_.max_expanded_repeat || max > opt_.max_expanded_repeat)
      Refuse("string length bound above " + std::to_string(opt_.max_expanded_repeat), path);
    return Seq({Lit("\""), Repeat(string_char_, min, max < 0 ? kUnbounded : max), Lit("\"")});
  }

  ExprPtr CompileArray(const Json& s, const std::string& path) {
    std::vector<ExprPtr> prefix;
    ExprPtr rest = AnyValue();  // items after the prefix; nullptr: none allowed
    auto sub = [&](const Json& v, const std::string& p) -> ExprPtr {
      if (v.is_boolean() && !v.get<bool>()) return nullptr;
      return Compile(v, p);
    };
    if (s.contains("prefixItems")) {
      int i = 0;
      for (const auto& v : s["prefixItems"]) {
        std::string p = path + "/prefixItems/" + std::to_string(i++);
        prefix.push_back(v.is_boolean() && !v.get<bool>() ? Nothing() : Compile(v, p));
      }
      if (s.contains("items")) rest = sub(s["items"], path + "/items");
      if (s.contains("additionalItems")) Refuse("additionalItems with prefixItems", path);
    } else if (s.contains("items") && s["items"].is_array()) {
      int i = 0;
      for (const auto& v : s["items"]) {
        std::string p = path + "/items/" + std::to_string(i++);
        prefix.push_back(v.is_boolean() && !v.get<bool>() ? Nothing() : Compile(v, p));
      }
      if (s.contains("additionalItems"))
        rest = sub(s["additionalItems"], path + "/additionalItems");
    } else if (s.contains("items")) {
      rest = sub(s["items"], path + "/items");
    }
    int min = std::max(0, Count(s, "minItems", path)), max = Count(s, "maxItems", path);
    if (!rest) max = max < 0 ? static_cast<int>(prefix.size()) : std::min<int>(max, prefix.size());
    if (max >= 0 && max < min) return Nothing();
    int explicit_n = std::max<int>(prefix.size(), min);
    if (explicit_n > opt_.max_expanded_repeat || max > opt_.max_expanded_repeat)
      Refuse("array size bound above " + std::to_string(opt_.max_expanded_repeat), path);
    ExprPtr sep = Seq({ws_, Lit(","), ws_});
    auto item = [&](int i) { return i < static_cast<int>(prefix.size()) ? prefix[i] : rest; };
    // tail(i): the items from index i on, each preceded by a comma.
    ExprPtr tail;
    int limit = max >= 0 ? max : explicit_n;
    if (max >= 0) {
      tail = Empty();
    } else {
      tail = Star(Seq({sep, rest}));
    }
    for (int i = limit - 1; i >= 1; --i) {
      ExprPtr one = Seq({sep, item(i), tail});
      tail = i >= min ? Optional(one) : one;
    }
    ExprPtr body;
    if (limit == 0) {
      body = max == 0 ? Empty() : Optional(Seq({rest, tail}));
    } else {
      ExprPtr first = Seq({item(0), tail});
      body = min == 0 ? Optional(first) : first;
    }
    return Seq({Lit("["), ws_, body, ws_, Lit("]")});
  }

  ExprPtr CompileObject(const Json& s, const std::string& path) {
    std::vector<std::string> names;
    std::vector<ExprPtr> values;
    std::set<std::string> required;
    if (s.contains("required")) {
      for (const auto& r : s["required"]) required.insert(r.get<std::string>());
    }
    ExprPtr additional = AnyValue();
    if (s.contains("additionalProperties")) {
      const Json& a = s["additionalProperties"];
      additional =
          a.is_boolean() && !a.get<bool>() ? nullptr : Compile(a, path + "/additionalProperties");
    }
    if (s.contains("properties")) {
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
        names.push_back(it.key());
        values.push_back(Compile(it.value(), path + "/properties/" + it.key()));
      }
    }
    // Required names without a declaration are governed by additionalProperties.
    for (const auto& r : required) {
      if (std::find(names.begin(), names.end(), r) != names.end()) continue;
      names.push_back(r);
      values.push_back(additional ? additional : Nothing());
    }
    ExprPtr sep = Seq({ws_, Lit(","), ws_});
    ExprPtr extra;
    if (additional) extra = Seq({KeyNotIn(names), ws_, Lit(":"), ws_, additional});
    // after[first]: the members from property i on; `first` when nothing was written before.
    ExprPtr after[2];
    after[0] = extra ? Star(Seq({sep, extra})) : Empty();
    after[1] = extra ? Optional(Seq({extra, after[0]})) : Empty();
    for (int i = static_cast<int>(names.size()) - 1; i >= 0; --i) {
      ExprPtr member =
          Seq({Lit(JsonQuoted(names[i], JsonNonAscii::kRaw)), ws_, Lit(":"), ws_, values[i]});
      int r0 = b_.AddRule("props"), r1 = b_.AddRule("props");
      b_.Define(r0, after[0]);
      b_.Define(r1, after[1]);
      ExprPtr not_first = Seq({sep, member, Ref(r0)});
      ExprPtr first = Seq({member, Ref(r0)});
      bool req = required.count(names[i]);
      after[0] = req ? not_first : Alt({not_first, Ref(r0)});
      after[1] = req ? first : Alt({first, Ref(r1)});
    }
    return Seq({Lit("{"), ws_, after[1], ws_, Lit("}")});
  }

  // A JSON string (quotes included) that is none of `names`, walking their shared prefixes.
  ExprPtr KeyNotIn(const std::vector<std::string>& names) {
    if (names.empty()) return any_string_;
    struct Node {
      std::map<uint32_t, int> kids;
      bool terminal = false;
    };
    std::vector<Node> trie(1);
    for (const auto& n : names) {
      int cur = 0;
      size_t i = 0;
      while (i < n.size()) {
        uint32_t c = NextCodepoint(n, i);
        if (c < 0x20 || c == '"' || c == '\\')
          throw CompileError{"property names with characters JSON escapes are not supported"};
        auto it = trie[cur].kids.find(c);
        if (it == trie[cur].kids.end()) {
          trie.push_back(Node{});
          it = trie[cur].kids.emplace(c, static_cast<int>(trie.size() - 1)).first;
        }
        cur = it->second;
      }
      trie[cur].terminal = true;
    }
    ExprPtr rest = Seq({Star(string_char_), Lit("\"")});
    std::vector<int> rule(trie.size());
    for (auto& r : rule) r = b_.AddRule("key");
    for (size_t n = 0; n < trie.size(); ++n) {
      std::vector<ExprPtr> alts;
      if (!trie[n].terminal) alts.push_back(Lit("\""));
      CodepointRanges kids;
      for (auto [c, child] : trie[n].kids) {
        kids.Add(c);
        alts.push_back(Seq({Lit(EncodeUtf8(c)), Ref(rule[child])}));
      }
      alts.push_back(Seq({JsonStringChar(kids), rest}));
      b_.Define(rule[n], Alt(std::move(alts)));
    }
    return Seq({Lit("\""), Ref(rule[0])});
  }

  const Json& root_;
  JsonSchemaOptions opt_;
  GrammarBuilder& b_;
  ExprPtr ws_, string_char_, any_string_;
  int any_value_ = -1;
  std::map<std::string, int> ref_rules_;
};

}  // namespace

Result<std::shared_ptr<const Grammar>> CompileJsonSchema(const std::string& schema_json,
                                                         const JsonSchemaOptions& options) {
  using R = Result<std::shared_ptr<const Grammar>>;
  Json schema = Json::parse(schema_json, nullptr, false);
  if (schema.is_discarded()) return R::Error("JSON Schema: not valid JSON");
  try {
    GrammarBuilder b;
    return SchemaCompiler(schema, options, b).Run();
  } catch (const CompileError& e) {
    return R::Error("JSON Schema: " + e.message);
  } catch (const nlohmann::json::exception& e) {
    return R::Error(std::string("JSON Schema: malformed keyword value (") + e.what() + ")");
  }
}

Result<std::shared_ptr<const Grammar>> CompileTaggedJsonSchemas(const std::string& spec_json,
                                                                const JsonSchemaOptions& options) {
  using R = Result<std::shared_ptr<const Grammar>>;
  const Json spec = Json::parse(spec_json, nullptr, false);
  auto text = [&spec](const char* key) -> std::string {
    const Json& v = spec.contains(key) ? spec[key] : Json("");
    if (!v.is_string()) throw CompileError{std::string("'") + key + "' must be a string"};
    return v.get<std::string>();
  };
  auto lit = [](const std::string& s) { return s.empty() ? Empty() : Lit(s); };
  try {
    if (!spec.is_object() || !spec.contains("items") || !spec["items"].is_array() ||
        spec["items"].empty()) {
      return R::Error("tagged JSON: needs a non-empty list 'items'");
    }
    const int max_items = spec.value("max_items", 1);
    if (max_items < 1) return R::Error("tagged JSON: 'max_items' must be at least 1");
    GrammarBuilder b;
    std::vector<ExprPtr> items;
    for (const Json& item : spec["items"]) {
      if (!item.is_object() || !item.contains("schema")) {
        return R::Error("tagged JSON: every item needs a 'schema'");
      }
      const Json& schema = item["schema"];
      const std::string begin = item.value("begin", ""), end = item.value("end", "");
      items.push_back(Seq({lit(begin), SchemaCompiler(schema, options, b).Value(), lit(end)}));
    }
    const int item = b.AddRule("item");
    b.Define(item, items.size() == 1 ? items[0] : Alt(items));
    const int root = b.AddRule("root");
    b.Define(root, Seq({lit(text("prefix")), Ref(item),
                        Repeat(Seq({lit(text("separator")), Ref(item)}), 0, max_items - 1),
                        lit(text("suffix"))}));
    return Grammar::Build(b, root, /*special_tokens=*/true);
  } catch (const CompileError& e) {
    return R::Error("JSON Schema: " + e.message);
  } catch (const nlohmann::json::exception& e) {
    return R::Error(std::string("tagged JSON: malformed value (") + e.what() + ")");
  }
}

}  // namespace llm::grammar
