#pragma once

// The handlers of the CLI's client commands, which ClientCommands::Dispatch (runtime/cli.cc)
// calls with the parsed options and a client of the daemon: each returns the exit code, having
// printed what the command prints.

#include <string_view>

#include "runtime/api_client.h"
#include "runtime/cli/client.h"

namespace nsbox::runtime::cli {

// sandboxes.cc: create, ls, stop and rm, network.
int Network(const Options& o, ApiClient& client);
int Create(const Options& o, ApiClient& client);
int List(const Options& o, ApiClient& client);
// stop and rm: `verb` is "stop" or "rm".
int ForEachId(const Options& o, ApiClient& client, std::string_view verb);

// ports.cc: port add, port ls, port rm.
int AddPort(const Options& o, ApiClient& client);
int ListPorts(const Options& o, ApiClient& client);
int RemovePort(const Options& o, ApiClient& client);

// images.cc: image import, image ls, image inspect, image rm.
int ImportImage(const Options& o, ApiClient& client);
int ListImages(const Options& o, ApiClient& client);
int InspectImage(const Options& o, ApiClient& client);
int RemoveImages(const Options& o, ApiClient& client);

// exec.cc: exec and shell.
int Exec(const Options& o, ApiClient& client);
int Shell(const Options& o, ApiClient& client);

// cp.cc: cp.
int Copy(const Options& o, ApiClient& client);

}  // namespace nsbox::runtime::cli
