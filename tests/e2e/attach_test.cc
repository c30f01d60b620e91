// docs/exec.md: exec sessions. Re-attach by offset (GET .../execs/{execId}/output), detach, a
// client that never reads, the output ring and its spill file, streamed stdin, terminals, and
// the exec WebSocket (its own small Beast client here, over the daemon's Unix socket).

#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int64_t Int(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return v != nullptr && v->is_int64() ? v->as_int64() : -1000;
}

// A WebSocket client on the daemon's Unix socket; every call has a deadline.
class WsClient {
 public:
  struct Message {
    bool text = false;
    std::string data;
  };

  WsClient(const std::string& socket_path, const std::string& target) : ws_(io_) {
    boost::system::error_code ec;
    beast::get_lowest_layer(ws_).connect(asio::local::stream_protocol::endpoint(socket_path), ec);
    if (ec) {
      error_ = "connect: " + ec.message();
      return;
    }
    bool done = false;
    ws_.async_handshake(response_, "localhost", target, [&](boost::system::error_code e) {
      ec = e;
      done = true;
    });
    Run(done, milliseconds(10000));
    if (!done) {
      error_ = "the handshake timed out";
    } else if (ec) {
      error_ = "handshake: " + ec.message();
    } else {
      ok_ = true;
    }
  }

  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  // The HTTP answer to the upgrade (101, or the error the daemon gave instead).
  int status() const { return response_.result_int(); }
  std::string body() const { return response_.body(); }

  bool Send(std::string_view data, bool text, milliseconds timeout = milliseconds(20000)) {
    bool done = false;
    boost::system::error_code ec;
    ws_.text(text);
    ws_.async_write(asio::buffer(data), [&](boost::system::error_code e, size_t) {
      ec = e;
      done = true;
    });
    Run(done, timeout);
    if (!done || ec) error_ = done ? "write: " + ec.message() : "write timed out";
    return done && !ec;
  }
  bool SendJson(const json::object& o) { return Send(json::serialize(o), true); }

  // The next message; nullopt at the close (close_code() then says which) or on an error.
  std::optional<Message> Read(milliseconds timeout = milliseconds(20000)) {
    bool done = false;
    boost::system::error_code ec;
    beast::flat_buffer buf;
    ws_.async_read(buf, [&](boost::system::error_code e, size_t) {
      ec = e;
      done = true;
    });
    Run(done, timeout);
    if (!done) {
      error_ = "read timed out";
      return std::nullopt;
    }
    if (ec) {
      error_ = "read: " + ec.message();
      closed_ = ec == websocket::error::closed;
      return std::nullopt;
    }
    return Message{ws_.got_text(), beast::buffers_to_string(buf.data())};
  }
  // Reads up to the next text message, collecting binary ones by channel into out[1], out[2].
  std::optional<json::object> NextControl(std::string out[3],
                                          milliseconds timeout = milliseconds(20000)) {
    for (;;) {
      auto m = Read(timeout);
      if (!m) return std::nullopt;
      if (!m->text) {
        if (!m->data.empty() && m->data[0] >= 1 && m->data[0] <= 2) {
          out[static_cast<int>(m->data[0])] += m->data.substr(1);
        } else {
          error_ =
              "a binary message with channel " + std::to_string(m->data.empty() ? -1 : m->data[0]);
          return std::nullopt;
        }
        continue;
      }
      json::value v = json::parse(m->data);
      return v.as_object();
    }
  }
  int close_code() const { return static_cast<int>(ws_.reason().code); }
  bool closed() const { return closed_; }
  void Drop() {
    boost::system::error_code ec;
    beast::get_lowest_layer(ws_).close(ec);
  }

 private:
  void Run(const bool& done, milliseconds timeout) {
    io_.restart();
    const auto deadline = Clock::now() + timeout;
    while (!done && Clock::now() < deadline) io_.run_for(milliseconds(50));
    if (!done) {
      Drop();
      io_.restart();
      io_.run_for(milliseconds(500));
    }
  }

  asio::io_context io_;
  websocket::stream<asio::local::stream_protocol::socket> ws_;
  beast::http::response<beast::http::string_body> response_;
  bool ok_ = false;
  bool closed_ = false;
  std::string error_;
};

class AttachTest : public E2eSandboxTest {
 protected:
  // Restarts the daemon with these extra arguments (the fixture's daemon has none).
  void RestartWith(const std::vector<std::string>& args) {
    ASSERT_TRUE(daemon().Stop()) << daemon().error();
    ASSERT_TRUE(daemon().Start(args)) << daemon().error();
    client().Disconnect();
  }
  std::string ExecPath(const std::string& exec_id, std::string_view suffix) {
    return SbPath(id_, "/execs/" + PctEncode(exec_id) + std::string(suffix));
  }
  std::string OutputPath(const std::string& exec_id, std::string_view query) {
    return ExecPath(exec_id, "/output") + std::string(query);
  }
  // Starts an NDJSON exec and returns the stream after its start event (its execId in *id).
  std::unique_ptr<NdjsonStream> Start(const json::object& body, std::string* exec_id) {
    auto s = std::make_unique<NdjsonStream>(daemon().endpoint(), "POST", SbPath(id_, "/exec"),
                                            json::serialize(body));
    EXPECT_EQ(s->status(), 200) << s->error();
    auto start = s->Next(milliseconds(10000));
    EXPECT_TRUE(start.has_value()) << s->error();
    if (start) {
      EXPECT_EQ(Str(*start, "type"), "start") << json::serialize(*start);
      *exec_id = Str(*start, "execId");
    }
    return s;
  }
  // A GET .../execs?all=1 entry.
  std::optional<json::object> Listed(const std::string& exec_id) {
    Response r = client().Get(SbPath(id_, "/execs?all=1"));
    EXPECT_EQ(r.status, 200) << r.Describe();
    for (const auto& e : Arr(r, "execs")) {
      if (e.is_object() && Str(e.as_object(), "execId") == exec_id) return e.as_object();
    }
    return std::nullopt;
  }
};

// Appends a stream's output events to `out`, checking that each starts where the last ended;
// returns the exit event if one came.
std::optional<json::object> Collect(const std::vector<json::object>& events, uint64_t* next,
                                    std::string* out) {
  std::optional<json::object> exit;
  for (const auto& e : events) {
    const std::string type = Str(e, "type");
    if (type == "stdout" || type == "stderr") {
      EXPECT_EQ(Int(e, "offset"), static_cast<int64_t>(*next)) << json::serialize(e);
      const std::string data = Str(e, "data");
      *out += data;
      *next += data.size();
    } else if (type == "exit") {
      exit = e;
    }
  }
  return exit;
}

TEST_F(AttachTest, ReattachTwiceLosesAndRepeatsNoLine) {
  // ~3 s of numbered lines, 10 ms apart; the starter and two re-attaches hang up mid-way.
  std::string exec_id;
  auto s =
      Start(json::object{{"command", "for i in $(seq 1 250); do echo line$i; sleep 0.01; done"},
                         {"detach", true}},
            &exec_id);
  ASSERT_FALSE(exec_id.empty());
  std::string out;
  uint64_t next = 0;
  for (int got = 0; got < 20;) {
    auto e = s->Next(milliseconds(10000));
    ASSERT_TRUE(e.has_value()) << s->error();
    got += Collect({*e}, &next, &out) ? 100 : 1;
  }
  s->Close();
  for (int round = 0; round < 2; ++round) {
    std::this_thread::sleep_for(milliseconds(400));
    NdjsonStream r(daemon().endpoint(), "GET",
                   OutputPath(exec_id, "?follow=1&offset=" + std::to_string(next)), "");
    ASSERT_EQ(r.status(), 200) << r.error() << r.ReadRest();
    auto start = r.Next(milliseconds(10000));
    ASSERT_TRUE(start.has_value()) << r.error();
    EXPECT_EQ(Str(*start, "type"), "start");
    for (int got = 0; got < 20; ++got) {
      auto e = r.Next(milliseconds(10000));
      ASSERT_TRUE(e.has_value()) << r.error();
      ASSERT_FALSE(Collect({*e}, &next, &out).has_value()) << "ended too soon";
    }
    r.Close();
  }
  NdjsonStream last(daemon().endpoint(), "GET",
                    OutputPath(exec_id, "?follow=1&offset=" + std::to_string(next)), "");
  ASSERT_EQ(last.status(), 200) << last.error();
  auto exit = Collect(last.ReadAll(milliseconds(20000)), &next, &out);
  ASSERT_TRUE(exit.has_value()) << last.error();
  EXPECT_EQ(Int(*exit, "exitCode"), 0) << json::serialize(*exit);
  std::string want;
  for (int i = 1; i <= 250; ++i) want += "line" + std::to_string(i) + "\n";
  EXPECT_EQ(out, want);
}

// A character whose bytes the other stream's output splits (issue 44): the text event that
// carries it says where its bytes start and end, and a re-attach at the greatest `end` received
// sends it whole, once. Control: base64 shows where each byte of the log is.
TEST_F(AttachTest, ACharacterSplitByTheOtherStreamGoesWholeAndReattachesExactly) {
  std::string exec_id;
  auto s = Start(json::object{{"command",
                               "printf 'ab\\342\\202'; sleep 0.2; echo err >&2; sleep 0.2; "
                               "printf '\\254\\n'"},
                              {"detach", true}},
                 &exec_id);
  ASSERT_FALSE(exec_id.empty());
  auto events = [](const std::vector<json::object>& all) {
    std::vector<std::string> out;
    for (const auto& e : all) {
      const std::string type = Str(e, "type");
      if (type != "stdout" && type != "stderr") continue;
      out.push_back(type + "@" + std::to_string(Int(e, "offset")) + "-" +
                    std::to_string(Int(e, "end")) + ":" +
                    (e.contains("data") ? Str(e, "data") : Str(e, "dataBase64")));
    }
    return out;
  };
  const std::string euro = "\xe2\x82\xac";
  EXPECT_EQ(events(s->ReadAll(milliseconds(20000))),
            (std::vector<std::string>{"stdout@0-2:ab", "stderr@4-8:err\n",
                                      "stdout@2-10:" + euro + "\n"}));
  auto reattach = [&](const std::string& query) {
    NdjsonStream r(daemon().endpoint(), "GET", OutputPath(exec_id, query), "");
    EXPECT_EQ(r.status(), 200) << r.error();
    return events(r.ReadAll(milliseconds(20000)));
  };
  // After the second event: the greatest end is 8.
  EXPECT_EQ(reattach("?offset=8"), (std::vector<std::string>{"stdout@2-10:" + euro + "\n"}));
  // After the first: 2.
  EXPECT_EQ(reattach("?offset=2"),
            (std::vector<std::string>{"stderr@4-8:err\n", "stdout@2-10:" + euro + "\n"}));
  EXPECT_EQ(reattach("?offset=10"), std::vector<std::string>{});
  EXPECT_EQ(reattach("?offset=8&encoding=base64"), (std::vector<std::string>{"stdout@8-10:rAo="}));
  EXPECT_EQ(
      reattach("?offset=0&encoding=base64"),
      (std::vector<std::string>{"stdout@0-4:YWLigg==", "stderr@4-8:ZXJyCg==", "stdout@8-10:rAo="}));
}

TEST_F(AttachTest, DetachedExecOutlivesItsStarterAndReattachGetsTheExit) {
  std::string exec_id;
  auto s =
      Start(json::object{{"command", "sleep 1; echo late; exit 3"}, {"detach", true}}, &exec_id);
  s->Close();
  std::this_thread::sleep_for(milliseconds(200));
  auto listed = Listed(exec_id);
  ASSERT_TRUE(listed.has_value());
  EXPECT_EQ(Str(*listed, "state"), "running") << json::serialize(*listed);
  NdjsonStream r(daemon().endpoint(), "GET", OutputPath(exec_id, "?follow=1"), "");
  ASSERT_EQ(r.status(), 200) << r.error();
  std::string out;
  uint64_t next = 0;
  auto exit = Collect(r.ReadAll(milliseconds(20000)), &next, &out);
  ASSERT_TRUE(exit.has_value()) << r.error();
  EXPECT_EQ(out, "late\n");
  EXPECT_EQ(Int(*exit, "exitCode"), 3);
  EXPECT_EQ(Str(*exit, "reason"), "exited");
  // Ended: listed with ?all=1 (state and exit), not in the plain list of running ones.
  listed = Listed(exec_id);
  ASSERT_TRUE(listed.has_value());
  EXPECT_EQ(Str(*listed, "state"), "exited");
  EXPECT_EQ(Int(*listed, "outputEnd"), 5);
  EXPECT_EQ(Int(Field(*listed, "exit").as_object(), "exitCode"), 3);
  EXPECT_EQ(client().Get(SbPath(id_, "/execs")).body.find(exec_id), std::string::npos);
  // Without follow, after the end: the output and the exit again.
  NdjsonStream again(daemon().endpoint(), "GET", OutputPath(exec_id, ""), "");
  out.clear();
  next = 0;
  EXPECT_TRUE(Collect(again.ReadAll(), &next, &out).has_value());
  EXPECT_EQ(out, "late\n");

  // A buffered detached exec: its starter hangs up mid-way, it still runs to its end.
  RawConnection raw(daemon().endpoint());
  const std::string body =
      json::serialize(json::object{{"command", "sleep 0.5; echo buffered"}, {"detach", true}});
  ASSERT_TRUE(raw.Send("POST " + SbPath(id_, "/exec") +
                       " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body));
  std::this_thread::sleep_for(milliseconds(200));
  raw.Close();
  Response list = client().Get(SbPath(id_, "/execs"));
  auto execs = Arr(list, "execs");
  ASSERT_EQ(execs.size(), 1u) << list.Describe();
  const std::string second = Str(execs[0].as_object(), "execId");
  NdjsonStream r2(daemon().endpoint(), "GET", OutputPath(second, "?follow=1"), "");
  out.clear();
  next = 0;
  exit = Collect(r2.ReadAll(milliseconds(20000)), &next, &out);
  ASSERT_TRUE(exit.has_value()) << r2.error();
  EXPECT_EQ(out, "buffered\n");
  EXPECT_EQ(Str(*exit, "reason"), "exited");
}

TEST_F(AttachTest, StopEndsExecsButKeepsTheirSessions) {
  std::string exec_id;
  auto s = Start(json::object{{"command", "echo before; sleep 1000"}, {"detach", true}}, &exec_id);
  auto before = s->Next(milliseconds(10000));
  ASSERT_TRUE(before.has_value()) << s->error();
  s->Close();
  Response stop = client().PostJson(SbPath(id_, "/stop"), json::object{});
  ASSERT_EQ(stop.status, 200) << stop.Describe();
  NdjsonStream r(daemon().endpoint(), "GET", OutputPath(exec_id, "?follow=1"), "");
  std::string out;
  uint64_t next = 0;
  auto exit = Collect(r.ReadAll(milliseconds(20000)), &next, &out);
  ASSERT_TRUE(exit.has_value()) << r.error();
  EXPECT_EQ(out, "before\n");
  EXPECT_EQ(Str(*exit, "reason"), "stopped");
}

TEST_F(AttachTest, ANeverReadingClientDoesNotHoldUpTheExec) {
  // The starter asks for a 20 MiB NDJSON stream and never reads a byte of it.
  RawConnection raw(daemon().endpoint());
  const std::string body =
      json::serialize(json::object{{"command", "head -c 20971520 /dev/zero; echo end >&2"}});
  ASSERT_TRUE(raw.Send("POST " + SbPath(id_, "/exec") +
                       " HTTP/1.1\r\nHost: x\r\nAccept: application/x-ndjson\r\n"
                       "Content-Type: application/json\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body));
  std::string exec_id;
  for (int i = 0; i < 100 && exec_id.empty(); ++i) {
    auto execs = Arr(client().Get(SbPath(id_, "/execs?all=1")), "execs");
    if (!execs.empty()) exec_id = Str(execs[0].as_object(), "execId");
    if (exec_id.empty()) std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_FALSE(exec_id.empty());
  // Another reader, from the end of what there is, sees the exit.
  const auto listed = Listed(exec_id);
  ASSERT_TRUE(listed.has_value());
  NdjsonStream r(daemon().endpoint(), "GET",
                 OutputPath(exec_id, "?follow=1&encoding=base64&offset=" +
                                         std::to_string(Int(*listed, "outputEnd"))),
                 "");
  ASSERT_EQ(r.status(), 200) << r.error();
  auto events = r.ReadAll(milliseconds(60000));
  ASSERT_FALSE(events.empty()) << r.error();
  EXPECT_EQ(Str(events.back(), "type"), "exit") << json::serialize(events.back());
  EXPECT_EQ(Str(events.back(), "reason"), "exited") << json::serialize(events.back());
  EXPECT_EQ(Int(*Listed(exec_id), "outputEnd"), 20971520 + 4);
  // The stalled connection is still open (nothing killed it) and the daemon serves others.
  EXPECT_TRUE(raw.connected());
  ExpectDaemonHealthy();
  raw.Close();
}

// Whether `path` exists, or comes to within `timeout`.
bool AppearsWithin(const std::string& path, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (::access(path.c_str(), F_OK) != 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

TEST_F(AttachTest, RingAndSpillKeepTheNewestBytesAndAreRemoved) {
  RestartWith({"--output-ring", "64K", "--output-spill", "256K", "--exec-retention", "2"});
  // A small exec never touches the disk.
  ExecResult small = Exec(id_, "echo small");
  ASSERT_EQ(small.exit_code(), 0) << small.Describe();
  const std::string execs_dir = daemon().SandboxDir(id_) + "/execs";
  EXPECT_FALSE(std::filesystem::exists(execs_dir) && !std::filesystem::is_empty(execs_dir));

  // ~1.3 MB of numbered lines: the buffered answer has all of it, the log the newest 320 KiB.
  ExecResult big = Exec(id_, "seq 1 200000");
  ASSERT_EQ(big.exit_code(), 0) << big.Describe();
  std::string want;
  for (int i = 1; i <= 200000; ++i) want += std::to_string(i) + "\n";
  ASSERT_EQ(big.out(), want);
  auto execs = Arr(client().Get(SbPath(id_, "/execs?all=1")), "execs");
  ASSERT_EQ(execs.size(), 2u);
  const json::object e = execs[1].as_object();
  const std::string exec_id = Str(e, "execId");
  const int64_t oldest = Int(e, "oldestOffset");
  EXPECT_EQ(Int(e, "outputEnd"), static_cast<int64_t>(want.size()));
  EXPECT_GT(oldest, 0);
  EXPECT_LE(static_cast<int64_t>(want.size()) - oldest, (64 + 256 + 64) * 1024) << oldest;
  EXPECT_GE(static_cast<int64_t>(want.size()) - oldest, 256 * 1024) << oldest;
  const std::string spill = execs_dir + "/" + exec_id + ".log";
  // Made by the daemon's spill thread, as soon as the ring overflowed.
  ASSERT_TRUE(AppearsWithin(spill, milliseconds(2000))) << spill;
  struct stat st {};
  ASSERT_EQ(::stat(spill.c_str(), &st), 0) << spill;
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  Response gone = client().Get(OutputPath(exec_id, "?offset=0"));
  EXPECT_EQ(gone.status, 410) << gone.Describe();
  EXPECT_EQ(gone.ErrorCode(), "offset_not_retained");
  EXPECT_NE(gone.ErrorMessage().find("the oldest kept offset is " + std::to_string(oldest)),
            std::string::npos)
      << gone.Describe();
  // Replay from the oldest kept offset: exactly the bytes of the output from there.
  NdjsonStream r(daemon().endpoint(), "GET",
                 OutputPath(exec_id, "?encoding=base64&offset=" + std::to_string(oldest)), "");
  ASSERT_EQ(r.status(), 200) << r.error();
  std::string replay;
  int64_t next = oldest;
  bool exited = false;
  for (const auto& ev : r.ReadAll()) {
    if (Str(ev, "type") == "exit") exited = true;
    if (Str(ev, "type") != "stdout") continue;
    EXPECT_EQ(Int(ev, "offset"), next);
    auto bytes = Base64Decode(Str(ev, "dataBase64"));
    ASSERT_TRUE(bytes.has_value());
    replay += *bytes;
    next += static_cast<int64_t>(bytes->size());
  }
  EXPECT_TRUE(exited);
  EXPECT_TRUE(replay == want.substr(static_cast<size_t>(oldest)))
      << replay.size() << " bytes, want " << want.size() - oldest;

  // Retention (2 s): then the session and its spill file are gone.
  for (int i = 0; i < 100 && ::access(spill.c_str(), F_OK) == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_NE(::access(spill.c_str(), F_OK), 0) << spill << " is still there";
  Response expired = client().Get(OutputPath(exec_id, ""));
  EXPECT_EQ(expired.status, 404) << expired.Describe();
  EXPECT_EQ(expired.ErrorCode(), "exec_not_found");

  // DELETE of the sandbox drops a retained session's spill file at once.
  ExecResult again = Exec(id_, "seq 1 200000");
  ASSERT_EQ(again.exit_code(), 0);
  auto after = Arr(client().Get(SbPath(id_, "/execs?all=1")), "execs");
  ASSERT_FALSE(after.empty());
  const std::string spill2 = execs_dir + "/" + Str(after.back().as_object(), "execId") + ".log";
  ASSERT_TRUE(AppearsWithin(spill2, milliseconds(2000))) << spill2;
  ASSERT_EQ(Delete(id_).status, 204);
  EXPECT_NE(::access(spill2.c_str(), F_OK), 0);
  EXPECT_EQ(client().Get(OutputPath(Str(after.back().as_object(), "execId"), "")).status, 404);
}

// The buffered answer takes the output as it arrives, not from the log: with a ring and a spill
// far smaller than the output, what left both between two of its reads was missing from an
// answer that said "truncated": false (3.2 MB of 4.8 in one run, an empty stdout in another).
TEST_F(AttachTest, TheBufferedAnswerIsWholeHoweverLittleTheLogKeeps) {
  RestartWith({"--output-ring", "4096", "--output-spill", "0"});
  std::string want_out, want_err;
  for (int i = 1; i <= 300000; ++i) want_out += std::to_string(i) + "\n";
  for (int i = 1; i <= 50000; ++i) want_err += std::to_string(i) + "\n";
  for (int run = 0; run < 3; ++run) {
    ExecResult r = Exec(id_, "seq 1 300000; seq 1 50000 >&2; seq 1 300000");
    ASSERT_EQ(r.exit_code(), 0) << r.Describe();
    EXPECT_EQ(r.out().size(), 2 * want_out.size()) << "run " << run;
    EXPECT_TRUE(r.out() == want_out + want_out) << "run " << run;
    EXPECT_TRUE(r.err() == want_err) << "run " << run << ": " << r.err().size() << " bytes";
    EXPECT_FALSE(r.answer.at("truncated").as_bool());
  }
}

TEST_F(AttachTest, LeftoverSpillFilesAreRemovedAtStart) {
  RestartWith({"--output-ring", "4096", "--output-spill", "1M"});
  std::string exec_id;
  auto s = Start(json::object{{"command", "seq 1 100000; sleep 1000"}, {"detach", true}}, &exec_id);
  s->Close();
  const std::string spill = daemon().SandboxDir(id_) + "/execs/" + exec_id + ".log";
  ASSERT_TRUE(AppearsWithin(spill, milliseconds(5000))) << spill;
  daemon().Kill();  // no clean shutdown: the file stays behind
  ASSERT_EQ(::access(spill.c_str(), F_OK), 0) << spill;
  ASSERT_TRUE(daemon().Restart()) << daemon().error();
  client().Disconnect();
  EXPECT_NE(::access(spill.c_str(), F_OK), 0) << spill;
  EXPECT_EQ(client().Get(OutputPath(exec_id, "")).status, 404);
}

TEST_F(AttachTest, EndedSessionsKeepABoundedRingInMemoryAndLoseNoByte) {
  // Each ended exec keeps its newest output (its 2 MiB ring) in memory for re-attach, for the
  // retention time; over 64 MiB of such rings in all, those of the execs that ended first move to
  // their spill files. 100 execs of 2.3 MB each: without the bound the daemon grew by about
  // 200 MB and kept it for the retention's 10 minutes.
  std::string want;
  for (int i = 1; i <= 350000; ++i) want += std::to_string(i) + "\n";
  const long before = RssKib(daemon().pid());
  ASSERT_GT(before, 0);
  for (int i = 0; i < 100; ++i) {
    ExecResult r = Exec(id_, "seq 1 350000");
    ASSERT_EQ(r.exit_code(), 0) << r.Describe();
    ASSERT_EQ(r.out().size(), want.size());
  }
  const long grown = RssKib(daemon().pid()) - before;
  EXPECT_LT(grown, 110 * 1024) << "the daemon grew by " << grown << " KiB";

  // Every byte of the first exec (its ring on disk now) and of the last (in memory) is there.
  auto execs = Arr(client().Get(SbPath(id_, "/execs?all=1")), "execs");
  ASSERT_EQ(execs.size(), 100u);
  for (size_t i : {size_t{0}, execs.size() - 1}) {
    const std::string exec_id = Str(execs[i].as_object(), "execId");
    EXPECT_EQ(Int(execs[i].as_object(), "oldestOffset"), 0) << exec_id;
    NdjsonStream r(daemon().endpoint(), "GET", OutputPath(exec_id, "?encoding=base64"), "");
    ASSERT_EQ(r.status(), 200) << r.error();
    std::string replay;
    for (const auto& ev : r.ReadAll()) {
      if (Str(ev, "type") != "stdout") continue;
      EXPECT_EQ(Int(ev, "offset"), static_cast<int64_t>(replay.size()));
      auto bytes = Base64Decode(Str(ev, "dataBase64"));
      ASSERT_TRUE(bytes.has_value());
      replay += *bytes;
    }
    EXPECT_TRUE(replay == want) << exec_id << ": " << replay.size() << " bytes of " << want.size();
  }
}

TEST_F(AttachTest, StdinStreamFedInPiecesThenClosed) {
  std::string exec_id;
  auto s =
      Start(json::object{{"command", "cat"}, {"stdinStream", true}, {"stdin", "zero\n"}}, &exec_id);
  ASSERT_FALSE(exec_id.empty());
  std::string want = "zero\n";
  for (int i = 1; i <= 3; ++i) {
    // The third piece is larger than one protocol frame (256 KiB): relayed in pieces.
    std::string piece = i < 3 ? "piece " + std::to_string(i) + "\n" : std::string(700000, 'x');
    want += piece;
    Response r = client().Request("POST", ExecPath(exec_id, "/stdin"), piece);
    EXPECT_EQ(r.status, 204) << r.Describe();
  }
  Response close = client().Request("POST", ExecPath(exec_id, "/stdin?close=1"), "");
  EXPECT_EQ(close.status, 204) << close.Describe();
  std::string out;
  uint64_t next = 0;
  auto exit = Collect(s->ReadAll(milliseconds(20000)), &next, &out);
  ASSERT_TRUE(exit.has_value()) << s->error();
  EXPECT_EQ(Int(*exit, "exitCode"), 0);
  EXPECT_TRUE(out == want) << out.size() << " bytes, want " << want.size();
  // Input to an ended exec.
  Response late = client().Request("POST", ExecPath(exec_id, "/stdin"), "more");
  EXPECT_EQ(late.status, 409) << late.Describe();
  EXPECT_EQ(late.ErrorCode(), "exec_ended");
}

TEST_F(AttachTest, StdinClosedAndNotStreamed) {
  std::string exec_id;
  auto s = Start(json::object{{"command", "cat; sleep 1000"}, {"stdinStream", true}}, &exec_id);
  Response close = client().Request("POST", ExecPath(exec_id, "/stdin?close=1"), "last");
  EXPECT_EQ(close.status, 204) << close.Describe();
  Response again = client().Request("POST", ExecPath(exec_id, "/stdin"), "more");
  EXPECT_EQ(again.status, 409) << again.Describe();
  EXPECT_EQ(again.ErrorCode(), "stdin_closed");
  auto e = s->Next(milliseconds(10000));
  ASSERT_TRUE(e.has_value()) << s->error();
  EXPECT_EQ(Str(*e, "data"), "last");
  s->Close();

  std::string plain;
  auto p = Start(json::object{{"command", "sleep 1000"}}, &plain);
  Response refused = client().Request("POST", ExecPath(plain, "/stdin"), "x");
  EXPECT_EQ(refused.status, 409) << refused.Describe();
  EXPECT_EQ(refused.ErrorCode(), "stdin_not_streamed");
  Response resize =
      client().PostJson(ExecPath(plain, "/resize"), json::object{{"rows", 10}, {"cols", 10}});
  EXPECT_EQ(resize.status, 409) << resize.Describe();
  EXPECT_EQ(resize.ErrorCode(), "not_a_terminal");
  Response unknown = client().Request("POST", ExecPath("e-000000000000", "/stdin"), "x");
  EXPECT_EQ(unknown.status, 404) << unknown.Describe();
  EXPECT_EQ(unknown.ErrorCode(), "exec_not_found");
  p->Close();
}

// A write into stdin that is held up by a full pipe when the command exits is told the exec
// ended, not that the command closed its stdin (it never did).
TEST_F(AttachTest, InputThatOutlivesTheCommandIsToldTheExecEnded) {
  std::string exec_id;
  auto s = Start(json::object{{"command", "sleep 1"}, {"stdinStream", true}}, &exec_id);
  Response r = client().Request("POST", ExecPath(exec_id, "/stdin"), std::string(10 << 20, 'x'));
  EXPECT_EQ(r.status, 409) << r.Describe();
  EXPECT_EQ(r.ErrorCode(), "exec_ended") << r.Describe();
  s->Close();
}

TEST_F(AttachTest, TerminalExecSizeAndResize) {
  std::string exec_id;
  auto s = Start(json::object{{"command", "stty size; read x; stty size; echo \"got $x\""},
                              {"tty", json::object{{"rows", 33}, {"cols", 101}}}},
                 &exec_id);
  auto first = s->Next(milliseconds(10000));
  ASSERT_TRUE(first.has_value()) << s->error();
  EXPECT_EQ(Str(*first, "data"), "33 101\r\n");
  Response bad =
      client().PostJson(ExecPath(exec_id, "/resize"), json::object{{"rows", 0}, {"cols", 80}});
  EXPECT_EQ(bad.status, 400) << bad.Describe();
  EXPECT_NE(bad.ErrorMessage().find("not 0"), std::string::npos) << bad.Describe();
  Response huge =
      client().PostJson(ExecPath(exec_id, "/resize"), json::object{{"rows", 20}, {"cols", 100000}});
  EXPECT_EQ(huge.status, 400) << huge.Describe();
  Response ok =
      client().PostJson(ExecPath(exec_id, "/resize"), json::object{{"rows", 50}, {"cols", 132}});
  EXPECT_EQ(ok.status, 204) << ok.Describe();
  Response in = client().Request("POST", ExecPath(exec_id, "/stdin"), "hello\n");
  EXPECT_EQ(in.status, 204) << in.Describe();
  std::string out;
  for (const auto& e : s->ReadAll(milliseconds(20000))) out += Str(e, "data");
  EXPECT_NE(out.find("50 132\r\n"), std::string::npos) << out;
  EXPECT_NE(out.find("got hello"), std::string::npos) << out;
}

TEST_F(AttachTest, BadInputForEveryNewParameter) {
  auto expect = [&](const Response& r, int status, std::string_view code, std::string_view what) {
    EXPECT_EQ(r.status, status) << what << ": " << r.Describe();
    EXPECT_EQ(r.ErrorCode(), code) << what << ": " << r.Describe();
  };
  const std::string exec_path = SbPath(id_, "/exec");
  for (const json::object& body :
       {json::object{{"command", "true"}, {"detach", "yes"}},
        json::object{{"command", "true"}, {"stdinStream", 1}},
        json::object{{"command", "true"}, {"tty", "big"}},
        json::object{{"command", "true"}, {"tty", json::object{{"rows", 0}, {"cols", 80}}}},
        json::object{{"command", "true"}, {"tty", json::object{{"rows", 24}, {"cols", 4097}}}},
        json::object{{"command", "true"}, {"tty", json::object{{"rows", 24}}}},
        json::object{{"command", "true"}, {"tty", json::object{{"rows", 2.5}, {"cols", 80}}}}}) {
    expect(client().PostJson(exec_path, body), 400, "invalid_request", json::serialize(body));
  }
  Response tty0 = client().PostJson(
      exec_path,
      json::object{{"command", "true"}, {"tty", json::object{{"rows", 0}, {"cols", 8}}}});
  EXPECT_NE(tty0.ErrorMessage().find("\"rows\""), std::string::npos) << tty0.Describe();
  EXPECT_NE(tty0.ErrorMessage().find("not 0"), std::string::npos) << tty0.Describe();

  ExecResult done = Exec(id_, "printf 12345");
  ASSERT_EQ(done.exit_code(), 0);
  const std::string exec_id =
      Str(Arr(client().Get(SbPath(id_, "/execs?all=1")), "execs")[0].as_object(), "execId");
  for (const char* q : {"?offset=-1", "?offset=abc", "?offset=", "?offset=1e3",
                        "?offset=99999999999999999999", "?follow=maybe", "?encoding=latin1"}) {
    expect(client().Get(OutputPath(exec_id, q)), 400, "invalid_request", q);
  }
  Response beyond = client().Get(OutputPath(exec_id, "?offset=6"));
  expect(beyond, 400, "invalid_request", "beyond");
  EXPECT_NE(beyond.ErrorMessage().find("6"), std::string::npos);
  EXPECT_NE(beyond.ErrorMessage().find("5"), std::string::npos);
  Response at_end = client().Get(OutputPath(exec_id, "?offset=5"));
  EXPECT_EQ(at_end.status, 200) << at_end.Describe();
  expect(client().Get(OutputPath("e-nope", "")), 404, "exec_not_found", "unknown exec");
  expect(client().Get(SbPath("no-such-sandbox", "/execs/e-1/output")), 404, "sandbox_not_found",
         "unknown sandbox");
  expect(client().Request("PUT", OutputPath(exec_id, "")), 405, "method_not_allowed", "PUT");
  expect(client().Get(ExecPath(exec_id, "/stdin")), 405, "method_not_allowed", "GET stdin");
  expect(client().Request("POST", ExecPath(exec_id, "/stdin?close=2"), ""), 400, "invalid_request",
         "close=2");
  expect(client().PostJson(ExecPath(exec_id, "/resize"), json::object{{"rows", "x"}, {"cols", 1}}),
         400, "invalid_request", "resize rows x");
  // A fraction is shown as written, not as Boost.JSON's 5.5E0.
  Response fraction =
      client().PostJson(ExecPath(exec_id, "/resize"), json::object{{"rows", 5.5}, {"cols", 10}});
  expect(fraction, 400, "invalid_request", "resize rows 5.5");
  EXPECT_NE(fraction.ErrorMessage().find("not 5.5"), std::string::npos) << fraction.Describe();
  // Keys a body does not take are refused, as everywhere (daemon.md).
  Response extra = client().PostJson(ExecPath(exec_id, "/resize"),
                                     json::object{{"rows", 5}, {"cols", 10}, {"x", 1}});
  expect(extra, 400, "invalid_request", "resize with x");
  EXPECT_NE(extra.ErrorMessage().find("\"x\""), std::string::npos) << extra.Describe();
  Response tty_extra = client().PostJson(
      SbPath(id_, "/exec"),
      json::object{{"command", "true"}, {"tty", json::object{{"rows", 5}, {"cols", 5}, {"z", 1}}}});
  expect(tty_extra, 400, "invalid_request", "tty with z");
  // Flags are 1/0 (true/false) everywhere; anything else is refused, not taken for 0.
  for (const char* q : {"?all=yes", "?all=2"}) {
    expect(client().Get(SbPath(id_, std::string("/execs") + q)), 400, "invalid_request", q);
  }
  EXPECT_EQ(client().Get(SbPath(id_, "/execs?all=true")).status, 200);
  expect(client().Request("POST", ExecPath(exec_id, "/resize"), "not json"), 400, "invalid_request",
         "resize not json");
  // The WebSocket routes without Upgrade.
  expect(client().Get(ExecPath(exec_id, "/attach")), 426, "upgrade_required", "attach");
  expect(client().Get(SbPath(id_, "/exec")), 405, "method_not_allowed", "GET exec");
}

// ---- the WebSocket ----

TEST_F(AttachTest, WebSocketExecWithPipeOutput) {
  WsClient ws(daemon().socket_path(), SbPath(id_, "/exec"));
  ASSERT_TRUE(ws.ok()) << ws.error();
  ASSERT_TRUE(ws.SendJson(json::object{{"command", "echo out; echo err >&2; exit 4"}}));
  std::string out[3];
  auto start = ws.NextControl(out);
  ASSERT_TRUE(start.has_value()) << ws.error();
  EXPECT_EQ(Str(*start, "type"), "start") << json::serialize(*start);
  const std::string exec_id = Str(*start, "execId");
  auto exit = ws.NextControl(out);
  ASSERT_TRUE(exit.has_value()) << ws.error();
  EXPECT_EQ(Str(*exit, "type"), "exit") << json::serialize(*exit);
  EXPECT_EQ(Int(*exit, "exitCode"), 4);
  EXPECT_EQ(out[1], "out\n");
  EXPECT_EQ(out[2], "err\n");
  EXPECT_FALSE(ws.Read().has_value());
  EXPECT_TRUE(ws.closed()) << ws.error();
  EXPECT_EQ(ws.close_code(), 1000);

  // Attach to the retained exec from an offset: the replay, then the exit.
  WsClient at(daemon().socket_path(), ExecPath(exec_id, "/attach?offset=2"));
  ASSERT_TRUE(at.ok()) << at.error();
  std::string again[3];
  auto s2 = at.NextControl(again);
  ASSERT_TRUE(s2.has_value()) << at.error();
  EXPECT_EQ(Str(*s2, "type"), "start");
  auto e2 = at.NextControl(again);
  ASSERT_TRUE(e2.has_value()) << at.error();
  EXPECT_EQ(Str(*e2, "type"), "exit");
  EXPECT_EQ(again[1] + again[2], "t\nerr\n");
  // Attach errors are HTTP answers before the upgrade.
  WsClient bad(daemon().socket_path(), ExecPath(exec_id, "/attach?offset=99"));
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status(), 400) << bad.body();
  WsClient none(daemon().socket_path(), ExecPath("e-nope", "/attach"));
  EXPECT_FALSE(none.ok());
  EXPECT_EQ(none.status(), 404) << none.body();
}

TEST_F(AttachTest, WebSocketStdinEchoAndControlMessages) {
  WsClient ws(daemon().socket_path(), SbPath(id_, "/exec"));
  ASSERT_TRUE(ws.ok()) << ws.error();
  ASSERT_TRUE(ws.SendJson(json::object{{"command", "cat"}}));
  std::string out[3];
  auto start = ws.NextControl(out);
  ASSERT_TRUE(start.has_value()) << ws.error();
  ASSERT_EQ(Str(*start, "type"), "start");
  // Bad control messages: an error each, and the connection stays.
  ASSERT_TRUE(ws.Send(std::string("\x07oops", 5), false));
  auto e1 = ws.NextControl(out);
  ASSERT_TRUE(e1.has_value()) << ws.error();
  EXPECT_EQ(Str(*e1, "type"), "error") << json::serialize(*e1);
  EXPECT_NE(json::serialize(*e1).find("channel 7"), std::string::npos) << json::serialize(*e1);
  ASSERT_TRUE(ws.SendJson(json::object{{"type", "resize"}, {"rows", 0}, {"cols", 80}}));
  auto e2 = ws.NextControl(out);
  ASSERT_TRUE(e2.has_value()) << ws.error();
  EXPECT_EQ(Str(*e2, "type"), "error") << json::serialize(*e2);
  ASSERT_TRUE(ws.SendJson(json::object{{"type", "resize"}, {"rows", 10}, {"cols", 80}}));
  auto e3 = ws.NextControl(out);
  ASSERT_TRUE(e3.has_value()) << ws.error();
  EXPECT_NE(json::serialize(*e3).find("not_a_terminal"), std::string::npos) << json::serialize(*e3);
  ASSERT_TRUE(ws.Send("{nope", true));
  auto e4 = ws.NextControl(out);
  ASSERT_TRUE(e4.has_value()) << ws.error();
  EXPECT_EQ(Str(*e4, "type"), "error");
  // stdin on channel 0, echoed by cat; then stdin-close ends it.
  ASSERT_TRUE(ws.Send(std::string("\0hello socket\n", 14), false));
  ASSERT_TRUE(ws.SendJson(json::object{{"type", "stdin-close"}}));
  auto exit = ws.NextControl(out);
  ASSERT_TRUE(exit.has_value()) << ws.error();
  EXPECT_EQ(Str(*exit, "type"), "exit") << json::serialize(*exit);
  EXPECT_EQ(Int(*exit, "exitCode"), 0);
  EXPECT_EQ(out[1], "hello socket\n");
}

// The server's first message is the start, even when a bad message came before the command
// started: its error follows the start (docs/exec.md "WebSocket").
TEST_F(AttachTest, WebSocketStartComesBeforeTheAnswerToAnEarlyBadMessage) {
  for (int round = 0; round < 5; ++round) {
    WsClient ws(daemon().socket_path(), SbPath(id_, "/exec"));
    ASSERT_TRUE(ws.ok()) << ws.error();
    ASSERT_TRUE(ws.SendJson(json::object{{"command", "sleep 0.3; echo x"}}));
    ASSERT_TRUE(ws.Send(std::string("\x07zz", 3), false));
    std::string out[3];
    auto first = ws.NextControl(out);
    ASSERT_TRUE(first.has_value()) << ws.error();
    EXPECT_EQ(Str(*first, "type"), "start") << json::serialize(*first);
    auto second = ws.NextControl(out);
    ASSERT_TRUE(second.has_value()) << ws.error();
    EXPECT_EQ(Str(*second, "type"), "error") << json::serialize(*second);
    auto exit = ws.NextControl(out);
    ASSERT_TRUE(exit.has_value()) << ws.error();
    EXPECT_EQ(Str(*exit, "type"), "exit") << json::serialize(*exit);
    EXPECT_EQ(out[1], "x\n");
  }
}

TEST_F(AttachTest, WebSocketTerminalAndHangUpKillsUnlessDetached) {
  WsClient ws(daemon().socket_path(), SbPath(id_, "/exec"));
  ASSERT_TRUE(ws.ok()) << ws.error();
  ASSERT_TRUE(ws.SendJson(json::object{{"command", "stty size; sleep 1000"},
                                       {"tty", json::object{{"rows", 7}, {"cols", 9}}}}));
  std::string out[3];
  auto start = ws.NextControl(out);
  ASSERT_TRUE(start.has_value()) << ws.error();
  const std::string exec_id = Str(*start, "execId");
  for (int i = 0; i < 100 && out[1].find("\n") == std::string::npos; ++i) {
    auto m = ws.Read(milliseconds(10000));
    ASSERT_TRUE(m.has_value()) << ws.error();
    if (!m->text) out[static_cast<int>(m->data[0])] += m->data.substr(1);
  }
  EXPECT_EQ(out[1], "7 9\r\n");
  ws.Drop();  // the starter hangs up: killed
  NdjsonStream r(daemon().endpoint(), "GET", OutputPath(exec_id, "?follow=1"), "");
  auto events = r.ReadAll(milliseconds(20000));
  ASSERT_FALSE(events.empty()) << r.error();
  EXPECT_EQ(Str(events.back(), "reason"), "cancelled") << json::serialize(events.back());

  WsClient d(daemon().socket_path(), SbPath(id_, "/exec"));
  ASSERT_TRUE(d.ok()) << d.error();
  ASSERT_TRUE(d.SendJson(json::object{{"command", "sleep 1; echo still"}, {"detach", true}}));
  auto dstart = d.NextControl(out);
  ASSERT_TRUE(dstart.has_value()) << d.error();
  const std::string detached = Str(*dstart, "execId");
  d.Drop();
  // An attach socket that hangs up never kills either.
  {
    WsClient a(daemon().socket_path(), ExecPath(detached, "/attach"));
    ASSERT_TRUE(a.ok()) << a.error();
    a.Drop();
  }
  NdjsonStream r2(daemon().endpoint(), "GET", OutputPath(detached, "?follow=1"), "");
  auto ev2 = r2.ReadAll(milliseconds(20000));
  ASSERT_FALSE(ev2.empty()) << r2.error();
  EXPECT_EQ(Str(ev2.back(), "reason"), "exited") << json::serialize(ev2.back());
}

TEST_F(AttachTest, WebSocketOverTcpNeedsTheToken) {
  const std::string token = "s3cret-token-0123456789abcdef";
  const std::string token_file = daemon().dir() + "/token";
  FILE* f = std::fopen(token_file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(token.c_str(), f);
  std::fclose(f);
  const uint16_t port = FreeTcpPort();
  RestartWith({"--listen", "127.0.0.1:" + std::to_string(port), "--token-file", token_file});
  const Headers upgrade = {{"Connection", "Upgrade"},
                           {"Upgrade", "websocket"},
                           {"Sec-WebSocket-Version", "13"},
                           {"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}};
  Client none(Endpoint::Tcp("127.0.0.1", port));
  Response refused = none.Request("GET", SbPath(id_, "/exec"), "", upgrade);
  EXPECT_EQ(refused.status, 401) << refused.Describe();
  EXPECT_EQ(refused.ErrorCode(), "unauthorized");
  Client with(Endpoint::Tcp("127.0.0.1", port), token);
  Response accepted = with.Request("GET", SbPath(id_, "/exec"), "", upgrade, milliseconds(5000));
  EXPECT_EQ(accepted.status, 101) << accepted.Describe();
  EXPECT_EQ(accepted.Header("sec-websocket-accept"), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
      << accepted.Describe();
}

TEST_F(AttachTest, WebSocketMessageOverOneMebibyteCloses1009) {
  WsClient ws(daemon().socket_path(), SbPath(id_, "/exec"));
  ASSERT_TRUE(ws.ok()) << ws.error();
  ASSERT_TRUE(ws.SendJson(json::object{{"command", "sleep 1000"}}));
  std::string out[3];
  auto start = ws.NextControl(out);
  ASSERT_TRUE(start.has_value()) << ws.error();
  (void)ws.Send(std::string(1, '\0') + std::string((1u << 20) + 10, 'x'), false);
  for (int i = 0; i < 10; ++i) {
    if (!ws.Read(milliseconds(10000)).has_value()) break;
  }
  EXPECT_EQ(ws.close_code(), 1009) << ws.error();
  // Its starter is gone: the exec was killed.
  const std::string exec_id = Str(*start, "execId");
  NdjsonStream r(daemon().endpoint(), "GET", OutputPath(exec_id, "?follow=1"), "");
  auto events = r.ReadAll(milliseconds(20000));
  ASSERT_FALSE(events.empty()) << r.error();
  EXPECT_EQ(Str(events.back(), "reason"), "cancelled");
  // A first message that is not an exec body: an error, then the socket closes.
  WsClient bad(daemon().socket_path(), SbPath(id_, "/exec"));
  ASSERT_TRUE(bad.ok()) << bad.error();
  ASSERT_TRUE(bad.SendJson(json::object{{"command", 5}}));
  auto err = bad.NextControl(out);
  ASSERT_TRUE(err.has_value()) << bad.error();
  EXPECT_EQ(Str(*err, "type"), "error");
  EXPECT_FALSE(bad.Read().has_value());
  EXPECT_EQ(bad.close_code(), 1008);
}

}  // namespace
}  // namespace nsbox::e2e
