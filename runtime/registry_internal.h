#pragma once

// What the files of nsboxd's registry (registry.cc and registry_*.cc) share besides registry.h.
// Private to them.

#include <string>

namespace nsbox::runtime {

// A CPU limit as cpu.max is given it: 6 significant digits (CanonicalCpus keeps that value).
std::string FormatCpus(double cpus);

}  // namespace nsbox::runtime
