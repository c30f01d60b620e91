// The idle stop (docs/daemon.md "Idle stop"): a sandbox created with `idleStopMs` is stopped once
// no request has used it and no process of its own has run for that long; nothing else stops
// it. Its files stay, and the next call starts it again.

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

class IdleStopTest : public E2eTest {
 protected:
  std::string State(const std::string& id) { return Str(Obj(client().Get(SbPath(id))), "state"); }

  // How long after `from` the sandbox was seen stopped (polled every 50 ms), or nullopt if it
  // still ran after `limit`.
  std::optional<milliseconds> StoppedAfter(const std::string& id, Clock::time_point from,
                                           milliseconds limit) {
    while (Clock::now() - from < limit) {
      if (State(id) == "stopped") {
        return std::chrono::duration_cast<milliseconds>(Clock::now() - from);
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    return std::nullopt;
  }

  // The "idle for N ms" of the daemon's last idle stop of `id`, -1 when it logged none in 5 s (the
  // state says "stopped" before the stop has ended and been logged).
  long IdleMsLogged(const std::string& id) {
    const std::string line = "sandbox=" + id + " stopped: idle for ";
    const auto deadline = Clock::now() + milliseconds(5000);
    for (;;) {
      const std::string log = daemon().Log();
      const size_t at = log.rfind(line);
      if (at != std::string::npos) return std::stol(log.substr(at + line.size()));
      if (Clock::now() > deadline) return -1;
      std::this_thread::sleep_for(milliseconds(20));
    }
  }

  // nsbox_idle_stops_total once it is at least `least` (within 5 s: it is counted once the stop
  // has ended), -1 when missing.
  long IdleStops(long least = 0) {
    const auto deadline = Clock::now() + milliseconds(5000);
    for (;;) {
      const std::string body = client().Get("/metrics").body;
      const std::string name = "\nnsbox_idle_stops_total ";
      const size_t at = body.find(name);
      const long n = at == std::string::npos ? -1 : std::stol(body.substr(at + name.size()));
      if (n >= least || Clock::now() > deadline) return n;
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
};

TEST_F(IdleStopTest, AnIdleSandboxStopsAndTheNextCallStartsItAgain) {
  const std::string id = NewId("idle");
  const std::string other = NewId("busy");
  Response put = Create(id, R"({"idleStopMs": 1500})");
  ASSERT_EQ(put.status, 201) << put.Describe();
  EXPECT_EQ(Field(Obj(put), "idleStopMs"), json::value(1500));
  Response plain = Create(other);
  EXPECT_EQ(Field(Obj(plain), "idleStopMs"), json::value(nullptr)) << plain.Describe();
  Sh(other, "true");

  Sh(id, "echo kept > /workspace/k; echo gone > /tmp/t");
  const auto last_use = Clock::now();
  ASSERT_EQ(State(id), "running");
  // A status request is not a use: the polling below does not hold the stop back.
  const auto stopped = StoppedAfter(id, last_use, milliseconds(15000));
  ASSERT_TRUE(stopped.has_value()) << "still running 15 s after its last use";
  // Not before its idle time: the daemon says how long it was idle (this client saw the answer
  // after the daemon had counted the request as ended), and the stop comes within the daemon's
  // next look (one a second), with room for a slow machine.
  EXPECT_GE(IdleMsLogged(id), 1500) << daemon().Log();
  EXPECT_GE(stopped->count(), 1000);
  EXPECT_LT(stopped->count(), 8000);
  EXPECT_EQ(IdleStops(1), 1);
  EXPECT_EQ(State(other), "running") << "a sandbox without idleStopMs is never stopped so";

  // Its files stay, /tmp does not (as after POST .../stop), and it stops again once idle.
  EXPECT_EQ(Sh(id, "cat /workspace/k; ls -A /tmp"), "kept\n");
  EXPECT_EQ(State(id), "running");
  ASSERT_TRUE(StoppedAfter(id, Clock::now(), milliseconds(15000)).has_value());
  EXPECT_EQ(IdleStops(2), 2);
}

TEST_F(IdleStopTest, AProcessOfItsOwnKeepsItRunning) {
  const std::string id = NewId("server");
  ASSERT_EQ(Create(id, R"({"idleStopMs": 2000})").status, 201);
  // A background process, as a dev server would be: the exec answers at once.
  const auto t0 = Clock::now();
  Sh(id, "sleep 3 > /dev/null 2>&1 &");
  std::this_thread::sleep_for(milliseconds(2500));
  EXPECT_EQ(State(id), "running") << "stopped while a process of its own ran";
  const auto stopped = StoppedAfter(id, t0, milliseconds(20000));
  ASSERT_TRUE(stopped.has_value());
  // Its idle time counts from when the process was last seen (3 s), not from the last request
  // (which would stop it at the first look without the process, before 4.2 s).
  EXPECT_GE(stopped->count(), 5000) << "stopped less than idleStopMs after its process ended";
}

TEST_F(IdleStopTest, ACommandOrAnUploadLongerThanTheIdleTimeIsNotCutShort) {
  const std::string id = NewId("long");
  ASSERT_EQ(Create(id, R"({"idleStopMs": 1000})").status, 201);
  ExecResult r = Exec(id, "sleep 2.5; echo done");
  EXPECT_EQ(r.reason(), "exited") << r.Describe();
  EXPECT_EQ(r.out(), "done\n") << r.Describe();

  // An upload whose body comes slowly: a request in progress, with no process inside.
  RawConnection c(daemon().endpoint());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.Send("PUT " + SbPath(id, "/files?path=/workspace/up.txt") +
                     " HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello"));
  std::this_thread::sleep_for(milliseconds(2500));
  EXPECT_EQ(State(id), "running") << "stopped in the middle of an upload";
  ASSERT_TRUE(c.Send("world"));
  Response up = c.ReadResponse();
  EXPECT_EQ(up.status, 204) << up.Describe();
  EXPECT_EQ(GetFile(id, "/workspace/up.txt").body, "helloworld");
  EXPECT_EQ(IdleStops(), 0);
}

TEST_F(IdleStopTest, BadValuesAreRefusedAndAGoodOneOutlivesARestart) {
  const std::string id = NewId("kept");
  for (const char* bad :
       {R"({"idleStopMs": 999})", R"({"idleStopMs": 2592000001})", R"({"idleStopMs": "5000"})",
        R"({"idleStopMs": 1500.5})", R"({"idleStopMs": -1000})", R"({"idleStopMs": true})"}) {
    Response r = client().Request("PUT", SbPath(id), bad, {{"Content-Type", "application/json"}});
    EXPECT_EQ(r.status, 400) << bad << "\n" << r.Describe();
    EXPECT_EQ(r.ErrorCode(), "invalid_request") << bad;
    EXPECT_NE(r.ErrorMessage().find("idleStopMs"), std::string::npos) << r.ErrorMessage();
  }
  EXPECT_EQ(client().Get(SbPath(id)).status, 404) << "a refused PUT created it";
  // 0 is never (as without one, on a daemon without --idle-stop).
  const std::string never = NewId("never");
  EXPECT_EQ(Field(Obj(Create(never, R"({"idleStopMs": 0})")), "idleStopMs"), json::value(nullptr));

  ASSERT_EQ(Create(id, R"({"idleStopMs": 1000})").status, 201);
  // Options apply at creation only.
  EXPECT_EQ(Field(Obj(Create(id, R"({"idleStopMs": 60000})")), "idleStopMs"), json::value(1000));
  ASSERT_TRUE(daemon().Stop()) << daemon().error();
  ASSERT_TRUE(daemon().Restart()) << daemon().error();
  client().Disconnect();
  EXPECT_EQ(Field(Obj(client().Get(SbPath(id))), "idleStopMs"), json::value(1000));
  // The next daemon stops it too, once a call has started it.
  Sh(id, "true");
  ASSERT_TRUE(StoppedAfter(id, Clock::now(), milliseconds(15000)).has_value())
      << "not stopped after the daemon's restart";
}

// `nsbox serve --idle-stop`: the idle stop of the sandboxes that do not say.
class IdleStopDefaultTest : public IdleStopTest {
 protected:
  std::vector<std::string> DaemonArgs() const override { return {"--idle-stop", "1s"}; }
};

TEST_F(IdleStopDefaultTest, TheDaemonsDefaultAppliesToSandboxesThatDoNotSay) {
  const std::string by_default = NewId("default");
  const std::string own = NewId("own");
  const std::string never = NewId("never");
  EXPECT_EQ(Field(Obj(Create(by_default)), "idleStopMs"), json::value(1000));
  EXPECT_EQ(Field(Obj(Create(own, R"({"idleStopMs": 60000})")), "idleStopMs"), json::value(60000));
  EXPECT_EQ(Field(Obj(Create(never, R"({"idleStopMs": 0})")), "idleStopMs"), json::value(nullptr));
  for (const auto& id : {by_default, own, never}) Sh(id, "true");
  ASSERT_TRUE(StoppedAfter(by_default, Clock::now(), milliseconds(15000)).has_value());
  EXPECT_GE(IdleMsLogged(by_default), 1000);
  EXPECT_EQ(State(own), "running");
  EXPECT_EQ(State(never), "running");
  // The default is the daemon's, not the sandbox's: a daemon without it leaves them all running.
  ASSERT_TRUE(daemon().Stop()) << daemon().error();
  ASSERT_TRUE(daemon().Start({})) << daemon().error();
  client().Disconnect();
  EXPECT_EQ(Field(Obj(client().Get(SbPath(by_default))), "idleStopMs"), json::value(nullptr));
  EXPECT_EQ(Field(Obj(client().Get(SbPath(own))), "idleStopMs"), json::value(60000));
  Sh(by_default, "true");
  std::this_thread::sleep_for(milliseconds(2500));
  EXPECT_EQ(State(by_default), "running");
  // 0 is kept in its config.json: under a daemon with the flag again, that one still never stops.
  ASSERT_TRUE(daemon().Stop()) << daemon().error();
  ASSERT_TRUE(daemon().Start(DaemonArgs())) << daemon().error();
  client().Disconnect();
  EXPECT_EQ(Field(Obj(client().Get(SbPath(never))), "idleStopMs"), json::value(nullptr));
  Sh(never, "true");
  std::this_thread::sleep_for(milliseconds(2500));
  EXPECT_EQ(State(never), "running");
}

TEST_F(IdleStopDefaultTest, ABadDefaultIsRefusedAtTheStart) {
  Daemon other;
  for (const char* bad : {"500ms", "31d", "soon"}) {
    EXPECT_EQ(other.RunToExit({"--idle-stop", bad}), 125) << bad << "\n" << other.Log();
    EXPECT_NE(other.Log().find(std::string("--idle-stop '") + bad + "'"), std::string::npos)
        << other.Log();
  }
}

}  // namespace
}  // namespace nsbox::e2e
