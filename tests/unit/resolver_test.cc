#include "net/resolver.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

// stdbool.h first: without it, ldns/common.h #defines true and false as ints.
#include <stdbool.h>

#include <ldns/ldns.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace nsbox::net {
namespace {

using namespace std::chrono_literals;
using boost::asio::ip::address_v4;
using boost::asio::ip::tcp;
using boost::asio::ip::udp;
using Bytes = std::vector<uint8_t>;

constexpr uint32_t kUpstreamAddress = 0x7f000002;  // 127.0.0.2
constexpr uint32_t kResolverAddress = 0x7f000003;  // 127.0.0.3
constexpr char kClient[] = "127.0.0.10";           // a sandbox with a policy
constexpr char kStranger[] = "127.0.0.11";         // no sandbox has this address

struct PktFree {
  void operator()(ldns_pkt* p) const { ldns_pkt_free(p); }
};
using Pkt = std::unique_ptr<ldns_pkt, PktFree>;

Bytes ToWire(const ldns_pkt* pkt) {
  uint8_t* wire = nullptr;
  size_t size = 0;
  EXPECT_EQ(ldns_pkt2wire(&wire, pkt, &size), LDNS_STATUS_OK);
  Bytes out(wire, wire + size);
  free(wire);
  return out;
}

Pkt Parse(const Bytes& wire) {
  ldns_pkt* pkt = nullptr;
  if (ldns_wire2pkt(&pkt, wire.data(), wire.size()) != LDNS_STATUS_OK) return nullptr;
  return Pkt(pkt);
}

std::string OwnerText(const ldns_rr* rr) {
  char* text = ldns_rdf2str(ldns_rr_owner(rr));
  std::string out(text);
  free(text);
  return out;
}

// An upstream DNS server built with ldns: answers from a table (query name -> the records of
// the answer, in zone-file form), over UDP and TCP, on 127.0.0.2.
class FakeUpstream {
 public:
  explicit FakeUpstream(boost::asio::io_context& io) : udp_(io), acceptor_(io) {
    udp_.open(udp::v4());
    udp_.bind(udp::endpoint(address_v4(kUpstreamAddress), 0));
    port_ = udp_.local_endpoint().port();
    acceptor_.open(tcp::v4());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    acceptor_.bind(tcp::endpoint(address_v4(kUpstreamAddress), port_));
    acceptor_.listen();
    Receive();
    Accept();
  }
  uint16_t port() const { return port_; }

  std::map<std::string, std::vector<std::string>> records;  // set before the io thread runs
  std::atomic<bool> silent{false};
  std::atomic<bool> truncate{false};
  std::atomic<int> udp_queries{0};
  std::atomic<int> tcp_queries{0};

 private:
  Bytes Answer(const uint8_t* data, size_t size) {
    ldns_pkt* parsed = nullptr;
    if (ldns_wire2pkt(&parsed, data, size) != LDNS_STATUS_OK) return {};
    Pkt query(parsed);
    Pkt answer(ldns_pkt_new());
    ldns_pkt_set_id(answer.get(), ldns_pkt_id(query.get()));
    ldns_pkt_set_qr(answer.get(), true);
    ldns_pkt_set_ra(answer.get(), true);
    const ldns_rr* question = ldns_rr_list_rr(ldns_pkt_question(query.get()), 0);
    ldns_pkt_push_rr(answer.get(), LDNS_SECTION_QUESTION, ldns_rr_clone(question));
    std::string name = OwnerText(question);
    for (char& c : name) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
    auto found = records.find(name);
    if (found == records.end()) {
      ldns_pkt_set_rcode(answer.get(), LDNS_RCODE_NXDOMAIN);
    } else {
      for (const std::string& text : found->second) {
        ldns_rr* rr = nullptr;
        EXPECT_EQ(ldns_rr_new_frm_str(&rr, text.c_str(), 0, nullptr, nullptr), LDNS_STATUS_OK)
            << text;
        ldns_pkt_push_rr(answer.get(), LDNS_SECTION_ANSWER, rr);
      }
    }
    ldns_pkt_set_tc(answer.get(), truncate.load());
    return ToWire(answer.get());
  }

  void Receive() {
    udp_.async_receive_from(boost::asio::buffer(buffer_), from_,
                            [this](boost::system::error_code ec, size_t n) {
                              if (ec) return;
                              ++udp_queries;
                              if (!silent) {
                                auto answer = std::make_shared<Bytes>(Answer(buffer_.data(), n));
                                udp_.async_send_to(boost::asio::buffer(*answer), from_,
                                                   [answer](boost::system::error_code, size_t) {});
                              }
                              Receive();
                            });
  }

  void Accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket s) {
      if (ec) return;
      auto sock = std::make_shared<tcp::socket>(std::move(s));
      auto length = std::make_shared<std::array<uint8_t, 2>>();
      boost::asio::async_read(
          *sock, boost::asio::buffer(*length),
          [this, sock, length](boost::system::error_code read_ec, size_t) {
            if (read_ec) return;
            auto body = std::make_shared<Bytes>(((*length)[0] << 8) | (*length)[1]);
            boost::asio::async_read(*sock, boost::asio::buffer(*body),
                                    [this, sock, body](boost::system::error_code body_ec, size_t) {
                                      if (body_ec) return;
                                      ++tcp_queries;
                                      if (silent) return;
                                      const bool was_truncating = truncate.exchange(false);
                                      Bytes answer = Answer(body->data(), body->size());
                                      truncate = was_truncating;
                                      auto out = std::make_shared<Bytes>();
                                      out->push_back(static_cast<uint8_t>(answer.size() >> 8));
                                      out->push_back(static_cast<uint8_t>(answer.size()));
                                      out->insert(out->end(), answer.begin(), answer.end());
                                      boost::asio::async_write(
                                          *sock, boost::asio::buffer(*out),
                                          [sock, out](boost::system::error_code, size_t) {});
                                    });
          });
      Accept();
    });
  }

  udp::socket udp_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::array<uint8_t, 65535> buffer_{};
  udp::endpoint from_;
};

struct OpenCall {
  uint32_t source;
  NameVerdict verdict;
  std::vector<Resolver::Learned> addresses;
  bool client_had_answer;  // the client's socket already held the answer when open ran
};

class ResolverTest : public ::testing::Test {
 protected:
  ResolverTest() : upstream_(io_) {
    upstream_.records["example.com."] = {"example.com. 300 IN A 93.184.216.34",
                                         "example.com. 300 IN AAAA 2606:2800:220:1::1"};
    upstream_.records["a.cdn.example.net."] = {"a.cdn.example.net. 60 IN A 10.1.2.3"};
    upstream_.records["git.example.org."] = {
        "git.example.org. 120 IN CNAME edge.hosting.test.",
        "edge.hosting.test. 30 IN CNAME lb.hosting.test.",
        "lb.hosting.test. 20 IN A 192.0.2.7",
        "lb.hosting.test. 20 IN A 192.0.2.8",
        "stray.test. 20 IN A 6.6.6.6",  // not on the chain: neither opened nor passed on
    };
    for (const char* entry : {"example.com", "*.cdn.example.net", "git.example.org:443"}) {
      auto parsed = ParseAllowEntry(entry);
      EXPECT_TRUE(parsed.ok()) << entry;
      if (parsed.ok()) policy_.allow.push_back(*parsed);
    }
    policy_.mode = NetworkPolicy::Mode::kAllow;
  }

  ~ResolverTest() override {
    io_.stop();
    if (thread_.joinable()) thread_.join();
    resolver_.reset();
  }

  void Start(std::chrono::milliseconds timeout = 2000ms, int upstream_copies = 1) {
    Resolver::Options options;
    options.listen_address = kResolverAddress;
    options.port = 0;
    options.upstream_timeout = timeout;
    for (int i = 0; i < upstream_copies; ++i) {
      options.upstreams.emplace_back(kUpstreamAddress, upstream_.port());
    }
    const uint32_t client = ntohl(inet_addr(kClient));
    auto started = Resolver::Start(
        io_, options,
        [this, client](uint32_t source) -> const NetworkPolicy* {
          return source == client ? &policy_ : nullptr;
        },
        [this](uint32_t source, const NameVerdict& verdict,
               const std::vector<Resolver::Learned>& addresses) -> Status {
          char peek = 0;
          const bool had =
              client_fd_ >= 0 && recv(client_fd_, &peek, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
          std::lock_guard lock(mutex_);
          opens_.push_back({source, verdict, addresses, had});
          if (open_fails_) return Error::Msg("nft: no such table");
          return Ok();
        });
    ASSERT_TRUE(started.ok()) << started.error().message();
    resolver_ = std::move(started).value();
    thread_ = std::thread([this] {
      auto guard = boost::asio::make_work_guard(io_);
      io_.run();
    });
  }

  int Socket(int type, const char* source) {
    const int fd = socket(AF_INET, type | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd, 0);
    sockaddr_in local{};
    local.sin_family = AF_INET;
    local.sin_addr.s_addr = inet_addr(source);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local), 0);
    const timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(kResolverAddress);
    to.sin_port = htons(resolver_->port());
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
    return fd;
  }

  static Bytes Query(const char* name, ldns_rr_type type, uint16_t id) {
    Pkt query(ldns_pkt_query_new(ldns_dname_new_frm_str(name), type, LDNS_RR_CLASS_IN, LDNS_RD));
    ldns_pkt_set_id(query.get(), id);
    return ToWire(query.get());
  }

  // Sends raw bytes over UDP from `source`; the reply, or nullopt after `wait`.
  std::optional<Bytes> ExchangeRaw(const Bytes& query, const char* source = kClient,
                                   std::chrono::seconds wait = 5s) {
    const int fd = Socket(SOCK_DGRAM, source);
    const timeval tv{static_cast<time_t>(wait.count()), 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    client_fd_ = fd;
    EXPECT_EQ(send(fd, query.data(), query.size(), 0), static_cast<ssize_t>(query.size()));
    Bytes reply(65535);
    const ssize_t n = recv(fd, reply.data(), reply.size(), 0);
    client_fd_ = -1;
    close(fd);
    if (n < 0) return std::nullopt;
    reply.resize(static_cast<size_t>(n));
    return reply;
  }

  Pkt Ask(const char* name, ldns_rr_type type = LDNS_RR_TYPE_A, const char* source = kClient) {
    const uint16_t id = static_cast<uint16_t>(rng_());
    auto reply = ExchangeRaw(Query(name, type, id), source);
    if (!reply) {
      ADD_FAILURE() << "no reply for " << name;
      return nullptr;
    }
    Pkt pkt = Parse(*reply);
    EXPECT_TRUE(pkt) << "unparsable reply for " << name;
    if (pkt) {
      EXPECT_EQ(ldns_pkt_id(pkt.get()), id) << "the client's own id comes back";
      EXPECT_TRUE(ldns_pkt_qr(pkt.get()));
    }
    return pkt;
  }

  std::vector<OpenCall> Opens() {
    std::lock_guard lock(mutex_);
    return opens_;
  }

  static std::vector<std::string> Records(const ldns_pkt* pkt, ldns_rr_type type) {
    std::vector<std::string> out;
    const ldns_rr_list* answer = ldns_pkt_answer(pkt);
    for (size_t i = 0; i < ldns_rr_list_rr_count(answer); ++i) {
      const ldns_rr* rr = ldns_rr_list_rr(answer, i);
      if (ldns_rr_get_type(rr) != type) continue;
      char* text = ldns_rdf2str(ldns_rr_rdf(rr, 0));
      out.emplace_back(text);
      free(text);
    }
    return out;
  }

  boost::asio::io_context io_;
  FakeUpstream upstream_;
  NetworkPolicy policy_;
  std::unique_ptr<Resolver> resolver_;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<OpenCall> opens_;
  std::atomic<bool> open_fails_{false};
  std::atomic<int> client_fd_{-1};
  std::mt19937 rng_{12345};
};

TEST_F(ResolverTest, AllowedNameIsOpenedBeforeTheAnswerGoesBack) {
  Start();
  Pkt reply = Ask("example.com.");
  ASSERT_TRUE(reply);
  EXPECT_EQ(ldns_pkt_get_rcode(reply.get()), LDNS_RCODE_NOERROR);
  EXPECT_EQ(Records(reply.get(), LDNS_RR_TYPE_A), std::vector<std::string>{"93.184.216.34"});
  EXPECT_TRUE(Records(reply.get(), LDNS_RR_TYPE_AAAA).empty()) << "AAAA records are removed";
  const auto opens = Opens();
  ASSERT_EQ(opens.size(), 1u);
  EXPECT_EQ(opens[0].source, ntohl(inet_addr(kClient)));
  EXPECT_TRUE(opens[0].verdict.all_ports);
  EXPECT_EQ(opens[0].addresses,
            (std::vector<Resolver::Learned>{{ntohl(inet_addr("93.184.216.34")), 300}}));
  EXPECT_FALSE(opens[0].client_had_answer) << "open must run before the answer is sent";
  EXPECT_EQ(upstream_.udp_queries, 1);
  EXPECT_EQ(resolver_->stats().answered, 1u);
}

TEST_F(ResolverTest, WildcardMatchesNamesBelowTheSuffixOnly) {
  Start();
  Pkt reply = Ask("A.CDN.example.net");
  ASSERT_TRUE(reply);
  EXPECT_EQ(ldns_pkt_get_rcode(reply.get()), LDNS_RCODE_NOERROR);
  EXPECT_EQ(Records(reply.get(), LDNS_RR_TYPE_A), std::vector<std::string>{"10.1.2.3"});
  ASSERT_EQ(Opens().size(), 1u);
  EXPECT_EQ(Opens()[0].addresses,
            (std::vector<Resolver::Learned>{{ntohl(inet_addr("10.1.2.3")), 60}}));

  Pkt suffix = Ask("cdn.example.net.");
  ASSERT_TRUE(suffix);
  EXPECT_EQ(ldns_pkt_get_rcode(suffix.get()), LDNS_RCODE_NXDOMAIN);
  EXPECT_EQ(upstream_.udp_queries, 1);
}

TEST_F(ResolverTest, CnameChainOpensTheAddressesAtItsEnd) {
  Start();
  Pkt reply = Ask("git.example.org.");
  ASSERT_TRUE(reply);
  EXPECT_EQ(ldns_pkt_get_rcode(reply.get()), LDNS_RCODE_NOERROR);
  EXPECT_EQ(Records(reply.get(), LDNS_RR_TYPE_CNAME).size(), 2u);
  EXPECT_EQ(Records(reply.get(), LDNS_RR_TYPE_A),
            (std::vector<std::string>{"192.0.2.7", "192.0.2.8"}))
      << "the stray A record off the chain is dropped";
  const auto opens = Opens();
  ASSERT_EQ(opens.size(), 1u);
  EXPECT_FALSE(opens[0].verdict.all_ports);
  EXPECT_EQ(opens[0].verdict.ports, std::vector<uint16_t>{443});
  EXPECT_EQ(opens[0].addresses,
            (std::vector<Resolver::Learned>{{ntohl(inet_addr("192.0.2.7")), 20},
                                            {ntohl(inet_addr("192.0.2.8")), 20}}));
}

TEST_F(ResolverTest, DeniedNameIsNxdomainWithoutAskingUpstream) {
  Start();
  Pkt reply = Ask("evil.example.");
  ASSERT_TRUE(reply);
  EXPECT_EQ(ldns_pkt_get_rcode(reply.get()), LDNS_RCODE_NXDOMAIN);
  EXPECT_EQ(ldns_pkt_qdcount(reply.get()), 1u);
  EXPECT_EQ(upstream_.udp_queries, 0);
  EXPECT_TRUE(Opens().empty());
  EXPECT_EQ(resolver_->stats().denied, 1u);
}

TEST_F(ResolverTest, LabelWithADotIsNotBelowTheWildcard) {
  upstream_.records["a\\.cdn.example.net."] = {"a\\.cdn.example.net. 60 IN A 10.9.9.9"};
  Start();
  // The labels "a.cdn", "example", "net": below example.net, not below cdn.example.net.
  Pkt reply = Ask("a\\.cdn.example.net.");
  ASSERT_TRUE(reply);
  EXPECT_EQ(ldns_pkt_get_rcode(reply.get()), LDNS_RCODE_NXDOMAIN);
  EXPECT_EQ(upstream_.udp_queries, 0);
  EXPECT_TRUE(Opens().empty());
}

TEST_F(ResolverTest, AaaaIsAnEmptyNoerror) {
  Start();
  Pkt reply = Ask("example.com.", LDNS_RR_TYPE_AAAA);
  ASSERT_TRUE(reply);
  EXPECT_EQ(ldns_pkt_get_rcode(reply.get()), LDNS_RCODE_NOERROR);
  EXPECT_EQ(ldns_pkt_ancount(reply.get()), 0u);
  EXPECT_EQ(upstream_.udp_queries, 0);
}

TEST_F(ResolverTest, UnknownSourceIsRefused) {
  Start();
  Pkt reply = Ask("example.com.", LDNS_RR_TYPE_A, kStranger);
  ASSERT_TRUE(reply);
  EXPECT_EQ(ldns_pkt_get_rcode(reply.get()), LDNS_RCODE_REFUSED);
  EXPECT_EQ(upstream_.udp_queries, 0);
}

TEST_F(ResolverTest, MalformedPacketsGetFormerrOrAreDroppedAndServingGoesOn) {
  Start();
  // A header of 5 bytes: FORMERR with the id.
  auto short_reply = ExchangeRaw({0x12, 0x34, 0x01, 0x00, 0x00});
  ASSERT_TRUE(short_reply);
  ASSERT_GE(short_reply->size(), 12u);
  EXPECT_EQ((*short_reply)[0], 0x12);
  EXPECT_EQ((*short_reply)[1], 0x34);
  EXPECT_EQ((*short_reply)[3] & 0x0f, LDNS_RCODE_FORMERR);
  // One byte: no id to answer to, dropped.
  EXPECT_FALSE(ExchangeRaw({0x12}, kClient, 1s));
  // A question name that is a compression pointer to itself.
  const Bytes loop{0xab, 0xcd, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
                   0x00, 0x00, 0x00, 0xc0, 0x0c, 0x00, 0x01, 0x00, 0x01};
  auto loop_reply = ExchangeRaw(loop);
  ASSERT_TRUE(loop_reply);
  ASSERT_GE(loop_reply->size(), 12u);
  EXPECT_EQ((*loop_reply)[0], 0xab);
  EXPECT_EQ((*loop_reply)[3] & 0x0f, LDNS_RCODE_FORMERR);
  // Random bytes, over UDP and TCP.
  const int fd = Socket(SOCK_DGRAM, kClient);
  for (int i = 0; i < 300; ++i) {
    Bytes junk(rng_() % 600);
    for (auto& b : junk) b = static_cast<uint8_t>(rng_());
    if (i % 3 == 0 && junk.size() > 12) junk[2] &= 0x7f;  // a query, not a response
    ASSERT_GE(send(fd, junk.data(), junk.size(), 0), 0);
  }
  close(fd);
  const int tcp_fd = Socket(SOCK_STREAM, kClient);
  Bytes junk(3000);
  for (auto& b : junk) b = static_cast<uint8_t>(rng_());
  (void)!write(tcp_fd, junk.data(), junk.size());
  close(tcp_fd);

  // UDP is lossy: the junk may have filled the socket's buffer, so let the resolver drain it.
  std::this_thread::sleep_for(1s);
  Pkt reply = Ask("example.com.");
  ASSERT_TRUE(reply);
  EXPECT_EQ(ldns_pkt_get_rcode(reply.get()), LDNS_RCODE_NOERROR);
  EXPECT_GE(resolver_->stats().failed, 2u);
}

TEST_F(ResolverTest, SilentUpstreamsGiveServfailAfterTheTimeout) {
  upstream_.silent = true;
  Start(300ms, 2);  // the same silent upstream twice: both are tried
  const auto start = std::chrono::steady_clock::now();
  Pkt reply = Ask("example.com.");
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(reply);
  EXPECT_EQ(ldns_pkt_get_rcode(reply.get()), LDNS_RCODE_SERVFAIL);
  EXPECT_EQ(upstream_.udp_queries, 2);
  EXPECT_GE(elapsed, 600ms);
  EXPECT_LT(elapsed, 5s);
  EXPECT_TRUE(Opens().empty());
  EXPECT_EQ(resolver_->stats().failed, 1u);
}

TEST_F(ResolverTest, OpenFailureGivesServfail) {
  open_fails_ = true;
  Start();
  Pkt reply = Ask("example.com.");
  ASSERT_TRUE(reply);
  EXPECT_EQ(ldns_pkt_get_rcode(reply.get()), LDNS_RCODE_SERVFAIL);
  EXPECT_EQ(ldns_pkt_ancount(reply.get()), 0u) << "no address the filter was not opened to";
}

TEST_F(ResolverTest, TruncatedAnswerIsPassedOnAndTcpIsForwardedOverTcp) {
  upstream_.truncate = true;  // over UDP only
  Start();
  Pkt reply = Ask("example.com.");
  ASSERT_TRUE(reply);
  EXPECT_TRUE(ldns_pkt_tc(reply.get()));
  EXPECT_EQ(ldns_pkt_ancount(reply.get()), 0u);
  EXPECT_TRUE(Opens().empty());

  // The retry over TCP: two queries on one connection.
  const int fd = Socket(SOCK_STREAM, kClient);
  for (uint16_t id : {uint16_t{0x1111}, uint16_t{0x2222}}) {
    Bytes query = Query(id == 0x1111 ? "example.com." : "git.example.org.", LDNS_RR_TYPE_A, id);
    Bytes framed{static_cast<uint8_t>(query.size() >> 8), static_cast<uint8_t>(query.size())};
    framed.insert(framed.end(), query.begin(), query.end());
    ASSERT_EQ(write(fd, framed.data(), framed.size()), static_cast<ssize_t>(framed.size()));
    uint8_t length[2];
    ASSERT_EQ(recv(fd, length, 2, MSG_WAITALL), 2);
    Bytes answer((length[0] << 8) | length[1]);
    ASSERT_EQ(recv(fd, answer.data(), answer.size(), MSG_WAITALL),
              static_cast<ssize_t>(answer.size()));
    Pkt pkt = Parse(answer);
    ASSERT_TRUE(pkt);
    EXPECT_EQ(ldns_pkt_id(pkt.get()), id);
    EXPECT_EQ(ldns_pkt_get_rcode(pkt.get()), LDNS_RCODE_NOERROR);
    EXPECT_FALSE(ldns_pkt_tc(pkt.get()));
    EXPECT_FALSE(Records(pkt.get(), LDNS_RR_TYPE_A).empty());
  }
  close(fd);
  EXPECT_EQ(upstream_.tcp_queries, 2);
  EXPECT_EQ(Opens().size(), 2u);
}

TEST(NameserversOf, TakesTheIpv4NameserverLines) {
  const auto servers = NameserversOf(
      "# comment\nsearch example.com\nnameserver 192.0.2.1\n  nameserver\t10.0.0.2 # x\n"
      "nameserver ::1\nnameserver 192.0.2.1\nnameservers 1.2.3.4\nnameserver 300.1.1.1\n");
  EXPECT_EQ(servers,
            (std::vector<std::pair<uint32_t, uint16_t>>{{0xc0000201, 53}, {0x0a000002, 53}}));
}

}  // namespace
}  // namespace nsbox::net
