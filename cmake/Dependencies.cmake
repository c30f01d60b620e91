# Every dependency is a Debian package installed by scripts/setup (never by hand).
find_package(PkgConfig REQUIRED)
pkg_check_modules(SECCOMP REQUIRED IMPORTED_TARGET libseccomp)
pkg_check_modules(CAP REQUIRED IMPORTED_TARGET libcap)
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(GTest REQUIRED)
find_package(Threads REQUIRED)

# Header-only spdlog and fmt so that the nsbox binary can be linked statically (Debian's
# fmt::fmt-header-only target still links libfmt.so, so the definitions are set by hand).
add_library(nsbox_log_deps INTERFACE)
target_compile_definitions(nsbox_log_deps INTERFACE SPDLOG_FMT_EXTERNAL FMT_HEADER_ONLY=1)

if(NSBOX_STATIC)
  # Prefer the static archives Debian ships (libseccomp.a, libcap.a, liburing.a).
  set(NSBOX_SECCOMP_LIB ${SECCOMP_LIBDIR}/libseccomp.a)
  set(NSBOX_CAP_LIB ${CAP_LIBDIR}/libcap.a)
  set(NSBOX_URING_LIB ${URING_LIBDIR}/liburing.a)
else()
  set(NSBOX_SECCOMP_LIB PkgConfig::SECCOMP)
  set(NSBOX_CAP_LIB PkgConfig::CAP)
  set(NSBOX_URING_LIB PkgConfig::URING)
endif()
