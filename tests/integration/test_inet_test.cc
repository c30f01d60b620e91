// The tests' small internet alone (tests/common/test_inet.h), from the host: its DNS server
// answers the zone and NXDOMAIN for the rest, each HTTP server answers with its name (and bytes
// and UDP echo), the host's own server answers, and nothing of it is left afterwards, also of a
// run that was SIGKILLed.

#include "tests/common/test_inet.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace nsbox::testinet {
namespace {

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + "\n";
  return out;
}

class TestInetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "NOT RUN: needs root";
    ASSERT_TRUE(inet_.Start()) << inet_.error();
  }
  TestInternet inet_;
};

TEST_F(TestInetTest, DnsAnswersTheZone) {
  for (const auto& [name, want] : std::vector<std::pair<std::string, std::string>>{
           {"allowed.test", inet_.allowed_address()},
           {"ALLOWED.test.", inet_.allowed_address()},
           {"sub.allowed.test", inet_.allowed_address()},
           {"denied.test", inet_.denied_address()}}) {
    DnsAnswer a = DnsQuery(inet_.dns_address(), 53, name);
    ASSERT_TRUE(a.answered) << name << ": " << a.error;
    EXPECT_EQ(a.rcode, 0) << name;
    EXPECT_EQ(a.a, std::vector<std::string>{want}) << name;
    EXPECT_EQ(a.min_ttl, kDnsTtl) << name;
  }
  DnsAnswer c = DnsQuery(inet_.dns_address(), 53, "cname.test");
  ASSERT_TRUE(c.answered) << c.error;
  EXPECT_EQ(c.rcode, 0);
  EXPECT_EQ(c.cname, std::vector<std::string>{"allowed.test"});
  EXPECT_EQ(c.a, std::vector<std::string>{inet_.allowed_address()});
  // A name of the zone, another type: no answer, no error.
  DnsAnswer aaaa = DnsQuery(inet_.dns_address(), 53, "allowed.test", "AAAA");
  ASSERT_TRUE(aaaa.answered) << aaaa.error;
  EXPECT_EQ(aaaa.rcode, 0);
  EXPECT_TRUE(aaaa.a.empty());
  for (const std::string name :
       {"nothing.test", "allowed.test.evil", "test", "x.sub.allowed.test"}) {
    DnsAnswer n = DnsQuery(inet_.dns_address(), 53, name);
    ASSERT_TRUE(n.answered) << name << ": " << n.error;
    EXPECT_EQ(n.rcode, 3) << name << " should be NXDOMAIN";
    EXPECT_TRUE(n.a.empty()) << name;
  }
  // Control: a server that is not there does not answer.
  DnsAnswer none =
      DnsQuery(inet_.raw_address(), 53, "allowed.test", "A", std::chrono::milliseconds(500));
  EXPECT_FALSE(none.answered);
}

TEST_F(TestInetTest, EachHttpServerAnswersWithItsName) {
  const std::vector<std::pair<std::string, std::string>> hosts = {
      {inet_.allowed_address(), "allowed.test"},
      {inet_.denied_address(), "denied.test"},
      {inet_.raw_address(), "raw-ip-host"},
      {kMetadataAddress, "metadata"}};
  for (const auto& [address, name] : hosts) {
    std::string body, error;
    EXPECT_EQ(HttpGet(address, kHttpPort, "/", &body, &error), 200) << address << ": " << error;
    EXPECT_EQ(body, name + "\n") << address;
    EXPECT_EQ(UdpEcho(address, kHttpPort, "ping " + name), "ping " + name) << address;
  }
  std::string body, error;
  ASSERT_EQ(HttpGet(inet_.allowed_address(), kHttpPort, "/bytes?n=100000", &body, &error), 200)
      << error;
  EXPECT_EQ(body, std::string(100000, 'x'));
  ASSERT_EQ(HttpGet(inet_.allowed_address(), kHttpPort, "/whoami", &body, &error), 200) << error;
  EXPECT_EQ(body, inet_.host_address() + "\n");
  EXPECT_EQ(HttpGet(inet_.allowed_address(), kHttpPort, "/nothing", &body, &error), 404);
  EXPECT_EQ(HttpGet(inet_.allowed_address(), kAltHttpPort, "/", &body, &error), 200) << error;
  EXPECT_EQ(body, "allowed.test\n");
  EXPECT_EQ(HttpGet(inet_.denied_address(), kAltHttpPort, "/", &body, &error), 200) << error;
  EXPECT_EQ(body, "denied.test\n");
  // The host's own server, on loopback and on the veth's host side.
  ASSERT_NE(inet_.host_port(), 0);
  for (const std::string& address : std::vector<std::string>{"127.0.0.1", inet_.host_address()}) {
    EXPECT_EQ(HttpGet(address, inet_.host_port(), "/", &body, &error), 200) << error;
    EXPECT_EQ(body, "host\n");
  }
  // Control: an address of the /29 that nothing listens on.
  EXPECT_EQ(
      HttpGet(inet_.dns_address(), kHttpPort, "/", &body, &error, std::chrono::milliseconds(2000)),
      0);
}

TEST_F(TestInetTest, StopLeavesNothing) {
  const std::string netns = inet_.netns();
  const std::string link = inet_.host_link();
  const std::vector<std::string> before = inet_.Remnants();
  // Control: Remnants sees the namespace, the link and the routes.
  EXPECT_NE(std::find(before.begin(), before.end(), "netns " + netns), before.end())
      << Join(before);
  EXPECT_NE(std::find(before.begin(), before.end(), "link " + link), before.end()) << Join(before);
  EXPECT_GE(before.size(), 4u) << Join(before);
  inet_.Stop();
  EXPECT_TRUE(inet_.Remnants().empty()) << Join(inet_.Remnants());
  std::string routes;
  RunCommand({"ip", "route", "show", "table", "all"}, &routes);
  EXPECT_EQ(routes.find(link), std::string::npos) << routes;
  inet_.Stop();  // idempotent
}

// Two instances in one process coexist (their own /29, their own metadata route).
TEST_F(TestInetTest, TwoInstancesCoexist) {
  TestInternet other;
  ASSERT_TRUE(other.Start()) << other.error();
  EXPECT_NE(other.allowed_address(), inet_.allowed_address());
  EXPECT_NE(other.netns(), inet_.netns());
  std::string body, error;
  EXPECT_EQ(HttpGet(other.allowed_address(), kHttpPort, "/", &body, &error), 200) << error;
  EXPECT_EQ(HttpGet(inet_.allowed_address(), kHttpPort, "/", &body, &error), 200) << error;
  other.Stop();
  EXPECT_TRUE(other.Remnants().empty()) << Join(other.Remnants());
  EXPECT_EQ(HttpGet(inet_.allowed_address(), kHttpPort, "/", &body, &error), 200) << error;
  EXPECT_EQ(HttpGet(kMetadataAddress, kHttpPort, "/", &body, &error), 200) << error;
}

// A process that builds one and is SIGKILLed leaves it; the next Start removes it.
TEST_F(TestInetTest, LeftoverOfAKilledRunIsRemovedAtTheNextStart) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipefd[0]);
    TestInternet leaked;
    if (!leaked.Start()) _exit(1);
    const std::string names = leaked.netns() + " " + leaked.host_link() + "\n";
    if (write(pipefd[1], names.data(), names.size()) < 0) _exit(1);
    pause();
    _exit(0);
  }
  close(pipefd[1]);
  char buf[256] = {};
  const ssize_t n = read(pipefd[0], buf, sizeof(buf) - 1);
  close(pipefd[0]);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_GT(n, 0) << "the child did not start its test internet";
  std::string netns, link;
  {
    std::string s(buf);
    netns = s.substr(0, s.find(' '));
    link = s.substr(s.find(' ') + 1);
    link.pop_back();
  }
  std::string out;
  RunCommand({"ip", "netns", "list"}, &out);
  ASSERT_NE(out.find(netns), std::string::npos) << "control: the killed run left " << netns;
  TestInternet next;
  ASSERT_TRUE(next.Start()) << next.error();
  RunCommand({"ip", "netns", "list"}, &out);
  EXPECT_EQ(out.find(netns), std::string::npos) << out;
  RunCommand({"ip", "-o", "link", "show"}, &out);
  EXPECT_EQ(out.find(link + ":"), std::string::npos) << out;
  EXPECT_EQ(out.find(link + "@"), std::string::npos) << out;
}

}  // namespace
}  // namespace nsbox::testinet
