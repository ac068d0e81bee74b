#include "engine/grammar_cache.h"

#include <exception>
#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace llm {

const char* ConstraintKindName(Constraint::Kind kind) {
  switch (kind) {
    case Constraint::Kind::kJsonSchema:
      return "json_schema";
    case Constraint::Kind::kJsonObject:
      return "json_object";
    case Constraint::Kind::kRegex:
      return "regex";
    case Constraint::Kind::kGrammar:
      return "grammar";
    case Constraint::Kind::kChoice:
      return "choice";
    case Constraint::Kind::kTaggedJson:
      return "tagged_json";
    case Constraint::Kind::kNone:
      break;
  }
  return "none";
}

namespace {

// The cache key: the kind, then the text (choices as a JSON list, so no separator is ambiguous).
std::string KeyOf(const Constraint& c) {
  std::string key = ConstraintKindName(c.kind);
  key += '\n';
  key += c.kind == Constraint::Kind::kChoice ? nlohmann::json(c.choices).dump() : c.text;
  return key;
}

grammar::Result<std::shared_ptr<const grammar::Grammar>> Compile(const Constraint& c) {
  using R = grammar::Result<std::shared_ptr<const grammar::Grammar>>;
  switch (c.kind) {
    case Constraint::Kind::kJsonSchema:
      return grammar::CompileJsonSchema(c.text);
    case Constraint::Kind::kJsonObject:
      // Any JSON object: properties of any name and value.
      return grammar::CompileJsonSchema(R"({"type": "object"})");
    case Constraint::Kind::kRegex:
      return grammar::ParseRegex(c.text);
    case Constraint::Kind::kGrammar:
      return grammar::ParseGbnf(c.text);
    case Constraint::Kind::kChoice:
      if (c.choices.empty()) return R::Error("choice: the list of choices is empty");
      return grammar::MakeChoices(c.choices);
    case Constraint::Kind::kTaggedJson:
      return grammar::CompileTaggedJsonSchemas(c.text);
    case Constraint::Kind::kNone:
      break;
  }
  return R::Error("no constraint");
}

}  // namespace

GrammarCache::GrammarCache(std::shared_ptr<const grammar::Vocabulary> vocab, size_t capacity)
    : vocab_(std::move(vocab)), capacity_(capacity == 0 ? 1 : capacity) {}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

size_t GrammarCache::compiles() const {
  std::lock_guard<std::mutex> lock(mu_);
  return compiles_;
}

StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> GrammarCache::Get(const Constraint& c) {
  const std::string key = KeyOf(c);
  std::promise<Compiled> promise;
  std::unique_lock<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  if (auto pending = compiling_.find(key); pending != compiling_.end()) {
    std::shared_future<Compiled> compiled = pending->second;
    lock.unlock();
    return compiled.get();
  }
  compiling_.emplace(key, promise.get_future().share());
  ++compiles_;
  lock.unlock();
  // Compiled outside the lock: one slow schema must not hold up other requests' lookups.
  // Nothing may escape before the waiters are answered.
  Compiled result = [&]() -> Compiled {
    try {
      auto g = Compile(c);
      if (!g.ok()) {
        return InvalidArgument(std::string(ConstraintKindName(c.kind)) +
                               " constraint: " + g.error());
      }
      return std::shared_ptr<const grammar::CompiledGrammar>(
          grammar::CompiledGrammar::Create(g.value(), vocab_));
    } catch (const std::exception& e) {
      return Internal(std::string(ConstraintKindName(c.kind)) + " constraint: " + e.what());
    }
  }();
  {
    std::lock_guard<std::mutex> relock(mu_);
    compiling_.erase(key);
    if (result.ok()) {  // errors are not kept: the next request compiles again
      lru_.emplace_front(key, result.value());
      index_[key] = lru_.begin();
      if (lru_.size() > capacity_) {
        index_.erase(lru_.back().first);
        lru_.pop_back();
      }
    }
  }
  promise.set_value(result);
  return result;
}

}  // namespace llm
