// Compiled structured-output grammars, keyed by (constraint kind, text) and bound to the model's
// vocabulary. Compiling a schema costs far more than a step, and clients repeat the same few
// schemas, so the engine keeps the most recently used ones. Thread-safe: request handler threads
// compile through it in EngineCore::Validate. A compile builds the grammar's token cache (hundreds
// of milliseconds for a large schema), so requests that ask for a grammar being compiled wait for
// that compile instead of repeating it.
#pragma once

#include <cstddef>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "base/status.h"
#include "engine/request.h"
#include "grammar/compiled_grammar.h"
#include "grammar/vocabulary.h"

namespace llm {

class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const grammar::Vocabulary> vocab, size_t capacity);

  // The constraint's grammar, compiled once; InvalidArgument with the grammar library's message
  // when it does not compile.
  StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> Get(const Constraint& c);

  const grammar::Vocabulary& vocab() const { return *vocab_; }
  size_t size() const;
  // Compiles run so far (cache misses that were not waiting on another request's compile).
  size_t compiles() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const grammar::CompiledGrammar>>;
  std::shared_ptr<const grammar::Vocabulary> vocab_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  using Compiled = StatusOr<std::shared_ptr<const grammar::CompiledGrammar>>;
  std::unordered_map<std::string, std::shared_future<Compiled>> compiling_;
  size_t compiles_ = 0;
};

}  // namespace llm
