// api.md's exec: the buffered answer (exit codes, signals, cwd, env, stdin, timeout, output cap,
// UTF-8 and base64, background processes), the NDJSON stream, and cancellation (DELETE of the
// exec, the client hanging up) that must reach the command's whole process tree.

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int64_t Int(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return v != nullptr && v->is_int64() ? v->as_int64() : -1000;
}

milliseconds Since(Clock::time_point t0) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
}

bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    size_t n = 0;
    if (c < 0x80) {
      n = 0;
    } else if ((c >> 5) == 6) {
      n = 1;
    } else if ((c >> 4) == 14) {
      n = 2;
    } else if ((c >> 3) == 30) {
      n = 3;
    } else {
      return false;
    }
    if (i + n >= s.size() && n > 0) return false;
    for (size_t k = 1; k <= n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    }
    i += n + 1;
  }
  return true;
}

class ExecTest : public E2eSandboxTest {
 protected:
  // Waits until `path` in the sandbox holds `lines` lines; false at the deadline.
  bool WaitForLines(const std::string& path, int lines, milliseconds timeout) {
    Client c = NewClient();
    const auto t0 = Clock::now();
    while (Since(t0) < timeout) {
      Response r = c.Get(SbPath(id_, "/files?path=" + PctEncode(path)));
      if (r.status == 200 && std::count(r.body.begin(), r.body.end(), '\n') >= lines) return true;
      std::this_thread::sleep_for(milliseconds(50));
    }
    return false;
  }

  // The pids (in the sandbox) from `path` that are still alive there, one line each.
  std::string AlivePids(const std::string& path) {
    ExecResult r = Exec(id_, "for p in $(cat " + path +
                                 "); do if kill -0 $p 2>/dev/null; then echo \"alive $p: $(cat "
                                 "/proc/$p/cmdline | tr '\\0' ' ')\"; fi; done");
    EXPECT_EQ(r.response.status, 200) << r.Describe();
    return r.out();
  }

  // Polls AlivePids until it is empty (up to `timeout`); what was left at the end.
  std::string WaitTreeGone(const std::string& path, milliseconds timeout) {
    const auto t0 = Clock::now();
    std::string alive;
    do {
      alive = AlivePids(path);
      if (alive.empty()) return alive;
      std::this_thread::sleep_for(milliseconds(100));
    } while (Since(t0) < timeout);
    return alive;
  }

  // A command that starts a tree (two background sleeps, one after setsid, one double-forked)
  // and writes each pid into `path`, then "ready", then waits.
  static std::string TreeCommand(const std::string& path) {
    return "sleep 1000 & echo $! >> " + path + "; sleep 1000 & echo $! >> " + path +
           "; setsid sh -c 'echo $$ >> " + path + "; exec sleep 1000' & (sleep 1000 & echo $! >> " +
           path + ") ; echo $$ >> " + path + "; sleep 0.2; echo ready; wait";
  }
};

// ---- buffered ----

TEST_F(ExecTest, BufferedAnswerHasEveryField) {
  const auto t0 = Clock::now();
  ExecResult r = Exec(id_, "echo out; echo err >&2; sleep 0.1; exit 3");
  const auto took = Since(t0);
  ASSERT_EQ(r.response.status, 200) << r.Describe();
  EXPECT_NE(r.response.Header("content-type").find("application/json"), std::string::npos);
  EXPECT_EQ(r.out(), "out\n");
  EXPECT_EQ(r.err(), "err\n");
  EXPECT_EQ(r.exit_code(), 3);
  EXPECT_EQ(r.reason(), "exited");
  EXPECT_TRUE(Field(r.answer, "signal").is_null()) << r.Describe();
  EXPECT_EQ(Field(r.answer, "timedOut"), json::value(false));
  EXPECT_EQ(Field(r.answer, "truncated"), json::value(false));
  const int64_t duration = Int(r.answer, "durationMs");
  EXPECT_GE(duration, 100) << r.Describe();
  EXPECT_LE(duration, took.count() + 1) << r.Describe();
}

TEST_F(ExecTest, ExitCodes) {
  for (int code : {0, 1, 2, 42, 126, 127, 255}) {
    ExecResult r = Exec(id_, "exit " + std::to_string(code));
    EXPECT_EQ(r.exit_code(), code) << r.Describe();
    EXPECT_EQ(r.reason(), "exited") << r.Describe();
    EXPECT_TRUE(Field(r.answer, "signal").is_null());
  }
  ExecResult missing = Exec(id_, "no-such-command-xyz");
  EXPECT_EQ(missing.exit_code(), 127) << missing.Describe();
  EXPECT_NE(missing.err().find("no-such-command-xyz"), std::string::npos) << missing.Describe();
  // bash is the shell when the image has it.
  EXPECT_EQ(Exec(id_, "echo $BASH_VERSION | cut -c1").out().size(), 2u);
  EXPECT_EQ(Exec(id_, "[[ 1 == 1 ]] && echo bash").out(), "bash\n");
}

TEST_F(ExecTest, SignalIsReported) {
  ExecResult r = Exec(id_, "kill -SEGV $$");
  ASSERT_EQ(r.response.status, 200) << r.Describe();
  EXPECT_EQ(r.exit_code(), 139) << r.Describe();
  EXPECT_EQ(Field(r.answer, "signal"), json::value("SIGSEGV")) << r.Describe();
  EXPECT_EQ(r.reason(), "signaled") << r.Describe();
  EXPECT_EQ(Field(r.answer, "timedOut"), json::value(false));

  ExecResult term = Exec(id_, "kill -TERM $$");
  EXPECT_EQ(term.exit_code(), 143) << term.Describe();
  EXPECT_EQ(Field(term.answer, "signal"), json::value("SIGTERM")) << term.Describe();
  EXPECT_EQ(term.reason(), "signaled");
  ExecResult kill = Exec(id_, "kill -KILL $$");
  EXPECT_EQ(kill.exit_code(), 137) << kill.Describe();
  EXPECT_EQ(Field(kill.answer, "signal"), json::value("SIGKILL")) << kill.Describe();
}

TEST_F(ExecTest, CwdRelativeAbsoluteAndMissing) {
  Sh(id_, "mkdir -p sub/dir && touch afile");
  ExecResult rel = Exec(id_, json::object{{"command", "pwd"}, {"cwd", "sub/dir"}});
  EXPECT_EQ(rel.out(), "/workspace/sub/dir\n") << rel.Describe();
  ExecResult dots = Exec(id_, json::object{{"command", "pwd"}, {"cwd", "sub/dir/../."}});
  EXPECT_EQ(dots.out(), "/workspace/sub\n") << dots.Describe();
  ExecResult abs = Exec(id_, json::object{{"command", "pwd"}, {"cwd", "/tmp"}});
  EXPECT_EQ(abs.out(), "/tmp\n") << abs.Describe();
  ExecResult home = Exec(id_, json::object{{"command", "pwd"}, {"cwd", "/root"}});
  EXPECT_EQ(home.out(), "/root\n") << home.Describe();
  EXPECT_EQ(Exec(id_, "pwd").out(), "/workspace\n");

  for (const char* bad : {"nope", "/no/such/dir", "afile"}) {
    ExecResult r = Exec(id_, json::object{{"command", "echo ran"}, {"cwd", bad}});
    ASSERT_EQ(r.response.status, 200) << bad << ": " << r.Describe();
    EXPECT_EQ(r.exit_code(), 1) << bad << ": " << r.Describe();
    EXPECT_EQ(r.out(), "") << "the command ran in " << bad;
    EXPECT_NE(r.err().find(std::string(bad).substr(std::string(bad).rfind('/') + 1)),
              std::string::npos)
        << "stderr should say which cwd: " << r.Describe();
  }
}

TEST_F(ExecTest, BaseEnvironmentExactly) {
  ExecResult r = Exec(id_, "env | sort; umask");
  ASSERT_EQ(r.exit_code(), 0) << r.Describe();
  const std::string out = r.out();
  for (const char* line : {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
                           "HOME=/root\n", "USER=root\n", "LOGNAME=root\n", "SHELL=/bin/bash\n",
                           "LANG=C.UTF-8\n", "TERM=xterm-256color\n", "TMPDIR=/tmp\n", "0022\n"}) {
    EXPECT_NE(out.find(line), std::string::npos) << "missing " << line << " in\n" << out;
  }
  EXPECT_NE(out.find("HOSTNAME="), std::string::npos) << out;
  EXPECT_EQ(Exec(id_, "echo $HOSTNAME").out(), Exec(id_, "hostname").out());
  // Nothing of the daemon's environment.
  EXPECT_EQ(out.find("NSBOX_E2E_DAEMON_SECRET"), std::string::npos) << out;
  EXPECT_EQ(Exec(id_, "id -u").out(), "0\n");
}

TEST_F(ExecTest, EnvIsLayeredAndNullUnsets) {
  const std::string id = NewId("env");
  Response c = client().PutJson(
      SbPath(id), json::object{{"env", json::object{{"FOO", "base"}, {"KEEP", "k"}}}});
  ASSERT_EQ(c.status, 201) << c.Describe();
  const std::string show =
      "echo \"FOO=${FOO-unset} KEEP=${KEEP-unset} CI=${CI-unset} "
      "LANG=${LANG-unset} PATH=${PATH-unset}\"";
  EXPECT_EQ(Exec(id, show).out(),
            "FOO=base KEEP=k CI=unset LANG=C.UTF-8 "
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
  ExecResult layered = Exec(
      id, json::object{
              {"command", show},
              {"env",
               json::object{{"CI", "1"}, {"FOO", nullptr}, {"LANG", nullptr}, {"KEEP", "over"}}}});
  EXPECT_EQ(layered.out(),
            "FOO=unset KEEP=over CI=1 LANG=unset "
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n")
      << layered.Describe();
  // Only for that call.
  EXPECT_EQ(Exec(id, "echo ${FOO-unset} ${CI-unset}").out(), "base unset\n");
  // Values with spaces, '=' and UTF-8 pass through as they are.
  ExecResult odd = Exec(id, json::object{{"command", "printf '%s' \"$ODD\""},
                                         {"env", json::object{{"ODD", "a b=c é\t"}}}});
  EXPECT_EQ(odd.out(), "a b=c é\t");
  // A bad name is refused in the API's words (the CLI's --env is not the API's).
  Response bad = client().PostJson(SbPath(id, "/exec"),
                                   json::object{{"command", "true"}, {"env", {{"", "x"}}}});
  EXPECT_EQ(bad.status, 400) << bad.Describe();
  EXPECT_EQ(bad.ErrorMessage(), "\"env\" entry '=x': the variable name is empty") << bad.Describe();
}

// A variable of the exec's env too long for execve (Linux: 131071 bytes per "K=V") makes a
// command that cannot be started, as a command line too long does: api.md's 200 with exit code 1
// and the reason on stderr (Flue's local(): spawn's E2BIG is a ShellResult), not an HTTP error.
// The sandbox's own env is still refused at its PUT (every command would fail).
TEST_F(ExecTest, AnEnvVariableTooLongForExecveIsACommandThatCannotStart) {
  const std::string reason =
      "nsbox: /bin/bash: Argument list too long (E2BIG): BIG=VALUE is 200004 bytes; Linux passes "
      "a command at most 131071 bytes per variable\n";
  // The command line too long, for comparison.
  ExecResult line = Exec(id_, "echo " + std::string(200000, 'x'));
  ASSERT_EQ(line.response.status, 200) << line.Describe().substr(0, 2000);
  EXPECT_EQ(line.exit_code(), 1);
  EXPECT_NE(line.err().find("Argument list too long"), std::string::npos) << line.err();

  for (const char* command : {"echo ran", "echo ran; echo twice"}) {
    ExecResult r = Exec(
        id_,
        json::object{{"command", command},
                     {"env", json::object{{"BIG", std::string(200000, 'x')}, {"SMALL", "s"}}}});
    ASSERT_EQ(r.response.status, 200) << command << ": " << r.Describe().substr(0, 2000);
    EXPECT_EQ(r.exit_code(), 1) << r.Describe().substr(0, 2000);
    EXPECT_EQ(r.reason(), "exited");
    EXPECT_EQ(r.out(), "");
    EXPECT_EQ(r.err(), reason) << command;
  }
  // The longest variable execve takes still runs.
  ExecResult longest =
      Exec(id_, json::object{{"command", "printf %s \"$BIG\" | wc -c"},
                             {"env", json::object{{"BIG", std::string(131067, 'y')}}}});
  EXPECT_EQ(longest.exit_code(), 0) << longest.Describe().substr(0, 2000);
  EXPECT_EQ(longest.out(), "131067\n");

  // Streamed, the same: a start, the reason on stderr, the exit.
  NdjsonStream s(
      daemon().endpoint(), "POST", SbPath(id_, "/exec"),
      json::serialize(json::object{{"command", "echo ran"},
                                   {"env", json::object{{"BIG", std::string(200000, 'x')}}}}));
  ASSERT_EQ(s.status(), 200) << s.error() << s.ReadRest().substr(0, 500);
  std::vector<json::object> events = s.ReadAll(milliseconds(20000));
  ASSERT_GE(events.size(), 2u) << s.error();
  EXPECT_EQ(Str(events.front(), "type"), "start");
  EXPECT_EQ(Str(events.back(), "type"), "exit");
  EXPECT_EQ(Int(events.back(), "exitCode"), 1) << json::serialize(events.back());
  std::string err;
  for (const auto& e : events) {
    if (Str(e, "type") == "stderr") err += Str(e, "data");
  }
  EXPECT_EQ(err, reason);

  // A sandbox's own variable that long: refused at its PUT, as before.
  Response put =
      client().PutJson(SbPath(NewId("big-env")),
                       json::object{{"env", json::object{{"BIG", std::string(200000, 'x')}}}});
  EXPECT_EQ(put.status, 400) << put.Describe().substr(0, 2000);
  EXPECT_NE(put.ErrorMessage().find("BIG=VALUE is 200004 bytes"), std::string::npos)
      << put.Describe().substr(0, 2000);
}

TEST_F(ExecTest, Stdin) {
  ExecResult r =
      Exec(id_, json::object{{"command", "cat; echo; echo end"}, {"stdin", "hello\nworld é"}});
  EXPECT_EQ(r.out(), "hello\nworld é\nend\n") << r.Describe();
  // Without stdin, standard input is /dev/null: cat ends at once.
  const auto t0 = Clock::now();
  ExecResult none = Exec(id_, "cat; readlink /proc/self/fd/0");
  EXPECT_EQ(none.out(), "/dev/null\n") << none.Describe();
  EXPECT_LT(Since(t0), milliseconds(5000));
  // A large stdin (500 kB) is fed whole, then EOF.
  std::string big(500000, 'q');
  ExecResult large = Exec(id_, json::object{{"command", "wc -c"}, {"stdin", big}});
  EXPECT_EQ(large.out(), "500000\n") << large.Describe();
  // A command that does not read its stdin still finishes.
  ExecResult ignored = Exec(id_, json::object{{"command", "echo done"}, {"stdin", big}});
  EXPECT_EQ(ignored.out(), "done\n") << ignored.Describe();
}

TEST_F(ExecTest, TimeoutKillsAndReports124) {
  const auto t0 = Clock::now();
  ExecResult r = Exec(id_, json::object{{"command", "echo before; sleep 30"}, {"timeoutMs", 500}});
  const auto took = Since(t0);
  ASSERT_EQ(r.response.status, 200) << r.Describe();
  EXPECT_EQ(r.exit_code(), 124) << r.Describe();
  EXPECT_EQ(Field(r.answer, "timedOut"), json::value(true)) << r.Describe();
  EXPECT_EQ(r.reason(), "timeout") << r.Describe();
  EXPECT_EQ(r.out(), "before\n");
  EXPECT_NE(r.err().find("nsbox: command timed out after 500 ms\n"), std::string::npos)
      << r.Describe();
  EXPECT_GE(took, milliseconds(450));
  EXPECT_LT(took, milliseconds(2000)) << "sleep ends on SIGTERM: no need for the 2 s grace";

  // A tree that ignores SIGTERM gets SIGKILL 2 s later, and the answer comes then, not later.
  const auto t1 = Clock::now();
  ExecResult stubborn =
      Exec(id_, json::object{{"command", "trap '' TERM; sleep 30 & sleep 30"}, {"timeoutMs", 300}});
  const auto took2 = Since(t1);
  EXPECT_EQ(stubborn.exit_code(), 124) << stubborn.Describe();
  EXPECT_EQ(Field(stubborn.answer, "timedOut"), json::value(true));
  EXPECT_NE(stubborn.err().find("nsbox: command timed out after 300 ms"), std::string::npos);
  EXPECT_GE(took2, milliseconds(2200)) << stubborn.Describe();
  EXPECT_LT(took2, milliseconds(4500)) << stubborn.Describe();
  EXPECT_EQ(Exec(id_, "pgrep -c sleep || true").out(), "0\n");

  // The line is a line of its own after a stderr that did not end one.
  ExecResult partial =
      Exec(id_, json::object{{"command", "printf partial >&2; sleep 10"}, {"timeoutMs", 300}});
  EXPECT_EQ(partial.exit_code(), 124) << partial.Describe();
  EXPECT_EQ(partial.err(), "partial\nnsbox: command timed out after 300 ms\n");
}

// A timeout ends the command's whole tree, also what left its process group and session (a
// setsid'd grandchild) or was double-forked: the kill goes through the command's cgroup, not its
// process group (api.md "exec", docs/cgroups.md). Run in the VM tier under each placement of
// the daemon (tests/vm/e2e_subset.txt), where the cgroup is one the daemon was given.
TEST_F(ExecTest, TimeoutKillsTheWholeTreeEvenASetsidGrandchild) {
  const milliseconds timeout = Scaled(milliseconds(1500));
  const auto t0 = Clock::now();
  ExecResult r = Exec(id_, json::object{{"command", TreeCommand("/workspace/pids")},
                                        {"timeoutMs", timeout.count()}});
  const auto took = Since(t0);
  ASSERT_EQ(r.response.status, 200) << r.Describe();
  EXPECT_EQ(r.exit_code(), 124) << r.Describe();
  EXPECT_EQ(r.reason(), "timeout") << r.Describe();
  EXPECT_EQ(r.out(), "ready\n") << "the tree was not made before the timeout: " << r.Describe();
  // Every process of the tree dies on SIGTERM: no wait for the 2 s grace.
  EXPECT_LT(took, timeout + Scaled(milliseconds(1500))) << r.Describe();
  ASSERT_TRUE(WaitForLines("/workspace/pids", 5, Scaled(milliseconds(5000))));
  EXPECT_EQ(WaitTreeGone("/workspace/pids", Scaled(milliseconds(3000))), "");
}

// A command that outgrows the sandbox's memory limit is ended by the kernel's OOM killer, and the
// answer says so (api.md: reason "oom", exit code 137, SIGKILL); the sandbox goes on. Control:
// 16 MiB fits under 64 MiB.
TEST_F(ExecTest, AMemoryLimitEndsACommandWithReasonOom) {
  const std::string id = NewId("mem");
  Response put = client().Request(
      "PUT", SbPath(id), json::serialize(json::object{{"limits", {{"memoryBytes", 64 << 20}}}}),
      {{"Content-Type", "application/json"}});
  ASSERT_EQ(put.status, 201) << put.Describe();
  ExecResult fits = Exec(id, "exec perl -e '$x = \"a\" x (16 << 20); print length($x), \"\\n\"'");
  EXPECT_EQ(fits.exit_code(), 0) << fits.Describe();
  EXPECT_EQ(fits.out(), "16777216\n") << fits.Describe();
  // 256 MiB: over the limit (no swap either, memory.swap.max 0), not over a small VM's memory
  // (an allocation the kernel refuses outright would be perl's "Out of memory!", not an OOM kill).
  ExecResult bomb = Exec(
      id, json::object{{"command", "exec perl -e '$x = \"a\" x (256 << 20); print length($x)'"}},
      Scaled(milliseconds(60000)));
  ASSERT_EQ(bomb.response.status, 200) << bomb.Describe();
  EXPECT_EQ(bomb.exit_code(), 137) << bomb.Describe();
  EXPECT_EQ(Str(bomb.answer, "signal"), "SIGKILL") << bomb.Describe();
  EXPECT_EQ(bomb.reason(), "oom") << bomb.Describe();
  EXPECT_EQ(bomb.out(), "") << bomb.Describe();
  EXPECT_EQ(Sh(id, "echo alive"), "alive\n");
}

TEST_F(ExecTest, OutputOverTheCapIsTruncated) {
  const auto t0 = Clock::now();
  ExecResult r = Exec(
      id_, json::object{{"command", "head -c 70000000 /dev/zero | tr '\\0' a; echo never >&2"}},
      milliseconds(120000));
  ASSERT_EQ(r.response.status, 200) << r.response.transport_error;
  EXPECT_EQ(r.exit_code(), 1) << r.err();
  EXPECT_EQ(Field(r.answer, "truncated"), json::value(true));
  EXPECT_EQ(r.reason(), "output_limit");
  EXPECT_NE(r.err().find("nsbox: output exceeded 67108864 bytes; process tree killed\n"),
            std::string::npos)
      << r.err().substr(0, 1000);
  EXPECT_EQ(r.err().find("never"), std::string::npos);
  const std::string out = r.out();
  EXPECT_LE(out.size() + r.err().size(), 67108864u + 200);
  EXPECT_GE(out.size(), 60000000u);
  EXPECT_EQ(out.find_first_not_of('a'), std::string::npos);
  EXPECT_LT(Since(t0), milliseconds(60000));
  // The daemon is still fine, and so is the sandbox.
  EXPECT_EQ(Sh(id_, "echo ok"), "ok\n");
}

// api.md: the cap is "configurable per sandbox": limits.outputBytes, kept in the sandbox's
// configuration (also across a restart of its nsbox-init).
TEST_F(ExecTest, TheOutputCapIsConfigurablePerSandbox) {
  const std::string small = NewId();
  Response made = Create(small, R"({"limits": {"outputBytes": 1000}})");
  ASSERT_EQ(made.status, 201) << made.Describe();
  EXPECT_EQ(Field(Field(Obj(made), "limits").as_object(), "outputBytes"), json::value(1000));
  for (int round = 0; round < 2; ++round) {
    ExecResult r = Exec(small, "head -c 5000 /dev/zero | tr '\\0' b; echo never >&2");
    EXPECT_EQ(r.exit_code(), 1) << r.Describe();
    EXPECT_EQ(Field(r.answer, "truncated"), json::value(true)) << r.Describe();
    EXPECT_EQ(r.reason(), "output_limit");
    EXPECT_NE(r.err().find("nsbox: output exceeded 1000 bytes; process tree killed\n"),
              std::string::npos)
        << r.err();
    EXPECT_LE(r.out().size(), 1000u);
    EXPECT_EQ(r.out().find_first_not_of('b'), std::string::npos);
    // Under the cap: whole.
    EXPECT_EQ(Exec(small, "head -c 900 /dev/zero | tr '\\0' c").out(), std::string(900, 'c'));
    // Stopped: the next exec starts it again, from its configuration.
    Response stopped = client().Request("POST", SbPath(small, "/stop"));
    ASSERT_EQ(stopped.status, 200) << stopped.Describe();
  }
  // Another sandbox keeps the default.
  EXPECT_EQ(Exec(id_, "head -c 5000 /dev/zero | wc -c").out(), "5000\n");
  for (const char* bad :
       {R"({"limits": {"outputBytes": 0}})", R"({"limits": {"outputBytes": -1}})",
        R"({"limits": {"outputBytes": 2147483648}})", R"({"limits": {"outputBytes": "1M"}})"}) {
    Response r =
        client().Request("PUT", SbPath(NewId()), bad, {{"Content-Type", "application/json"}});
    EXPECT_EQ(r.status, 400) << bad << ": " << r.Describe();
    EXPECT_EQ(r.ErrorCode(), "invalid_request") << bad;
  }
}

TEST_F(ExecTest, InvalidUtf8BecomesReplacementCharacter) {
  // Node's Buffer.toString('utf8'): one U+FFFD per maximal invalid subpart.
  ExecResult r = Exec(id_, R"(printf 'a\377b\342\202z\303'; printf '\300\257' >&2)");
  ASSERT_EQ(r.response.status, 200) << r.Describe();
  EXPECT_EQ(r.out(),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD"
            "z\xEF\xBF\xBD")
      << r.Describe();
  EXPECT_EQ(r.err(), "\xEF\xBF\xBD\xEF\xBF\xBD") << r.Describe();
  // Valid multi-byte text is untouched.
  EXPECT_EQ(Exec(id_, "printf 'é€🎉'").out(), "é€🎉");
}

TEST_F(ExecTest, Base64EncodingIsExactBytes) {
  std::string expected_out;
  for (int i = 0; i < 256; ++i) expected_out += static_cast<char>(i);
  ExecResult r = Exec(id_, json::object{{"command",
                                         "for i in $(seq 0 255); do printf \"\\\\$(printf %o "
                                         "$i)\"; done; printf '\\377\\000x' >&2"},
                                        {"encoding", "base64"}});
  ASSERT_EQ(r.response.status, 200) << r.Describe();
  EXPECT_FALSE(r.answer.contains("stdout")) << r.Describe();
  EXPECT_FALSE(r.answer.contains("stderr")) << r.Describe();
  auto out = Base64Decode(Str(r.answer, "stdoutBase64"));
  auto err = Base64Decode(Str(r.answer, "stderrBase64"));
  ASSERT_TRUE(out.has_value()) << r.Describe();
  ASSERT_TRUE(err.has_value()) << r.Describe();
  EXPECT_EQ(*out, expected_out);
  EXPECT_EQ(*err, std::string("\xff\0x", 3));
  EXPECT_EQ(r.exit_code(), 0);
  ExecResult empty = Exec(id_, json::object{{"command", "true"}, {"encoding", "base64"}});
  EXPECT_EQ(Str(empty.answer, "stdoutBase64"), "") << empty.Describe();
}

TEST_F(ExecTest, BackgroundProcessDoesNotHoldTheAnswer) {
  const auto t0 = Clock::now();
  ExecResult r = Exec(id_, "sleep 100 & echo started");
  const auto took = Since(t0);
  EXPECT_EQ(r.out(), "started\n") << r.Describe();
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_LT(took, milliseconds(2000)) << r.Describe();
  // It keeps running.
  EXPECT_EQ(Exec(id_, "pgrep -x sleep >/dev/null && echo running").out(), "running\n");
  // Output a background process writes later is drained and dropped; nothing blocks.
  const auto t1 = Clock::now();
  ExecResult noisy = Exec(id_, "(sleep 0.2; yes) & echo quick");
  EXPECT_EQ(noisy.out(), "quick\n") << noisy.Describe();
  EXPECT_LT(Since(t1), milliseconds(2000));
  EXPECT_EQ(Sh(id_, "echo still"), "still\n");
  Sh(id_, "pkill yes; true");
}

// ---- streaming ----

TEST_F(ExecTest, StreamEventsInOrder) {
  NdjsonStream s(daemon().endpoint(), "POST", SbPath(id_, "/exec"),
                 R"({"command":"echo a; echo b >&2; sleep 0.2; echo c; exit 5"})");
  ASSERT_EQ(s.status(), 200) << s.error();
  EXPECT_NE(s.headers().at("content-type").find("application/x-ndjson"), std::string::npos);
  std::vector<json::object> events = s.ReadAll(milliseconds(20000));
  ASSERT_GE(events.size(), 3u) << s.error();
  EXPECT_EQ(Str(events.front(), "type"), "start") << json::serialize(events.front());
  EXPECT_FALSE(Str(events.front(), "execId").empty());
  EXPECT_GT(Int(events.front(), "pid"), 0) << json::serialize(events.front());
  const json::object& exit = events.back();
  EXPECT_EQ(Str(exit, "type"), "exit") << json::serialize(exit);
  EXPECT_EQ(Int(exit, "exitCode"), 5);
  EXPECT_EQ(Str(exit, "reason"), "exited");
  EXPECT_TRUE(Field(exit, "signal").is_null());
  EXPECT_EQ(Field(exit, "timedOut"), json::value(false));
  EXPECT_EQ(Field(exit, "truncated"), json::value(false));
  EXPECT_EQ(Field(exit, "cancelled"), json::value(false));
  EXPECT_GE(Int(exit, "durationMs"), 200);
  std::string out, err;
  for (size_t i = 1; i + 1 < events.size(); ++i) {
    const std::string type = Str(events[i], "type");
    ASSERT_TRUE(type == "stdout" || type == "stderr") << json::serialize(events[i]);
    (type == "stdout" ? out : err) += Str(events[i], "data");
  }
  EXPECT_EQ(out, "a\nc\n");
  EXPECT_EQ(err, "b\n");
  EXPECT_TRUE(s.done());
}

// Media types are case-insensitive; a range refused with q=0 is not asked for.
TEST_F(ExecTest, StreamIsChosenByTheAcceptHeaderAsHttpReadsIt) {
  const std::string body = json::serialize(json::object{{"command", "echo hi"}});
  const std::pair<const char*, bool> cases[] = {
      {"application/x-ndjson", true},
      {"APPLICATION/X-NDJSON", true},
      {"application/json, application/x-ndjson;q=0.5", true},
      {"application/x-ndjson ; charset=utf-8", true},
      {"application/x-ndjson;q=0", false},
      {"application/x-ndjson;q=0.000", false},
      {"application/json", false},
      {"application/x-ndjsonx", false},
  };
  for (const auto& [accept, streamed] : cases) {
    Response r = client().Request("POST", SbPath(id_, "/exec"), body,
                                  {{"Content-Type", "application/json"}, {"Accept", accept}});
    ASSERT_EQ(r.status, 200) << accept << ": " << r.Describe();
    EXPECT_EQ(r.Header("content-type"), streamed ? "application/x-ndjson" : "application/json")
        << accept;
    EXPECT_EQ(r.body.find("\"type\":\"start\"") != std::string::npos, streamed) << accept;
  }
}

TEST_F(ExecTest, StreamNeverSplitsAUtf8Character) {
  // The euro sign (3 bytes) and an emoji (4 bytes) written in pieces with pauses between.
  NdjsonStream s(
      daemon().endpoint(), "POST", SbPath(id_, "/exec"),
      R"({"command":"printf '\\342\\202'; sleep 0.3; printf '\\254\\360'; sleep 0.3; printf '\\237\\216'; sleep 0.3; printf '\\211\\n'"})");
  ASSERT_EQ(s.status(), 200) << s.error();
  std::vector<json::object> events = s.ReadAll(milliseconds(20000));
  ASSERT_FALSE(events.empty()) << s.error();
  std::string out;
  int data_events = 0;
  for (const auto& e : events) {
    if (Str(e, "type") != "stdout") continue;
    ++data_events;
    const std::string d = Str(e, "data");
    EXPECT_TRUE(ValidUtf8(d)) << PctEncode(d);
    EXPECT_EQ(d.find("\xEF\xBF\xBD"), std::string::npos)
        << "a character was split: " << PctEncode(d);
    out += d;
  }
  EXPECT_EQ(out, "€🎉\n");
  EXPECT_EQ(Str(events.back(), "type"), "exit");
  // An invalid byte at the very end is still reported (as U+FFFD) when the command ends.
  NdjsonStream t(daemon().endpoint(), "POST", SbPath(id_, "/exec"),
                 R"({"command":"printf 'x\\342\\202'"})");
  std::string tail;
  for (const auto& e : t.ReadAll(milliseconds(20000))) {
    if (Str(e, "type") == "stdout") tail += Str(e, "data");
  }
  EXPECT_EQ(tail, "x\xEF\xBF\xBD");
}

TEST_F(ExecTest, StreamBase64CarriesBytes) {
  NdjsonStream s(
      daemon().endpoint(), "POST", SbPath(id_, "/exec"),
      R"({"command":"printf '\\377\\000'; sleep 0.2; printf 'z' >&2; printf '\\342'","encoding":"base64"})");
  ASSERT_EQ(s.status(), 200) << s.error();
  std::string out, err;
  for (const auto& e : s.ReadAll(milliseconds(20000))) {
    const std::string type = Str(e, "type");
    if (type != "stdout" && type != "stderr") continue;
    EXPECT_FALSE(e.contains("data")) << json::serialize(e);
    auto bytes = Base64Decode(Str(e, "dataBase64"));
    ASSERT_TRUE(bytes.has_value()) << json::serialize(e);
    (type == "stdout" ? out : err) += *bytes;
  }
  EXPECT_EQ(out, std::string("\xff\0\xe2", 3));
  EXPECT_EQ(err, "z");
}

TEST_F(ExecTest, StreamTimeout) {
  NdjsonStream s(daemon().endpoint(), "POST", SbPath(id_, "/exec"),
                 R"({"command":"sleep 30","timeoutMs":300})");
  ASSERT_EQ(s.status(), 200) << s.error();
  auto events = s.ReadAll(milliseconds(10000));
  ASSERT_FALSE(events.empty()) << s.error();
  const json::object& exit = events.back();
  EXPECT_EQ(Str(exit, "type"), "exit");
  EXPECT_EQ(Int(exit, "exitCode"), 124);
  EXPECT_EQ(Field(exit, "timedOut"), json::value(true));
  EXPECT_EQ(Str(exit, "reason"), "timeout");
  std::string err;
  for (const auto& e : events) {
    if (Str(e, "type") == "stderr") err += Str(e, "data");
  }
  EXPECT_NE(err.find("nsbox: command timed out after 300 ms"), std::string::npos) << err;
}

// A command whose process cannot be made (the sandbox's pids limit is reached) is answered as
// api.md says of a command that cannot be started: 200, exit code 1, the reason on stderr; not
// reason "stopped", which says the sandbox was stopped under it.
TEST_F(ExecTest, ACommandThatCannotStartAtThePidsLimitSaysWhy) {
  const std::string id = NewId();
  Response put =
      client().Request("PUT", SbPath(id), json::serialize(json::object{{"limits", {{"pids", 8}}}}),
                       {{"Content-Type", "application/json"}});
  ASSERT_EQ(put.status, 201) << put.Describe();
  // Takes every free pid of the sandbox, and again whenever one frees (nsbox-init's own threads
  // count too, and come and go).
  NdjsonStream holder(
      daemon().endpoint(), "POST", SbPath(id, "/exec"),
      json::serialize(json::object{
          {"command",
           "perl -e '$| = 1; my $said = 0; while (1) { my $p = fork(); if (!defined $p) { "
           "print \"holding\\n\" unless $said++; select(undef, undef, undef, 0.005); next } "
           "if ($p == 0) { sleep 30; exit } }'"},
          {"timeoutMs", Scaled(milliseconds(20000)).count()}}));
  ASSERT_EQ(holder.status(), 200) << holder.error();
  std::string out;
  while (out.find("holding") == std::string::npos) {
    auto e = holder.Next(Scaled(milliseconds(10000)));
    ASSERT_TRUE(e.has_value()) << holder.error() << out;
    if (Str(*e, "type") == "stdout") out += Str(*e, "data");
  }
  int unstarted = 0;
  for (int i = 0; i < 30 && unstarted < 3; ++i) {
    // The pid an ended command frees goes back to the holder (which tries every 5 ms), not to the
    // next command.
    std::this_thread::sleep_for(milliseconds(50));
    ExecResult r = Exec(id, "echo ran");
    ASSERT_EQ(r.response.status, 200) << r.Describe();
    ASSERT_NE(r.reason(), "stopped") << r.Describe();
    if (r.exit_code() == 0) continue;  // a pid was free at that moment
    EXPECT_EQ(r.exit_code(), 1) << r.Describe();
    EXPECT_EQ(r.reason(), "exited") << r.Describe();
    EXPECT_EQ(r.out(), "");
    EXPECT_NE(r.err().find("could not be started"), std::string::npos) << r.Describe();
    EXPECT_NE(r.err().find("pids limit"), std::string::npos) << r.Describe();
    ++unstarted;
  }
  EXPECT_GT(unstarted, 0) << "no exec met the pids limit";
  // The stream of one says the same: its start first (pid 0), the reason, the exit.
  bool streamed = false;
  for (int i = 0; i < 30 && !streamed; ++i) {
    std::this_thread::sleep_for(milliseconds(50));
    NdjsonStream s(daemon().endpoint(), "POST", SbPath(id, "/exec"),
                   json::serialize(json::object{{"command", "echo ran"}}));
    auto events = s.ReadAll(Scaled(milliseconds(10000)));
    ASSERT_GE(events.size(), 2u) << s.error();
    EXPECT_EQ(Str(events.front(), "type"), "start");
    EXPECT_EQ(Str(events.back(), "type"), "exit");
    if (Field(events.back(), "exitCode") != json::value(1)) continue;  // it could start
    streamed = true;
    EXPECT_EQ(Field(events.front(), "pid"), json::value(0)) << json::serialize(events.front());
    std::string err;
    for (const auto& e : events) {
      if (Str(e, "type") == "stderr") err += Str(e, "data");
    }
    EXPECT_NE(err.find("could not be started"), std::string::npos) << err;
    EXPECT_EQ(Str(events.back(), "reason"), "exited");
  }
  EXPECT_TRUE(streamed) << "no streamed exec met the pids limit";
  ASSERT_EQ(client().Request("POST", SbPath(id, "/stop"), "").status, 200);
}

TEST_F(ExecTest, CancelByDeleteListsThenKillsTheTree) {
  NdjsonStream s(daemon().endpoint(), "POST", SbPath(id_, "/exec"),
                 json::serialize(json::object{{"command", TreeCommand("/workspace/pids")}}));
  ASSERT_EQ(s.status(), 200) << s.error();
  auto start = s.Next(milliseconds(10000));
  ASSERT_TRUE(start.has_value()) << s.error();
  ASSERT_EQ(Str(*start, "type"), "start");
  const std::string exec_id = Str(*start, "execId");
  std::string out;
  while (out.find("ready") == std::string::npos) {
    auto e = s.Next(milliseconds(10000));
    ASSERT_TRUE(e.has_value()) << s.error();
    out += Str(*e, "data");
  }
  ASSERT_TRUE(WaitForLines("/workspace/pids", 5, milliseconds(5000)));
  const std::string alive = AlivePids("/workspace/pids");
  ASSERT_EQ(std::count(alive.begin(), alive.end(), '\n'), 5) << alive;
  // Listed while it runs.
  Response list = client().Get(SbPath(id_, "/execs"));
  ASSERT_EQ(list.status, 200) << list.Describe();
  EXPECT_NE(list.body.find("\"" + exec_id + "\""), std::string::npos) << list.Describe();

  const auto t0 = Clock::now();
  Response del = client().Delete(SbPath(id_, "/execs/" + PctEncode(exec_id)));
  EXPECT_EQ(del.status, 202) << del.Describe();
  auto rest = s.ReadAll(milliseconds(10000));
  ASSERT_FALSE(rest.empty()) << s.error();
  const json::object& exit = rest.back();
  EXPECT_EQ(Str(exit, "type"), "exit") << json::serialize(exit);
  EXPECT_EQ(Field(exit, "cancelled"), json::value(true)) << json::serialize(exit);
  EXPECT_EQ(Str(exit, "reason"), "cancelled") << json::serialize(exit);
  EXPECT_LT(Since(t0), milliseconds(3500));
  EXPECT_EQ(WaitTreeGone("/workspace/pids", milliseconds(3000)), "");
  // No longer listed; a second cancel is a 404.
  Response after = client().Get(SbPath(id_, "/execs"));
  EXPECT_EQ(after.body.find("\"" + exec_id + "\""), std::string::npos) << after.Describe();
  Response again = client().Delete(SbPath(id_, "/execs/" + PctEncode(exec_id)));
  EXPECT_EQ(again.status, 404) << again.Describe();
  EXPECT_EQ(again.ErrorCode(), "exec_not_found") << again.Describe();
}

TEST_F(ExecTest, HangUpOnStreamKillsTheTree) {
  auto s = std::make_unique<NdjsonStream>(
      daemon().endpoint(), "POST", SbPath(id_, "/exec"),
      json::serialize(json::object{{"command", TreeCommand("/workspace/pids")}}));
  ASSERT_EQ(s->status(), 200) << s->error();
  std::string out;
  while (out.find("ready") == std::string::npos) {
    auto e = s->Next(milliseconds(10000));
    ASSERT_TRUE(e.has_value()) << s->error();
    out += Str(*e, "data");
  }
  ASSERT_TRUE(WaitForLines("/workspace/pids", 5, milliseconds(5000)));
  const std::string alive = AlivePids("/workspace/pids");
  EXPECT_EQ(std::count(alive.begin(), alive.end(), '\n'), 5) << alive;
  s->Close();
  // "killed at once (SIGTERM, SIGKILL after 2 s)": sleep dies on SIGTERM.
  EXPECT_EQ(WaitTreeGone("/workspace/pids", milliseconds(3000)), "");
  Response list = client().Get(SbPath(id_, "/execs"));
  EXPECT_EQ(list.body.find("sleep"), std::string::npos) << list.Describe();
}

TEST_F(ExecTest, HangUpOnBufferedExecKillsTheTree) {
  RawConnection raw(daemon().endpoint());
  const std::string body =
      json::serialize(json::object{{"command", TreeCommand("/workspace/pids")}});
  ASSERT_TRUE(
      raw.Send("POST " + SbPath(id_, "/exec") +
               " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body));
  ASSERT_TRUE(WaitForLines("/workspace/pids", 5, milliseconds(10000)));
  std::this_thread::sleep_for(milliseconds(100));
  const std::string alive = AlivePids("/workspace/pids");
  ASSERT_EQ(std::count(alive.begin(), alive.end(), '\n'), 5) << alive;
  Response list = client().Get(SbPath(id_, "/execs"));
  EXPECT_NE(list.body.find("execId"), std::string::npos) << list.Describe();
  raw.Close();
  EXPECT_EQ(WaitTreeGone("/workspace/pids", milliseconds(3000)), "");
  // The stubborn kind: ignores SIGTERM, so SIGKILL follows 2 s later.
  Sh(id_, "rm -f /workspace/pids2");
  RawConnection raw2(daemon().endpoint());
  const std::string body2 = json::serialize(
      json::object{{"command",
                    "trap '' TERM; sleep 1000 & echo $! >> /workspace/pids2; echo $$ >> "
                    "/workspace/pids2; wait"}});
  ASSERT_TRUE(raw2.Send("POST " + SbPath(id_, "/exec") +
                        " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        "Content-Length: " +
                        std::to_string(body2.size()) + "\r\n\r\n" + body2));
  ASSERT_TRUE(WaitForLines("/workspace/pids2", 2, milliseconds(10000)));
  raw2.Close();
  EXPECT_EQ(WaitTreeGone("/workspace/pids2", milliseconds(4500)), "");
}

TEST_F(ExecTest, ManyConcurrentExecsInOneSandbox) {
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Client c = NewClient();
      for (int i = 0; i < 5; ++i) {
        Response r = c.PostJson(SbPath(id_, "/exec"),
                                json::object{{"command", "echo " + std::to_string(t * 100 + i)}});
        json::value v = r.Json();
        if (r.status != 200 || !v.is_object() ||
            Str(v.as_object(), "stdout") != std::to_string(t * 100 + i) + "\n") {
          bad.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace nsbox::e2e
