#include "text/jinja/parser.h"

#include <charconv>
#include <cstdlib>
#include <set>

#include "text/jinja/error.h"

namespace llm::jinja {

namespace {

using T = Token::Type;

constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : toks_(tokens) {}

  Body ParseTemplate() {
    Body body = ParseBody({});
    if (Cur().type != T::kEof) Fail("unexpected '" + Cur().text + "'");
    return body;
  }

 private:
  const Token& Cur() const { return toks_[pos_]; }
  const Token& Peek(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }

  [[noreturn]] void Fail(const std::string& msg) const {
    throw JinjaError(ErrorKind::kSyntax, msg, Cur().line);
  }
  [[noreturn]] void Unsupported(const std::string& what) const {
    throw JinjaError(ErrorKind::kUnsupported, "unsupported construct: " + what, Cur().line);
  }

  bool IsOp(const char* op) const { return Cur().type == T::kOperator && Cur().text == op; }
  bool IsName(const char* name) const { return Cur().type == T::kName && Cur().text == name; }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(const char* name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  void ExpectOp(const char* op) {
    if (!SkipOp(op)) Fail(std::string("expected '") + op + "', got '" + Cur().text + "'");
  }
  std::string ExpectName() {
    if (Cur().type != T::kName) Fail("expected a name, got '" + Cur().text + "'");
    std::string n = Cur().text;
    Next();
    return n;
  }
  void ExpectBlockEnd() {
    if (Cur().type != T::kBlockEnd) Fail("expected end of statement, got '" + Cur().text + "'");
    Next();
  }

  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p(p) {
      if (++p->depth_ > kMaxNesting) {
        throw JinjaError(ErrorKind::kLimit, "template nested deeper than 200", p->Cur().line);
      }
    }
    ~DepthGuard() { --p->depth_; }
    Parser* p;
  };

  // Statements until a block tag whose keyword is in `ends` (left unconsumed, after "{%").
  Body ParseBody(const std::set<std::string>& ends) {
    DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& t = Cur();
      if (t.type == T::kEof) {
        if (!ends.empty()) Fail("unexpected end of template, expected '" + *ends.begin() + "'");
        return body;
      }
      if (t.type == T::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        Next();
      } else if (t.type == T::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = t.line;
        Next();
        s->expr = ParseTuple();
        if (Cur().type != T::kVarEnd) Fail("expected '}}', got '" + Cur().text + "'");
        Next();
        body.push_back(std::move(s));
      } else if (t.type == T::kBlockBegin) {
        const Token& kw = Peek();
        if (kw.type == T::kName && ends.count(kw.text)) {
          Next();
          return body;
        }
        Next();
        body.push_back(ParseStatement());
      } else {
        Fail("unexpected '" + t.text + "'");
      }
    }
  }

  StmtPtr ParseStatement() {
    if (Cur().type != T::kName) Fail("expected a statement keyword, got '" + Cur().text + "'");
    std::string kw = Cur().text;
    int line = Cur().line;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    Next();
    if (kw == "if") {
      s->kind = Stmt::Kind::kIf;
      s->conditions.push_back(ParseTuple());
      ExpectBlockEnd();
      while (true) {
        s->bodies.push_back(ParseBody({"elif", "else", "endif"}));
        std::string end = ExpectName();
        if (end == "elif") {
          s->conditions.push_back(ParseTuple());
          ExpectBlockEnd();
          continue;
        }
        if (end == "else") {
          ExpectBlockEnd();
          s->else_body = ParseBody({"endif"});
          ExpectName();
        }
        ExpectBlockEnd();
        break;
      }
    } else if (kw == "for") {
      s->kind = Stmt::Kind::kFor;
      s->targets.push_back(ExpectName());
      while (SkipOp(",")) s->targets.push_back(ExpectName());
      if (!SkipName("in")) Fail("expected 'in' in for loop");
      s->expr = ParseTuple(/*with_condexpr=*/false);
      if (SkipName("if")) s->condition = ParseExpression();
      if (IsName("recursive")) Unsupported("recursive for loop");
      ExpectBlockEnd();
      s->body = ParseBody({"else", "endfor"});
      if (ExpectName() == "else") {
        ExpectBlockEnd();
        s->else_body = ParseBody({"endfor"});
        ExpectName();
      }
      ExpectBlockEnd();
    } else if (kw == "set") {
      s->kind = Stmt::Kind::kSet;
      s->targets.push_back(ExpectName());
      if (SkipOp(".")) {
        s->text = ExpectName();  // namespace attribute
      } else {
        while (SkipOp(",")) s->targets.push_back(ExpectName());
      }
      if (SkipOp("=")) {
        s->expr = ParseTuple();
        ExpectBlockEnd();
      } else {
        if (s->targets.size() != 1) Fail("block set takes one name");
        if (SkipOp("|")) Unsupported("filter on a block set");
        ExpectBlockEnd();
        s->body = ParseBody({"endset"});
        ExpectName();
        ExpectBlockEnd();
      }
    } else if (kw == "macro" || kw == "call") {
      bool macro = kw == "macro";
      s->kind = macro ? Stmt::Kind::kMacro : Stmt::Kind::kCallBlock;
      if (macro) s->text = ExpectName();
      if (macro || IsOp("(")) ParseParams(s->params);
      if (!macro) s->expr = ParseExpression();
      ExpectBlockEnd();
      s->body = ParseBody({macro ? "endmacro" : "endcall"});
      ExpectName();
      ExpectBlockEnd();
    } else if (kw == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      ExprPtr chain;
      do {
        chain = ParseFilter(std::move(chain));
      } while (SkipOp("|"));
      s->expr = std::move(chain);
      ExpectBlockEnd();
      s->body = ParseBody({"endfilter"});
      ExpectName();
      ExpectBlockEnd();
    } else if (kw == "with") {
      s->kind = Stmt::Kind::kWith;
      while (Cur().type != T::kBlockEnd) {
        if (!s->params.empty()) ExpectOp(",");
        MacroParam p;
        p.name = ExpectName();
        ExpectOp("=");
        p.default_value = ParseExpression();
        s->params.push_back(std::move(p));
      }
      ExpectBlockEnd();
      s->body = ParseBody({"endwith"});
      ExpectName();
      ExpectBlockEnd();
    } else if (kw == "generation") {
      // transformers' AssistantTracker block: renders its body unchanged.
      s->kind = Stmt::Kind::kWith;
      ExpectBlockEnd();
      s->body = ParseBody({"endgeneration"});
      ExpectName();
      ExpectBlockEnd();
    } else if (kw == "break" || kw == "continue") {
      s->kind = kw == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      ExpectBlockEnd();
    } else if (kw == "include" || kw == "extends" || kw == "import" || kw == "from" ||
               kw == "block" || kw == "autoescape") {
      Unsupported("{% " + kw + " %}");
    } else {
      // jinja2 (with only the loopcontrols extension) rejects these as syntax errors too.
      Fail("Encountered unknown tag '" + kw + "'.");
    }
    return s;
  }

  void ParseParams(std::vector<MacroParam>& params) {
    ExpectOp("(");
    while (!SkipOp(")")) {
      if (!params.empty()) ExpectOp(",");
      if (SkipOp(")")) break;
      MacroParam p;
      p.name = ExpectName();
      if (SkipOp("=")) p.default_value = ParseExpression();
      params.push_back(std::move(p));
    }
  }

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  ExprPtr Binary(const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto e = Make(Expr::Kind::kBinary, line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  // A comma-separated list without brackets becomes a tuple (jinja2's parse_tuple).
  ExprPtr ParseTuple(bool with_condexpr = true) {
    int line = Cur().line;
    ExprPtr first = with_condexpr ? ParseExpression() : ParseOr();
    if (!IsOp(",")) return first;
    auto t = Make(Expr::Kind::kTuple, line);
    t->args.push_back(std::move(first));
    while (SkipOp(",")) {
      if (Cur().type == T::kBlockEnd || Cur().type == T::kVarEnd || IsOp(")") || IsName("if"))
        break;
      t->args.push_back(with_condexpr ? ParseExpression() : ParseOr());
    }
    return t;
  }

  ExprPtr ParseExpression() {
    DepthGuard guard(this);
    int line = Cur().line;
    ExprPtr expr = ParseOr();
    while (SkipName("if")) {
      auto c = Make(Expr::Kind::kCondition, line);
      ExprPtr cond = ParseOr();
      ExprPtr otherwise = SkipName("else") ? ParseExpression() : nullptr;
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(expr));
      c->args.push_back(std::move(otherwise));
      expr = std::move(c);
    }
    return expr;
  }

  ExprPtr ParseOr() {
    int line = Cur().line;
    ExprPtr left = ParseAnd();
    while (SkipName("or")) left = Binary("or", std::move(left), ParseAnd(), line);
    return left;
  }
  ExprPtr ParseAnd() {
    int line = Cur().line;
    ExprPtr left = ParseNot();
    while (SkipName("and")) left = Binary("and", std::move(left), ParseNot(), line);
    return left;
  }
  ExprPtr ParseNot() {
    int line = Cur().line;
    if (SkipName("not")) {
      DepthGuard guard(this);
      auto e = Make(Expr::Kind::kUnary, line);
      e->name = "not";
      e->target = ParseNot();
      return e;
    }
    return ParseCompare();
  }
  ExprPtr ParseCompare() {
    int line = Cur().line;
    ExprPtr left = ParseMath1();
    bool compared = false;
    while (true) {
      std::string op;
      if (Cur().type == T::kOperator &&
          (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == ">" ||
           Cur().text == "<=" || Cur().text == ">=")) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == T::kName && Peek().text == "in") {
        op = "not in";
        Next();
        Next();
      } else {
        return left;
      }
      // Chained comparisons (a < b < c) are rare in templates; refuse them rather than guess.
      if (compared) Unsupported("chained comparison");
      compared = true;
      left = Binary(op, std::move(left), ParseMath1(), line);
    }
  }
  ExprPtr ParseMath1() {
    int line = Cur().line;
    ExprPtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      std::string op = Cur().text;
      Next();
      left = Binary(op, std::move(left), ParseConcat(), line);
    }
    return left;
  }
  ExprPtr ParseConcat() {
    int line = Cur().line;
    ExprPtr left = ParseMath2();
    while (SkipOp("~")) left = Binary("~", std::move(left), ParseMath2(), line);
    return left;
  }
  ExprPtr ParseMath2() {
    int line = Cur().line;
    ExprPtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = Cur().text;
      Next();
      left = Binary(op, std::move(left), ParsePow(), line);
    }
    return left;
  }
  ExprPtr ParsePow() {
    int line = Cur().line;
    ExprPtr left = ParseUnary(true);
    while (SkipOp("**")) left = Binary("**", std::move(left), ParseUnary(true), line);
    return left;
  }
  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    int line = Cur().line;
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      node = Make(Expr::Kind::kUnary, line);
      node->name = Cur().text;
      Next();
      node->target = ParseUnary(false);
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
    const Token& t = Cur();
    int line = t.line;
    if (t.type == T::kName) {
      auto e = Make(Expr::Kind::kLiteral, line);
      if (t.text == "true" || t.text == "True") {
        e->value = Value::Bool(true);
      } else if (t.text == "false" || t.text == "False") {
        e->value = Value::Bool(false);
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::None();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      Next();
      return e;
    }
    if (t.type == T::kString) {
      std::string s;
      while (Cur().type == T::kString) {  // adjacent literals concatenate
        s += Cur().text;
        Next();
      }
      auto e = Make(Expr::Kind::kLiteral, line);
      e->value = Value::String(std::move(s));
      return e;
    }
    if (t.type == T::kInt) {
      auto e = Make(Expr::Kind::kLiteral, line);
      int64_t v = 0;
      auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
      if (r.ec != std::errc()) Unsupported("integer literal beyond 64 bits");
      e->value = Value::Int(v);
      Next();
      return e;
    }
    if (t.type == T::kFloat) {
      auto e = Make(Expr::Kind::kLiteral, line);
      e->value = Value::Float(std::strtod(t.text.c_str(), nullptr));
      Next();
      return e;
    }
    if (SkipOp("(")) {
      if (SkipOp(")")) return Make(Expr::Kind::kTuple, line);
      ExprPtr inner = ParseTuple();
      ExpectOp(")");
      return inner;
    }
    if (SkipOp("[")) {
      auto e = Make(Expr::Kind::kList, line);
      while (!SkipOp("]")) {
        if (!e->args.empty()) ExpectOp(",");
        if (SkipOp("]")) break;
        e->args.push_back(ParseExpression());
      }
      return e;
    }
    if (SkipOp("{")) {
      auto e = Make(Expr::Kind::kDict, line);
      while (!SkipOp("}")) {
        if (!e->args.empty()) ExpectOp(",");
        if (SkipOp("}")) break;
        e->args.push_back(ParseExpression());
        ExpectOp(":");
        e->args.push_back(ParseExpression());
      }
      return e;
    }
    Fail("unexpected '" + t.text + "'");
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      int line = Cur().line;
      if (SkipOp(".")) {
        auto e = Make(Expr::Kind::kGetAttr, line);
        if (Cur().type == T::kInt) {
          e->kind = Expr::Kind::kGetItem;
          auto idx = Make(Expr::Kind::kLiteral, line);
          idx->value = Value::Int(std::atoll(Cur().text.c_str()));
          Next();
          e->args.push_back(std::move(idx));
        } else {
          e->name = ExpectName();
        }
        e->target = std::move(node);
        node = std::move(e);
      } else if (SkipOp("[")) {
        node = ParseSubscript(std::move(node), line);
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr target, int line) {
    ExprPtr parts[3];
    bool slice = false;
    for (int i = 0; i < 3; ++i) {
      if (!IsOp(":") && !IsOp("]")) parts[i] = ParseExpression();
      if (i < 2 && SkipOp(":")) {
        slice = true;
        continue;
      }
      break;
    }
    if (IsOp(",")) Unsupported("tuple subscript");
    ExpectOp("]");
    auto e = Make(slice ? Expr::Kind::kSlice : Expr::Kind::kGetItem, line);
    e->target = std::move(target);
    if (slice) {
      for (auto& p : parts) e->args.push_back(std::move(p));
    } else {
      if (!parts[0]) Fail("empty subscript");
      e->args.push_back(std::move(parts[0]));
    }
    return e;
  }

  void ParseArgs(Expr& e) {
    ExpectOp("(");
    bool first = true;
    while (!SkipOp(")")) {
      if (!first) ExpectOp(",");
      first = false;
      if (SkipOp(")")) break;
      if (IsOp("*") || IsOp("**")) Unsupported("*args / **kwargs in a call");
      if (Cur().type == T::kName && Peek().type == T::kOperator && Peek().text == "=") {
        std::string key = Cur().text;
        Next();
        Next();
        e.kwargs.emplace_back(key, ParseExpression());
      } else {
        if (!e.kwargs.empty()) Fail("positional argument after a keyword argument");
        e.args.push_back(ParseExpression());
      }
    }
  }

  ExprPtr ParseCall(ExprPtr target) {
    auto e = Make(Expr::Kind::kCall, Cur().line);
    e->target = std::move(target);
    ParseArgs(*e);
    return e;
  }

  ExprPtr ParseFilter(ExprPtr target) {
    auto e = Make(Expr::Kind::kFilter, Cur().line);
    e->name = ExpectName();
    while (SkipOp(".")) e->name += "." + ExpectName();
    e->target = std::move(target);
    if (IsOp("(")) ParseArgs(*e);
    return e;
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (SkipOp("|")) {
        node = ParseFilter(std::move(node));
      } else if (SkipName("is")) {
        auto e = Make(Expr::Kind::kTest, Cur().line);
        e->negated = SkipName("not");
        e->name = ExpectName();
        while (SkipOp(".")) e->name += "." + ExpectName();
        e->target = std::move(node);
        const Token& t = Cur();
        if (IsOp("(")) {
          ParseArgs(*e);
        } else if ((t.type == T::kName && t.text != "else" && t.text != "or" && t.text != "and") ||
                   t.type == T::kString || t.type == T::kInt || t.type == T::kFloat || IsOp("[") ||
                   IsOp("{")) {
          // jinja2 accepts one bare argument: `x is divisibleby 3`, `x is sameas none`.
          if (t.type == T::kName &&
              (t.text == "is" || t.text == "in" || t.text == "not" || t.text == "if"))
            return e;
          ExprPtr arg = ParsePrimary();
          arg = ParsePostfix(std::move(arg));
          e->args.push_back(std::move(arg));
        }
        node = std::move(e);
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  const std::vector<Token>& toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Body Parse(const std::vector<Token>& tokens) {
  return Parser(tokens).ParseTemplate();
}

}  // namespace llm::jinja
