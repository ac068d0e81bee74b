// Status / StatusOr: the error currency at module and RPC boundaries. No exceptions cross threads.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "base/check.h"

namespace llm {

enum class StatusCode {
  kOk = 0,
  kCancelled = 1,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) {
  return {StatusCode::kNotFound, std::move(m)};
}
inline Status Internal(std::string m) {
  return {StatusCode::kInternal, std::move(m)};
}
inline Status DataLoss(std::string m) {
  return {StatusCode::kDataLoss, std::move(m)};
}
inline Status Unimplemented(std::string m) {
  return {StatusCode::kUnimplemented, std::move(m)};
}
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status Unavailable(std::string m) {
  return {StatusCode::kUnavailable, std::move(m)};
}

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    LLM_CHECK(!status_.ok()) << "StatusOr built from an OK status without a value";
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & {
    LLM_CHECK(ok()) << status_.ToString();
    return *value_;
  }
  const T& value() const& {
    LLM_CHECK(ok()) << status_.ToString();
    return *value_;
  }
  T&& value() && {
    LLM_CHECK(ok()) << status_.ToString();
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace llm

#define LLM_CONCAT_INNER(a, b) a##b
#define LLM_CONCAT(a, b) LLM_CONCAT_INNER(a, b)

// Returns the status from the enclosing function when it is not OK.
#define LLM_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::llm::Status _llm_status = (expr);        \
    if (!_llm_status.ok()) return _llm_status; \
  } while (0)

#define LLM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

// LLM_ASSIGN_OR_RETURN(auto x, MakeX()); binds x or returns the error.
#define LLM_ASSIGN_OR_RETURN(lhs, expr) \
  LLM_ASSIGN_OR_RETURN_IMPL(LLM_CONCAT(_llm_statusor_, __LINE__), lhs, expr)
