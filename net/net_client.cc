#include "net/net_client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/files.h"
#include "base/syscalls.h"

extern char** environ;

namespace nsbox::net {
namespace json = boost::json;

namespace {

constexpr int kAnswerTimeoutMs = 10000;
constexpr size_t kMaxAnswer = 1 << 20;

Result<std::string> ReceiveAnswer(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  int ready = 0;
  do {
    ready = ::poll(&p, 1, timeout_ms);
  } while (ready < 0 && errno == EINTR);
  if (ready < 0) return Error::Sys("poll", "nsbox-net channel", errno);
  if (ready == 0) return Error(ETIMEDOUT, "nsbox-net did not answer within 10 s");
  // The answer's length first (a peek with MSG_TRUNC): a buffer of its size, not of the most.
  const ssize_t size = ::recv(fd, nullptr, 0, MSG_PEEK | MSG_TRUNC);
  if (size < 0) return Error::Sys("recv", "nsbox-net channel", errno);
  std::string buf(std::min(static_cast<size_t>(size), kMaxAnswer), '\0');
  ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
  if (n < 0) return Error::Sys("recv", "nsbox-net channel", errno);
  if (n == 0) return Error(EPIPE, "nsbox-net exited (its log says why)");
  buf.resize(static_cast<size_t>(n));
  return buf;
}

// The answer's object, or its "error" as an Error.
Result<json::object> Parse(const std::string& text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec || !v.is_object()) return Error::Msg("nsbox-net answered something that is not JSON");
  json::object& o = v.as_object();
  if (const json::value* e = o.if_contains("error"); e != nullptr && e->is_string()) {
    return Error::Msg(std::string(e->as_string()));
  }
  return std::move(o);
}

std::string Text(const json::object& o, const char* key) {
  const json::value* v = o.if_contains(key);
  return v != nullptr && v->is_string() ? std::string(v->as_string()) : "";
}

}  // namespace

Result<std::string> DefaultNetBinary() {
  return FindBesideSelf({"/nsbox-net", kNetInLibexec, "/../net/nsbox-net"}, "nsbox-net");
}

Result<std::unique_ptr<NetHelper>> NetHelper::Start(const Options& options) {
  std::string binary = options.binary;
  if (binary.empty()) {
    NSBOX_ASSIGN_OR_RETURN(binary, DefaultNetBinary());
  }
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    return Error::Sys("socketpair", "nsbox-net channel", errno);
  }
  UniqueFd ours(pair[0]);
  UniqueFd theirs(pair[1]);
  // The child's end becomes its fd 3 (dup2 clears close-on-exec).
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, theirs.get(), 3);
  std::vector<std::string> args = {binary,      "--channel-fd", "3",
                                   "--range",   options.range,  "--tag",
                                   options.tag, "--log-level",  options.log_level};
  for (const std::string& u : options.dns_upstreams) {
    args.push_back("--dns-upstream");
    args.push_back(u);
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int err = ::posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return Error::Sys("posix_spawn", binary, err);
  theirs.reset();
  std::unique_ptr<NetHelper> h(new NetHelper());
  h->channel_ = std::move(ours);
  h->pid_ = pid;
  auto ready = ReceiveAnswer(h->channel_.get(), kAnswerTimeoutMs);
  Result<json::object> parsed = ready.ok() ? Parse(*ready) : Result<json::object>(ready.error());
  if (!parsed.ok()) {
    h->dead_ = true;  // the destructor reaps it
    return std::move(parsed).error();
  }
  h->gateway_ = Text(*parsed, "gateway");
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC) != 0) return Error::Sys("pipe2", "nsbox-net watcher", errno);
  h->wake_read_.reset(wake[0]);
  h->wake_write_.reset(wake[1]);
  h->on_death_ = options.on_death;
  h->watcher_ = std::thread([helper = h.get()] { helper->Watch(); });
  return h;
}

void NetHelper::Watch() {
  // Events 0 on the channel: only its hang-up (POLLHUP) is reported, never the answers that
  // Call reads.
  pollfd fds[2] = {{channel_.get(), 0, 0}, {wake_read_.get(), POLLIN, 0}};
  for (;;) {
    int n = ::poll(fds, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || (fds[1].revents & POLLIN) != 0) return;  // destroyed
    if ((fds[0].revents & (POLLHUP | POLLERR)) != 0) break;
  }
  dead_ = true;
  if (on_death_) on_death_();
}

NetHelper::~NetHelper() {
  if (watcher_.joinable()) {
    (void)!::write(wake_write_.get(), "x", 1);
    watcher_.join();
  }
  channel_.reset();
  if (pid_ <= 0) return;
  // It cleans up and exits when the channel closes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool NetHelper::alive() const {
  if (dead_) return false;
  // The channel hangs up the moment nsbox-net dies; the watcher may not have run yet.
  pollfd p{channel_.get(), 0, 0};
  int n = 0;
  do {
    n = ::poll(&p, 1, 0);
  } while (n < 0 && errno == EINTR);
  if (n > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0) dead_ = true;
  return !dead_;
}

Result<std::string> NetHelper::Call(const std::string& request, int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dead_) return Error(EPIPE, "nsbox-net exited (the daemon's log says why)");
  iovec iov{const_cast<char*>(request.data()), request.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  sys::FdControl control;
  if (fd >= 0) sys::AttachFd(&msg, &control, fd);
  if (::sendmsg(channel_.get(), &msg, MSG_NOSIGNAL) < 0) {
    const int e = errno;
    dead_ = true;
    return Error::Sys("sendmsg", "nsbox-net channel", e);
  }
  auto answer = ReceiveAnswer(channel_.get(), kAnswerTimeoutMs);
  // A channel out of step (a late answer would be taken for the next request's) is unusable.
  if (!answer.ok()) dead_ = true;
  return answer;
}

Result<NetHelper::Attached> NetHelper::Attach(const std::string& key, const std::string& id,
                                              int netns_fd, const NetworkPolicy& policy) {
  json::object o;
  o["op"] = "attach";
  o["key"] = key;
  o["id"] = id;
  o["policy"] = PolicyToJson(policy);
  NSBOX_ASSIGN_OR_RETURN(std::string text, Call(json::serialize(o), netns_fd));
  NSBOX_ASSIGN_OR_RETURN(json::object reply, Parse(text));
  return Attached{Text(reply, "address"), Text(reply, "interface")};
}

Status NetHelper::Replace(const std::string& key, const NetworkPolicy& policy) {
  json::object o;
  o["op"] = "policy";
  o["key"] = key;
  o["policy"] = PolicyToJson(policy);
  NSBOX_ASSIGN_OR_RETURN(std::string text, Call(json::serialize(o)));
  auto parsed = Parse(text);
  if (!parsed.ok()) return std::move(parsed).error();
  return Ok();
}

Status NetHelper::Detach(const std::string& key) {
  json::object o;
  o["op"] = "detach";
  o["key"] = key;
  NSBOX_ASSIGN_OR_RETURN(std::string text, Call(json::serialize(o)));
  auto parsed = Parse(text);
  if (!parsed.ok()) return std::move(parsed).error();
  return Ok();
}

Result<std::map<std::string, NetHelper::Counts>> NetHelper::Counters() {
  NSBOX_ASSIGN_OR_RETURN(std::string text, Call(R"({"op":"counters"})"));
  NSBOX_ASSIGN_OR_RETURN(json::object reply, Parse(text));
  std::map<std::string, Counts> out;
  const json::value* all = reply.if_contains("counters");
  if (all == nullptr || !all->is_object()) return out;
  for (const auto& [key, v] : all->as_object()) {
    if (!v.is_object()) continue;
    Counts c;
    boost::system::error_code ec;
    if (const json::value* a = v.as_object().if_contains("allowed")) {
      c.allowed = a->to_number<uint64_t>(ec);
    }
    if (const json::value* r = v.as_object().if_contains("refused")) {
      c.refused = r->to_number<uint64_t>(ec);
    }
    out[std::string(key)] = c;
  }
  return out;
}

}  // namespace nsbox::net
