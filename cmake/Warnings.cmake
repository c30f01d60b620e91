# Warnings are errors everywhere in nsbox's own code.
set(NSBOX_WARNINGS
    -Wall -Wextra -Werror -Wshadow -Wnon-virtual-dtor -Wcast-qual -Wformat=2
    -Wimplicit-fallthrough -Wundef -Wmissing-declarations -Wpointer-arith)

function(nsbox_target_defaults target)
  target_compile_options(${target} PRIVATE ${NSBOX_WARNINGS})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
endfunction()
