# What `cmake --install` puts where, and the Debian package made of it (`cpack -G DEB` in the
# build directory): nsbox in bin/, nsbox-init and nsbox-net in
# libexec/nsbox/ (where nsbox looks after its own directory: runtime/sandbox.h kInitInLibexec),
# the systemd unit, and the documents. docs/daemon.md "As a service" says what the package does.
include(GNUInstallDirs)

install(TARGETS nsbox RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS nsbox-init nsbox-net RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/nsbox)

# The installed unit is deploy/nsboxd.service, the one file of the unit, with ExecStart pointing at
# the installed nsbox and giving the socket to the group nsbox (the package makes it; after a
# bare `cmake --install`, `groupadd --system nsbox`). Written at install time, from the prefix
# installed to (/usr for the package, /usr/local by default), so that `cmake --install` and the
# package make it the same way. In lib/systemd/system under the prefix: /usr/lib/systemd/system
# in the package (the same directory as /lib/systemd/system on a merged-/usr system, and on the
# unit path of every systemd), /usr/local/lib/systemd/system after `cmake --install`.
set(NSBOX_UNIT_GROUP "nsbox" CACHE STRING "The socket's group in the installed nsboxd.service")
install(CODE "
  file(READ \"${PROJECT_SOURCE_DIR}/deploy/nsboxd.service\" unit)
  set(exec \"\nExecStart=/usr/local/bin/nsbox serve\n\")
  string(FIND \"\${unit}\" \"\${exec}\" at)
  if(at EQUAL -1)
    message(FATAL_ERROR \"deploy/nsboxd.service has no line 'ExecStart=/usr/local/bin/nsbox serve'\")
  endif()
  string(REPLACE \"\${exec}\"
    \"\nExecStart=\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/nsbox serve --socket-group ${NSBOX_UNIT_GROUP}\n\"
    unit \"\${unit}\")
  file(WRITE \"${PROJECT_BINARY_DIR}/deploy/nsboxd.service\" \"\${unit}\")
  file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/lib/systemd/system\" TYPE FILE
       PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
       FILES \"${PROJECT_BINARY_DIR}/deploy/nsboxd.service\")
")
install(FILES README.md CHANGELOG.md deploy/debian/copyright
        DESTINATION ${CMAKE_INSTALL_DOCDIR})

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME nsbox)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# CPack wants a maintainer; the project has no public address or homepage yet (none is made up).
set(CPACK_PACKAGE_CONTACT "nsbox maintainers <nsbox@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Linux sandboxes with persistent workspaces (nsboxd)")
string(CONCAT CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "nsbox runs commands in jails made of user, mount, PID, network, IPC, UTS\n"
    "and cgroup namespaces with seccomp. nsboxd (the service nsboxd.service)\n"
    "keeps sandboxes by id over an HTTP API on /run/nsbox/nsboxd.sock, whose\n"
    "group nsbox may use it.")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # nsbox_VERSION_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# What the dynamically linked nsbox-net needs (libnftables, libldns...) comes from
# dpkg-shlibdeps (dpkg-dev); nsbox and nsbox-init are static. Beside them, what runs at run
# time: mkfs.ext4 for a sandbox's own disk, groupadd/groupdel in the maintainer scripts.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "e2fsprogs, passwd")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/deploy/debian/postinst
    ${PROJECT_SOURCE_DIR}/deploy/debian/prerm ${PROJECT_SOURCE_DIR}/deploy/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
