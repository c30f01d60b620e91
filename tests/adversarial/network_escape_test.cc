// The attacker's suite, network part (issue 9, docs/network.md): a sandbox's root with
// CAP_NET_RAW in its own network namespace tries to get past its network policy. The daemon runs
// with a range of its own and the tests' small internet (tests/common/test_inet.h) as its DNS
// upstream; every case has a control showing that the probe works where the policy allows it.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "tests/adversarial/fixture.h"
#include "tests/common/test_inet.h"

namespace nsbox::adversarial {
namespace {

using testinet::TestInternet;

// 10.218.K.0/24: a range no other suite's daemon uses.
std::string Range() { return "10.218." + std::to_string(getpid() % 250 + 1) + ".0/24"; }
std::string Gateway() { return "10.218." + std::to_string(getpid() % 250 + 1) + ".1"; }

// A UDP socket of the test on `address` (a host address): what reaches it.
class UdpSink {
 public:
  explicit UdpSink(const std::string& address) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, address.c_str(), &a.sin_addr);
    // SAFETY: sockaddr_in is the address of an AF_INET socket.
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    socklen_t len = sizeof a;
    // SAFETY: as above.
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~UdpSink() {
    if (fd_ >= 0) ::close(fd_);
  }
  uint16_t port() const { return port_; }
  // The datagrams that arrive within `wait`, as "SOURCE MESSAGE" lines.
  std::string Received(milliseconds wait) {
    std::string out;
    const auto end = Clock::now() + wait;
    for (;;) {
      const auto left = std::chrono::duration_cast<milliseconds>(end - Clock::now()).count();
      if (left <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) break;
      char buf[2048];
      sockaddr_in from{};
      socklen_t len = sizeof from;
      // SAFETY: sockaddr_in is the address of an AF_INET socket.
      ssize_t n = ::recvfrom(fd_, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
      if (n < 0) break;
      char src[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &from.sin_addr, src, sizeof src);
      out += std::string(src) + " " + std::string(buf, static_cast<size_t>(n)) + "\n";
    }
    return out;
  }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

class NetworkEscapeTest : public AdversarialTest {
 protected:
  static void SetUpTestSuite() {
    inet_ = std::make_unique<TestInternet>();
    if (!inet_->Start()) {
      inet_error_ = inet_->error();
      return;
    }
    extra_daemon_args_ = {"--network-range", Range(), "--dns-upstream", inet_->dns_upstream()};
    AdversarialTest::SetUpTestSuite();
  }
  static void TearDownTestSuite() {
    AdversarialTest::TearDownTestSuite();
    extra_daemon_args_.clear();
    inet_.reset();
  }
  void SetUp() override {
    ASSERT_TRUE(inet_error_.empty()) << "the test internet: " << inet_error_;
    AdversarialTest::SetUp();
  }
  // A sandbox with `network` (a JSON value), the tools installed; its address.
  std::string Networked(const std::string& network, std::string* address) {
    const std::string id = NewSandbox("net", R"({"network": )" + network + "}");
    InstallTools(id);
    Response r = Call("GET", SbPath(id, "/network"));
    json::value v = json::parse(r.body);
    *address = v.at("address").is_string() ? std::string(v.at("address").as_string()) : "";
    EXPECT_FALSE(address->empty()) << r.Describe();
    return id;
  }
  static TestInternet& inet() { return *inet_; }

 private:
  static std::unique_ptr<TestInternet> inet_;
  static std::string inet_error_;
};

std::unique_ptr<TestInternet> NetworkEscapeTest::inet_;
std::string NetworkEscapeTest::inet_error_;

// A raw socket forges the source address of a datagram to a destination its policy allows: the
// host's filter drops it, whatever the forged source (another sandbox's address, an outside
// host, the gateway). Control: the same datagram from the real address arrives, with that source.
TEST_F(NetworkEscapeTest, ForgedSourceAddressesAreDropped) {
  const std::string sink_address = inet().host_address();
  UdpSink sink(sink_address);
  ASSERT_NE(sink.port(), 0);
  std::string other_address;
  Networked(R"("open")", &other_address);
  std::string own;
  const std::string id = Networked(R"({"allow": [")" + sink_address + R"("]})", &own);
  const std::string port = std::to_string(sink.port());
  EXPECT_EQ(Get(Attack(id, "udp - " + sink_address + " " + port + " real"), "send"), "0");
  for (const std::string& forged : {other_address, inet().raw_address(), Gateway()}) {
    EXPECT_EQ(
        Get(Attack(id, "udp " + forged + " " + sink_address + " " + port + " forged"), "send"), "0")
        << "the sandbox may send what it likes; the host must not pass it on";
  }
  const std::string got = sink.Received(milliseconds(1500));
  EXPECT_EQ(got, own + " real\n") << "control: the real datagram arrives, and nothing forged";
}

// The sandbox's root cannot give itself another address or route: no CAP_NET_ADMIN, even in its
// own network namespace. Control: it reads its own address.
TEST_F(NetworkEscapeTest, NoAddressOrRouteChangesFromInside) {
  std::string own;
  const std::string id = Networked(R"("open")", &own);
  ExecResult show = Exec(id, "ip -o -4 addr show dev eth0");
  EXPECT_NE(show.out().find(own + "/32"), std::string::npos) << show.Describe();
  for (const std::string& change :
       {std::string("ip addr add 10.218.250.9/32 dev eth0"), std::string("ip route del default"),
        std::string("ip link set eth0 down"), std::string("ip link add x0 type dummy")}) {
    ExecResult r = Exec(id, change + " 2>&1; echo rc=$?");
    EXPECT_NE(r.out().find("Operation not permitted"), std::string::npos)
        << change << ": " << r.Describe();
  }
  EXPECT_NE(Exec(id, "ip -o -4 addr show dev eth0").out().find(own + "/32"), std::string::npos);
}

// Addresses the resolver learned are opened for the sandbox that asked only: a neighbour that
// may resolve denied.test does not open it for a sandbox that may not. Control: the neighbour
// reaches it.
TEST_F(NetworkEscapeTest, LearnedAddressesBelongToTheSandboxThatAsked) {
  std::string a_address, b_address;
  const std::string a = Networked(R"({"allow": ["allowed.test"]})", &a_address);
  const std::string b = Networked(R"({"allow": ["denied.test"]})", &b_address);
  ExecResult resolved = Exec(b, "getent hosts denied.test");
  EXPECT_NE(resolved.out().find(inet().denied_address()), std::string::npos) << resolved.Describe();
  EXPECT_EQ(Get(Attack(b, "connect tcp " + inet().denied_address() + " 80"), "connect"), "0")
      << "control: the sandbox that resolved it connects";
  EXPECT_EQ(Get(Attack(a, "connect tcp " + inet().denied_address() + " 80"), "connect"),
            "ECONNREFUSED");
  ExecResult denied = Exec(a, "getent hosts denied.test; echo rc=$?");
  EXPECT_EQ(denied.out(), "rc=2\n") << denied.Describe();
}

// Nothing of the host is reachable but the resolver: not the test's service on the gateway
// address, not the daemon's TCP port, not the DNS port over TCP beyond the resolver. Control: the
// host reaches its own service; the sandbox's names resolve.
TEST_F(NetworkEscapeTest, TheGatewayIsOnlyAResolver) {
  std::string own;
  const std::string id = Networked(R"("open")", &own);
  for (const std::string& port : {std::to_string(inet().host_port()), std::to_string(tcp_port()),
                                  std::string("22"), std::string("111")}) {
    KeyValues out = Attack(id, "connect tcp " + Gateway() + " " + port);
    EXPECT_EQ(Get(out, "connect"), "ECONNREFUSED") << "port " << port;
  }
  KeyValues host = AttackOnHost({"connect", "tcp", Gateway(), std::to_string(inet().host_port())});
  EXPECT_EQ(Get(host, "connect"), "0") << "control: the host reaches its own service there";
  ExecResult names = Exec(id, "getent hosts allowed.test");
  EXPECT_NE(names.out().find(inet().allowed_address()), std::string::npos) << names.Describe();
}

// An allow entry wide enough to cover the host or link-local does not open them (issue 44):
// `0.0.0.0/0` reaches neither the metadata address nor the host's service on all addresses (by
// a host address or the gateway), `10.0.0.0/8` not that service through the gateway. Controls:
// the wide entry reaches an outside address it covers, and entries naming each of those
// addresses alone reach them.
TEST_F(NetworkEscapeTest, WideAllowEntriesReachNeitherTheHostNorLinkLocal) {
  const std::string host_port = std::to_string(inet().host_port());
  std::string own;
  const std::string id = Networked(R"({"allow": ["0.0.0.0/0"]})", &own);
  auto connect = [&](const std::string& address, const std::string& port) {
    return Get(Attack(id, "connect tcp " + address + " " + port), "connect");
  };
  EXPECT_EQ(connect(inet().raw_address(), "80"), "0") << "control: the range opens the outside";
  EXPECT_EQ(connect(testinet::kMetadataAddress, "80"), "ECONNREFUSED");
  EXPECT_EQ(connect(inet().host_address(), host_port), "ECONNREFUSED");
  EXPECT_EQ(connect(Gateway(), host_port), "ECONNREFUSED");
  auto set_policy = [&](const std::string& network) {
    Response r = Call("PUT", SbPath(id, "/network"), R"({"network": )" + network + "}");
    ASSERT_EQ(r.status, 200) << r.Describe();
  };
  set_policy(R"({"allow": ["10.0.0.0/8"]})");
  EXPECT_EQ(connect(Gateway(), host_port), "ECONNREFUSED");
  // Named by their own addresses, each is reachable: the refusals above are the policy's.
  set_policy(R"({"allow": [")" + std::string(testinet::kMetadataAddress) + R"(", ")" +
             inet().host_address() + R"(", ")" + Gateway() + R"(", "0.0.0.0/0"]})");
  EXPECT_EQ(connect(testinet::kMetadataAddress, "80"), "0");
  EXPECT_EQ(connect(inet().host_address(), host_port), "0");
  EXPECT_EQ(connect(Gateway(), host_port), "0");
  KeyValues host = AttackOnHost({"connect", "tcp", Gateway(), host_port});
  EXPECT_EQ(Get(host, "connect"), "0") << "control: the host's service listens there";
}

// IPv6 does not exist for a sandbox: no address, no route, whatever the policy.
TEST_F(NetworkEscapeTest, NoIpv6) {
  std::string own;
  const std::string id = Networked(R"("open")", &own);
  EXPECT_EQ(Exec(id, "ip -6 -o addr show | grep -v ' lo ' | wc -l").out(), "0\n");
  EXPECT_EQ(Get(Attack(id, "connect tcp6 2001:db8::1 80"), "connect"), "ENETUNREACH");
  EXPECT_EQ(Get(Attack(id, "connect tcp6 64:ff9b::c612:4 80"), "connect"), "ENETUNREACH");
}

}  // namespace
}  // namespace nsbox::adversarial
