// llm-grammar-check: one JSON request per stdin line,
//   {"schema": <JSON Schema>, "instances": ["<text>", ...]}
// answered by one line,
//   {"ok": true, "accepted": [true, false, ...]}  or  {"ok": false, "error": "..."}
// where an instance is accepted when the whole text is in the schema's grammar.
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"

int main() {
  using nlohmann::json;
  namespace g = llm::grammar;
  std::string line;
  while (std::getline(std::cin, line)) {
    nlohmann::ordered_json req = nlohmann::ordered_json::parse(line, nullptr, false);
    json out;
    if (req.is_discarded() || !req.contains("schema")) {
      out = {{"ok", false}, {"error", "bad request line"}};
    } else {
      auto grammar = g::CompileJsonSchema(req["schema"].dump());
      if (!grammar.ok()) {
        out = {{"ok", false}, {"error", grammar.error()}};
      } else {
        auto compiled = g::CompiledGrammar::Create(grammar.value(), nullptr);
        json accepted = json::array();
        for (const auto& inst : req["instances"]) {
          g::Matcher m(compiled);
          accepted.push_back(m.AcceptString(inst.get<std::string>()) && m.CanTerminate());
        }
        out = {{"ok", true}, {"accepted", accepted}};
      }
    }
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n" << std::flush;
  }
  return 0;
}
