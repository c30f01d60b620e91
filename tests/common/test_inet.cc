#include "tests/common/test_inet.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>  // first: else ldns/common.h defines bool, true and false as macros
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>

#include <ldns/ldns.h>

#include "net/policy.h"

namespace nsbox::testinet {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr const char* kNetnsPrefix = "nsbox-tinet-";
constexpr const char* kLinkPrefix = "tinet";
constexpr uint32_t kRangeBase = (198u << 24) | (18u << 16);  // 198.18.0.0/15
constexpr uint32_t kSlots = (1u << 17) / 8;                  // /29s in it

std::atomic<int> g_instances{0};

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The pid in "PREFIX<pid>-<n>", or -1.
pid_t PidOf(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return -1;
  const std::string rest = name.substr(prefix.size());
  const size_t dash = rest.find('-');
  if (dash == 0 || dash == std::string::npos) return -1;
  for (size_t i = 0; i < dash; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(rest[i]))) return -1;
  }
  return static_cast<pid_t>(std::stol(rest.substr(0, dash)));
}

bool Dead(pid_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

std::vector<std::string> NetnsNames() {
  std::vector<std::string> out;
  DIR* d = opendir("/run/netns");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  closedir(d);
  return out;
}

// The /29 slots that an IPv4 address of a host interface falls into.
std::set<uint32_t> UsedSlots() {
  std::string out;
  RunCommand({"ip", "-o", "-4", "addr", "show"}, &out);
  std::set<uint32_t> used;
  std::istringstream in(out);
  std::string word;
  while (in >> word) {
    if (word != "inet" || !(in >> word)) continue;
    const std::string addr = word.substr(0, word.find('/'));
    in_addr a{};
    if (inet_pton(AF_INET, addr.c_str(), &a) != 1) continue;
    const uint32_t h = ntohl(a.s_addr);
    if ((h & 0xFFFE0000u) == kRangeBase) used.insert((h - kRangeBase) / 8);
  }
  return used;
}

}  // namespace

// "ip -o link" lines are "3: name@peer: <...".
std::vector<std::string> LinkNames() {
  std::string out;
  RunCommand({"ip", "-o", "link", "show"}, &out);
  std::vector<std::string> names;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(": ");
    if (a == std::string::npos) continue;
    const size_t b = line.find_first_of(":@", a + 2);
    if (b == std::string::npos) continue;
    names.push_back(line.substr(a + 2, b - a - 2));
  }
  return names;
}

int RunCommand(const std::vector<std::string>& argv, std::string* output, milliseconds timeout) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return -1;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    return -1;
  }
  if (pid == 0) {
    const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    dup2(null, 0);
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(pipefd[1]);
  std::string out;
  const auto deadline = Clock::now() + timeout;
  bool killed = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    pollfd p{pipefd[0], POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    const ssize_t n = read(pipefd[0], buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(pipefd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (output != nullptr) *output = out;
  if (killed) return 128 + SIGKILL;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<std::string> TestInternet::RemoveLeftovers() {
  std::vector<std::string> removed;
  for (const auto& ns : NetnsNames()) {
    if (!Dead(PidOf(ns, kNetnsPrefix))) continue;
    if (RunCommand({"ip", "netns", "delete", ns}) == 0) removed.push_back("netns " + ns);
  }
  for (const auto& link : LinkNames()) {
    if (!Dead(PidOf(link, kLinkPrefix))) continue;
    if (RunCommand({"ip", "link", "delete", link}) == 0) removed.push_back("link " + link);
  }
  return removed;
}

std::string TestInternet::Address(int offset) const {
  return net::Ipv4Text(base_ + static_cast<uint32_t>(offset));
}

bool TestInternet::Fail(const std::string& message) {
  error_ = message;
  Stop();
  return false;
}

TestInternet::~TestInternet() { Stop(); }

bool TestInternet::StartServer(bool inside, const std::vector<std::string>& args, pid_t* pid,
                               std::vector<uint16_t>* ports) {
  int netns_fd = -1;
  if (inside) {
    const std::string path = "/run/netns/" + netns_;
    netns_fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (netns_fd < 0) return Fail("open " + path + ": " + std::strerror(errno));
  }
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return Fail(std::string("pipe2: ") + std::strerror(errno));
  std::vector<std::string> full = {NSBOX_TEST_INET_BIN};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (netns_fd >= 0 && setns(netns_fd, CLONE_NEWNET) != 0) _exit(126);
    dup2(pipefd[1], 1);
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (netns_fd >= 0) close(netns_fd);
  close(pipefd[1]);
  if (child < 0) {
    close(pipefd[0]);
    return Fail(std::string("fork: ") + std::strerror(errno));
  }
  *pid = child;
  std::string line;
  const auto deadline = Clock::now() + milliseconds(10000);
  while (line.find('\n') == std::string::npos && Clock::now() < deadline) {
    pollfd p{pipefd[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[256];
    const ssize_t n = read(pipefd[0], buf, sizeof(buf));
    if (n <= 0) break;
    line.append(buf, static_cast<size_t>(n));
  }
  close(pipefd[0]);
  std::istringstream in(line);
  std::string word;
  if (!(in >> word) || word != "ready") {
    return Fail(std::string("nsbox-test-inet did not start") + (inside ? " in " + netns_ : "") +
                " (its stderr is the test's)");
  }
  unsigned port = 0;
  while (in >> port) ports->push_back(static_cast<uint16_t>(port));
  return true;
}

bool TestInternet::Start() {
  if (geteuid() != 0) return Fail("needs root");
  RemoveLeftovers();
  const int n = g_instances++;
  const std::string id = std::to_string(getpid()) + "-" + std::to_string(n);
  netns_ = kNetnsPrefix + id;
  link_ = kLinkPrefix + id;
  if (link_.size() > 15) return Fail("link name too long: " + link_);
  // A namespace or link of this very name is a leftover of a former process with this pid.
  RunCommand({"ip", "netns", "delete", netns_});
  RunCommand({"ip", "link", "delete", link_});

  const std::set<uint32_t> used = UsedSlots();
  uint32_t slot = (static_cast<uint32_t>(getpid()) * 4u + static_cast<uint32_t>(n)) % kSlots;
  for (uint32_t i = 0; i < kSlots && used.count(slot) != 0; ++i) slot = (slot + 1) % kSlots;
  base_ = kRangeBase + slot * 8;
  metric_ = 100 + static_cast<int>(slot);
  started_ = true;

  const std::string inner = "ti0";
  const std::vector<std::vector<std::string>> steps = {
      {"ip", "netns", "add", netns_},
      {"ip", "link", "add", link_, "type", "veth", "peer", "name", inner, "netns", netns_},
      {"ip", "-n", netns_, "link", "set", "lo", "up"},
      {"ip", "-n", netns_, "addr", "add", Address(2) + "/29", "dev", inner},
      {"ip", "-n", netns_, "addr", "add", Address(3) + "/32", "dev", inner},
      {"ip", "-n", netns_, "addr", "add", Address(4) + "/32", "dev", inner},
      {"ip", "-n", netns_, "addr", "add", Address(5) + "/32", "dev", inner},
      {"ip", "-n", netns_, "addr", "add", Address(6) + "/32", "dev", inner},
      {"ip", "-n", netns_, "addr", "add", std::string(kMetadataAddress) + "/32", "dev", "lo"},
      {"ip", "-n", netns_, "link", "set", inner, "up"},
      {"ip", "-n", netns_, "route", "add", "default", "via", Address(1)},
      {"ip", "addr", "add", Address(1) + "/29", "dev", link_},
      {"ip", "link", "set", link_, "up"},
      {"ip", "route", "add", std::string(kMetadataAddress) + "/32", "via", Address(2), "dev", link_,
       "metric", std::to_string(metric_)},
  };
  for (const auto& step : steps) {
    std::string out;
    const int rc = RunCommand(step, &out);
    if (rc != 0) {
      std::string cmd;
      for (const auto& a : step) cmd += (cmd.empty() ? "" : " ") + a;
      return Fail(cmd + ": exit " + std::to_string(rc) + ": " + Trim(out));
    }
  }
  // The veth answers at once (no IPv6 DAD to wait for: only IPv4 is used).
  std::vector<uint16_t> ports;
  const std::string port80 = ":" + std::to_string(kHttpPort);
  const std::vector<std::string> inner_args = {
      "--dns",      Address(3) + ":53",
      "--zone",     "allowed.test=" + Address(4),
      "--zone",     "sub.allowed.test=" + Address(4),
      "--zone",     "denied.test=" + Address(5),
      "--cname",    "cname.test=allowed.test",
      "--ttl",      std::to_string(kDnsTtl),
      "--http",     "allowed.test@" + Address(4) + port80,
      "--http",     "allowed.test@" + Address(4) + ":" + std::to_string(kAltHttpPort),
      "--http",     "denied.test@" + Address(5) + port80,
      "--http",     "denied.test@" + Address(5) + ":" + std::to_string(kAltHttpPort),
      "--http",     "raw-ip-host@" + Address(6) + port80,
      "--http",     "metadata@" + std::string(kMetadataAddress) + port80,
      "--udp-echo", Address(4) + port80,
      "--udp-echo", Address(5) + port80,
      "--udp-echo", Address(6) + port80,
      "--udp-echo", std::string(kMetadataAddress) + port80,
  };
  if (!StartServer(true, inner_args, &inner_pid_, &ports)) return false;
  ports.clear();
  if (!StartServer(false, {"--http", "host@0.0.0.0:0"}, &host_pid_, &ports)) return false;
  if (ports.size() != 1) return Fail("the host's server reported no port");
  host_port_ = ports[0];
  return true;
}

void TestInternet::Stop() {
  for (pid_t* pid : {&inner_pid_, &host_pid_}) {
    if (*pid <= 0) continue;
    kill(*pid, SIGKILL);
    while (waitpid(*pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    *pid = -1;
  }
  if (!started_) return;
  started_ = false;
  // Deleting the namespace deletes the veth (both ends) and with it the host's route.
  RunCommand({"ip", "netns", "delete", netns_});
  for (const auto& link : LinkNames()) {
    if (link == link_) RunCommand({"ip", "link", "delete", link_});
  }
}

std::vector<std::string> TestInternet::Remnants() const {
  std::vector<std::string> out;
  if (netns_.empty()) return out;
  for (const auto& ns : NetnsNames()) {
    if (ns == netns_) out.push_back("netns " + ns);
  }
  for (const auto& link : LinkNames()) {
    if (link == link_) out.push_back("link " + link);
  }
  std::string routes;
  RunCommand({"ip", "-o", "route", "show", "table", "all"}, &routes);
  std::istringstream in(routes);
  std::string line;
  while (std::getline(in, line)) {
    const std::string padded = line + " ";
    if (padded.find(" dev " + link_ + " ") != std::string::npos ||
        padded.find(" via " + Address(2) + " ") != std::string::npos) {
      out.push_back("route " + line);
    }
  }
  return out;
}

// ---- clients --------------------------------------------------------------------------------

DnsAnswer DnsQuery(const std::string& server, uint16_t port, const std::string& name,
                   const std::string& type, milliseconds timeout) {
  DnsAnswer answer;
  ldns_pkt* query = nullptr;
  const ldns_rr_type rr_type = type == "AAAA" ? LDNS_RR_TYPE_AAAA : LDNS_RR_TYPE_A;
  if (ldns_pkt_query_new_frm_str(&query, name.c_str(), rr_type, LDNS_RR_CLASS_IN, LDNS_RD) !=
      LDNS_STATUS_OK) {
    answer.error = "bad name " + name;
    return answer;
  }
  ldns_pkt_set_id(query, static_cast<uint16_t>(getpid() ^ 0x5a5a));
  uint8_t* wire = nullptr;
  size_t wire_size = 0;
  ldns_pkt2wire(&wire, query, &wire_size);
  ldns_pkt_free(query);

  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, server.c_str(), &sa.sin_addr);
  const ssize_t sent =
      sendto(fd, wire, wire_size, 0, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa));
  std::free(wire);
  if (sent < 0) {
    answer.error = std::string("sendto: ") + std::strerror(errno);
    close(fd);
    return answer;
  }
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(timeout.count())) <= 0) {
    answer.error = "no reply from " + server + " within " + std::to_string(timeout.count()) + " ms";
    close(fd);
    return answer;
  }
  std::vector<uint8_t> buf(65536);
  const ssize_t n = recv(fd, buf.data(), buf.size(), 0);
  close(fd);
  ldns_pkt* reply = nullptr;
  if (n <= 0 || ldns_wire2pkt(&reply, buf.data(), static_cast<size_t>(n)) != LDNS_STATUS_OK) {
    answer.error = "unparsable reply";
    return answer;
  }
  answer.answered = true;
  answer.rcode = ldns_pkt_get_rcode(reply);
  ldns_rr_list* rrs = ldns_pkt_answer(reply);
  bool first = true;
  for (size_t i = 0; rrs != nullptr && i < ldns_rr_list_rr_count(rrs); ++i) {
    ldns_rr* rr = ldns_rr_list_rr(rrs, i);
    char* text = ldns_rdf2str(ldns_rr_rdf(rr, 0));
    std::string value = text != nullptr ? text : "";
    std::free(text);
    if (!value.empty() && value.back() == '.') value.pop_back();
    if (ldns_rr_get_type(rr) == LDNS_RR_TYPE_A) answer.a.push_back(value);
    if (ldns_rr_get_type(rr) == LDNS_RR_TYPE_CNAME) answer.cname.push_back(value);
    answer.min_ttl = first ? ldns_rr_ttl(rr) : std::min(answer.min_ttl, ldns_rr_ttl(rr));
    first = false;
  }
  ldns_pkt_free(reply);
  return answer;
}

int HttpGet(const std::string& address, uint16_t port, const std::string& path, std::string* body,
            std::string* error, milliseconds timeout) {
  std::string out;
  const std::string url = "http://" + address + ":" + std::to_string(port) + path;
  const double seconds = static_cast<double>(timeout.count()) / 1000.0;
  const int rc = RunCommand(
      {"curl", "-sS", "--noproxy", "*", "-m", std::to_string(seconds), "-w", "\n%{http_code}", url},
      &out, timeout + milliseconds(2000));
  if (rc != 0) {
    if (error != nullptr) *error = "curl " + url + ": exit " + std::to_string(rc) + ": " + out;
    return 0;
  }
  const size_t nl = out.rfind('\n');
  if (body != nullptr) *body = out.substr(0, nl);
  return std::atoi(out.c_str() + nl + 1);
}

std::string UdpEcho(const std::string& address, uint16_t port, const std::string& payload,
                    milliseconds timeout) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, address.c_str(), &sa.sin_addr);
  sendto(fd, payload.data(), payload.size(), 0, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa));
  pollfd p{fd, POLLIN, 0};
  std::string reply;
  if (poll(&p, 1, static_cast<int>(timeout.count())) > 0) {
    char buf[65536];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) reply.assign(buf, static_cast<size_t>(n));
  }
  close(fd);
  return reply;
}

}  // namespace nsbox::testinet
