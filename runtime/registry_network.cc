// The sandboxes' networks (docs/network.md): nsbox-net started on first need, a running
// sandbox's network attached and detached, a policy replaced, the connection counters.

#include <mutex>

#include "base/files.h"
#include "base/log.h"
#include "net/net_client.h"
#include "runtime/registry.h"

namespace nsbox::runtime {

bool Registry::NetLost() {
  std::unique_lock<std::mutex> lock(net_mu_, std::try_to_lock);
  return !lock.owns_lock() || net_ == nullptr || !net_->alive();
}

Result<net::NetHelper*> Registry::Net() {
  std::lock_guard<std::mutex> lock(net_mu_);
  if (net_ != nullptr && net_->alive()) return net_.get();
  if (net_ != nullptr) {
    // It died: a new one removes what it left (its table, the sandboxes' links). The running
    // sandboxes with a network are attached again at their next use (Running).
    log::error("nsbox-net (pid {}) is gone; starting a new one", net_->pid());
    net_.reset();
    for (const auto& e : List()) {
      std::lock_guard<std::mutex> entry_lock(e->mu_);
      e->address_.clear();
    }
  }
  net::NetHelper::Options o;
  o.binary = options_.net_binary;
  o.range = options_.network_range;
  // The interfaces, the nftables table and the log group of this daemon are named after it, so
  // that two daemons (two state directories) never touch each other's.
  o.tag = cgroup_prefix_.substr(6, 8);
  o.dns_upstreams = options_.dns_upstreams;
  o.log_level = options_.log_level;
  // Its death is noticed at once (not at the next call): every sandbox loses its network
  // record, so that its next use attaches it to a new nsbox-net (Running).
  o.on_death = [this] {
    log::error("nsbox-net exited; sandboxes with a network get it back at their next use");
    for (const auto& e : List()) {
      std::lock_guard<std::mutex> entry_lock(e->mu_);
      e->address_.clear();
    }
  };
  auto started = net::NetHelper::Start(o);
  if (!started.ok()) return std::move(started).error().Context("start nsbox-net");
  net_ = std::move(started).value();
  log::info("nsbox-net started: range {}, resolver {}", options_.network_range, nameserver_);
  return net_.get();
}

Status Registry::AttachLocked(SandboxEntry& entry, Sandbox& box, const net::NetworkPolicy& policy) {
  NSBOX_ASSIGN_OR_RETURN(net::NetHelper * net, Net());
  // The namespace's fd the sandbox holds since its start (Sandbox::netns_fd).
  NSBOX_ASSIGN_OR_RETURN(auto attached,
                         net->Attach(entry.hash_, entry.config_.id, box.netns_fd(), policy));
  {
    std::lock_guard<std::mutex> lock(entry.mu_);
    entry.address_ = attached.address;
  }
  if (!entry.config_.image_id.empty()) {
    // An imported image has its own /etc: its resolv.conf is written through nsbox-init, inside
    // the jail (the host image's is generated read-only, and names the resolver already).
    const std::string resolv_conf =
        "# nsbox: the sandbox's resolver, run by nsboxd (docs/network.md).\nnameserver " +
        nameserver_ + "\noptions timeout:2 attempts:2\n";
    auto written = box.client().WriteFile("/etc/resolv.conf", resolv_conf);
    if (!written.ok()) {
      log::warn("sandbox={} write /etc/resolv.conf: {}", entry.config_.id, written.error().message);
    }
  }
  log::info("sandbox={} network {}: address {} on {}", entry.config_.id, net::PolicySummary(policy),
            attached.address, attached.interface);
  return Ok();
}

void Registry::DetachLocked(SandboxEntry& entry) {
  std::string address;
  {
    std::lock_guard<std::mutex> lock(entry.mu_);
    address.swap(entry.address_);
  }
  if (address.empty()) return;
  net::NetHelper* net = nullptr;
  {
    std::lock_guard<std::mutex> lock(net_mu_);
    net = net_.get();
  }
  if (net == nullptr) return;
  if (auto st = net->Detach(entry.hash_); !st.ok()) {
    log::warn("sandbox={} remove its network: {}", entry.config_.id, st.error().message());
  }
}

ApiOutcome<bool> Registry::CheckNetwork(const net::NetworkPolicy& policy) {
  if (!policy.networked()) return true;
  auto net = Net();
  if (!net.ok()) {
    return ApiError::Of(422, "network_unavailable",
                        "this host cannot enforce the network policy " +
                            net::PolicySummary(policy) + ": " + net.error().message() +
                            " (nsbox doctor tells what is missing)");
  }
  return true;
}

ApiOutcome<bool> Registry::SetNetwork(SandboxEntry& entry, const net::NetworkPolicy& policy) {
  if (auto ok = CheckNetwork(policy); !ok.ok()) return ok.error();
  std::lock_guard<std::mutex> lifecycle(entry.lifecycle_mu_);
  std::shared_ptr<Sandbox> box;
  bool attached = false;
  {
    std::lock_guard<std::mutex> lock(entry.mu_);
    if (entry.deleted_) return ApiError::SandboxNotFound(entry.config_.id);
    if (entry.box_ != nullptr && entry.box_->client().connected()) box = entry.box_;
    attached = !entry.address_.empty();
  }
  SandboxConfig updated = entry.config_;
  updated.network = policy;
  if (auto st = WriteFileAtomic(entry.dir_, "config.json", EncodeConfig(updated)); !st.ok()) {
    return ApiError::Internal("set the network of sandbox '" + entry.config_.id +
                              "': " + st.error().message());
  }
  {
    std::lock_guard<std::mutex> lock(entry.mu_);
    entry.network_ = policy;
  }
  log::info("sandbox={} network policy now {}", entry.config_.id, net::PolicySummary(policy));
  if (box == nullptr) return true;  // applied at its next start
  Status applied = Ok();
  if (!policy.networked()) {
    DetachLocked(entry);
  } else if (!attached) {
    applied = AttachLocked(entry, *box, policy);
  } else {
    auto net = Net();
    applied = net.ok() ? net.value()->Replace(entry.hash_, policy) : Status(net.error());
  }
  if (!applied.ok()) {
    // Fail closed: rather no network than the old policy's.
    DetachLocked(entry);
    log::error("sandbox={} apply network policy: {}", entry.config_.id, applied.error().message());
    return ApiError::Internal("sandbox '" + entry.config_.id +
                              "': the new network policy is saved but could not be applied (" +
                              applied.error().message() +
                              "); the sandbox has no network until it is stopped and started");
  }
  return true;
}

std::map<std::string, NetworkConnections> Registry::NetworkCounters() {
  std::map<std::string, NetworkConnections> out;
  net::NetHelper* net = nullptr;
  {
    std::lock_guard<std::mutex> lock(net_mu_);
    net = net_.get();
  }
  if (net == nullptr) return out;  // never started: no sandbox ever had a network
  auto counters = net->Counters();
  if (!counters.ok()) {
    log::warn("read the network counters: {}", counters.error().message());
    return out;
  }
  for (const auto& e : List()) {
    auto it = counters->find(e->hash());
    if (it != counters->end()) out[e->config().id] = {it->second.allowed, it->second.refused};
  }
  return out;
}

}  // namespace nsbox::runtime
