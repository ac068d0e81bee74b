// Tests for StopMatcher: stop strings split across pushes, held-back prefixes, Flush, and the
// earliest of several stops.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "engine/stop_matcher.h"

namespace llm {
namespace {

TEST_CASE("StopMatcher matches a stop string split over several pushes", "[stop_matcher]") {
  StopMatcher m({"</s>"});
  std::string matched;
  CHECK(m.Push("Hel", &matched) == "Hel");
  CHECK(m.Push("lo<", &matched) == "lo");  // "<" could start the stop string
  CHECK(matched.empty());
  CHECK(m.Push("/", &matched) == "");
  CHECK(m.Push("s", &matched) == "");
  CHECK(matched.empty());
  CHECK(m.Push(">tail", &matched) == "");  // the stop and what follows are dropped
  CHECK(matched == "</s>");
}

TEST_CASE("StopMatcher emits the text before a stop in the same push", "[stop_matcher]") {
  StopMatcher m({"STOP"});
  std::string matched;
  CHECK(m.Push("ab STOP cd", &matched) == "ab ");
  CHECK(matched == "STOP");
}

TEST_CASE("StopMatcher holds back a partial prefix and releases it on divergence",
          "[stop_matcher]") {
  StopMatcher m({"STOP"});
  std::string matched;
  CHECK(m.Push("xST", &matched) == "x");
  CHECK(m.Push("A", &matched) == "STA");  // "STA" is not a prefix of "STOP"
  CHECK(matched.empty());
  // A held prefix that diverges but leaves a new prefix at its end keeps only that.
  CHECK(m.Push("S", &matched) == "");
  CHECK(m.Push("TS", &matched) == "ST");
  CHECK(m.Push("TOP!", &matched) == "");
  CHECK(matched == "STOP");
}

TEST_CASE("StopMatcher Flush releases the held text", "[stop_matcher]") {
  StopMatcher m({"<|end|>"});
  std::string matched;
  CHECK(m.Push("answer<|en", &matched) == "answer");
  CHECK(m.Flush() == "<|en");
  CHECK(m.Flush() == "");
  CHECK(matched.empty());
  // After a flush, matching starts afresh.
  CHECK(m.Push("d|>", &matched) == "d|>");
  CHECK(matched.empty());
}

TEST_CASE("StopMatcher earliest of several stops wins", "[stop_matcher]") {
  std::string matched;
  SECTION("in one push") {
    StopMatcher m({"bar", "foo"});
    CHECK(m.Push("xxfoo--bar", &matched) == "xx");
    CHECK(matched == "foo");
  }
  SECTION("a longer stop that starts earlier beats a shorter one inside it") {
    StopMatcher m({"bc", "abcd"});
    CHECK(m.Push("xab", &matched) == "x");
    CHECK(m.Push("cd", &matched) == "");
    CHECK(matched == "abcd");
  }
  SECTION("a shorter stop that completes first and starts first") {
    StopMatcher m({"abcd", "ab"});
    CHECK(m.Push("zab", &matched) == "z");
    CHECK(matched == "ab");
  }
  SECTION("a hold for one stop, a match of another") {
    StopMatcher m({"<|end|>", "<|eot|>"});
    CHECK(m.Push("text<|e", &matched) == "text");
    CHECK(m.Push("ot|>", &matched) == "");
    CHECK(matched == "<|eot|>");
  }
}

TEST_CASE("StopMatcher without stops passes text through", "[stop_matcher]") {
  std::string matched = "unchanged";
  StopMatcher none({});
  CHECK(none.Push("any <text", &matched) == "any <text");
  CHECK(none.Push("", &matched) == "");
  CHECK(none.Flush() == "");
  CHECK(matched == "unchanged");
  // Empty stop strings are ignored.
  StopMatcher empty({""});
  CHECK(empty.Push("abc", &matched) == "abc");
  CHECK(matched == "unchanged");
}

TEST_CASE("StopMatcher concatenated output equals the text up to the stop", "[stop_matcher]") {
  const std::string text = "The quick brown fox###END### jumps";
  for (size_t piece = 1; piece <= 6; ++piece) {
    StopMatcher m({"###END###", "zzz"});
    std::string matched, emitted;
    for (size_t i = 0; i < text.size() && matched.empty(); i += piece) {
      emitted += m.Push(text.substr(i, piece), &matched);
    }
    if (matched.empty()) emitted += m.Flush();
    INFO("piece size " << piece);
    CHECK(matched == "###END###");
    CHECK(emitted == "The quick brown fox");
  }
  // No stop in the text: everything comes out after Flush.
  StopMatcher m({"###END###"});
  std::string matched, emitted;
  const std::string plain = "a # b ## c ###E";
  for (char ch : plain) emitted += m.Push(std::string(1, ch), &matched);
  emitted += m.Flush();
  CHECK(matched.empty());
  CHECK(emitted == plain);
}

}  // namespace
}  // namespace llm
