#include "net/resolver.h"

#include <errno.h>
#include <sys/random.h>

// stdbool.h first: without it, ldns/common.h #defines true and false as ints.
#include <stdbool.h>

#include <ldns/ldns.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_set>

#include "base/log.h"

namespace nsbox::net {

namespace {

using boost::asio::ip::address_v4;
using boost::asio::ip::tcp;
using boost::asio::ip::udp;
using Bytes = std::vector<uint8_t>;
// Sends a reply to the client; an empty one means "nothing to send" (dropped query).
using Reply = std::function<void(Bytes)>;

// A DNS message over TCP is at most this long (two-byte length); answers are capped there.
constexpr size_t kMaxMessage = 65535;
constexpr size_t kHeaderSize = 12;

struct PktFree {
  void operator()(ldns_pkt* p) const { ldns_pkt_free(p); }
};
using Pkt = std::unique_ptr<ldns_pkt, PktFree>;

uint16_t RandomId() {
  uint16_t id = 0;
  if (getrandom(&id, sizeof id, 0) != static_cast<ssize_t>(sizeof id)) {
    // getrandom on 2 bytes does not fail once the pool is initialised; never a fixed id anyway.
    id = static_cast<uint16_t>(std::rand());
  }
  return id;
}

std::string EndpointText(uint32_t address, uint16_t port) {
  return Ipv4Text(address) + ":" + std::to_string(port);
}

// A reply carrying only a header: for queries ldns cannot parse (FORMERR), keeping their id,
// opcode and RD bit.
Bytes HeaderOnly(const uint8_t* query, uint8_t rcode) {
  Bytes out(kHeaderSize, 0);
  out[0] = query[0];
  out[1] = query[1];
  out[2] = static_cast<uint8_t>(0x80 | (query[2] & 0x79));  // QR, opcode and RD of the query
  out[3] = static_cast<uint8_t>(0x80 | (rcode & 0x0f));     // RA
  return out;
}

std::optional<Bytes> ToWire(const ldns_pkt* pkt) {
  uint8_t* wire = nullptr;
  size_t size = 0;
  if (ldns_pkt2wire(&wire, pkt, &size) != LDNS_STATUS_OK || wire == nullptr) {
    free(wire);
    return std::nullopt;
  }
  Bytes out(wire, wire + size);
  free(wire);
  return out;
}

const ldns_rr* QuestionOf(const ldns_pkt* pkt) {
  const ldns_rr_list* q = ldns_pkt_question(pkt);
  if (ldns_pkt_qdcount(pkt) != 1 || q == nullptr || ldns_rr_list_rr_count(q) != 1) return nullptr;
  return ldns_rr_list_rr(q, 0);
}

// A reply to `query` with its question and no records.
Bytes ReplyTo(const ldns_pkt* query, const uint8_t* raw, ldns_pkt_rcode rcode) {
  Pkt reply(ldns_pkt_new());
  if (reply) {
    ldns_pkt_set_id(reply.get(), ldns_pkt_id(query));
    ldns_pkt_set_qr(reply.get(), true);
    ldns_pkt_set_opcode(reply.get(), ldns_pkt_get_opcode(query));
    ldns_pkt_set_rd(reply.get(), ldns_pkt_rd(query));
    ldns_pkt_set_cd(reply.get(), ldns_pkt_cd(query));
    ldns_pkt_set_ra(reply.get(), true);
    ldns_pkt_set_rcode(reply.get(), static_cast<uint8_t>(rcode));
    const ldns_rr* question = QuestionOf(query);
    bool ok = true;
    if (question != nullptr) {
      ldns_rr* copy = ldns_rr_clone(question);
      ok = copy != nullptr && ldns_pkt_push_rr(reply.get(), LDNS_SECTION_QUESTION, copy);
      if (!ok) ldns_rr_free(copy);
    }
    if (ok) {
      if (auto wire = ToWire(reply.get())) return std::move(*wire);
    }
  }
  return HeaderOnly(raw, static_cast<uint8_t>(rcode));
}

// The name of an owner or target as text, without the trailing dot ("" on failure).
std::string NameText(const ldns_rdf* name) {
  char* text = ldns_rdf2str(name);
  if (text == nullptr) return "";
  std::string out(text);
  free(text);
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

bool SameName(const ldns_rdf* a, const ldns_rdf* b) { return ldns_dname_compare(a, b) == 0; }

// Keeps the records of `list` for which keep(rr) holds; returns the new count.
template <typename Keep>
uint16_t FilterSection(ldns_rr_list* list, Keep keep) {
  if (list == nullptr) return 0;
  std::vector<ldns_rr*> kept;
  const size_t count = ldns_rr_list_rr_count(list);
  for (size_t i = 0; i < count; ++i) {
    ldns_rr* rr = ldns_rr_list_rr(list, i);
    if (keep(rr)) {
      kept.push_back(rr);
    } else {
      ldns_rr_free(rr);
    }
  }
  ldns_rr_list_set_rr_count(list, 0);
  for (ldns_rr* rr : kept) ldns_rr_list_push_rr(list, rr);
  return static_cast<uint16_t>(kept.size());
}

bool IsAddress(const ldns_rr* rr) {
  const ldns_rr_type type = ldns_rr_get_type(rr);
  return type == LDNS_RR_TYPE_A || type == LDNS_RR_TYPE_AAAA;
}

struct Forward;
struct Connection;

}  // namespace

struct Resolver::Impl : std::enable_shared_from_this<Impl> {
  Impl(boost::asio::io_context& io_context, Options opts, PolicyFor policy, Open open_fn)
      : io(io_context),
        options(std::move(opts)),
        policy_for(std::move(policy)),
        open(std::move(open_fn)),
        udp_socket(io_context),
        acceptor(io_context) {}

  void ReceiveUdp();
  void Accept();
  void Stop();
  // One query from `source`, over either transport; `reply` is called at most once (exactly
  // once unless the resolver stops first).
  void HandleQuery(uint32_t source, const uint8_t* data, size_t size, bool over_tcp, Reply reply);

  boost::asio::io_context& io;
  Options options;
  PolicyFor policy_for;
  Open open;
  udp::socket udp_socket;
  tcp::acceptor acceptor;
  uint16_t bound_port = 0;
  Stats counters;
  bool stopped = false;
  std::array<uint8_t, kMaxMessage> udp_buffer{};
  udp::endpoint udp_from;
  std::unordered_set<Forward*> forwards;
  std::unordered_set<Connection*> connections;
};

namespace {

// One query forwarded to the upstreams, one after the other until one answers.
struct Forward : std::enable_shared_from_this<Forward> {
  Forward(std::shared_ptr<Resolver::Impl> owner, uint32_t from, NameVerdict name_verdict,
          Pkt client_query, bool tcp_transport, Reply reply_fn)
      : impl(std::move(owner)),
        source(from),
        verdict(std::move(name_verdict)),
        query(std::move(client_query)),
        client_id(ldns_pkt_id(query.get())),
        over_tcp(tcp_transport),
        reply(std::move(reply_fn)),
        timer(impl->io) {
    impl->forwards.insert(this);
  }
  ~Forward() { impl->forwards.erase(this); }

  void Cancel() {
    done = true;
    CloseSockets();
    timer.cancel();
  }
  void CloseSockets() {
    boost::system::error_code ignored;
    if (udp_sock) udp_sock->close(ignored);
    if (tcp_sock) tcp_sock->close(ignored);
  }

  // Sends the query to the next upstream, or SERVFAIL when none is left.
  void TryNext() {
    if (done) return;
    CloseSockets();
    if (next_upstream >= impl->options.upstreams.size()) {
      Fail("no upstream answered");
      return;
    }
    const auto [address, port] = impl->options.upstreams[next_upstream++];
    const unsigned attempt = ++attempts;
    id = RandomId();
    ldns_pkt_set_id(query.get(), id);
    auto wire = ToWire(query.get());
    ldns_pkt_set_id(query.get(), client_id);
    if (!wire) {
      Fail("cannot build the forwarded query");
      return;
    }
    out = std::move(*wire);
    timer.expires_after(impl->options.upstream_timeout);
    timer.async_wait([self = shared_from_this(), attempt](boost::system::error_code ec) {
      if (ec || self->done || attempt != self->attempts) return;
      self->TryNext();
    });
    const udp::endpoint udp_to(address_v4(address), port);
    if (!over_tcp) {
      udp_sock.emplace(impl->io);
      boost::system::error_code ec;
      udp_sock->open(udp::v4(), ec);
      // A connected socket on a fresh ephemeral port: only the upstream's datagrams arrive.
      if (!ec) udp_sock->connect(udp_to, ec);
      if (ec) {
        log::warn("resolver: upstream {}: {}", EndpointText(address, port), ec.message());
        TryNext();
        return;
      }
      udp_sock->async_send(
          boost::asio::buffer(out),
          [self = shared_from_this(), attempt](boost::system::error_code send_ec, size_t) {
            if (self->done || attempt != self->attempts) return;
            if (send_ec) {
              self->TryNext();
              return;
            }
            self->ReceiveUdp(attempt);
          });
      return;
    }
    tcp_sock.emplace(impl->io);
    const tcp::endpoint tcp_to(address_v4(address), port);
    tcp_sock->async_connect(
        tcp_to, [self = shared_from_this(), attempt](boost::system::error_code ec) {
          if (self->done || attempt != self->attempts) return;
          if (ec) {
            self->TryNext();
            return;
          }
          self->length[0] = static_cast<uint8_t>(self->out.size() >> 8);
          self->length[1] = static_cast<uint8_t>(self->out.size());
          const std::array<boost::asio::const_buffer, 2> buffers{boost::asio::buffer(self->length),
                                                                 boost::asio::buffer(self->out)};
          boost::asio::async_write(*self->tcp_sock, buffers,
                                   [self, attempt](boost::system::error_code write_ec, size_t) {
                                     if (self->done || attempt != self->attempts) return;
                                     if (write_ec) {
                                       self->TryNext();
                                       return;
                                     }
                                     self->ReadTcpLength(attempt);
                                   });
        });
  }

  void ReceiveUdp(unsigned attempt) {
    in.resize(kMaxMessage);
    udp_sock->async_receive(boost::asio::buffer(in), [self = shared_from_this(), attempt](
                                                         boost::system::error_code ec, size_t n) {
      if (self->done || attempt != self->attempts) return;
      if (ec) {
        // ECONNREFUSED (nothing listens there) and the like: the next upstream at once.
        self->TryNext();
        return;
      }
      self->in.resize(n);
      if (Pkt answer = self->Matching()) {
        self->Complete(std::move(answer));
        return;
      }
      self->ReceiveUdp(attempt);  // not the answer (spoofed or stale): keep waiting
    });
  }

  void ReadTcpLength(unsigned attempt) {
    boost::asio::async_read(
        *tcp_sock, boost::asio::buffer(length),
        [self = shared_from_this(), attempt](boost::system::error_code ec, size_t) {
          if (self->done || attempt != self->attempts) return;
          const size_t n = (size_t{self->length[0]} << 8) | self->length[1];
          if (ec || n < kHeaderSize) {
            self->TryNext();
            return;
          }
          self->in.resize(n);
          boost::asio::async_read(*self->tcp_sock, boost::asio::buffer(self->in),
                                  [self, attempt](boost::system::error_code read_ec, size_t) {
                                    if (self->done || attempt != self->attempts) return;
                                    Pkt answer = read_ec ? nullptr : self->Matching();
                                    if (!answer) {
                                      self->TryNext();
                                      return;
                                    }
                                    self->Complete(std::move(answer));
                                  });
        });
  }

  // The parsed answer in `in` when it answers our query: a response with our id and question.
  Pkt Matching() const {
    ldns_pkt* parsed = nullptr;
    if (in.size() < kHeaderSize || ldns_wire2pkt(&parsed, in.data(), in.size()) != LDNS_STATUS_OK) {
      return nullptr;
    }
    Pkt answer(parsed);
    if (!ldns_pkt_qr(answer.get()) || ldns_pkt_id(answer.get()) != id) return nullptr;
    const ldns_rr* asked = QuestionOf(query.get());
    const ldns_rr* answered = QuestionOf(answer.get());
    if (asked == nullptr || answered == nullptr ||
        ldns_rr_get_type(asked) != ldns_rr_get_type(answered) ||
        ldns_rr_get_class(asked) != ldns_rr_get_class(answered) ||
        !SameName(ldns_rr_owner(asked), ldns_rr_owner(answered))) {
      return nullptr;
    }
    return answer;
  }

  void Fail(const std::string& why) {
    if (done) return;
    done = true;
    CloseSockets();
    timer.cancel();
    const ldns_rr* question = QuestionOf(query.get());
    log::debug("resolver: SERVFAIL for {} from {}: {}",
               question ? NameText(ldns_rr_owner(question)) : "?", Ipv4Text(source), why);
    ++impl->counters.failed;
    uint8_t header[kHeaderSize] = {};
    header[0] = static_cast<uint8_t>(client_id >> 8);
    header[1] = static_cast<uint8_t>(client_id);
    reply(ReplyTo(query.get(), header, LDNS_RCODE_SERVFAIL));
  }

  // The upstream's answer: open the filter to its addresses, then pass it on.
  void Complete(Pkt answer) {
    done = true;
    CloseSockets();
    timer.cancel();
    if (impl->stopped) return;
    ldns_pkt* pkt = answer.get();
    const ldns_rr* question = QuestionOf(query.get());
    if (!over_tcp && ldns_pkt_tc(pkt)) {
      // Truncated: only the header and question go back, so the client retries over TCP (and
      // uses no address that was not opened).
      ldns_pkt_set_ancount(pkt,
                           FilterSection(ldns_pkt_answer(pkt), [](ldns_rr*) { return false; }));
      ldns_pkt_set_nscount(pkt,
                           FilterSection(ldns_pkt_authority(pkt), [](ldns_rr*) { return false; }));
      ldns_pkt_set_arcount(pkt,
                           FilterSection(ldns_pkt_additional(pkt), [](ldns_rr*) { return false; }));
      Send(pkt);
      return;
    }
    // The names the answer may give addresses of: the question and the CNAME chain from it.
    std::vector<const ldns_rdf*> names{ldns_rr_owner(question)};
    const ldns_rr_list* records = ldns_pkt_answer(pkt);
    const size_t count = records ? ldns_rr_list_rr_count(records) : 0;
    auto known = [&names](const ldns_rdf* name) {
      return std::any_of(names.begin(), names.end(),
                         [name](const ldns_rdf* n) { return SameName(n, name); });
    };
    for (bool grew = true; grew && names.size() <= count;) {
      grew = false;
      for (size_t i = 0; i < count; ++i) {
        const ldns_rr* rr = ldns_rr_list_rr(records, i);
        if (ldns_rr_get_type(rr) != LDNS_RR_TYPE_CNAME || ldns_rr_rd_count(rr) != 1) continue;
        const ldns_rdf* target = ldns_rr_rdf(rr, 0);
        if (known(ldns_rr_owner(rr)) && !known(target)) {
          names.push_back(target);
          grew = true;
        }
      }
    }
    std::vector<Resolver::Learned> learned;
    for (size_t i = 0; i < count; ++i) {
      const ldns_rr* rr = ldns_rr_list_rr(records, i);
      if (ldns_rr_get_type(rr) != LDNS_RR_TYPE_A || ldns_rr_get_class(rr) != LDNS_RR_CLASS_IN ||
          ldns_rr_rd_count(rr) != 1 || !known(ldns_rr_owner(rr))) {
        continue;
      }
      const ldns_rdf* rdata = ldns_rr_rdf(rr, 0);
      if (ldns_rdf_get_type(rdata) != LDNS_RDF_TYPE_A || ldns_rdf_size(rdata) != 4) continue;
      const uint8_t* a = ldns_rdf_data(rdata);
      const uint32_t address =
          (uint32_t{a[0]} << 24) | (uint32_t{a[1]} << 16) | (uint32_t{a[2]} << 8) | uint32_t{a[3]};
      auto same = std::find_if(learned.begin(), learned.end(),
                               [address](const auto& l) { return l.address == address; });
      if (same == learned.end()) {
        learned.push_back({address, ldns_rr_ttl(rr)});
      } else {
        same->ttl_seconds = std::max(same->ttl_seconds, ldns_rr_ttl(rr));
      }
    }
    // No AAAA anywhere (sandboxes have IPv4 only), and no A record the filter was not opened
    // to: none outside the chain, none in the authority or additional sections.
    ldns_pkt_set_ancount(pkt, FilterSection(ldns_pkt_answer(pkt), [&known](ldns_rr* rr) {
                           const ldns_rr_type type = ldns_rr_get_type(rr);
                           if (type == LDNS_RR_TYPE_AAAA) return false;
                           return type != LDNS_RR_TYPE_A || known(ldns_rr_owner(rr));
                         }));
    ldns_pkt_set_nscount(
        pkt, FilterSection(ldns_pkt_authority(pkt), [](ldns_rr* rr) { return !IsAddress(rr); }));
    ldns_pkt_set_arcount(
        pkt, FilterSection(ldns_pkt_additional(pkt), [](ldns_rr* rr) { return !IsAddress(rr); }));
    if (!learned.empty()) {
      const Status opened = impl->open(source, verdict, learned);
      if (!opened.ok()) {
        done = false;
        Fail("open the filter: " + opened.error().message());
        return;
      }
    }
    Send(pkt);
  }

  void Send(ldns_pkt* pkt) {
    ldns_pkt_set_id(pkt, client_id);
    auto wire = ToWire(pkt);
    if (!wire || wire->size() > kMaxMessage) {
      done = false;
      Fail("the answer cannot be passed on");
      return;
    }
    ++impl->counters.answered;
    reply(std::move(*wire));
  }

  std::shared_ptr<Resolver::Impl> impl;
  uint32_t source;
  NameVerdict verdict;
  Pkt query;
  uint16_t client_id;
  bool over_tcp;
  Reply reply;
  boost::asio::steady_timer timer;
  std::optional<udp::socket> udp_sock;
  std::optional<tcp::socket> tcp_sock;
  size_t next_upstream = 0;
  unsigned attempts = 0;
  uint16_t id = 0;
  bool done = false;
  Bytes out;
  Bytes in;
  std::array<uint8_t, 2> length{};
};

// A client's TCP connection: length-prefixed queries, one after the other, an idle timeout.
struct Connection : std::enable_shared_from_this<Connection> {
  Connection(std::shared_ptr<Resolver::Impl> owner, tcp::socket s, uint32_t from)
      : impl(std::move(owner)), sock(std::move(s)), timer(impl->io), source(from) {
    impl->connections.insert(this);
  }
  ~Connection() { impl->connections.erase(this); }

  void Close() {
    closed = true;
    boost::system::error_code ignored;
    sock.close(ignored);
    timer.cancel();
  }

  void ReadNext() {
    if (closed) return;
    timer.expires_after(impl->options.tcp_idle_timeout);
    timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->Close();
    });
    boost::asio::async_read(sock, boost::asio::buffer(length),
                            [self = shared_from_this()](boost::system::error_code ec, size_t) {
                              if (ec || self->closed) {
                                self->Close();
                                return;
                              }
                              const size_t n = (size_t{self->length[0]} << 8) | self->length[1];
                              self->body.resize(n);
                              boost::asio::async_read(
                                  self->sock, boost::asio::buffer(self->body),
                                  [self](boost::system::error_code read_ec, size_t) {
                                    if (read_ec || self->closed) {
                                      self->Close();
                                      return;
                                    }
                                    // The forward has its own timeout; no idle one meanwhile.
                                    self->timer.cancel();
                                    self->impl->HandleQuery(
                                        self->source, self->body.data(), self->body.size(), true,
                                        [self](Bytes answer) { self->Write(std::move(answer)); });
                                  });
                            });
  }

  void Write(Bytes answer) {
    if (closed) return;
    if (answer.empty()) {
      ReadNext();
      return;
    }
    out.resize(2 + answer.size());
    out[0] = static_cast<uint8_t>(answer.size() >> 8);
    out[1] = static_cast<uint8_t>(answer.size());
    std::memcpy(out.data() + 2, answer.data(), answer.size());
    boost::asio::async_write(sock, boost::asio::buffer(out),
                             [self = shared_from_this()](boost::system::error_code ec, size_t) {
                               if (ec) {
                                 self->Close();
                                 return;
                               }
                               self->ReadNext();
                             });
  }

  std::shared_ptr<Resolver::Impl> impl;
  tcp::socket sock;
  boost::asio::steady_timer timer;
  uint32_t source;
  bool closed = false;
  std::array<uint8_t, 2> length{};
  Bytes body;
  Bytes out;
};

}  // namespace

void Resolver::Impl::HandleQuery(uint32_t source, const uint8_t* data, size_t size, bool over_tcp,
                                 Reply reply) {
  if (size < 2) {  // not even an id to answer to
    reply({});
    return;
  }
  ++counters.queries;
  if (size < kHeaderSize) {
    ++counters.failed;
    uint8_t header[kHeaderSize] = {};
    std::memcpy(header, data, size);
    reply(HeaderOnly(header, LDNS_RCODE_FORMERR));
    return;
  }
  if ((data[2] & 0x80) != 0) {  // a response: never answered, so no reflection loops
    reply({});
    return;
  }
  ldns_pkt* parsed = nullptr;
  if (ldns_wire2pkt(&parsed, data, size) != LDNS_STATUS_OK || parsed == nullptr) {
    ++counters.failed;
    reply(HeaderOnly(data, LDNS_RCODE_FORMERR));
    return;
  }
  Pkt query(parsed);
  if (ldns_pkt_get_opcode(query.get()) != LDNS_PACKET_QUERY) {
    ++counters.failed;
    reply(ReplyTo(query.get(), data, LDNS_RCODE_NOTIMPL));
    return;
  }
  const ldns_rr* question = QuestionOf(query.get());
  if (question == nullptr) {
    ++counters.failed;
    reply(ReplyTo(query.get(), data, LDNS_RCODE_FORMERR));
    return;
  }
  const ldns_rr_type type = ldns_rr_get_type(question);
  if (ldns_rr_get_class(question) != LDNS_RR_CLASS_IN || type == LDNS_RR_TYPE_AXFR ||
      type == LDNS_RR_TYPE_IXFR) {
    ++counters.denied;
    reply(ReplyTo(query.get(), data, LDNS_RCODE_REFUSED));
    return;
  }
  const NetworkPolicy* policy = policy_for(source);
  if (policy == nullptr) {
    ++counters.denied;
    reply(ReplyTo(query.get(), data, LDNS_RCODE_REFUSED));
    return;
  }
  const std::string name = NameText(ldns_rr_owner(question));
  const NameVerdict verdict = MatchName(*policy, name);  // escaped names too (policy.h)
  if (!verdict.allowed) {
    ++counters.denied;
    log::debug("resolver: {} asked for {}: not allowed", Ipv4Text(source), name);
    reply(ReplyTo(query.get(), data, LDNS_RCODE_NXDOMAIN));
    return;
  }
  if (type == LDNS_RR_TYPE_AAAA) {
    ++counters.answered;
    reply(ReplyTo(query.get(), data, LDNS_RCODE_NOERROR));
    return;
  }
  if (forwards.size() >= options.max_in_flight) {
    ++counters.failed;
    reply(ReplyTo(query.get(), data, LDNS_RCODE_SERVFAIL));
    return;
  }
  auto forward = std::make_shared<Forward>(shared_from_this(), source, std::move(verdict),
                                           std::move(query), over_tcp, std::move(reply));
  forward->TryNext();
}

void Resolver::Impl::ReceiveUdp() {
  udp_socket.async_receive_from(
      boost::asio::buffer(udp_buffer), udp_from,
      [self = shared_from_this()](boost::system::error_code ec, size_t n) {
        if (self->stopped || ec == boost::asio::error::operation_aborted) return;
        if (!ec && self->udp_from.address().is_v4()) {
          const udp::endpoint to = self->udp_from;
          const uint32_t source = to.address().to_v4().to_uint();
          self->HandleQuery(source, self->udp_buffer.data(), n, false, [self, to](Bytes answer) {
            if (answer.empty() || self->stopped) return;
            auto shared = std::make_shared<Bytes>(std::move(answer));
            self->udp_socket.async_send_to(boost::asio::buffer(*shared), to,
                                           [shared](boost::system::error_code, size_t) {});
          });
        }
        self->ReceiveUdp();
      });
}

void Resolver::Impl::Accept() {
  acceptor.async_accept([self = shared_from_this()](boost::system::error_code ec, tcp::socket s) {
    if (self->stopped || ec == boost::asio::error::operation_aborted) return;
    if (!ec) {
      boost::system::error_code peer_ec;
      const tcp::endpoint peer = s.remote_endpoint(peer_ec);
      if (!peer_ec && peer.address().is_v4() &&
          self->connections.size() < self->options.max_tcp_connections) {
        std::make_shared<Connection>(self, std::move(s), peer.address().to_v4().to_uint())
            ->ReadNext();
      }
      // else: the socket closes as it goes out of scope
    }
    self->Accept();
  });
}

void Resolver::Impl::Stop() {
  stopped = true;
  boost::system::error_code ignored;
  udp_socket.close(ignored);
  acceptor.close(ignored);
  for (Forward* forward : std::vector<Forward*>(forwards.begin(), forwards.end())) {
    forward->Cancel();
  }
  for (Connection* c : std::vector<Connection*>(connections.begin(), connections.end())) {
    c->Close();
  }
}

Resolver::Resolver(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Resolver::~Resolver() { impl_->Stop(); }

Resolver::Stats Resolver::stats() const { return impl_->counters; }

uint16_t Resolver::port() const { return impl_->bound_port; }

Result<std::unique_ptr<Resolver>> Resolver::Start(boost::asio::io_context& io, Options options,
                                                  PolicyFor policy_for, Open open) {
  if (!policy_for || !open) return Error::Msg("resolver: policy_for and open are required");
  const uint32_t address = options.listen_address;
  const uint16_t wanted = options.port;
  auto impl =
      std::make_shared<Impl>(io, std::move(options), std::move(policy_for), std::move(open));
  boost::system::error_code ec;
  impl->udp_socket.open(udp::v4(), ec);
  if (ec) return Error::Sys("socket", "udp", ec.value());
  impl->udp_socket.bind(udp::endpoint(address_v4(address), wanted), ec);
  if (ec) return Error::Sys("bind", "udp " + EndpointText(address, wanted), ec.value());
  const uint16_t port = impl->udp_socket.local_endpoint(ec).port();
  if (ec) return Error::Sys("getsockname", "udp " + EndpointText(address, wanted), ec.value());
  impl->bound_port = port;
  impl->acceptor.open(tcp::v4(), ec);
  if (ec) return Error::Sys("socket", "tcp", ec.value());
  impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (ec) return Error::Sys("setsockopt(SO_REUSEADDR)", "tcp", ec.value());
  impl->acceptor.bind(tcp::endpoint(address_v4(address), port), ec);
  if (ec) return Error::Sys("bind", "tcp " + EndpointText(address, port), ec.value());
  impl->acceptor.listen(64, ec);
  if (ec) return Error::Sys("listen", "tcp " + EndpointText(address, port), ec.value());
  impl->ReceiveUdp();
  impl->Accept();
  return std::unique_ptr<Resolver>(new Resolver(std::move(impl)));
}

std::vector<std::pair<uint32_t, uint16_t>> NameserversOf(std::string_view resolv_conf) {
  std::vector<std::pair<uint32_t, uint16_t>> out;
  while (!resolv_conf.empty()) {
    const size_t end = resolv_conf.find('\n');
    std::string_view line = resolv_conf.substr(0, end);
    resolv_conf = end == std::string_view::npos ? std::string_view() : resolv_conf.substr(end + 1);
    auto skip_space = [&line] {
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    };
    skip_space();
    constexpr std::string_view kKeyword = "nameserver";
    if (line.substr(0, kKeyword.size()) != kKeyword) continue;
    line.remove_prefix(kKeyword.size());
    if (line.empty() || (line.front() != ' ' && line.front() != '\t')) continue;
    skip_space();
    const size_t stop = line.find_first_of(" \t\r#;");
    const auto address = ParseIpv4(line.substr(0, stop));
    if (!address) continue;  // IPv6 nameservers: sandboxes have IPv4 only
    const std::pair<uint32_t, uint16_t> upstream{*address, 53};
    if (std::find(out.begin(), out.end(), upstream) == out.end()) out.push_back(upstream);
  }
  return out;
}

}  // namespace nsbox::net
