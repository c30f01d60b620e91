# nsboxd's client of nsbox-net: sockets and Boost.JSON only, so it links into the static nsbox.
add_library(nsbox_net_client STATIC ${CMAKE_CURRENT_SOURCE_DIR}/net_client.cc)
nsbox_target_defaults(nsbox_net_client)
target_link_libraries(nsbox_net_client PUBLIC nsbox_net_policy)

# nsbox-net: linked dynamically (Debian ships libnftables and libmnl as shared libraries only).
pkg_check_modules(NFTABLES REQUIRED IMPORTED_TARGET libnftables)
pkg_check_modules(MNL REQUIRED IMPORTED_TARGET libmnl)
add_library(nsbox_net_host STATIC ${CMAKE_CURRENT_SOURCE_DIR}/netlink.cc
                                  ${CMAKE_CURRENT_SOURCE_DIR}/firewall.cc
                                  ${CMAKE_CURRENT_SOURCE_DIR}/nft_elements.cc
                                  ${CMAKE_CURRENT_SOURCE_DIR}/netd.cc)
nsbox_target_defaults(nsbox_net_host)
target_link_libraries(nsbox_net_host PUBLIC nsbox_net_policy nsbox_net_resolver nsbox_http_deps
                                            PkgConfig::NFTABLES PkgConfig::MNL)
add_executable(nsbox-net ${CMAKE_CURRENT_SOURCE_DIR}/netd_main.cc)
nsbox_target_defaults(nsbox-net)
target_link_libraries(nsbox-net PRIVATE nsbox_net_host CLI11::CLI11)
# Installed by cmake/Packaging.cmake (libexec/nsbox/, where nsbox finds it).
