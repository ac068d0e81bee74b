// A choice list: the output is exactly one of the given strings.
#include "grammar/grammar.h"

namespace llm::grammar {

Result<std::shared_ptr<const Grammar>> MakeChoices(const std::vector<std::string>& choices) {
  GrammarBuilder b;
  int root = b.AddRule("root");
  std::vector<ExprPtr> alts;
  for (const auto& c : choices) alts.push_back(Lit(c));
  b.Define(root, Alt(std::move(alts)));
  return Grammar::Build(b, root);
}

}  // namespace llm::grammar
