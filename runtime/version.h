#pragma once

namespace nsbox::runtime {

// The version every binary reports (`nsbox --version`, GET /v1/health).
inline constexpr const char* kVersion = "0.1.0";

}  // namespace nsbox::runtime
