// Status and Result<T>: how every internal function reports failure.
//
// A Status carries a Code that maps 1:1 onto ncclResult_t, a message that
// states the fact and the fix, and a trail of call sites it passed through
// (added by LOOM_TRY). No exception is used for errors inside loom; the C ABI
// layer converts Status into ncclResult_t and the last-error text.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace loom {

// Same numeric values as ncclResult_t.
enum class Code : int {
  kSuccess = 0,
  kCudaError = 1,       // ncclUnhandledCudaError
  kSystemError = 2,     // a syscall or the OS failed
  kInternalError = 3,   // a bug in loom
  kInvalidArgument = 4, // bad value passed by the caller
  kInvalidUsage = 5,    // calls in the wrong order or not supported
  kRemoteError = 6,     // a peer failed or vanished
  kInProgress = 7,      // non-blocking operation not finished yet
};

const char* codeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // success
  Status(Code code, std::string message);

  static Status ok() { return Status(); }

  bool isOk() const { return rep_ == nullptr; }
  explicit operator bool() const { return isOk(); }
  Code code() const { return rep_ ? rep_->code : Code::kSuccess; }
  // The message alone ("" on success).
  const std::string& message() const;
  // Message plus the call-site trail, for logs.
  std::string toString() const;

  // Appends "at file:line" to the trail; used by LOOM_TRY.
  Status& addTrail(const char* file, int line);
  // Prefixes context to the message: "while X: <message>".
  Status& addContext(std::string_view context);

  // Marks a Status as deliberately ignored.
  void ignore() const {}

 private:
  struct Rep {
    Code code;
    std::string message;
    std::string trail;
  };
  std::shared_ptr<Rep> rep_;
};

// Helpers that read like the message they build.
Status invalidArgument(std::string message);
Status invalidUsage(std::string message);
Status systemError(std::string message);  // caller adds strerror where useful
Status systemErrno(std::string_view what, int err);  // "<what>: <strerror> (errno N)"
std::string errnoText(int err);                       // "<strerror> (errno N)", thread-safe
// What every wait returns when its communicator's abort flag is set
// (ncclCommAbort, a parent's abort, a failed init of the same group): one
// code everywhere, kInvalidUsage. `what` says what was interrupted.
Status abortedError(std::string_view what);
Status internalError(std::string message);
Status remoteError(std::string message);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT

  bool isOk() const { return status_.isOk(); }
  const Status& status() const { return status_; }
  Status takeStatus() { return std::move(status_); }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  const T& value() const& { return *value_; }
  T* operator->() { return &*value_; }
  T& operator*() { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace loom

#define LOOM_CONCAT_INNER(a, b) a##b
#define LOOM_CONCAT(a, b) LOOM_CONCAT_INNER(a, b)

// Evaluates a Status expression; returns it (with this call site added to its
// trail) when it is not ok.
#define LOOM_TRY(expr)                                   \
  do {                                                   \
    ::loom::Status loom_try_status_ = (expr);            \
    if (!loom_try_status_.isOk()) {                      \
      loom_try_status_.addTrail(__FILE__, __LINE__);     \
      return loom_try_status_;                           \
    }                                                    \
  } while (0)

// LOOM_ASSIGN_OR_RETURN(auto x, resultExpr);
#define LOOM_ASSIGN_OR_RETURN(decl, expr) \
  LOOM_ASSIGN_OR_RETURN_IMPL(LOOM_CONCAT(loom_result_, __LINE__), decl, expr)
#define LOOM_ASSIGN_OR_RETURN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                                \
  if (!tmp.isOk()) {                                \
    ::loom::Status s_ = tmp.takeStatus();           \
    s_.addTrail(__FILE__, __LINE__);                \
    return s_;                                      \
  }                                                 \
  decl = std::move(tmp).value()
