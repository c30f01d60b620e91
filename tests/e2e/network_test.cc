// Network policy (issue 9, docs/network.md), black box: a daemon with a network range of its own
// and the tests' small internet (tests/common/test_inet.h) as its DNS upstream and its
// "internet"; sandboxes with "none", "open" and allowlists reach exactly what their policy names,
// never the host's own services nor the metadata address (unless an open policy lists it), never
// each other; a refused connection fails at once (a reject, not a timeout), is counted and
// logged; a policy replaced on a running sandbox applies to new connections at once; DELETE
// leaves no interface and no nftables chain behind.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/common/test_inet.h"
#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

using testinet::kAltHttpPort;
using testinet::kHttpPort;
using testinet::kMetadataAddress;
using testinet::TestInternet;
using Clock = std::chrono::steady_clock;

// What curl did inside a sandbox: its exit code, its stdout (+ stderr) and how long it took.
struct Curl {
  int64_t rc = -1;
  std::string out;
  long ms = -1;
  std::string Describe() const {
    return "curl exit " + std::to_string(rc) + " after " + std::to_string(ms) + " ms: " + out;
  }
};

std::set<std::string> Lines(const std::string& text, const std::string& must_contain) {
  std::set<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(must_contain) != std::string::npos) out.insert(line);
  }
  return out;
}

// The names of the host's interfaces that start with `prefix`.
std::set<std::string> HostLinks(const std::string& prefix) {
  std::set<std::string> names;
  for (auto& name : testinet::LinkNames()) {
    if (name.rfind(prefix, 0) == 0) names.insert(std::move(name));
  }
  return names;
}

// The device of the host's route to `address` ("" when there is none but the default).
std::string RouteDevice(const std::string& address) {
  std::string out;
  testinet::RunCommand({"ip", "-o", "route", "show", address + "/32"}, &out);
  const size_t dev = out.find(" dev ");
  if (dev == std::string::npos) return "";
  const size_t end = out.find_first_of(" \n", dev + 5);
  return out.substr(dev + 5, end == std::string::npos ? std::string::npos : end - dev - 5);
}

std::string NftRuleset() {
  std::string out;
  testinet::RunCommand({"nft", "list", "ruleset"}, &out);
  return out;
}

class NetworkTest : public E2eTest {
 protected:
  void SetUp() override {
    if (geteuid() == 0) {
      inet_ = std::make_unique<TestInternet>();
      ASSERT_TRUE(inet_->Start()) << inet_->error();
    }
    E2eTest::SetUp();
  }
  void TearDown() override {
    E2eTest::TearDown();
    inet_.reset();
  }
  std::vector<std::string> DaemonArgs() const override {
    return {"--network-range", Range(), "--dns-upstream", inet_->dns_upstream()};
  }

  // 10.215.K.0/24, K from the pid: concurrent test daemons never share a range.
  static std::string Range() { return "10.215." + std::to_string(getpid() % 250 + 1) + ".0/24"; }
  // Its first address: the resolver and gateway (held by the host).
  static std::string Gateway() { return "10.215." + std::to_string(getpid() % 250 + 1) + ".1"; }
  TestInternet& inet() { return *inet_; }
  // The tables of `ruleset` that name this daemon's range (its first three octets).
  static std::string OwnTables(const std::string& ruleset) {
    const std::string prefix = Gateway().substr(0, Gateway().size() - 1);
    std::string out, table;
    std::istringstream in(ruleset);
    std::string line;
    while (std::getline(in, line)) {
      table += line + "\n";
      if (line == "}") {
        if (table.find(prefix) != std::string::npos) out += table;
        table.clear();
      }
    }
    return out;
  }

  // PUT the sandbox with {"network": policy}, asserting 201; its JSON.
  json::object CreateNet(const std::string& id, const json::value& policy) {
    Response r = client().PutJson(SbPath(id), json::object{{"network", policy}});
    EXPECT_EQ(r.status, 201) << r.Describe();
    return Obj(r);
  }
  // PUT .../network.
  Response SetPolicy(const std::string& id, const json::value& policy) {
    return client().PutJson(SbPath(id, "/network"), json::object{{"network", policy}});
  }
  // The sandbox's address as GET reports it once it runs ("" when null or absent): an exec
  // first, since a sandbox has an address only while it runs.
  std::string AddressOf(const std::string& id) {
    Sh(id, "true");
    const json::value a = Field(Obj(client().Get(SbPath(id))), "address");
    return a.is_string() ? std::string(a.as_string()) : "";
  }

  // curl inside the sandbox, timed inside it.
  Curl CurlIn(const std::string& id, const std::string& url, int max_seconds = 5) {
    const std::string cmd =
        "s=$(date +%s%N); curl -sS --noproxy '*' -m " +
        std::to_string(Scaled(std::chrono::seconds(max_seconds)).count() / 1000) + " '" + url +
        "' 2>&1; rc=$?; e=$(date +%s%N); "
        "echo; echo \"__rc=$rc ms=$(( (e - s) / 1000000 ))\"";
    ExecResult r = Exec(id, cmd);
    Curl c;
    const std::string out = r.out();
    const size_t at = out.rfind("__rc=");
    if (r.response.status != 200 || at == std::string::npos) {
      c.out = r.Describe();
      return c;
    }
    c.out = out.substr(0, at);
    while (!c.out.empty() && c.out.back() == '\n') c.out.pop_back();
    c.rc = std::atoll(out.c_str() + at + 5);
    const size_t ms = out.find("ms=", at);
    if (ms != std::string::npos) c.ms = std::atol(out.c_str() + ms + 3);
    return c;
  }
  std::string Url(const std::string& host, uint16_t port = kHttpPort,
                  const std::string& path = "/") {
    return "http://" + host + ":" + std::to_string(port) + path;
  }
  // Reached: curl exits 0 with the server's name as the body.
  void ExpectReaches(const std::string& id, const std::string& url, const std::string& name) {
    Curl c = CurlIn(id, url);
    EXPECT_EQ(c.rc, 0) << url << ": " << c.Describe();
    EXPECT_EQ(c.out, name) << url << ": " << c.Describe();
  }
  // Refused: curl cannot connect (exit 7) well under a second: a reject, not a dropped packet.
  void ExpectRefused(const std::string& id, const std::string& url) {
    Curl c = CurlIn(id, url, 10);
    EXPECT_EQ(c.rc, 7) << url << ": " << c.Describe();
    EXPECT_GE(c.ms, 0) << c.Describe();
    EXPECT_LT(c.ms, 1000) << url << " was not refused at once: " << c.Describe();
  }
  // `getent hosts name` inside: its exit code and output.
  std::pair<int64_t, std::string> Getent(const std::string& id, const std::string& name) {
    ExecResult r = Exec(id, "getent hosts " + name);
    return {r.exit_code(), r.out()};
  }

  // A DNS query for `name` (type A) sent by hand from inside the sandbox (bash's /dev/udp) to
  // server:53, bypassing resolv.conf: the first 12 bytes of the reply in hex ("" when none came
  // within 2 s). "12 34 85 80 ..." is an answer to it (id 0x1234, QR AA RD RA).
  std::string DirectDnsQuery(const std::string& id, const std::string& server,
                             const std::string& name) {
    std::string qname;
    std::istringstream labels(name);
    std::string label;
    char hex[8];
    while (std::getline(labels, label, '.')) {
      std::snprintf(hex, sizeof(hex), "\\x%02x", static_cast<unsigned>(label.size()));
      qname += hex + label;
    }
    const std::string packet = "\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00" +
                               qname + "\\x00\\x00\\x01\\x00\\x01";
    ExecResult r = Exec(id, "exec 3<>/dev/udp/" + server + "/53 && printf '" + packet +
                                "' >&3 && timeout 2 head -c 12 <&3 | od -An -tx1");
    std::string out = r.out();
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    while (!out.empty() && out.front() == ' ') out.erase(0, 1);
    return out;
  }

  // The value of nsbox_network_connections_total for the sandbox and verdict (-1 if absent).
  double ConnectionsMetric(const std::string& id, const std::string& verdict) {
    Response r = client().Get("/metrics");
    for (const auto& line : Lines(r.body, "nsbox_network_connections_total{")) {
      if (line.find("sandbox=\"" + id + "\"") == std::string::npos) continue;
      if (line.find("verdict=\"" + verdict + "\"") == std::string::npos) continue;
      return std::atof(line.c_str() + line.rfind(' ') + 1);
    }
    return -1;
  }

  std::unique_ptr<TestInternet> inet_;
};

json::value Allow(std::initializer_list<std::string> entries) {
  json::array a;
  for (const auto& e : entries) a.emplace_back(e);
  return json::object{{"allow", a}};
}

TEST_F(NetworkTest, AllowlistReachesTheAllowedHost) {
  const std::string id = NewId();
  const json::object sb = CreateNet(id, Allow({"allowed.test"}));
  EXPECT_EQ(Field(sb, "network"), json::parse(R"({"allow":["allowed.test"]})"))
      << json::serialize(sb);
  const std::string address = AddressOf(id);
  ASSERT_FALSE(address.empty()) << client().Get(SbPath(id)).Describe();
  EXPECT_EQ(address.rfind(Gateway().substr(0, Gateway().size() - 1), 0), 0u)
      << address << " is not in " << Range();
  EXPECT_NE(address, Gateway());
  // eth0 holds it; resolv.conf names the resolver.
  EXPECT_NE(Sh(id, "ip -o -4 addr show dev eth0").find(" " + address + "/"), std::string::npos);
  EXPECT_NE(Sh(id, "cat /etc/resolv.conf").find("nameserver " + Gateway()), std::string::npos);

  auto [rc, out] = Getent(id, "allowed.test");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.substr(0, out.find(' ')), inet().allowed_address()) << out;
  ExpectReaches(id, "http://allowed.test/", "allowed.test");
  ExpectReaches(id, "http://allowed.test:" + std::to_string(kAltHttpPort) + "/", "allowed.test");
  // A raw socket, to the address the resolver gave.
  ExecResult raw = Exec(id,
                        "ip=$(getent hosts allowed.test | cut -d' ' -f1) && exec 3<>/dev/tcp/$ip/80"
                        " && printf 'GET / HTTP/1.0\\r\\nHost: allowed.test\\r\\n\\r\\n' >&3 && "
                        "cat <&3");
  EXPECT_EQ(raw.exit_code(), 0) << raw.Describe();
  EXPECT_NE(raw.out().find("\r\n\r\nallowed.test\n"), std::string::npos) << raw.Describe();

  // Stopped, it has no address; started again, its network is back.
  Response stop = client().Request("POST", SbPath(id, "/stop"));
  ASSERT_EQ(stop.status, 200) << stop.Describe();
  EXPECT_TRUE(Field(Obj(stop), "address").is_null()) << stop.Describe();
  EXPECT_TRUE(Field(Obj(client().Get(SbPath(id))), "address").is_null());
  ExpectReaches(id, "http://allowed.test/", "allowed.test");
  EXPECT_FALSE(AddressOf(id).empty());
  EXPECT_EQ(Field(Obj(client().Get(SbPath(id))), "network"),
            json::parse(R"({"allow":["allowed.test"]})"));
}

TEST_F(NetworkTest, AllowlistRefusesEverythingElse) {
  const std::string id = NewId();
  CreateNet(id, Allow({"allowed.test"}));
  // Other names do not resolve (an exact entry does not cover its subdomains).
  for (const std::string name : {"denied.test", "sub.allowed.test", "nothing.test"}) {
    auto [rc, out] = Getent(id, name);
    EXPECT_NE(rc, 0) << name << " resolved: " << out;
  }
  // Control: it does resolve on the upstream.
  EXPECT_EQ(testinet::DnsQuery(inet().dns_address(), 53, "denied.test").a,
            std::vector<std::string>{inet().denied_address()});
  // Dialled directly: refused at once.
  ExpectRefused(id, Url(inet().denied_address()));
  ExpectRefused(id, Url(inet().raw_address()));
  ExpectRefused(id, Url(kMetadataAddress));
  // The host's own service, on the gateway and on the host's side of the test veth.
  ExpectRefused(id, Url(Gateway(), inet().host_port()));
  ExpectRefused(id, Url(inet().host_address(), inet().host_port()));
  // Control: the host's service and the others answer from the host.
  std::string body;
  EXPECT_EQ(testinet::HttpGet(Gateway(), inet().host_port(), "/", &body), 200);
  EXPECT_EQ(testinet::HttpGet(inet().denied_address(), kHttpPort, "/", &body), 200);
  EXPECT_EQ(testinet::HttpGet(kMetadataAddress, kHttpPort, "/", &body), 200);
  // UDP to a host it may not reach: no echo.
  ExecResult udp = Exec(id, "exec 3<>/dev/udp/" + inet().denied_address() +
                                "/80; printf ping >&3; timeout 2 head -c 4 <&3");
  EXPECT_EQ(udp.out().find("ping"), std::string::npos) << udp.Describe();
  // No way around the resolver: the upstream asked directly does not answer (control: it does
  // from the host), and the resolver itself answers only for the allowed name.
  EXPECT_EQ(DirectDnsQuery(id, inet().dns_address(), "denied.test"), "");
  EXPECT_TRUE(testinet::DnsQuery(inet().dns_address(), 53, "denied.test").answered);
  EXPECT_EQ(DirectDnsQuery(id, Gateway(), "allowed.test").substr(0, 5), "12 34");
  // No IPv6 address on eth0.
  EXPECT_EQ(Sh(id, "ip -o -6 addr show dev eth0 | wc -l"), "0\n");
  // And the allowed host still answers.
  ExpectReaches(id, "http://allowed.test/", "allowed.test");
}

TEST_F(NetworkTest, WildcardAndPortEntries) {
  const std::string id = NewId();
  const json::object sb =
      CreateNet(id, Allow({"*.allowed.test", "denied.test:" + std::to_string(kAltHttpPort)}));
  EXPECT_EQ(
      Field(sb, "network"),
      json::value(json::object{
          {"allow", json::array{json::value("*.allowed.test"),
                                json::value("denied.test:" + std::to_string(kAltHttpPort))}}}))
      << json::serialize(sb);
  // Below the suffix, at any depth: sub.allowed.test (same address as allowed.test).
  auto [rc, out] = Getent(id, "sub.allowed.test");
  EXPECT_EQ(rc, 0) << out;
  ExpectReaches(id, "http://sub.allowed.test/", "allowed.test");
  // Never the suffix itself.
  auto [rc2, out2] = Getent(id, "allowed.test");
  EXPECT_NE(rc2, 0) << out2;
  // denied.test, only on its port: it resolves, port 80 is refused, 8080 answers.
  auto [rc3, out3] = Getent(id, "denied.test");
  EXPECT_EQ(rc3, 0) << out3;
  ExpectRefused(id, "http://denied.test/");
  ExpectReaches(id, "http://denied.test:" + std::to_string(kAltHttpPort) + "/", "denied.test");
}

TEST_F(NetworkTest, NoneReachesNothing) {
  const std::string id = NewId();
  const json::object sb = CreateNet(id, "none");
  EXPECT_EQ(Field(sb, "network"), json::value("none")) << json::serialize(sb);
  EXPECT_TRUE(Field(sb, "address").is_null()) << json::serialize(sb);
  EXPECT_TRUE(Field(Obj(client().Get(SbPath(id))), "address").is_null());
  // The default is "none" too.
  const std::string plain = NewId("plain");
  Create(plain);
  const json::object plain_sb = Obj(client().Get(SbPath(plain)));
  EXPECT_EQ(Field(plain_sb, "network"), json::value("none")) << json::serialize(plain_sb);
  EXPECT_TRUE(Field(plain_sb, "address").is_null()) << json::serialize(plain_sb);

  for (const std::string& s : {id, plain}) {
    EXPECT_EQ(Sh(s, "ip -o link show | cut -d: -f2"), " lo\n");
    EXPECT_EQ(Sh(s, "ip -o -4 addr show | awk '{print $2, $4}'"), "lo 127.0.0.1/8\n");
    auto [rc, out] = Getent(s, "allowed.test");
    EXPECT_NE(rc, 0) << out;
    for (const std::string& url :
         {std::string("http://allowed.test/"), Url(inet().allowed_address()), Url(kMetadataAddress),
          Url(Gateway(), inet().host_port())}) {
      Curl c = CurlIn(s, url, 3);
      EXPECT_NE(c.rc, 0) << url << ": " << c.Describe();
      EXPECT_EQ(c.out.find("allowed.test\n"), std::string::npos) << c.Describe();
    }
  }
}

TEST_F(NetworkTest, OpenReachesTheInternetButNotTheHostNorMetadata) {
  const std::string id = NewId();
  const json::object sb = CreateNet(id, "open");
  EXPECT_EQ(Field(sb, "network"), json::value("open")) << json::serialize(sb);
  ExpectReaches(id, "http://allowed.test/", "allowed.test");
  ExpectReaches(id, "http://denied.test/", "denied.test");
  ExpectReaches(id, "http://cname.test/", "allowed.test");
  ExpectReaches(id, Url(inet().raw_address()), "raw-ip-host");
  auto [rc, out] = Getent(id, "nothing.test");
  EXPECT_NE(rc, 0) << out;
  ExpectRefused(id, Url(kMetadataAddress));
  ExpectRefused(id, Url(Gateway(), inet().host_port()));
  ExpectRefused(id, Url(inet().host_address(), inet().host_port()));
}

// A directed broadcast of a host link (the test internet's /29: its last address) is delivered
// to the host's own sockets, yet is not an address of type local: an open sandbox sent
// datagrams to a host service on 0.0.0.0 that way.
TEST_F(NetworkTest, OpenDoesNotReachTheHostThroughABroadcastAddress) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << strerror(errno);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  timeval wait{2, 0};
  ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait), 0);
  const std::string host = inet().host_address();
  const std::string broadcast = host.substr(0, host.rfind('.') + 1) +
                                std::to_string(std::stoi(host.substr(host.rfind('.') + 1)) + 6);
  const std::string id = NewId();
  CreateNet(id, "open");
  ExecResult sent =
      Exec(id,
           "python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
           "s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1); "
           "[s.sendto(b\"from-the-sandbox\", (\"" +
               broadcast + "\", " + std::to_string(port) + ")) for _ in range(3)]'");
  char buf[64];
  const ssize_t got = ::recv(fd, buf, sizeof buf, 0);
  ::close(fd);
  EXPECT_LT(got, 0) << "the host received " << std::string(buf, got > 0 ? got : 0) << " sent to "
                    << broadcast << ": " << sent.Describe();
}

TEST_F(NetworkTest, OpenWithAllowReachesTheMetadataAddress) {
  const std::string id = NewId();
  const json::object sb =
      CreateNet(id, json::parse(R"({"open":true,"allow":["169.254.169.254"]})"));
  EXPECT_EQ(Field(sb, "network"), json::parse(R"({"open":true,"allow":["169.254.169.254"]})"))
      << json::serialize(sb);
  ExpectReaches(id, Url(kMetadataAddress), "metadata");
  ExpectReaches(id, "http://denied.test/", "denied.test");
  // Still not the host.
  ExpectRefused(id, Url(Gateway(), inet().host_port()));
}

TEST_F(NetworkTest, CidrEntryWithAPortAllowsOnlyThatPort) {
  // The test internet's /29, port 80 only.
  const std::string a = inet().allowed_address();
  const std::string net = a.substr(0, a.rfind('.') + 1) +
                          std::to_string(std::stoi(a.substr(a.rfind('.') + 1)) & ~7) + "/29:80";
  const std::string id = NewId();
  const json::object sb = CreateNet(id, Allow({net}));
  EXPECT_EQ(Field(sb, "network"),
            json::value(json::object{{"allow", json::array{json::value(net)}}}))
      << json::serialize(sb);
  ExpectReaches(id, Url(a), "allowed.test");
  ExpectReaches(id, Url(inet().raw_address()), "raw-ip-host");
  ExpectReaches(id, Url(inet().denied_address()), "denied.test");
  ExpectRefused(id, Url(a, kAltHttpPort));
  // Not a name entry: names still do not resolve.
  auto [rc, out] = Getent(id, "allowed.test");
  EXPECT_NE(rc, 0) << out;
  // UDP to port 80 of the range goes through (the echo answers).
  ExecResult udp =
      Exec(id, "exec 3<>/dev/udp/" + a + "/80; printf ping >&3; timeout 3 head -c 4 <&3");
  EXPECT_EQ(udp.out(), "ping") << udp.Describe();
}

TEST_F(NetworkTest, ReplacingThePolicyOfARunningSandboxTakesEffect) {
  const std::string id = NewId();
  CreateNet(id, Allow({"allowed.test"}));
  ExpectReaches(id, "http://allowed.test/", "allowed.test");
  ExpectRefused(id, Url(inet().raw_address()));
  const std::string address = AddressOf(id);

  Response open = SetPolicy(id, "open");
  ASSERT_EQ(open.status, 200) << open.Describe();
  EXPECT_EQ(Field(Obj(open), "network"), json::value("open")) << open.Describe();
  EXPECT_EQ(Str(Obj(open), "id"), id);
  EXPECT_EQ(Str(Obj(client().Get(SbPath(id))), "state"), "running");
  ExpectReaches(id, Url(inet().raw_address()), "raw-ip-host");
  ExpectReaches(id, "http://denied.test/", "denied.test");

  Response only_denied = SetPolicy(id, Allow({"denied.test"}));
  ASSERT_EQ(only_denied.status, 200) << only_denied.Describe();
  EXPECT_EQ(Field(Obj(only_denied), "network"), json::parse(R"({"allow":["denied.test"]})"));
  ExpectReaches(id, "http://denied.test/", "denied.test");
  ExpectRefused(id, Url(inet().allowed_address()));
  ExpectRefused(id, Url(inet().raw_address()));
  auto [rc, out] = Getent(id, "allowed.test");
  EXPECT_NE(rc, 0) << out;
  EXPECT_EQ(AddressOf(id), address) << "the address stays while the sandbox runs";

  // Errors: an unknown sandbox, a bad entry (the policy stays as it was).
  Response missing = SetPolicy("no-such-sandbox", "open");
  EXPECT_EQ(missing.status, 404) << missing.Describe();
  EXPECT_EQ(missing.ErrorCode(), "sandbox_not_found");
  Response bad = SetPolicy(id, Allow({"allowed.test", "foo..com"}));
  EXPECT_EQ(bad.status, 400) << bad.Describe();
  EXPECT_EQ(bad.ErrorCode(), "invalid_request");
  EXPECT_NE(bad.ErrorMessage().find("foo..com"), std::string::npos) << bad.Describe();
  EXPECT_EQ(Field(Obj(client().Get(SbPath(id))), "network"),
            json::parse(R"({"allow":["denied.test"]})"));
  ExpectReaches(id, "http://denied.test/", "denied.test");
}

TEST_F(NetworkTest, TwoSandboxesHaveTheirOwnAddressesAndCannotReachEachOther) {
  const std::string a = NewId("a");
  const std::string b = NewId("b");
  CreateNet(a, "open");
  CreateNet(b, "open");
  const std::string addr_a = AddressOf(a);
  const std::string addr_b = AddressOf(b);
  ASSERT_FALSE(addr_a.empty());
  ASSERT_FALSE(addr_b.empty());
  EXPECT_NE(addr_a, addr_b);
  Sh(a,
     "mkdir -p /tmp/www && echo peer-a > /tmp/www/index.html && busybox httpd -p 8000 -h "
     "/tmp/www");
  // Control: it serves, inside A, on its own address.
  Curl self = CurlIn(a, Url(addr_a, 8000, "/index.html"));
  ASSERT_EQ(self.rc, 0) << self.Describe();
  ASSERT_EQ(self.out, "peer-a") << self.Describe();
  Curl other = CurlIn(b, Url(addr_a, 8000, "/index.html"), 10);
  EXPECT_NE(other.rc, 0) << other.Describe();
  EXPECT_EQ(other.out.find("peer-a"), std::string::npos) << other.Describe();
  ExpectRefused(b, Url(addr_a, 8000, "/index.html"));
  // A range that covers the sandboxes' range does not open them all: 0.0.0.0/0, the /8, the
  // daemon's range itself (each reached every sandbox, through the entry's accept).
  const std::string slash8 = addr_a.substr(0, addr_a.find('.')) + ".0.0.0/8";
  for (const std::string& wide : {std::string("0.0.0.0/0"), slash8, Range()}) {
    for (bool open : {false, true}) {
      json::object policy{{"allow", json::array{json::value(wide)}}};
      if (open) policy["open"] = true;
      Response r = SetPolicy(b, policy);
      ASSERT_EQ(r.status, 200) << r.Describe();
      ExpectRefused(b, Url(addr_a, 8000, "/index.html"));
    }
  }
  // Named by its one address, the other sandbox is reachable (the entry wins), also in an
  // allowlist.
  for (bool open : {false, true}) {
    json::object policy{{"allow", json::array{json::value(addr_a)}}};
    if (open) policy["open"] = true;
    Response r = SetPolicy(b, policy);
    ASSERT_EQ(r.status, 200) << r.Describe();
    ExpectReaches(b, Url(addr_a, 8000, "/index.html"), "peer-a");
  }
}

// nsbox-net dies (SIGKILL): the filter it left stays in the kernel meanwhile, and the next use
// of the sandbox starts a new nsbox-net, which removes the old table and links and gives the
// sandbox its network again, with its policy.
TEST_F(NetworkTest, ASandboxGetsItsNetworkBackAfterNsboxNetDies) {
  const std::string id = NewId();
  CreateNet(id, Allow({"allowed.test"}));
  ExpectReaches(id, "http://allowed.test/", "allowed.test");
  // The request right after the death finds the network back: the daemon asks nsbox-net, not
  // only its watcher thread, which may not have run yet (it had not in one CI run of three).
  // Three rounds, for that window to be met.
  for (int round = 0; round < 3; ++round) {
    std::vector<e2e::ProcessId> helpers;
    for (const auto& p : e2e::Descendants(daemon().pid())) {
      if (p.comm == "nsbox-net") helpers.push_back(p);
    }
    ASSERT_EQ(helpers.size(), 1u) << "one nsbox-net under the daemon, round " << round;
    ASSERT_EQ(::kill(helpers[0].pid, SIGKILL), 0);
    for (int i = 0; i < 1000 && e2e::StillAlive(helpers[0]); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_FALSE(e2e::StillAlive(helpers[0]));
    ExpectReaches(id, "http://allowed.test/", "allowed.test");
  }
  ExpectRefused(id, Url(inet().denied_address()));
  EXPECT_FALSE(AddressOf(id).empty());
  int now = 0;
  for (const auto& p : e2e::Descendants(daemon().pid())) now += p.comm == "nsbox-net" ? 1 : 0;
  EXPECT_EQ(now, 1) << "a new nsbox-net";
}

TEST_F(NetworkTest, DeleteLeavesNoInterfaceNorChain) {
  // A first sandbox, running, so that whatever the daemon keeps for itself exists before the
  // snapshot. Only this daemon's tables are compared (other daemons may run on the host): those
  // that name its range.
  const std::string keep = NewId("keep");
  CreateNet(keep, Allow({"allowed.test"}));
  ASSERT_FALSE(AddressOf(keep).empty());
  const std::set<std::string> chains_before = Lines(OwnTables(NftRuleset()), "chain ");
  ASSERT_FALSE(chains_before.empty()) << "no nftables table names " << Range() << ":\n"
                                      << NftRuleset();

  const std::string id = NewId();
  CreateNet(id, Allow({"allowed.test", "denied.test"}));
  ExpectReaches(id, "http://allowed.test/", "allowed.test");
  const std::string address = AddressOf(id);
  ASSERT_FALSE(address.empty());
  // Control: the host reaches it through an nsb* interface of its own, which the ruleset names
  // (or it names the address).
  const std::string link = RouteDevice(address);
  EXPECT_EQ(link.rfind("nsb", 0), 0u)
      << "the route to " << address << " is through '" << link << "'";
  EXPECT_EQ(HostLinks(link).count(link), 1u);
  const std::string during = OwnTables(NftRuleset());
  EXPECT_TRUE(during.find(address) != std::string::npos ||
              during.find("\"" + link + "\"") != std::string::npos)
      << "the ruleset names neither " << address << " nor " << link << ":\n"
      << during;

  Response del = Delete(id);
  ASSERT_EQ(del.status, 204) << del.Describe();
  EXPECT_EQ(HostLinks(link).count(link), 0u) << link << " is still on the host";
  EXPECT_NE(RouteDevice(address), link);
  const std::string after = OwnTables(NftRuleset());
  EXPECT_EQ(Lines(after, "chain "), chains_before) << after;
  for (const char* end : {" ", ",", "\n", "/", "-", " }"}) {
    EXPECT_EQ((after + "\n").find(address + std::string(end)), std::string::npos) << after;
  }
  EXPECT_EQ(after.find("\"" + link + "\""), std::string::npos) << after;
  // The other sandbox still works.
  ExpectReaches(keep, "http://allowed.test/", "allowed.test");
}

TEST_F(NetworkTest, BadEntriesAreRefusedNamingThem) {
  for (const std::string entry : {"foo..com", "x:0", "x:70000", "::1", "10.0.0.1/33"}) {
    const std::string id = NewId();
    Response r = client().PutJson(SbPath(id), json::object{{"network", Allow({"ok.test", entry})}});
    EXPECT_EQ(r.status, 400) << entry << ": " << r.Describe();
    EXPECT_EQ(r.ErrorCode(), "invalid_request") << r.Describe();
    EXPECT_NE(r.ErrorMessage().find(entry), std::string::npos)
        << "the message does not name " << entry << ": " << r.Describe();
    EXPECT_EQ(client().Get(SbPath(id)).status, 404) << entry << ": created anyway";
  }
  for (const json::value& policy :
       {json::value("bogus"), json::value(5), json::parse(R"({"allow":"x.test"})"),
        json::parse(R"({"allow":[5]})"), json::parse(R"({"open":"yes"})")}) {
    Response r = client().PutJson(SbPath(NewId()), json::object{{"network", policy}});
    EXPECT_EQ(r.status, 400) << json::serialize(policy) << ": " << r.Describe();
    EXPECT_EQ(r.ErrorCode(), "invalid_request") << r.Describe();
  }
}

// An allow list with nothing in it reaches nothing, as "none" does: a create or a PUT of one is
// a 400 that names the allow list and "none", and nothing is made or changed. Control: the same
// with one entry is taken.
TEST_F(NetworkTest, AnEmptyAllowListIsRefused) {
  const json::value empty = json::parse(R"({"allow":[]})");
  const std::string id = NewId();
  Response r = client().PutJson(SbPath(id), json::object{{"network", empty}});
  EXPECT_EQ(r.status, 400) << r.Describe();
  EXPECT_EQ(r.ErrorCode(), "invalid_request") << r.Describe();
  EXPECT_NE(r.ErrorMessage().find("empty allow list"), std::string::npos) << r.Describe();
  EXPECT_NE(r.ErrorMessage().find("\"none\""), std::string::npos) << r.Describe();
  EXPECT_EQ(client().Get(SbPath(id)).status, 404) << "created anyway";

  ASSERT_EQ(client().PutJson(SbPath(id), json::object{}).status, 201);
  r = client().PutJson(SbPath(id) + "/network", json::object{{"network", empty}});
  EXPECT_EQ(r.status, 400) << r.Describe();
  EXPECT_EQ(r.ErrorCode(), "invalid_request") << r.Describe();
  EXPECT_NE(r.ErrorMessage().find("empty allow list"), std::string::npos) << r.Describe();
  r = client().Get(SbPath(id) + "/network");
  EXPECT_EQ(json::serialize(r.Json().at("network")), R"("none")") << r.Describe();

  // Open with an empty list is open; allow with one entry is taken.
  r = client().PutJson(SbPath(id) + "/network",
                       json::object{{"network", json::parse(R"({"open":true,"allow":[]})")}});
  EXPECT_EQ(r.status, 200) << r.Describe();
  r = client().PutJson(SbPath(id) + "/network", json::object{{"network", Allow({"ok.test"})}});
  EXPECT_EQ(r.status, 200) << r.Describe();
  EXPECT_EQ(json::serialize(client().Get(SbPath(id) + "/network").Json().at("network")),
            R"({"allow":["ok.test"]})");
  const std::string other = NewId();
  r = client().PutJson(SbPath(other), json::object{{"network", Allow({"ok.test"})}});
  EXPECT_EQ(r.status, 201) << r.Describe();
}

TEST_F(NetworkTest, RefusedAndAllowedConnectionsAreCountedAndLogged) {
  const std::string id = NewId();
  CreateNet(id, Allow({"allowed.test"}));
  ExpectReaches(id, "http://allowed.test/", "allowed.test");
  ExpectRefused(id, Url(inet().denied_address()));
  ExpectRefused(id, Url(kMetadataAddress));
  // The counters and the log may trail the connection by a moment.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  double allowed = -1, refused = -1;
  bool logged = false;
  std::string log;
  while (Clock::now() < deadline) {
    allowed = ConnectionsMetric(id, "allowed");
    refused = ConnectionsMetric(id, "refused");
    log = daemon().Log();
    logged = false;
    for (const auto& line : Lines(log, "refused")) {
      logged = logged || (line.find(id) != std::string::npos &&
                          line.find(inet().denied_address()) != std::string::npos);
    }
    if (allowed >= 1 && refused >= 2 && logged) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_GE(allowed, 1) << client().Get("/metrics").body;
  EXPECT_GE(refused, 2) << client().Get("/metrics").body;
  EXPECT_TRUE(logged) << "no 'refused' line naming " << id << " and " << inet().denied_address()
                      << " in the log:\n"
                      << log;
  // A sandbox without a network has no counters of its own that move.
  const std::string none = NewId("none");
  CreateNet(none, "none");
  CurlIn(none, Url(inet().denied_address()), 2);
  EXPECT_LE(ConnectionsMetric(none, "refused"), 0) << client().Get("/metrics").body;
}

// Seconds left of an nft duration ("29s812ms", "1m5s", "750ms").
double NftSeconds(const std::string& text) {
  double total = 0;
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    size_t end = i;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    const double n = std::stod(text.substr(i, end - i));
    size_t unit_end = end;
    while (unit_end < text.size() && std::isalpha(static_cast<unsigned char>(text[unit_end]))) {
      ++unit_end;
    }
    const std::string unit = text.substr(end, unit_end - end);
    total += unit == "ms" ? n / 1000 : unit == "s" ? n : unit == "m" ? n * 60 : n * 3600;
    i = unit_end;
  }
  return total;
}

// The resolver opens an address it answered for the answer's TTL (the test DNS server gives 30
// s), in the sandbox's own set of the daemon's table; a later answer starts that time again.
TEST_F(NetworkTest, LearnedAddressesLastTheirTtlAndALaterAnswerRenewsThem) {
  const std::string id = NewId();
  CreateNet(id, Allow({"allowed.test"}));
  ASSERT_EQ(Getent(id, "allowed.test").first, 0);
  const std::string element = inet().allowed_address() + " timeout 30s expires ";
  // What is left of the element's time, from `nft list ruleset` (-1: not there).
  auto left = [&]() {
    const std::string tables = OwnTables(NftRuleset());
    const size_t at = tables.find(element);
    if (at == std::string::npos) return -1.0;
    return NftSeconds(tables.substr(at + element.size(), 20));
  };
  const double first = left();
  ASSERT_GT(first, 25) << OwnTables(NftRuleset());
  EXPECT_LE(first, 30);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  const double later = left();
  EXPECT_LT(later, first - 2) << OwnTables(NftRuleset());
  ASSERT_EQ(Getent(id, "allowed.test").first, 0);
  const double renewed = left();
  EXPECT_GT(renewed, later + 2) << OwnTables(NftRuleset());
  EXPECT_LE(renewed, 30);
}

// A host that cannot enforce a policy (here: the daemon's range overlaps a route of the host, the
// test internet's link, so nsbox-net refuses to start) refuses it with 422 network_unavailable,
// never runs the sandbox with a wider network, and keeps serving sandboxes with "none".
class NetworkUnavailableTest : public NetworkTest {
 protected:
  std::vector<std::string> DaemonArgs() const override {
    const std::string a = inet_->host_address();
    return {"--network-range", a.substr(0, a.rfind('.')) + ".0/24", "--dns-upstream",
            inet_->dns_upstream()};
  }
};

TEST_F(NetworkUnavailableTest, APolicyThatCannotBeEnforcedIsRefused) {
  const std::string id = NewId();
  Response r = client().PutJson(SbPath(id), json::object{{"network", Allow({"allowed.test"})}});
  EXPECT_EQ(r.status, 422) << r.Describe();
  EXPECT_EQ(r.ErrorCode(), "network_unavailable") << r.Describe();
  EXPECT_NE(r.body.find("in use on this host"), std::string::npos) << r.Describe();
  EXPECT_EQ(client().Get(SbPath(id)).status, 404) << "not created";

  const std::string plain = NewId("plain");
  r = client().PutJson(SbPath(plain), json::object{{"network", "none"}});
  ASSERT_EQ(r.status, 201) << r.Describe();
  EXPECT_EQ(Sh(plain, "echo ok"), "ok\n");
  r = SetPolicy(plain, "open");
  EXPECT_EQ(r.status, 422) << r.Describe();
  EXPECT_EQ(Field(Obj(client().Get(SbPath(plain))), "network"), json::value("none"));
  EXPECT_EQ(Sh(plain, "ip -o link show | cut -d: -f2"), " lo\n");
}

}  // namespace
}  // namespace nsbox::e2e
