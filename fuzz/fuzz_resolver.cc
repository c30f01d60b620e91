// The resolver (net/resolver.h) as a sandbox and an upstream see it: the input's first part is a
// query a sandbox sends over UDP; when the resolver forwards it, the rest becomes the upstream's
// answer, with the forwarded id and question spliced in so that it reaches the answer path (CNAME
// chains, record filtering, re-encoding). One resolver serves every input on 127.0.0.91, its
// upstream is a socket of the fuzzer on 127.0.0.92; the io_context is only polled, so each input
// runs to its end synchronously. Input: [2 bytes: query length] query [answer header fields...].

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "net/resolver.h"

namespace {

using nsbox::net::NetworkPolicy;
using nsbox::net::Resolver;

constexpr uint32_t kResolver = 0x7f00005b;  // 127.0.0.91
constexpr uint32_t kUpstream = 0x7f00005c;  // 127.0.0.92

int BoundUdp(uint32_t address, uint16_t port) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = htonl(address);
  local.sin_port = htons(port);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) std::abort();
  return fd;
}

struct World {
  World() {
    upstream = BoundUdp(kUpstream, 0);
    sockaddr_in bound{};
    socklen_t len = sizeof bound;
    getsockname(upstream, reinterpret_cast<sockaddr*>(&bound), &len);
    policy.mode = NetworkPolicy::Mode::kOpen;  // every name is forwarded
    Resolver::Options options;
    options.listen_address = kResolver;
    options.port = 0;
    options.upstreams = {{kUpstream, ntohs(bound.sin_port)}};
    options.upstream_timeout = std::chrono::milliseconds(50);  // unanswered forwards go soon
    auto started = Resolver::Start(
        io, options, [this](uint32_t) { return &policy; },
        [](uint32_t, const nsbox::net::NameVerdict&, const std::vector<Resolver::Learned>&) {
          return nsbox::Ok();
        });
    if (!started.ok()) std::abort();
    resolver = std::move(started).value();
    client = BoundUdp(0x7f00005d, 0);  // 127.0.0.93
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(kResolver);
    to.sin_port = htons(resolver->port());
    if (connect(client, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) std::abort();
  }
  void Drain(int fd) {
    uint8_t buffer[65536];
    while (recv(fd, buffer, sizeof buffer, 0) >= 0) {
    }
  }

  boost::asio::io_context io;
  NetworkPolicy policy;
  std::unique_ptr<Resolver> resolver;
  int upstream = -1;
  int client = -1;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* world = new World();
  if (size < 2) return 0;
  const size_t query_size = std::min(size - 2, (size_t{data[0]} << 8) | data[1]);
  const uint8_t* query = data + 2;
  const uint8_t* rest = query + query_size;
  const size_t rest_size = size - 2 - query_size;
  if (send(world->client, query, query_size, 0) < 0) return 0;
  world->io.poll();
  world->io.restart();

  uint8_t forwarded[65536];
  sockaddr_in from{};
  socklen_t from_len = sizeof from;
  const ssize_t n = recvfrom(world->upstream, forwarded, sizeof forwarded, 0,
                             reinterpret_cast<sockaddr*>(&from), &from_len);
  if (n >= 12 && rest_size >= 10) {
    // The forwarded id and question (header's 12 bytes, then labels, then type and class).
    size_t end = 12;
    while (end < static_cast<size_t>(n) && forwarded[end] != 0) end += forwarded[end] + 1u;
    end += 5;
    if (end <= static_cast<size_t>(n)) {
      std::vector<uint8_t> answer(forwarded, forwarded + 2);
      answer.insert(answer.end(), rest, rest + 2);  // flags
      answer.insert(answer.end(), {0, 1});          // one question
      answer.insert(answer.end(), rest + 2, rest + 8);
      answer.insert(answer.end(), forwarded + 12, forwarded + end);
      answer.insert(answer.end(), rest + 8, rest + rest_size);
      answer[2] |= 0x80;  // a response
      sendto(world->upstream, answer.data(), answer.size(), 0, reinterpret_cast<sockaddr*>(&from),
             from_len);
      world->io.poll();
      world->io.restart();
    }
  }
  world->Drain(world->client);
  world->Drain(world->upstream);
  return 0;
}
