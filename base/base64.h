#pragma once

#include <string>
#include <string_view>

#include "base/error.h"

namespace nsbox {

// Base64, RFC 4648 section 4 (the standard alphabet), with padding: exec output, file names and
// paths that are not UTF-8 (api.md "Paths").
std::string Base64Encode(std::string_view bytes);

// The bytes of `text`. Its padding may be short or left out (as Node's Buffer reads it). A
// character outside the alphabet, a '=' before the end or beyond what the last group lacks, or a
// length that leaves one character over is EINVAL, with the offset it was found at.
Result<std::string> Base64Decode(std::string_view text);

}  // namespace nsbox
