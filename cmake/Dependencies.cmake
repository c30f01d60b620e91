# Every dependency is a Debian package installed by scripts/lib.sh's install_packages, which
# scripts/start and scripts/test run (never by hand).
find_package(PkgConfig REQUIRED)
pkg_check_modules(SECCOMP REQUIRED IMPORTED_TARGET libseccomp)
pkg_check_modules(CAP REQUIRED IMPORTED_TARGET libcap)
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(GTest REQUIRED)
find_package(Threads REQUIRED)

# spdlog compiled once, in base/log.cc, and header-only fmt, so that the nsbox binaries can be
# linked statically (Debian ships neither libspdlog.a nor libfmt.a, and its fmt::fmt-header-only
# target still links libfmt.so, so the definitions are set by hand).
add_library(nsbox_log_deps INTERFACE)
target_compile_definitions(nsbox_log_deps INTERFACE SPDLOG_COMPILED_LIB SPDLOG_FMT_EXTERNAL
                                                    FMT_HEADER_ONLY=1)

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

# HTTP and JSON for nsboxd, the CLI's client and the tests: Boost.Beast (on Boost.Asio) and
# Boost.JSON from Debian's boost 1.81, so the static nsbox binary needs no Boost library at run
# time. Beast's and JSON's sources are compiled once, in base/beast_impl.cc and base/json_impl.cc;
# Asio stays header-only: compiled once, its socket_ops brought glibc's getaddrinfo into the
# static binaries (a link warning), and saved 1 s of serve.cc's 51. Every file that includes them must see the same
# definitions: use nsbox_http_deps, never Boost::headers alone.
find_package(Boost 1.81 REQUIRED CONFIG)
add_library(nsbox_boost_headers INTERFACE)
target_link_libraries(nsbox_boost_headers INTERFACE Boost::headers Threads::Threads)
target_compile_definitions(nsbox_boost_headers INTERFACE
    BOOST_ASIO_NO_DEPRECATED BOOST_BEAST_SEPARATE_COMPILATION
    BOOST_JSON_NO_LIB BOOST_CONTAINER_NO_LIB)
add_library(nsbox_http_deps INTERFACE)
target_link_libraries(nsbox_http_deps INTERFACE nsbox_boost_headers nsbox_beast)

# Image import: libarchive reads every tar flavour (only the tar format and the gzip, zstd, xz and
# bzip2 filters are referenced, so a static link pulls neither libxml2 nor the other formats),
# nettle computes the SHA-256 of every blob, and zlib checks a gzip stream's trailer, which
# libarchive does not (images/import.cc, GzipCheck). Debian's libarchive-dev, nettle-dev and
# zlib1g-dev.
pkg_check_modules(ARCHIVE REQUIRED IMPORTED_TARGET libarchive)
pkg_check_modules(NETTLE REQUIRED IMPORTED_TARGET nettle)
pkg_check_modules(ZLIB REQUIRED IMPORTED_TARGET zlib)
add_library(nsbox_archive_deps INTERFACE)
if(NSBOX_STATIC)
  find_library(NSBOX_ARCHIVE_A libarchive.a REQUIRED)
  foreach(lib nettle acl lzma zstd lz4 bz2 z)
    find_library(NSBOX_${lib}_A lib${lib}.a REQUIRED)
    list(APPEND NSBOX_ARCHIVE_STATIC_LIBS ${NSBOX_${lib}_A})
  endforeach()
  target_link_libraries(nsbox_archive_deps INTERFACE ${NSBOX_ARCHIVE_A} ${NSBOX_ARCHIVE_STATIC_LIBS})
else()
  target_link_libraries(nsbox_archive_deps INTERFACE PkgConfig::ARCHIVE PkgConfig::NETTLE
                                                      PkgConfig::ZLIB)
endif()
