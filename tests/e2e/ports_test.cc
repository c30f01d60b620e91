// Exposed ports (docs/network.md "Ports"): a host listener relaying each connection byte for
// byte to 127.0.0.1:<port> inside the sandbox (network "none": loopback only), its errors, its
// life with the sandbox (stop keeps it, DELETE closes it) and with the daemon (restart re-opens
// it). The server inside is busybox's nc running cat per connection: an echo.

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>

#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr const char* kEcho = "busybox nc -ll -p 3000 -e cat </dev/null >/dev/null 2>&1 &";

int ConnectTo(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // SAFETY: sockaddr_in is the sockaddr of an AF_INET socket.
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

// Sends `data` on a new connection to `port`, half-closes, reads until the end: what came back,
// or nullopt when the connection failed (*why says how).
std::optional<std::string> RoundTrip(uint16_t port, const std::string& data, std::string* why) {
  int fd = ConnectTo(port);
  if (fd < 0) {
    *why = std::string("connect: ") + std::strerror(errno);
    return std::nullopt;
  }
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  std::thread writer([fd, &data] {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    shutdown(fd, SHUT_WR);
  });
  std::string got;
  char buf[65536];
  bool failed = false;
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0) break;
    if (n < 0) {
      *why = std::string("recv: ") + std::strerror(errno);
      failed = true;
      break;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  writer.join();
  close(fd);
  if (failed) return std::nullopt;
  return got;
}

class PortsTest : public E2eTest {
 protected:
  Response Expose(std::string_view id, const json::object& body) {
    return client().PostJson(SbPath(id, "/ports"), body);
  }
  // Exposes port 3000 of `id`; its host port (0 on failure).
  uint16_t ExposeEcho(std::string_view id) {
    Response r = Expose(id, json::object{{"port", 3000}});
    EXPECT_EQ(r.status, 201) << r.Describe();
    auto o = Obj(r);
    return o.contains("hostPort") ? static_cast<uint16_t>(o.at("hostPort").to_number<int>()) : 0;
  }
  // Starts the echo server inside and waits (up to 10 s) until a round trip through `host_port`
  // works.
  void StartEchoAndWait(std::string_view id, uint16_t host_port) {
    Sh(id, kEcho);
    const auto t0 = Clock::now();
    std::string why;
    while (Clock::now() - t0 < std::chrono::seconds(10)) {
      auto got = RoundTrip(host_port, "ping", &why);
      if (got && *got == "ping") return;
      std::this_thread::sleep_for(milliseconds(100));
    }
    ADD_FAILURE() << "the echo server never answered through port " << host_port << ": " << why;
  }
};

TEST_F(PortsTest, RelaysSeveralMebibytesBothWaysAndCountsThem) {
  const std::string id = NewId();
  Create(id);
  Response r = Expose(id, json::object{{"port", 3000}});
  ASSERT_EQ(r.status, 201) << r.Describe();
  auto o = Obj(r);
  EXPECT_EQ(o.at("port").to_number<int>(), 3000);
  EXPECT_EQ(Str(o, "address"), "127.0.0.1");
  const auto host_port = static_cast<uint16_t>(o.at("hostPort").to_number<int>());
  ASSERT_GT(host_port, 0);
  EXPECT_EQ(Str(o, "url"), "http://127.0.0.1:" + std::to_string(host_port) + "/");
  StartEchoAndWait(id, host_port);

  std::string data(6u << 20, '\0');
  std::mt19937 rng(9);
  for (auto& ch : data) ch = static_cast<char>(rng());
  std::string why;
  auto got = RoundTrip(host_port, data, &why);
  ASSERT_TRUE(got) << why;
  EXPECT_EQ(got->size(), data.size());
  EXPECT_TRUE(*got == data) << "the bytes that came back differ";

  // Two connections at once, both served (no head-of-line blocking between them).
  int a = ConnectTo(host_port);
  ASSERT_GE(a, 0);
  auto second = RoundTrip(host_port, "second", &why);
  ASSERT_TRUE(second) << why;
  EXPECT_EQ(*second, "second");
  close(a);

  Response m = client().Get("/metrics");
  EXPECT_NE(m.body.find("nsbox_ports_exposed 1\n"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("nsbox_port_connections_total "), std::string::npos);

  Response list = client().Get(SbPath(id, "/ports"));
  ASSERT_EQ(list.status, 200) << list.Describe();
  auto ports = Arr(list, "ports");
  ASSERT_EQ(ports.size(), 1u);
  EXPECT_EQ(ports[0].as_object().at("hostPort").to_number<int>(), host_port);
}

TEST_F(PortsTest, NothingListeningInsideClosesTheConnectionAtOnce) {
  const std::string id = NewId();
  Create(id);
  const uint16_t host_port = ExposeEcho(id);
  ASSERT_GT(host_port, 0);
  const auto t0 = Clock::now();
  std::string why;
  auto got = RoundTrip(host_port, "hello", &why);
  EXPECT_TRUE(!got || got->empty()) << "bytes came back from nowhere: " << *got;
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
}

TEST_F(PortsTest, ErrorsSayWhatIsWrong) {
  const std::string id = NewId();
  Create(id);
  auto expect = [&](const json::object& body, int status, const std::string& code,
                    const std::string& in_message) {
    Response r = Expose(id, body);
    EXPECT_EQ(r.status, status) << json::serialize(body) << " -> " << r.Describe();
    EXPECT_EQ(r.ErrorCode(), code) << r.Describe();
    EXPECT_NE(r.ErrorMessage().find(in_message), std::string::npos) << r.Describe();
  };
  expect(json::object{{"port", 0}}, 400, "invalid_request", "0");
  expect(json::object{{"port", 70000}}, 400, "invalid_request", "70000");
  expect(json::object{{"port", "80"}}, 400, "invalid_request", "\"80\"");
  expect(json::object{}, 400, "invalid_request", "port");
  expect(json::object{{"port", 80}, {"hostPort", -1}}, 400, "invalid_request", "-1");
  expect(json::object{{"port", 80}, {"hostPort", 65536}}, 400, "invalid_request", "65536");
  expect(json::object{{"port", 80}, {"address", "localhost"}}, 400, "invalid_request", "localhost");
  expect(json::object{{"port", 80}, {"address", "::1"}}, 400, "invalid_request", "::1");
  expect(json::object{{"port", 80}, {"address", "192.0.2.1"}}, 400, "invalid_request", "192.0.2.1");

  const uint16_t host_port = ExposeEcho(id);
  ASSERT_GT(host_port, 0);
  expect(json::object{{"port", 3000}}, 409, "port_already_exposed", std::to_string(host_port));
  // A host port someone else listens on.
  expect(json::object{{"port", 3001}, {"hostPort", host_port}}, 409, "address_in_use",
         "Address already in use");

  Response d = client().Delete(SbPath(id, "/ports/3001"));
  EXPECT_EQ(d.status, 404) << d.Describe();
  EXPECT_EQ(d.ErrorCode(), "not_found");
  d = client().Delete(SbPath(id, "/ports/x"));
  EXPECT_EQ(d.status, 400) << d.Describe();
  Response m = client().Request("PUT", SbPath(id, "/ports"), "{}");
  EXPECT_EQ(m.status, 405) << m.Describe();
  m = client().Get(SbPath(id, "/ports/3000"));
  EXPECT_EQ(m.status, 405) << m.Describe();
  Response u = client().PostJson(SbPath("no-such-sandbox", "/ports"), json::object{{"port", 1}});
  EXPECT_EQ(u.status, 404) << u.Describe();
  EXPECT_EQ(u.ErrorCode(), "sandbox_not_found");

  // DELETE of the port closes its listener.
  d = client().Delete(SbPath(id, "/ports/3000"));
  EXPECT_EQ(d.status, 204) << d.Describe();
  EXPECT_EQ(ConnectTo(host_port), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
  EXPECT_EQ(Arr(client().Get(SbPath(id, "/ports")), "ports").size(), 0u);
}

TEST_F(PortsTest, DeletingTheSandboxClosesListenerAndConnections) {
  const std::string id = NewId();
  Create(id);
  const uint16_t host_port = ExposeEcho(id);
  ASSERT_GT(host_port, 0);
  StartEchoAndWait(id, host_port);
  int open_conn = ConnectTo(host_port);
  ASSERT_GE(open_conn, 0);
  ASSERT_EQ(send(open_conn, "x", 1, MSG_NOSIGNAL), 1);
  char c;
  ASSERT_EQ(recv(open_conn, &c, 1, 0), 1);
  Response d = Delete(id);
  EXPECT_EQ(d.status, 204) << d.Describe();
  EXPECT_EQ(ConnectTo(host_port), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
  // The open connection ended too.
  timeval tv{10, 0};
  setsockopt(open_conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  EXPECT_LE(recv(open_conn, &c, 1, 0), 0);
  close(open_conn);
  EXPECT_NE(client().Get("/metrics").body.find("nsbox_ports_exposed 0\n"), std::string::npos);
}

TEST_F(PortsTest, ExposureSurvivesSandboxStopAndDaemonRestart) {
  const std::string id = NewId();
  Create(id);
  const uint16_t host_port = ExposeEcho(id);
  ASSERT_GT(host_port, 0);
  Response s = client().Request("POST", SbPath(id, "/stop"));
  EXPECT_EQ(s.status, 200) << s.Describe();
  // Still listed, still listening; a connection starts the sandbox.
  EXPECT_EQ(Arr(client().Get(SbPath(id, "/ports")), "ports").size(), 1u);
  StartEchoAndWait(id, host_port);

  ASSERT_TRUE(daemon().Stop()) << daemon().error();
  EXPECT_EQ(ConnectTo(host_port), -1);
  ASSERT_TRUE(daemon().Restart()) << daemon().error();
  client().Disconnect();
  auto ports = Arr(client().Get(SbPath(id, "/ports")), "ports");
  ASSERT_EQ(ports.size(), 1u);
  EXPECT_EQ(ports[0].as_object().at("hostPort").to_number<int>(), host_port);
  StartEchoAndWait(id, host_port);
}

TEST_F(PortsTest, AHostPortTakenAtRestartIsDroppedAndLogged) {
  const std::string id = NewId();
  Create(id);
  const uint16_t host_port = ExposeEcho(id);
  ASSERT_GT(host_port, 0);
  ASSERT_TRUE(daemon().Stop()) << daemon().error();
  // Someone else takes the host port meanwhile.
  int squatter = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(host_port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // SAFETY: sockaddr_in is the sockaddr of an AF_INET socket.
  ASSERT_EQ(bind(squatter, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  ASSERT_EQ(listen(squatter, 1), 0);
  ASSERT_TRUE(daemon().Restart()) << daemon().error();
  client().Disconnect();
  EXPECT_EQ(Arr(client().Get(SbPath(id, "/ports")), "ports").size(), 0u);
  EXPECT_NE(daemon().Log().find("not re-opened"), std::string::npos);
  close(squatter);
}

TEST_F(PortsTest, CliAddListRemove) {
  const std::string id = NewId();
  Create(id);
  const std::string log = daemon().dir() + "/cli.log";
  std::string out;
  const std::vector<std::string> base = {kNsboxBin, "--socket", daemon().socket_path()};
  auto run = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProgram(argv, log, &out);
  };
  ASSERT_EQ(run({"port", "add", id, "3000"}), 0) << out;
  EXPECT_NE(out.find("http://127.0.0.1:"), std::string::npos) << out;
  ASSERT_EQ(run({"port", "ls", id, "--json"}), 0) << out;
  auto v = json::parse(out);
  ASSERT_EQ(v.at("ports").as_array().size(), 1u) << out;
  ASSERT_EQ(run({"port", "ls", id}), 0) << out;
  EXPECT_NE(out.find("3000"), std::string::npos) << out;
  EXPECT_NE(run({"port", "add", id, "3000"}), 0) << out;
  EXPECT_NE(out.find("exposed already"), std::string::npos) << out;
  ASSERT_EQ(run({"port", "rm", id, "3000"}), 0) << out;
  EXPECT_NE(run({"port", "rm", id, "3000"}), 0) << out;
  EXPECT_EQ(Arr(client().Get(SbPath(id, "/ports")), "ports").size(), 0u);
}

// ---- the HTTP path through the API ----

class HttpPathTest : public PortsTest {
 protected:
  void SetUp() override {
    PortsTest::SetUp();
    id_ = NewId();
    Create(id_);
    const std::string server =
        ReadHostFile(std::string(NSBOX_SOURCE_DIR) + "/tests/e2e/ports_echo_server.pl");
    ASSERT_FALSE(server.empty());
    Response put = PutFile(id_, "/workspace/echo.pl", server);
    ASSERT_LT(put.status, 300) << put.Describe();
    Sh(id_, "perl /workspace/echo.pl </dev/null >/dev/null 2>&1 &");
    // Until it answers.
    const auto t0 = Clock::now();
    while (Clock::now() - t0 < std::chrono::seconds(10)) {
      if (client().Get(Http("/")).status == 200) return;
      std::this_thread::sleep_for(milliseconds(100));
    }
    FAIL() << "the echo server never answered";
  }
  std::string Http(std::string_view rest, uint16_t port = 3000) {
    return SbPath(id_, "/ports/" + std::to_string(port) + "/http" + std::string(rest));
  }
  // Restarts the daemon with a TCP listener and a token; its port.
  uint16_t RestartWithTcp() {
    token_file_ = daemon().dir() + "/token";
    FILE* f = fopen(token_file_.c_str(), "w");
    fputs(kToken, f);
    fclose(f);
    tcp_port_ = FreeTcpPort();
    EXPECT_TRUE(daemon().Stop()) << daemon().error();
    EXPECT_TRUE(daemon().Start(
        {"--listen", "127.0.0.1:" + std::to_string(tcp_port_), "--token-file", token_file_}))
        << daemon().error();
    client().Disconnect();
    Sh(id_, "perl /workspace/echo.pl </dev/null >/dev/null 2>&1 &");
    return tcp_port_;
  }
  static constexpr const char* kToken = "proxy-test-token-0123456789";
  std::string id_;
  std::string token_file_;
  uint16_t tcp_port_ = 0;
};

TEST_F(HttpPathTest, StreamsSeveralMebibytesBothWaysAndRewritesTheHead) {
  std::string data(5u << 20, '\0');
  std::mt19937 rng(3);
  for (auto& ch : data) ch = static_cast<char>('a' + rng() % 26);
  Response r = client().Request("POST", Http("/up/load?x=1&y=%2F"), data,
                                {{"Authorization", "Bearer secret-of-the-host"},
                                 {"Cookie", "theme=dark; nsbox_token=also-secret; lang=en"},
                                 {"Content-Type", "application/octet-stream"}});
  ASSERT_EQ(r.status, 200) << r.Describe();
  EXPECT_EQ(r.Header("x-echo"), "yes");
  const size_t split = r.body.find("\r\n\r\n");
  ASSERT_NE(split, std::string::npos);
  const std::string head = r.body.substr(0, split + 2);
  const std::string body = r.body.substr(split + 4);
  EXPECT_EQ(head.rfind("POST /up/load?x=1&y=%2F HTTP/1.1\r\n", 0), 0u) << head;
  EXPECT_EQ(head.find("secret"), std::string::npos) << "a secret reached the sandbox:\n" << head;
  EXPECT_EQ(head.find("Authorization"), std::string::npos) << head;
  EXPECT_NE(head.find("Cookie: theme=dark; lang=en\r\n"), std::string::npos) << head;
  EXPECT_NE(head.find("Host: 127.0.0.1:3000\r\n"), std::string::npos) << head;
  EXPECT_NE(head.find("X-Forwarded-Prefix: " + SbPath(id_, "/ports/3000/http") + "\r\n"),
            std::string::npos)
      << head;
  EXPECT_NE(head.find("X-Forwarded-Proto: http\r\n"), std::string::npos) << head;
  EXPECT_NE(head.find("X-Forwarded-For: "), std::string::npos) << head;
  EXPECT_NE(head.find("X-Forwarded-Host: "), std::string::npos) << head;
  EXPECT_NE(head.find("Connection: close\r\n"), std::string::npos) << head;
  EXPECT_EQ(body.size(), data.size());
  EXPECT_TRUE(body == data) << "the body that came back differs";
}

// curl sends a body over 1 MiB with "Expect: 100-continue": the daemon answers the 100 itself
// and sends the body on. Forwarded, the upstream's interim 100 (Python's and Node's servers send
// one) was taken for the answer and the body was never sent. A field that Connection names is
// hop-by-hop (RFC 9110 7.6.1) and stays on its side.
TEST_F(HttpPathTest, ExpectContinueIsAnsweredHereAndConnectionNamedFieldsStay) {
  const std::string file = daemon().dir() + "/upload.bin";
  const std::string data(2u << 20, 'u');
  {
    FILE* f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fwrite(data.data(), 1, data.size(), f);
    std::fclose(f);
  }
  std::string out;
  const int rc = RunProgram(
      {"curl", "-sS", "-v", "--unix-socket", daemon().socket_path(), "-H", "Expect: 100-continue",
       "-H", "Connection: X-Hop", "-H", "X-Hop: 1", "-H", "X-Kept: 2", "--data-binary", "@" + file,
       "-o", daemon().dir() + "/answer", "http://nsboxd" + Http("/up")},
      daemon().dir() + "/curl.log", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("< HTTP/1.1 100 Continue"), std::string::npos) << out.substr(0, 3000);
  EXPECT_NE(out.find("< HTTP/1.1 200 OK"), std::string::npos) << out.substr(0, 3000);
  // The echo: the head the server inside got, a blank line, the body.
  const std::string answer = ReadHostFile(daemon().dir() + "/answer");
  const size_t split = answer.find("\r\n\r\n");
  ASSERT_NE(split, std::string::npos) << answer.substr(0, 3000);
  const std::string head = answer.substr(0, split);
  EXPECT_EQ(head.rfind("POST /up HTTP/1.1\r\n", 0), 0u) << head;
  EXPECT_EQ(head.find("\r\nExpect:"), std::string::npos) << head;
  EXPECT_EQ(head.find("\r\nX-Hop:"), std::string::npos) << head;
  EXPECT_NE(head.find("X-Kept: 2"), std::string::npos) << head;
  EXPECT_TRUE(answer.substr(split + 4) == data) << "the body that came back differs";
}

// A client that gives up on an upstream that accepted and never answers: the daemon lets go
// of both connections at once. It waited for the answer, holding two fds per abandoned request
// until the sandbox was deleted.
TEST_F(HttpPathTest, AClientThatHangsUpOnASilentUpstreamFreesItsConnections) {
  Sh(id_, "busybox nc -ll -p 3002 -e sleep 1000 </dev/null >/dev/null 2>&1 &");
  std::this_thread::sleep_for(milliseconds(300));
  const int before = daemon().CountFds();
  ASSERT_GT(before, 0);
  const std::string request = "GET " + Http("/slow", 3002) + " HTTP/1.1\r\nHost: nsboxd\r\n\r\n";
  for (int i = 0; i < 20; ++i) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", daemon().socket_path().c_str());
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
    std::this_thread::sleep_for(milliseconds(50));
    ::close(fd);
  }
  int after = 0;
  const auto t0 = Clock::now();
  do {
    std::this_thread::sleep_for(milliseconds(100));
    after = daemon().CountFds();
  } while (after > before + 2 && Clock::now() - t0 < std::chrono::seconds(5));
  EXPECT_LE(after, before + 2) << "fds before " << before << ", after " << after;
  EXPECT_EQ(client().Get(Http("/")).status, 200) << "the proxy still serves";
}

// The router decodes a path's segments, so ".../%68ttp/..." is the proxy too: its prefix is
// found the same way, and the rest of the path goes upstream (it got "/").
TEST_F(HttpPathTest, AnEncodedHttpSegmentKeepsTheRestOfThePath) {
  Response r = client().Get(SbPath(id_, "/ports/3000/%68ttp/zzz?q=1"));
  ASSERT_EQ(r.status, 200) << r.Describe();
  EXPECT_EQ(r.body.rfind("GET /zzz?q=1 HTTP/1.1\r\n", 0), 0u) << r.body.substr(0, 300);
}

// An upstream that closes in the middle of its body: what it sent reaches the client, which
// then sees the answer end early (curl: exit 18, a partial file). The bytes were dropped.
TEST_F(HttpPathTest, AnAnswerCutShortStillPassesOnWhatCame) {
  Sh(id_,
     "perl -MIO::Socket::INET -e '$l = IO::Socket::INET->new(LocalAddr => \"127.0.0.1:3003\", "
     "Listen => 5, ReuseAddr => 1) or die; while ($c = $l->accept) { while (<$c>) { last if $_ "
     "eq \"\\r\\n\" } print $c \"HTTP/1.1 200 OK\\r\\nContent-Length: 100\\r\\n\\r\\nseven..\"; "
     "close $c }' </dev/null >/dev/null 2>&1 &");
  const std::string answer = daemon().dir() + "/cut-short";
  std::string out;
  int rc = 0;
  const auto t0 = Clock::now();
  do {
    std::this_thread::sleep_for(milliseconds(100));
    rc = RunProgram({"curl", "-sS", "--unix-socket", daemon().socket_path(), "-o", answer,
                     "http://nsboxd" + Http("/x", 3003)},
                    daemon().dir() + "/curl.log", &out);
  } while (rc == 0 && Clock::now() - t0 < std::chrono::seconds(10));  // 502 until it listens
  EXPECT_EQ(rc, 18) << out;                                           // CURLE_PARTIAL_FILE
  EXPECT_EQ(ReadHostFile(answer), "seven..") << out;
}

TEST_F(HttpPathTest, NothingListeningIs502NamingThePort) {
  Response r = client().Get(Http("/", 3999));
  EXPECT_EQ(r.status, 502) << r.Describe();
  EXPECT_EQ(r.ErrorCode(), "upstream_unreachable");
  EXPECT_NE(r.ErrorMessage().find("3999"), std::string::npos) << r.Describe();
  r = client().Get(Http("/", 0));
  EXPECT_EQ(r.status, 400) << r.Describe();
  r = client().Get(SbPath("no-such-sandbox", "/ports/3000/http/"));
  EXPECT_EQ(r.status, 404) << r.Describe();
}

TEST_F(HttpPathTest, WebSocketEchoThroughTheHttpPath) {
  namespace asio = boost::asio;
  namespace beast = boost::beast;
  asio::io_context io;
  beast::websocket::stream<asio::local::stream_protocol::socket> ws(io);
  ws.next_layer().connect(asio::local::stream_protocol::endpoint(daemon().socket_path()));
  // Blocking calls with a deadline: a relay that stalls fails the test instead of hanging it.
  timeval tv{20, 0};
  setsockopt(ws.next_layer().native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  beast::error_code ec;
  beast::websocket::response_type handshake;
  ws.handshake(handshake, "localhost", Http("/ws"), ec);
  ASSERT_FALSE(ec) << ec.message();
  // The server inside tries to plant the token cookie with its 101: the daemon drops it, as
  // from any other answer (the sandbox's pages share the daemon's origin).
  EXPECT_EQ(handshake.count(beast::http::field::set_cookie), 1u) << handshake;
  EXPECT_EQ(handshake[beast::http::field::set_cookie], "theme=dark") << handshake;
  for (const std::string& msg : {std::string("first message"), std::string(200000, 'w'),
                                 std::string("third, after the big one came back")}) {
    ws.binary(msg.size() > 100);
    ws.write(asio::buffer(msg), ec);
    ASSERT_FALSE(ec) << ec.message();
    beast::flat_buffer in;
    ws.read(in, ec);
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_EQ(beast::buffers_to_string(in.data()), msg);
  }
  ws.close(beast::websocket::close_code::normal, ec);
  EXPECT_FALSE(ec) << ec.message();
}

TEST_F(HttpPathTest, TheTokenCookieAuthenticatesItsPathOnly) {
  const uint16_t port = RestartWithTcp();
  ASSERT_GT(port, 0);
  Client tcp(Endpoint::Tcp("127.0.0.1", port));
  // No token: 401.
  Response r = tcp.Get(Http("/page"));
  EXPECT_EQ(r.status, 401) << r.Describe();
  // A wrong token in the query: 401, no cookie.
  r = tcp.Get(Http("/page?nsbox_token=wrong"));
  EXPECT_EQ(r.status, 401) << r.Describe();
  EXPECT_EQ(r.Header("set-cookie"), "");
  // The right one: 302 to the URL without it, and the cookie for this path only.
  r = tcp.Get(Http("/page?a=1&nsbox_token=") + kToken + "&b=2");
  ASSERT_EQ(r.status, 302) << r.Describe();
  EXPECT_EQ(r.Header("location"), Http("/page?a=1&b=2"));
  const std::string cookie = r.Header("set-cookie");
  // Its value is bound to this path (an HMAC of it keyed with the token), never the token.
  const std::string tail = "; Path=" + Http("/") + "; HttpOnly; SameSite=Strict";
  ASSERT_TRUE(cookie.starts_with("nsbox_token=") && cookie.ends_with(tail)) << cookie;
  const std::string value = cookie.substr(12, cookie.size() - 12 - tail.size());
  EXPECT_EQ(value.size(), 64u) << cookie;
  EXPECT_EQ(cookie.find(kToken), std::string::npos) << cookie;
  const Headers with_cookie = {{"Cookie", "nsbox_token=" + value}};
  // Waits until the server inside answers (it was started again after the restart).
  const auto t0 = Clock::now();
  do {
    r = tcp.Request("GET", Http("/page?a=1&b=2"), {}, with_cookie);
    if (r.status == 200) break;
    std::this_thread::sleep_for(milliseconds(100));
  } while (Clock::now() - t0 < std::chrono::seconds(10));
  ASSERT_EQ(r.status, 200) << r.Describe();
  EXPECT_EQ(r.body.find(kToken), std::string::npos) << "the token reached the sandbox: " << r.body;
  // The cookie is worth nothing elsewhere: not on the API, not on another port's path.
  r = tcp.Request("GET", SbPath(id_), {}, with_cookie);
  EXPECT_EQ(r.status, 401) << r.Describe();
  r = tcp.Request("GET", SbPath(id_, "/ports"), {}, with_cookie);
  EXPECT_EQ(r.status, 401) << r.Describe();
  r = tcp.Request("GET", SbPath(id_, "/ports/3001/http/page"), {}, with_cookie);
  EXPECT_EQ(r.status, 401) << "another port's path: " << r.Describe();
  r = tcp.Request("GET", SbPath("other-sandbox", "/ports/3000/http/page"), {}, with_cookie);
  EXPECT_EQ(r.status, 401) << "another sandbox's path: " << r.Describe();
  // Nor is the token itself a cookie.
  r = tcp.Request("GET", Http("/page"), {}, {{"Cookie", std::string("nsbox_token=") + kToken}});
  EXPECT_EQ(r.status, 401) << r.Describe();
  // A wrong cookie: 401.
  r = tcp.Request("GET", Http("/page"), {}, {{"Cookie", "nsbox_token=wrong"}});
  EXPECT_EQ(r.status, 401) << r.Describe();
  // The bearer header works too, and does not reach the sandbox.
  r = tcp.Request("GET", Http("/page"), {}, {{"Authorization", std::string("Bearer ") + kToken}});
  ASSERT_EQ(r.status, 200) << r.Describe();
  EXPECT_EQ(r.body.find(kToken), std::string::npos) << r.body;
  // With the token in the query as well: the query goes on without it.
  r = tcp.Request("GET", Http("/page?nsbox_token=") + kToken + "&z=1", {},
                  {{"Authorization", std::string("Bearer ") + kToken}});
  ASSERT_EQ(r.status, 200) << r.Describe();
  EXPECT_EQ(r.body.find(kToken), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("z=1"), std::string::npos) << r.body;
}

}  // namespace
}  // namespace nsbox::e2e
