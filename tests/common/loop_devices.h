#pragma once

// The host's loop devices and the files behind them, as sysfs tells (tests of a sandbox's own
// disk, isolate/disk.h).

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace nsbox::testutil {

// Every bound loop device: {"/dev/loop3", its backing file's path}.
inline std::vector<std::pair<std::string, std::string>> BoundLoopDevices() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : std::filesystem::directory_iterator("/sys/block")) {
    const std::string name = e.path().filename();
    if (name.rfind("loop", 0) != 0) continue;
    std::ifstream in(e.path() / "loop" / "backing_file");
    std::string backing;
    if (in && std::getline(in, backing)) out.emplace_back("/dev/" + name, backing);
  }
  return out;
}

}  // namespace nsbox::testutil
