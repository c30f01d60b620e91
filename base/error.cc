#include "base/error.h"

#include <string.h>

#include <string>

namespace nsbox {

std::string ErrnoName(int err) {
  // SAFETY: strerrorname_np returns a pointer to a static string or NULL (glibc >= 2.32).
  const char* name = strerrorname_np(err);
  return name != nullptr ? std::string(name) : "errno " + std::to_string(err);
}

std::string ErrnoText(int err) { return ErrnoName(err) + " (" + strerrordesc_np(err) + ")"; }

Error Error::Sys(std::string_view call, std::string_view subject, int err) {
  std::string msg(call);
  msg += "(";
  if (!subject.empty()) {
    msg += "\"";
    msg += subject;
    msg += "\"";
  }
  msg += "): ";
  msg += ErrnoText(err);
  return Error(err, std::move(msg));
}

Error Error::Context(std::string_view what) && {
  std::string msg(what);
  msg += ": ";
  msg += message_;
  message_ = std::move(msg);
  return std::move(*this);
}

}  // namespace nsbox
