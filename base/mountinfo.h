#pragma once

#include <string>
#include <string_view>

namespace nsbox {

// A path field of /proc/PID/mountinfo with its escapes undone: the kernel writes space, tab,
// newline and backslash as \040, \011, \012 and \134 (fs/proc_namespace.c, mangle()).
std::string UnescapeMountField(std::string_view field);

}  // namespace nsbox
