// nsbox-test-inet: the servers of the tests' "small internet" (tests/common/test_inet.h), one
// process per network namespace. Started by TestInternet, never by hand in a test:
//
//   nsbox-test-inet [--dns ADDR:PORT] [--zone NAME=IPV4]... [--cname NAME=TARGET]... [--ttl S]
//                   [--http NAME@ADDR:PORT]... [--udp-echo ADDR:PORT]...
//
// --dns: an authoritative-style UDP DNS server for the --zone A records and --cname aliases (a
//   CNAME answer carries the target's A record too, as a recursive resolver's would); a name of
//   the zone asked for another type gets NOERROR without answers, any other name NXDOMAIN.
// --http: an HTTP/1.1 server that answers GET / with "NAME\n", GET /whoami with the client's
//   address, and GET /bytes?n=N with N bytes. Port 0 picks a free port.
// --udp-echo: sends every datagram back to where it came from.
// When every socket is bound it prints "ready" and the --http ports in order on one line of
// stdout; it runs until it is killed.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>  // first: else ldns/common.h defines bool, true and false as macros
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <ldns/ldns.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "nsbox-test-inet: %s\n", message.c_str());
  std::exit(2);
}

struct HostPort {
  std::string host;
  uint16_t port = 0;
};

HostPort ParseHostPort(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) Die("ADDR:PORT expected: " + text);
  const long port = std::strtol(text.c_str() + colon + 1, nullptr, 10);
  if (port < 0 || port > 65535) Die("bad port: " + text);
  return {text.substr(0, colon), static_cast<uint16_t>(port)};
}

sockaddr_in SockAddr(const HostPort& hp) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(hp.port);
  if (inet_pton(AF_INET, hp.host.c_str(), &sa.sin_addr) != 1) Die("bad IPv4 address: " + hp.host);
  return sa;
}

int BindUdp(const HostPort& hp) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) Die(std::string("socket: ") + std::strerror(errno));
  const sockaddr_in sa = SockAddr(hp);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) != 0) {
    Die("bind udp " + hp.host + ":" + std::to_string(hp.port) + ": " + std::strerror(errno));
  }
  return fd;
}

// ---- DNS ------------------------------------------------------------------------------------

struct Zone {
  std::map<std::string, std::string> a;      // name -> IPv4
  std::map<std::string, std::string> cname;  // name -> target
  uint32_t ttl = 30;
};

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

void PushRr(ldns_pkt* reply, const std::string& text) {
  ldns_rr* rr = nullptr;
  if (ldns_rr_new_frm_str(&rr, text.c_str(), 0, nullptr, nullptr) != LDNS_STATUS_OK) {
    Die("bad record: " + text);
  }
  ldns_pkt_push_rr(reply, LDNS_SECTION_ANSWER, rr);
}

// The answer to one query (nullptr when it is not one worth answering).
ldns_pkt* Answer(const Zone& zone, const uint8_t* data, size_t size) {
  ldns_pkt* query = nullptr;
  if (ldns_wire2pkt(&query, data, size) != LDNS_STATUS_OK) return nullptr;
  ldns_rr_list* questions = ldns_pkt_question(query);
  if (ldns_pkt_qr(query) || questions == nullptr || ldns_rr_list_rr_count(questions) != 1) {
    ldns_pkt_free(query);
    return nullptr;
  }
  ldns_rr* q = ldns_rr_list_rr(questions, 0);
  char* owner_text = ldns_rdf2str(ldns_rr_owner(q));
  const std::string name = Lower(owner_text != nullptr ? owner_text : "");
  std::free(owner_text);
  const ldns_rr_type type = ldns_rr_get_type(q);

  ldns_pkt* reply = ldns_pkt_new();
  ldns_pkt_set_id(reply, ldns_pkt_id(query));
  ldns_pkt_set_qr(reply, true);
  ldns_pkt_set_aa(reply, true);
  ldns_pkt_set_rd(reply, ldns_pkt_rd(query));
  ldns_pkt_set_ra(reply, true);
  ldns_pkt_set_opcode(reply, ldns_pkt_get_opcode(query));
  ldns_pkt_push_rr(reply, LDNS_SECTION_QUESTION, ldns_rr_clone(q));
  const std::string ttl = std::to_string(zone.ttl);
  std::string target = name;
  if (auto c = zone.cname.find(name); c != zone.cname.end()) {
    PushRr(reply, name + ". " + ttl + " IN CNAME " + c->second + ".");
    target = c->second;
  }
  auto a = zone.a.find(target);
  if (a == zone.a.end() && target == name) {
    ldns_pkt_set_rcode(reply, LDNS_RCODE_NXDOMAIN);
  } else if (a != zone.a.end() && (type == LDNS_RR_TYPE_A || type == LDNS_RR_TYPE_ANY)) {
    PushRr(reply, target + ". " + ttl + " IN A " + a->second);
  }
  ldns_pkt_free(query);
  return reply;
}

void ServeDns(int fd, const Zone& zone) {
  std::vector<uint8_t> buf(65536);
  for (;;) {
    sockaddr_storage from{};
    socklen_t from_len = sizeof(from);
    const ssize_t n =
        recvfrom(fd, buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n < 0) {
      if (errno == EINTR) continue;
      Die(std::string("recvfrom: ") + std::strerror(errno));
    }
    ldns_pkt* reply = Answer(zone, buf.data(), static_cast<size_t>(n));
    if (reply == nullptr) continue;
    uint8_t* wire = nullptr;
    size_t wire_size = 0;
    if (ldns_pkt2wire(&wire, reply, &wire_size) == LDNS_STATUS_OK) {
      sendto(fd, wire, wire_size, 0, reinterpret_cast<sockaddr*>(&from), from_len);
    }
    std::free(wire);
    ldns_pkt_free(reply);
  }
}

void ServeUdpEcho(int fd) {
  std::vector<char> buf(65536);
  for (;;) {
    sockaddr_storage from{};
    socklen_t from_len = sizeof(from);
    const ssize_t n =
        recvfrom(fd, buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n < 0) {
      if (errno == EINTR) continue;
      Die(std::string("recvfrom: ") + std::strerror(errno));
    }
    sendto(fd, buf.data(), static_cast<size_t>(n), 0, reinterpret_cast<sockaddr*>(&from), from_len);
  }
}

// ---- HTTP -----------------------------------------------------------------------------------

// N bytes of 'x' after the header, written in large pieces.
void WriteBytes(tcp::socket& s, unsigned long long n, bool keep_alive, beast::error_code& ec) {
  const std::string head =
      "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
      "Content-Length: " +
      std::to_string(n) + "\r\nConnection: " + (keep_alive ? "keep-alive" : "close") + "\r\n\r\n";
  asio::write(s, asio::buffer(head), ec);
  static const std::string chunk(1 << 18, 'x');
  while (!ec && n > 0) {
    const size_t piece = static_cast<size_t>(std::min<unsigned long long>(n, chunk.size()));
    asio::write(s, asio::buffer(chunk.data(), piece), ec);
    n -= piece;
  }
}

void ServeConnection(tcp::socket s, std::string name) {
  beast::error_code ec;
  beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(1 << 20);
    parser.header_limit(16 << 10);
    http::read(s, buffer, parser, ec);
    if (ec) return;
    const auto& req = parser.get();
    const bool keep_alive = req.keep_alive();
    const std::string target(req.target());
    http::response<http::string_body> res;
    res.version(11);
    res.keep_alive(keep_alive);
    res.set(http::field::server, "nsbox-test-inet");
    res.set(http::field::content_type, "text/plain");
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      res.result(http::status::method_not_allowed);
      res.body() = "GET only\n";
    } else if (target == "/") {
      res.result(http::status::ok);
      res.body() = name + "\n";
    } else if (target == "/whoami") {
      res.result(http::status::ok);
      auto remote = s.remote_endpoint(ec);
      res.body() = (ec ? std::string("?") : remote.address().to_string()) + "\n";
    } else if (target.rfind("/bytes?n=", 0) == 0) {
      char* end = nullptr;
      const unsigned long long n = std::strtoull(target.c_str() + 9, &end, 10);
      if (end == target.c_str() + 9 || *end != '\0' || n > (1ULL << 40)) {
        res.result(http::status::bad_request);
        res.body() = "bad n\n";
      } else {
        WriteBytes(s, n, keep_alive, ec);
        if (ec || !keep_alive) return;
        continue;
      }
    } else {
      res.result(http::status::not_found);
      res.body() = "not found\n";
    }
    res.prepare_payload();
    http::write(s, res, ec);
    if (ec || !keep_alive) return;
  }
}

void ServeHttp(tcp::acceptor& acceptor, const std::string& name) {
  for (;;) {
    beast::error_code ec;
    tcp::socket s(acceptor.get_executor());
    acceptor.accept(s, ec);
    if (ec) continue;
    std::thread(ServeConnection, std::move(s), name).detach();
  }
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  Zone zone;
  std::vector<HostPort> dns;
  std::vector<std::pair<std::string, HostPort>> https;
  std::vector<HostPort> echoes;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Die("missing value after " + flag);
    const std::string value = argv[++i];
    const size_t eq = value.find('=');
    if (flag == "--dns") {
      dns.push_back(ParseHostPort(value));
    } else if (flag == "--zone" && eq != std::string::npos) {
      zone.a[Lower(value.substr(0, eq))] = value.substr(eq + 1);
    } else if (flag == "--cname" && eq != std::string::npos) {
      zone.cname[Lower(value.substr(0, eq))] = Lower(value.substr(eq + 1));
    } else if (flag == "--ttl") {
      zone.ttl = static_cast<uint32_t>(std::strtoul(value.c_str(), nullptr, 10));
    } else if (flag == "--http" && value.find('@') != std::string::npos) {
      const size_t at = value.find('@');
      https.emplace_back(value.substr(0, at), ParseHostPort(value.substr(at + 1)));
    } else if (flag == "--udp-echo") {
      echoes.push_back(ParseHostPort(value));
    } else {
      Die("unknown or malformed argument: " + flag + " " + value);
    }
  }

  asio::io_context io;
  std::vector<std::unique_ptr<tcp::acceptor>> acceptors;
  std::string ready = "ready";
  for (const auto& [name, hp] : https) {
    tcp::endpoint ep(asio::ip::make_address_v4(hp.host), hp.port);
    auto acceptor = std::make_unique<tcp::acceptor>(io);
    beast::error_code ec;
    acceptor->open(ep.protocol(), ec);
    if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor->bind(ep, ec);
    if (!ec) acceptor->listen(128, ec);
    if (ec) Die("listen " + hp.host + ":" + std::to_string(hp.port) + ": " + ec.message());
    ready += " " + std::to_string(acceptor->local_endpoint().port());
    acceptors.push_back(std::move(acceptor));
  }
  std::vector<std::thread> threads;
  for (const auto& hp : dns) {
    const int fd = BindUdp(hp);
    threads.emplace_back([fd, &zone] { ServeDns(fd, zone); });
  }
  for (const auto& hp : echoes) {
    const int fd = BindUdp(hp);
    threads.emplace_back([fd] { ServeUdpEcho(fd); });
  }
  for (size_t i = 0; i < acceptors.size(); ++i) {
    threads.emplace_back([&acceptors, &https, i] { ServeHttp(*acceptors[i], https[i].first); });
  }
  std::printf("%s\n", ready.c_str());
  std::fflush(stdout);
  for (auto& t : threads) t.join();
  return 0;
}
