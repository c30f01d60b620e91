#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace nsbox {

// An error that tells the whole story: the failed call, its subject and the errno, with the
// context gained on the way up, e.g.
//   start sandbox: mount /proc: mount("proc", "/proc"): EPERM (Operation not permitted)
// `code` is the errno (0 for errors that are not a syscall's, such as bad input).
class Error {
 public:
  Error(int code, std::string message) : code_(code), message_(std::move(message)) {}

  // A failed syscall: `call` with its subject (a path, a pid, ...), and errno `err`.
  static Error Sys(std::string_view call, std::string_view subject, int err);
  // A plain error with no errno: invalid input, a broken expectation about the environment.
  static Error Msg(std::string message) { return Error(0, std::move(message)); }

  int code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prefixes what the caller was doing: "mount /proc: " + message.
  Error Context(std::string_view what) &&;

 private:
  int code_;
  std::string message_;
};

// "EPERM (Operation not permitted)" for EPERM; the number when glibc has no name for it.
std::string ErrnoText(int err);
// "EPERM" for EPERM.
std::string ErrnoName(int err);

// The one result type of nsbox: a value or an Error. [[nodiscard]] so no error is dropped.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT: implicit on purpose, like std::expected.
  Result(Error error) : v_(std::move(error)) {}  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const& { return std::get<1>(v_); }
  Error&& error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const& { return error_; }
  Error&& error() && { return std::move(error_); }

 private:
  Error error_{0, ""};
  bool ok_ = true;
};

using Status = Result<void>;

inline Status Ok() { return Status(); }

}  // namespace nsbox

// Propagates an error from an expression that yields a Result, optionally adding context.
#define NSBOX_TRY(expr)                            \
  do {                                             \
    auto&& nsbox_try_result_ = (expr);             \
    if (!nsbox_try_result_.ok()) {                 \
      return std::move(nsbox_try_result_).error(); \
    }                                              \
  } while (0)

#define NSBOX_TRY_CTX(expr, ctx)                                \
  do {                                                          \
    auto&& nsbox_try_result_ = (expr);                          \
    if (!nsbox_try_result_.ok()) {                              \
      return std::move(nsbox_try_result_).error().Context(ctx); \
    }                                                           \
  } while (0)

#define NSBOX_CONCAT_INNER_(a, b) a##b
#define NSBOX_CONCAT_(a, b) NSBOX_CONCAT_INNER_(a, b)
// auto x = NSBOX_ASSIGN_OR_RETURN(...) is not possible in standard C++; this declares it.
#define NSBOX_ASSIGN_OR_RETURN(decl, expr)                            \
  auto NSBOX_CONCAT_(nsbox_result_, __LINE__) = (expr);               \
  if (!NSBOX_CONCAT_(nsbox_result_, __LINE__).ok()) {                 \
    return std::move(NSBOX_CONCAT_(nsbox_result_, __LINE__)).error(); \
  }                                                                   \
  decl = std::move(NSBOX_CONCAT_(nsbox_result_, __LINE__)).value()
