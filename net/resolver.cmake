# The DNS resolver of nsbox-net (docs/network.md "Names"), parsing and building messages with
# ldns; linked dynamically into nsbox-net and into its unit test.
find_package(PkgConfig REQUIRED)
pkg_check_modules(LDNS REQUIRED IMPORTED_TARGET ldns)

add_library(nsbox_net_resolver STATIC resolver.cc)
nsbox_target_defaults(nsbox_net_resolver)
target_link_libraries(nsbox_net_resolver PUBLIC nsbox_net_policy nsbox_base PkgConfig::LDNS)
