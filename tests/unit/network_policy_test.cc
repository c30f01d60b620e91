#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "net/policy.h"

namespace nsbox::net {
namespace {

namespace json = boost::json;

Result<NetworkPolicy> Parse(std::string_view text) { return ParsePolicy(json::parse(text)); }

std::string ErrorOf(std::string_view entry) {
  auto e = ParseAllowEntry(entry);
  return e.ok() ? "(accepted as " + e->Text() + ")" : e.error().message();
}

TEST(NetworkPolicy, EntriesAreNormalised) {
  struct Case {
    const char* in;
    const char* text;
    AllowEntry::Kind kind;
  };
  for (const Case& c : {
           Case{"Packages.Example.COM", "packages.example.com", AllowEntry::Kind::kDomain},
           Case{"example.com.", "example.com", AllowEntry::Kind::kDomain},
           Case{"*.cdn.example.net", "*.cdn.example.net", AllowEntry::Kind::kWildcard},
           Case{"git.example.org:443", "git.example.org:443", AllowEntry::Kind::kDomain},
           Case{"10.20.0.0/16", "10.20.0.0/16", AllowEntry::Kind::kCidr},
           Case{"10.0.0.7", "10.0.0.7", AllowEntry::Kind::kCidr},
           Case{"10.0.0.7/32:5432", "10.0.0.7:5432", AllowEntry::Kind::kCidr},
           Case{"0.0.0.0/0", "0.0.0.0/0", AllowEntry::Kind::kCidr},
           Case{"_acme.example.com", "_acme.example.com", AllowEntry::Kind::kDomain},
       }) {
    auto e = ParseAllowEntry(c.in);
    ASSERT_TRUE(e.ok()) << c.in << ": " << e.error().message();
    EXPECT_EQ(e->Text(), c.text) << c.in;
    EXPECT_EQ(e->kind, c.kind) << c.in;
  }
  auto cidr = ParseAllowEntry("192.168.4.0/22:8080");
  ASSERT_TRUE(cidr.ok());
  EXPECT_EQ(cidr->address, 0xC0A80400u);
  EXPECT_EQ(cidr->prefix, 22);
  EXPECT_EQ(cidr->port, 8080);
}

TEST(NetworkPolicy, BadEntriesAreRefusedNamingThem) {
  for (const char* bad : {"",
                          "foo..com",
                          "x:0",
                          "x:70000",
                          "x:-1",
                          "x:",
                          ":80",
                          "::1",
                          "[::1]:80",
                          "10.0.0.1/33",
                          "10.0.0.1/16",
                          "256.1.1.1",
                          "1.2.3",
                          "010.1.1.1",
                          "a*.example.com",
                          "*",
                          "*.",
                          "-a.com",
                          "a-.com",
                          "exa mple.com",
                          "ex\x01.com",
                          "é.com",
                          "a.b.c.d.e/8"}) {
    const std::string message = ErrorOf(bad);
    EXPECT_EQ(message.rfind("allow entry '", 0), 0u) << bad << " -> " << message;
  }
  EXPECT_NE(ErrorOf("x:70000").find("70000"), std::string::npos);
  EXPECT_NE(ErrorOf("::1").find("IPv6"), std::string::npos);
  EXPECT_NE(ErrorOf("10.0.0.1/16").find("10.0.0.0/16"), std::string::npos);
  EXPECT_NE(ErrorOf(std::string(64, 'a') + ".com").find("63"), std::string::npos);
  // Control characters never reach a log or an answer raw.
  EXPECT_EQ(ErrorOf("ex\x01.com").find('\x01'), std::string::npos);
}

TEST(NetworkPolicy, JsonFormsRoundTrip) {
  for (const char* text : {R"("none")", R"("open")", R"({"allow":["a.test","10.0.0.0/8:22"]})",
                           R"({"open":true,"allow":["169.254.169.254"]})"}) {
    auto p = Parse(text);
    ASSERT_TRUE(p.ok()) << text << ": " << p.error().message();
    EXPECT_EQ(json::serialize(PolicyToJson(*p)), text);
  }
  auto none = ParsePolicy(json::value(nullptr));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->networked());
  auto dup = Parse(R"({"allow":["A.test","a.test"]})");
  ASSERT_TRUE(dup.ok());
  EXPECT_EQ(dup->allow.size(), 1u);
  EXPECT_EQ(PolicySummary(*dup), "allow(1)");
}

// An allow list with nothing in it reaches nothing: refused from a client, naming the list and
// "none"; read back as it is from a config.json written before it was refused.
TEST(NetworkPolicy, AnEmptyAllowListIsRefusedUnlessStored) {
  for (const char* text : {R"({"allow":[]})", R"({"open":false,"allow":[]})"}) {
    auto p = Parse(text);
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_NE(p.error().message().find("empty allow list"), std::string::npos)
        << p.error().message();
    EXPECT_NE(p.error().message().find("\"none\""), std::string::npos) << p.error().message();
    auto stored = ParseStoredPolicy(json::parse(text));
    ASSERT_TRUE(stored.ok()) << text << ": " << stored.error().message();
    EXPECT_EQ(stored->mode, NetworkPolicy::Mode::kAllow);
    EXPECT_TRUE(stored->allow.empty());
    EXPECT_EQ(json::serialize(PolicyToJson(*stored)), R"({"allow":[]})");
  }
  // Controls: one entry; open with an empty list is open.
  EXPECT_TRUE(Parse(R"({"allow":["a.test"]})").ok());
  auto open = Parse(R"({"open":true,"allow":[]})");
  ASSERT_TRUE(open.ok()) << open.error().message();
  EXPECT_EQ(open->mode, NetworkPolicy::Mode::kOpen);
}

TEST(NetworkPolicy, BadJsonIsRefused) {
  for (const char* text :
       {R"("closed")", "42", "[]", R"({})", R"({"allow":"a.test"})", R"({"allow":[1]})",
        R"({"open":"yes"})", R"({"allow":[],"deny":[]})", R"({"allow":["foo..com"]})"}) {
    auto p = Parse(text);
    EXPECT_FALSE(p.ok()) << text;
  }
  EXPECT_NE(Parse(R"({"allow":["ok.test","foo..com"]})").error().message().find("foo..com"),
            std::string::npos);
  json::array many;
  for (size_t i = 0; i <= kMaxAllowEntries; ++i) many.emplace_back("h" + std::to_string(i) + ".t");
  json::object o;
  o["allow"] = many;
  auto too_many = ParsePolicy(o);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.error().message().find("1025 different entries"), std::string::npos)
      << too_many.error().message();
  // Duplicates are dropped before the count: 1,500 entries, 1,000 of them different.
  json::array repeated;
  for (size_t i = 0; i < 1500; ++i) repeated.emplace_back("h" + std::to_string(i % 1000) + ".t");
  o["allow"] = repeated;
  auto deduped = ParsePolicy(o);
  ASSERT_TRUE(deduped.ok()) << deduped.error().message();
  EXPECT_EQ(deduped->allow.size(), 1000u);
  // Two ports is not IPv6.
  auto two = Parse(R"({"allow":["a.test:80:90"]})");
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.error().message().find("one :PORT"), std::string::npos) << two.error().message();
}

TEST(NetworkPolicy, NamesMatchExactlyOrBelowAWildcard) {
  auto p = Parse(R"({"allow":["allowed.test","*.cdn.test","git.test:443","git.test:22",
                               "10.0.0.0/8"]})");
  ASSERT_TRUE(p.ok());
  auto v = MatchName(*p, "ALLOWED.test.");
  EXPECT_TRUE(v.allowed);
  EXPECT_TRUE(v.all_ports);
  EXPECT_FALSE(MatchName(*p, "sub.allowed.test").allowed);
  EXPECT_FALSE(MatchName(*p, "notallowed.test").allowed);
  EXPECT_TRUE(MatchName(*p, "a.cdn.test").allowed);
  EXPECT_TRUE(MatchName(*p, "a.b.cdn.test").allowed);
  EXPECT_FALSE(MatchName(*p, "cdn.test").allowed);
  EXPECT_FALSE(MatchName(*p, "xcdn.test").allowed);
  auto git = MatchName(*p, "git.test");
  EXPECT_TRUE(git.allowed);
  EXPECT_FALSE(git.all_ports);
  EXPECT_EQ(git.ports, (std::vector<uint16_t>{22, 443}));
  EXPECT_FALSE(MatchName(*p, "10.0.0.1").allowed);  // a CIDR is no name
  auto open = Parse(R"("open")");
  EXPECT_TRUE(MatchName(*open, "anything.example").all_ports);
  EXPECT_FALSE(MatchName(NetworkPolicy{}, "allowed.test").allowed);
}

TEST(NetworkPolicy, Ipv4TextIsStrict) {
  EXPECT_EQ(ParseIpv4("198.18.0.1"), 0xC6120001u);
  EXPECT_EQ(Ipv4Text(0xC6120001u), "198.18.0.1");
  for (const char* bad : {"", "1.2.3", "1.2.3.4.5", "1.2.3.256", "01.2.3.4", "1..3.4", " 1.2.3.4",
                          "1.2.3.4 ", "+1.2.3.4", "0x1.2.3.4"}) {
    EXPECT_FALSE(ParseIpv4(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace nsbox::net
