#include "runtime/cli/commands.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <boost/json.hpp>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include "base/base64.h"
#include "runtime/cli/client.h"
#include "runtime/terminal.h"
#include "runtime/units.h"
#include "runtime/ws_exec.h"

namespace nsbox::runtime::cli {

namespace {

// The connection a running exec uses, for the signal handler to shut down: closing it is what
// kills the command's process tree (api.md "exec", Cancellation).
std::atomic<int> g_exec_fd{-1};
volatile sig_atomic_t g_interrupted = 0;  // the signal that interrupted the exec, or 0

void OnInterrupt(int sig) {
  g_interrupted = sig;
  int fd = g_exec_fd.load();
  // SAFETY: shutdown(2) is async-signal-safe; the fd stays open (only main code closes it), so
  // it cannot name another file here. The blocked read returns and the connection is dropped.
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

void CatchInterrupts() {
  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocked call returns at once
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

// The command's output to our stdout or stderr, given up when a signal of CatchInterrupts came
// (its write returns EINTR: no SA_RESTART): a reader that stopped reading (`| less` left open)
// must not keep Ctrl-C, SIGTERM or SIGHUP from ending nsbox, as WriteAll's retry did.
// The flag is also looked at before each write: a signal that came while nsbox was not in one
// (its stream's read) leaves none to interrupt. One that comes between the look and the write
// is caught by the next signal (a second Ctrl-C).
Status WriteOutput(int fd, std::string_view data, std::string_view what) {
  while (!data.empty()) {
    if (g_interrupted != 0) return Error::Sys("write", what, EINTR);
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR && g_interrupted == 0) continue;
      return Error::Sys("write", what, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Ok();
}

// The exec body of api.md from the options both `exec` and `shell` take.
Result<json::object> ExecBody(const Options& o, std::string command) {
  json::object body;
  body["command"] = std::move(command);
  if (!o.cwd.empty()) body["cwd"] = o.cwd;
  if (!o.env.empty()) {
    NSBOX_ASSIGN_OR_RETURN(auto env, EnvObject(o.env));
    body["env"] = std::move(env);
  }
  if (o.timeout) {
    NSBOX_ASSIGN_OR_RETURN(auto ms, ParseCount("--timeout", *o.timeout, 0, kMaxExecTimeoutMs));
    body["timeoutMs"] = ms;
  }
  return body;
}

// How `nsbox exec` and `nsbox shell` end: the command's exit code, and a line on stderr when
// nsbox ended it.
int ExecExitCode(std::string_view what, int64_t exit_code, std::string_view reason) {
  if (reason == "oom") {
    Fail(what, "the command ran out of memory (the sandbox's memory limit) and was killed");
  } else if (reason == "stopped") {
    Fail(what, "the sandbox was stopped or removed while the command ran");
  } else if (reason == "cancelled") {
    Fail(what, "the command was cancelled");
  }
  if (exit_code < 0 || exit_code > 255) return kExitApiError;
  return static_cast<int>(exit_code);
}

// Over the exec WebSocket: -i streams stdin, -t runs the command on a terminal (`nsbox shell`).
int InteractiveExec(const Options& o, ApiClient& client, json::object body, bool tty) {
  const std::string what = (o.shell != nullptr && o.shell->parsed() ? "shell " : "exec ") + o.id;
  // The sandbox first: a missing one (or no daemon) is what to say, whatever the terminal. This
  // also settles which of the default sockets answers, for the WebSocket below. GET does not
  // start a stopped sandbox.
  if (auto found = Check(client, client.Call(Method::kGet, SandboxTarget(o.id))); !found.ok()) {
    return Fail(what, found.error().message());
  }
  if (tty) {
    if (!::isatty(STDIN_FILENO)) {
      return Fail(what,
                  "the input is not a terminal: a terminal session needs one (for a pipe or a "
                  "file, use `nsbox exec -i` without -t)",
                  kExitUsage);
    }
    WindowSize size = TerminalSize(STDIN_FILENO).value_or(WindowSize{24, 80});
    body["tty"] = json::object{{"rows", size.rows}, {"cols", size.cols}};
    if (const char* term = std::getenv("TERM"); term != nullptr && *term != '\0') {
      json::object& env =
          body["env"].is_object() ? body["env"].get_object() : body["env"].emplace_object();
      if (!env.contains("TERM")) env["TERM"] = term;
    }
  }
  body["stdinStream"] = true;
  WsExecOptions options;
  options.body = std::move(body);
  options.tty = tty;
  options.in_fd = o.interactive || tty ? STDIN_FILENO : -1;
  if (options.in_fd < 0) options.body["stdinStream"] = false;
  auto result = RunWsExec(client.endpoint(), o.id, options);
  if (!result.ok()) {
    return Fail(what, Transport(client, std::move(result).error()).message());
  }
  // 128 + the signal, as for exec without a WebSocket (130 for SIGINT).
  if (result->interrupted && !result->exited) {
    return result->signal > 0 ? 128 + result->signal : kExitInterrupted;
  }
  if (!result->exited) return Fail(what, "the connection ended before the command did");
  return ExecExitCode(what, result->exit_code, result->reason);
}

}  // namespace

int Exec(const Options& o, ApiClient& client) {
  std::string what = "exec " + o.id;
  auto made = ExecBody(o, ShellCommand(o.command));
  if (!made.ok()) return Fail("exec", made.error().message(), kExitUsage);
  json::object body = std::move(*made);
  if (o.interactive || o.tty) return InteractiveExec(o, client, std::move(body), o.tty);
  body["encoding"] = "base64";

  CatchInterrupts();
  if (Status st = client.Connect(); !st.ok()) {
    return Fail(what, Transport(client, std::move(st).error()).message());
  }
  g_exec_fd.store(client.socket_fd());
  // 128 + the signal, as a shell reports a command it ended (130 for Ctrl-C).
  if (g_interrupted) return 128 + g_interrupted;

  bool exited = false;
  int64_t exit_code = 1;
  std::string reason;
  auto on_line = [&](std::string_view line) -> Status {
    if (line.empty()) return Ok();
    boost::system::error_code ec;
    json::value v = json::parse(line, ec);
    if (ec || !v.is_object()) return Error::Msg("the daemon's stream has a line that is not JSON");
    const json::object& event = v.get_object();
    std::string type = JsonText(event, "type");
    if (type == "stdout" || type == "stderr") {
      std::string data;
      if (const json::value* b64 = event.if_contains("dataBase64"); b64 && b64->is_string()) {
        NSBOX_ASSIGN_OR_RETURN(data, Base64Decode(b64->get_string()));
      } else if (const json::value* text = event.if_contains("data"); text && text->is_string()) {
        data = std::string(text->get_string());
      }
      int fd = type == "stdout" ? STDOUT_FILENO : STDERR_FILENO;
      return WriteOutput(fd, data, type);
    }
    if (type == "exit") {
      exited = true;
      reason = JsonText(event, "reason");
      const json::value* code = event.if_contains("exitCode");
      exit_code = code != nullptr && code->is_int64() ? code->get_int64() : 1;
    }
    return Ok();
  };
  auto answer = client.StreamLines(Method::kPost, SandboxTarget(o.id, "/exec"), body,
                                   "application/x-ndjson", on_line);
  g_exec_fd.store(-1);
  if (g_interrupted && !exited) return 128 + g_interrupted;
  answer = Check(client, std::move(answer));
  if (!answer.ok()) return Fail(what, answer.error().message());
  if (!exited) return Fail(what, "the daemon's stream ended before the command did");
  return ExecExitCode(what, exit_code, reason);
}

// A login shell (or the given command) on a terminal in the sandbox.
int Shell(const Options& o, ApiClient& client) {
  // bash where the image has it, else sh; -l: a login shell reads the profile, as ssh's does.
  std::string command =
      o.command.empty() ? "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi"
                        : ShellCommand(o.command);
  auto made = ExecBody(o, std::move(command));
  if (!made.ok()) return Fail("shell", made.error().message(), kExitUsage);
  return InteractiveExec(o, client, std::move(*made), /*tty=*/true);
}

}  // namespace nsbox::runtime::cli
