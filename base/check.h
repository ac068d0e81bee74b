// CHECK-style invariant macros. A failed check is a bug in this program, not bad input:
// it logs the condition and message and aborts. Bad input is reported with Status instead.
#pragma once

#include <sstream>

namespace llm::detail {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `LLM_CHECK(x) << "msg"` compile to a no-op stream expression when x holds.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace llm::detail

#define LLM_CHECK(cond) \
  (cond)                \
      ? (void)0         \
      : ::llm::detail::Voidify() & ::llm::detail::CheckFailure(__FILE__, __LINE__, #cond).stream()

#define LLM_CHECK_EQ(a, b) LLM_CHECK((a) == (b)) << (a) << " vs " << (b) << " "
#define LLM_CHECK_LT(a, b) LLM_CHECK((a) < (b)) << (a) << " vs " << (b) << " "
#define LLM_CHECK_LE(a, b) LLM_CHECK((a) <= (b)) << (a) << " vs " << (b) << " "
#define LLM_CHECK_GE(a, b) LLM_CHECK((a) >= (b)) << (a) << " vs " << (b) << " "
