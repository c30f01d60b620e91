#pragma once

// An error as the HTTP API reports it (api.md "Transport"): a status, a code (an errno name for
// file-system errors, a snake_case word for API errors) and a factual, self-contained message.

#include <string>
#include <utility>

#include "fs/file_ops.h"

namespace nsbox::runtime {

struct ApiError {
  int status = 500;
  std::string code = "internal";
  std::string message;
  std::string path;     // file-system errors only
  std::string syscall;  // file-system errors only
  // When not 0: the answer carries Retry-After with this many seconds (a 429 or a 503 that will
  // pass).
  int retry_after_seconds = 0;

  // Every ApiError a coroutine uses is made by a function like these, never braced in place:
  // GCC 12 mishandles aggregate temporaries in co_await expressions (runtime/serve.cc).
  static ApiError Of(int status, std::string code, std::string message, std::string path = {},
                     std::string syscall = {}) {
    return {status, std::move(code), std::move(message), std::move(path), std::move(syscall)};
  }
  static ApiError Invalid(std::string message) {
    return {400, "invalid_request", std::move(message), {}, {}};
  }
  static ApiError SandboxNotFound(const std::string& id);
  static ApiError ImageNotFound(const std::string& name) {
    return {404,
            "image_not_found",
            "no image named '" + name + "' (nsbox image ls lists them; \"host\" is built in)",
            {},
            {}};
  }
  static ApiError Unsupported(std::string message) {
    return {422, "unsupported", std::move(message), {}, {}};
  }
  static ApiError Unavailable(std::string message) {
    return {503, "sandbox_unavailable", std::move(message), {}, {}};
  }
  static ApiError Internal(std::string message) {
    return {500, "internal", std::move(message), {}, {}};
  }
  // A file verb's error: the errno's name and api.md's status for it. An error of the control
  // channel itself (err 0, or EPIPE when nsbox-init is gone) is sandbox_unavailable.
  static ApiError FromFs(const fs::FsError& error);
};

// The status api.md gives an errno ("ENOENT" 404, "EEXIST" 409, ...; 500 for one it does not list).
int StatusForErrno(int err);
// "ENOENT"; "E<number>" for an errno glibc has no name for.
std::string ErrnoName(int err);

template <typename T>
class [[nodiscard]] ApiOutcome {
 public:
  ApiOutcome(T value) : ok_(true), value_(std::move(value)) {}          // NOLINT
  ApiOutcome(ApiError error) : ok_(false), error_(std::move(error)) {}  // NOLINT
  bool ok() const { return ok_; }
  T& value() { return value_; }
  const T& value() const { return value_; }
  const ApiError& error() const { return error_; }

 private:
  bool ok_;
  T value_{};
  ApiError error_;
};

}  // namespace nsbox::runtime
