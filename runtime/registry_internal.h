#pragma once

// What the files of nsboxd's registry (registry.cc and registry_*.cc) share besides registry.h.
// Private to them.

#include <string>

#include "runtime/api_error.h"

namespace nsbox::runtime {

// A CPU limit as cpu.max is given it: 6 significant digits (CanonicalCpus keeps that value).
std::string FormatCpus(double cpus);

// The refusal of a PUT of `id` whose directory `dir` (sandboxes/<IdHash(id)>) exists but is not
// one of the registry's sandboxes: 409 sandbox_unloadable, with why it does not load (as Load
// finds it now: its config.json missing, unreadable, not a config, or of another id). Such a
// directory is never reused or removed: it may hold someone's files.
ApiError UnloadableDir(const std::string& id, const std::string& dir);

}  // namespace nsbox::runtime
