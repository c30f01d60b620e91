// nsbox: the command line. `nsbox run` isolates one command; `nsbox doctor` says what this host
// allows.

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <string>
#include <tuple>

#include "base/log.h"
#include "isolate/jail.h"
#include "runtime/cli.h"
#include "runtime/doctor.h"
#include "runtime/paths.h"
#include "runtime/registry.h"
#include "runtime/run.h"
#include "runtime/serve.h"
#include "runtime/units.h"
#include "runtime/version.h"

namespace {

using nsbox::runtime::kVersion;

constexpr const char* kLeaveCgroupMountHelp =
    "do not give the host's cgroup2 mount favordynmods (on a host with v1 controllers each move "
    "of a jail or command into its cgroups may then wait milliseconds; docs/cgroups.md)";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"nsbox: a sandbox runtime for Linux (namespaces, seccomp, cgroups)", "nsbox"};
  app.require_subcommand(1);
  app.set_version_flag("--version", kVersion);
  // Global options may also follow the subcommand: `nsbox serve --log-level debug`.
  app.fallthrough();
  std::string log_level;
  app.add_option("--log-level", log_level,
                 "trace, debug, info, warn, error or off (default: info for serve, else warn)");

  nsbox::runtime::RunOptions run;
  auto* run_cmd = app.add_subcommand(
      "run", "Run one command in a fresh jail: nsbox run [OPTIONS] -- COMMAND [ARGS...]");
  run_cmd->add_option("--image", run.image, "root file system (only 'host' so far)")
      ->capture_default_str();
  run_cmd->add_option("--workspace,-w", run.workspace,
                      "host directory bound read-write at /workspace (default: the current "
                      "directory)");
  run_cmd->add_option("--cwd", run.cwd,
                      "working directory inside, relative to /workspace (default: /workspace)");
  run_cmd->add_option("--env,-e", run.env, "set a variable, NAME=VALUE (repeatable)");
  run_cmd->add_option("--memory,-m", run.memory, "memory limit, e.g. 512M or 2G");
  run_cmd->add_option("--pids", run.pids, "most processes and threads at once (default 4096)");
  run_cmd->add_option("--cpus", run.cpus, "CPU time limit in CPUs, e.g. 1.5");
  run_cmd->add_option("--hostname", run.hostname, "hostname inside")->capture_default_str();
  run_cmd->add_option("--uid-base", run.uid_base,
                      "host uid/gid that root inside maps to; 65536 ids from there (default: "
                      "the 'nsbox' entry of /etc/subuid, else 1610612736)");
  run_cmd->add_flag("--tty,-t", run.tty, "give the command a terminal inside the jail");
  run_cmd->add_flag("--dry-run", run.dry_run, "print the jail's plan and exit");
  run_cmd->add_flag("--leave-cgroup-mount", run.leave_cgroup_mount, kLeaveCgroupMountHelp);
  run_cmd->add_option("command", run.command, "the command and its arguments")->required();
  run_cmd->positionals_at_end();

  bool doctor_json = false;
  auto* doctor_cmd =
      app.add_subcommand("doctor", "Probe the kernel and say which isolation layers work here");
  doctor_cmd->add_flag("--json", doctor_json, "machine-readable output");

  nsbox::runtime::ServeOptions serve;
  auto* serve_cmd = app.add_subcommand(
      "serve",
      "Run nsboxd (as root): persistent sandboxes by id over an HTTP API. In nsbox's source "
      "tree, docs/api.md describes the API and docs/daemon.md the daemon and these options");
  // It runs as root only (a normal user is refused at start): root's defaults are the defaults.
  serve_cmd->add_option(
      "--socket", serve.socket,
      "Unix socket to listen on, mode 0660 (default " + nsbox::runtime::SystemSocketPath() + ")");
  serve_cmd->add_option("--socket-group", serve.socket_group,
                        "give the socket this group (root:GROUP, mode 0660), whose members then "
                        "use nsbox without sudo (the package's unit: nsbox)");
  serve_cmd->add_option("--state-dir", serve.state_dir,
                        "where sandboxes live (default /var/lib/nsbox)");
  serve_cmd->add_option("--listen", serve.listen,
                        "also listen on TCP HOST:PORT (requires --token-file)");
  serve_cmd->add_option("--token-file", serve.token_file,
                        "file holding the bearer token TCP clients must send");
  serve_cmd
      ->add_option("--auth-timeout", serve.auth_timeout_seconds,
                   "seconds a TCP connection has to send a request with the token before it is "
                   "closed (default 30)")
      ->check(CLI::Range(1, 3600));
  std::string output_ring;
  std::string output_spill;
  serve_cmd->add_option("--output-ring", output_ring,
                        "memory kept of each exec's output for re-attach (default 2M)");
  serve_cmd->add_option("--output-spill", output_spill,
                        "older output of an exec kept on disk beyond the ring (default 64M)");
  serve_cmd->add_option("--exec-retention", serve.exec_retention_seconds,
                        "seconds an ended exec stays for re-attach (default 600)");

  serve_cmd
      ->add_option("--pool", serve.pool_size,
                   "jails of the host image kept started ahead, for sandboxes that start "
                   "(default 1; 0 for none)")
      ->check(CLI::Range(0, 64));
  serve_cmd->add_option("--network-range", serve.network_range,
                        "IPv4 range of the sandboxes with a network; its first address is their "
                        "resolver (default 10.213.0.0/16)");
  serve_cmd->add_option("--dns-upstream", serve.dns_upstreams,
                        "ADDR[:PORT] the sandboxes' resolver asks (repeatable; default: the "
                        "nameservers of /etc/resolv.conf)");
  std::string idle_stop;
  serve_cmd->add_option("--idle-stop", idle_stop,
                        "stop a sandbox created without its own idleStopMs once it has been idle "
                        "this long, e.g. 15m (1s to 30d; default: never)");
  serve_cmd->add_flag("--leave-cgroup-mount", serve.leave_cgroup_mount, kLeaveCgroupMountHelp);
  // Image imports (docs/images.md "Limits").
  std::string image_max_bytes;
  std::string image_keep_free;
  serve_cmd->add_option("--image-max-bytes", image_max_bytes,
                        "the most one image import may write: its upload, a compressed "
                        "tarball's decompressed copy, its unpacked files, each (default 8G)");
  serve_cmd
      ->add_option("--image-max-layers", serve.image_imports.limits.max_layers,
                   "the most layers an imported image may have (default 128)")
      ->check(CLI::Range(1, 65536));
  serve_cmd
      ->add_option("--image-imports", serve.image_imports.max_imports,
                   "image imports at once; more are refused with 429 (default 2)")
      ->check(CLI::Range(size_t{1}, nsbox::runtime::kMaxMaxImports));
  serve_cmd->add_option("--image-keep-free", image_keep_free,
                        "free space an import leaves on the state directory's file system: N% "
                        "of its size (and inodes) or a size (default 5%; 0 for none)");

  // create, ls, exec, cp, stop, rm: clients of nsboxd, and --socket / --url / --token.
  nsbox::runtime::ClientCommands client_commands(app);

  // Every word whole, "[a,b]" included (runtime/cli.h, ProtectWords).
  nsbox::runtime::UnmarkValues(app);
  std::vector<std::string> words = nsbox::runtime::ProtectWords(argc, argv);
  try {
    app.parse(std::vector<std::string>(words.rbegin(), words.rend() - 1));
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "nsbox: %s\n", e.what());
    std::fprintf(
        stderr, "Run 'nsbox %s--help' for usage.\n",
        app.get_subcommands().empty() ? "" : (app.get_subcommands()[0]->get_name() + " ").c_str());
    return nsbox::isolate::kExitSetupFailed;
  }
  if (log_level.empty()) log_level = *serve_cmd ? "info" : "warn";
  serve.log_level = log_level;
  if (auto st = nsbox::log::SetLevel(log_level); !st.ok()) {
    std::fprintf(stderr, "nsbox: --log-level: %s\n", st.error().message().c_str());
    return nsbox::isolate::kExitSetupFailed;
  }
  if (*run_cmd) return nsbox::runtime::Run(run);
  if (*serve_cmd) {
    if (serve.socket.empty()) serve.socket = client_commands.GlobalSocket();
    for (auto [flag, text, out] :
         {std::tuple{"--output-ring", &output_ring, &serve.output_ring},
          std::tuple{"--output-spill", &output_spill, &serve.output_spill}}) {
      if (text->empty()) continue;
      auto bytes = nsbox::runtime::ParseBytes(flag, *text);
      if (!bytes.ok()) {
        std::fprintf(stderr, "nsbox serve: %s\n", bytes.error().message().c_str());
        return nsbox::isolate::kExitSetupFailed;
      }
      *out = *bytes;
    }
    if (!image_max_bytes.empty()) {
      auto bytes = nsbox::runtime::ParseBytes("--image-max-bytes", image_max_bytes);
      if (bytes.ok() && *bytes < (uint64_t{1} << 20)) {
        bytes = nsbox::Error(EINVAL, "--image-max-bytes '" + image_max_bytes + "': at least 1M");
      }
      if (!bytes.ok()) {
        std::fprintf(stderr, "nsbox serve: %s\n", bytes.error().message().c_str());
        return nsbox::isolate::kExitSetupFailed;
      }
      serve.image_imports.limits.max_bytes = *bytes;
    }
    if (!image_keep_free.empty()) {
      auto st = nsbox::runtime::ParseKeepFree(image_keep_free, &serve.image_imports.limits);
      if (!st.ok()) {
        std::fprintf(stderr, "nsbox serve: %s\n", st.error().message().c_str());
        return nsbox::isolate::kExitSetupFailed;
      }
    }
    if (!idle_stop.empty()) {
      auto ms = nsbox::runtime::ParseDurationMs(
          "--idle-stop", idle_stop, nsbox::runtime::kMinIdleStopMs, nsbox::runtime::kMaxIdleStopMs);
      if (!ms.ok()) {
        std::fprintf(stderr, "nsbox serve: %s\n", ms.error().message().c_str());
        return nsbox::isolate::kExitSetupFailed;
      }
      serve.idle_stop_ms = *ms;
    }
    // Each value out of its range is said on its own, with its flag, the value and the range.
    if (serve.output_ring < 4096) {
      std::fprintf(stderr,
                   "nsbox serve: --output-ring '%s' is %llu bytes: it must be at least 4096 (4K); "
                   "the default is 2M\n",
                   output_ring.c_str(), static_cast<unsigned long long>(serve.output_ring));
      return nsbox::isolate::kExitSetupFailed;
    }
    if (serve.exec_retention_seconds > 7 * 24 * 3600) {
      std::fprintf(stderr,
                   "nsbox serve: --exec-retention %llu is out of range: 0 to 604800 seconds (7 "
                   "days); the default is 600\n",
                   static_cast<unsigned long long>(serve.exec_retention_seconds));
      return nsbox::isolate::kExitSetupFailed;
    }
    return nsbox::runtime::Serve(serve);
  }
  if (*doctor_cmd) return nsbox::runtime::RunDoctor(doctor_json, stdout);
  if (auto rc = client_commands.Dispatch()) return *rc;
  return nsbox::isolate::kExitSetupFailed;
}
