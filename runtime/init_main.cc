// nsbox-init: PID 1 of a sandbox. Started by the jail (isolate/jail.cc, init mode) from an fd
// the host opened, with the control channel on fd 3; see runtime/init_server.h.

#include "runtime/init_server.h"

int main(int argc, char** argv) { return nsbox::runtime::InitMain(argc, argv); }
