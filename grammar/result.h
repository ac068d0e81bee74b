// A value or an error message: the library's boundary never throws.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace llm::grammar {

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit on purpose
  static Result Error(std::string message) {
    Result r;
    r.error_ = std::move(message);
    return r;
  }
  bool ok() const { return value_.has_value(); }
  const std::string& error() const { return error_; }
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  T& operator*() { return *value_; }
  T* operator->() { return &*value_; }

 private:
  Result() = default;
  std::optional<T> value_;
  std::string error_;
};

// Thrown inside the front ends, caught at the public entry points and turned into a Result.
struct CompileError {
  std::string message;
};

}  // namespace llm::grammar
