#pragma once

// nsboxd's handle on nsbox-net (net/netd.h): starts it with one end of a SOCK_SEQPACKET
// socketpair and makes its requests. Only sockets and Boost.JSON: it links into the static
// nsbox. Thread-safe; every call blocks until nsbox-net answers (at most 10 s).

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"
#include "net/policy.h"

namespace nsbox::net {

class NetHelper {
 public:
  struct Options {
    std::string binary;  // nsbox-net; "" for the one beside the running executable
    std::string range = "10.213.0.0/16";
    std::string tag;  // 1 to 8 hex digits
    std::vector<std::string> dns_upstreams;
    std::string log_level = "info";
    // Called once, on a thread of the helper's own, when nsbox-net exits unasked (not when the
    // NetHelper is destroyed).
    std::function<void()> on_death;
  };
  // Spawns nsbox-net and waits until it is ready (its error when it cannot be).
  static Result<std::unique_ptr<NetHelper>> Start(const Options& options);
  // Closes the channel: nsbox-net removes its table and interfaces and exits (waited for 5 s,
  // then killed).
  ~NetHelper();
  NetHelper(const NetHelper&) = delete;
  NetHelper& operator=(const NetHelper&) = delete;

  struct Attached {
    std::string address;
    std::string interface;
  };
  Result<Attached> Attach(const std::string& key, const std::string& id, int netns_fd,
                          const NetworkPolicy& policy);
  Status Replace(const std::string& key, const NetworkPolicy& policy);
  Status Detach(const std::string& key);
  struct Counts {
    uint64_t allowed = 0;
    uint64_t refused = 0;
  };
  Result<std::map<std::string, Counts>> Counters();
  // Whether nsbox-net still runs (false once it died: every call then fails). Asks the channel
  // itself, so that a death is seen before the watcher thread has run; never waits.
  bool alive() const;
  const std::string& resolver_address() const { return gateway_; }
  pid_t pid() const { return pid_; }

 private:
  NetHelper() = default;
  // One request and its answer (an {"error": ...} answer is an Error).
  Result<std::string> Call(const std::string& request, int fd = -1);

  // Waits for the channel to hang up (nsbox-net gone) or for wake_ (the destructor).
  void Watch();
  mutable std::mutex mu_;
  UniqueFd channel_;
  UniqueFd wake_read_, wake_write_;
  std::thread watcher_;
  std::function<void()> on_death_;
  pid_t pid_ = -1;
  std::string gateway_;
  // Set by the watcher, a failed call or alive(); read without mu_ (alive() never waits for a
  // call under way).
  mutable std::atomic<bool> dead_{false};
};

// Where the package and `cmake --install` put nsbox-net, from nsbox's directory (bin/).
inline constexpr const char* kNetInLibexec = "/../libexec/nsbox/nsbox-net";
// nsbox-net beside the running executable, else in ../libexec/nsbox, else in the build tree's
// net/ beside runtime/.
Result<std::string> DefaultNetBinary();

}  // namespace nsbox::net
