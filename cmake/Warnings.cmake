# Warnings are errors everywhere in nsbox's own code.
set(NSBOX_WARNINGS
    -Wall -Wextra -Werror -Wshadow -Wnon-virtual-dtor -Wcast-qual -Wformat=2
    -Wimplicit-fallthrough -Wundef -Wmissing-declarations -Wpointer-arith)

# GCC 12 reports std::string copies as overlapping memcpy at -O3 (GCC bug 105329, fixed in 13):
# a false positive that would fail a Release build.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  list(APPEND NSBOX_WARNINGS -Wno-restrict)
endif()

function(nsbox_target_defaults target)
  target_compile_options(${target} PRIVATE ${NSBOX_WARNINGS})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
endfunction()
