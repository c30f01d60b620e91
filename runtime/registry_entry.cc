// One sandbox id's entry in the registry (registry.h SandboxEntry): its network, its exec
// sessions, its use by requests.

#include <algorithm>
#include <mutex>

#include "base/files.h"
#include "runtime/exec_session.h"
#include "runtime/registry.h"

namespace nsbox::runtime {

SandboxEntry::SandboxEntry(SandboxConfig config, std::string hash, std::string dir,
                           uint64_t idle_stop_ms)
    : config_(std::move(config)),
      hash_(std::move(hash)),
      dir_(std::move(dir)),
      idle_stop_ms_(idle_stop_ms),
      network_(config_.network) {}

net::NetworkPolicy SandboxEntry::network() const {
  std::lock_guard<std::mutex> lock(mu_);
  return network_;
}

std::string SandboxEntry::address() const {
  std::lock_guard<std::mutex> lock(mu_);
  return address_;
}

void SandboxEntry::BeginUse() {
  std::lock_guard<std::mutex> lock(mu_);
  ++users_;
}

void SandboxEntry::EndUse() {
  std::lock_guard<std::mutex> lock(mu_);
  --users_;
  last_used_ = std::chrono::steady_clock::now();
}

std::optional<std::chrono::steady_clock::time_point> SandboxEntry::IdleCheckAt() const {
  if (idle_stop_ms_ == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  return IdleCheckAtLocked();
}

std::optional<std::chrono::steady_clock::time_point> SandboxEntry::IdleCheckAtLocked() const {
  if (idle_stop_ms_ == 0 || deleted_ || box_ == nullptr || users_ > 0) return std::nullopt;
  if (busy_) return last_busy_ + kIdleBusyRecheck;
  return std::max(last_used_, last_busy_) + std::chrono::milliseconds(idle_stop_ms_);
}

bool SandboxEntry::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return box_ != nullptr && box_->client().connected();
}

std::string SandboxEntry::NewExecId() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string exec_id;
  do {
    exec_id = "e-" + RandomHex(12);
  } while (sessions_.count(exec_id) != 0);
  return exec_id;
}

void SandboxEntry::AddSession(std::shared_ptr<ExecSession> session) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string id = session->id();
  sessions_[id] = std::move(session);
  session_order_.push_back(id);
}

std::shared_ptr<ExecSession> SandboxEntry::FindSession(const std::string& exec_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(exec_id);
  return it == sessions_.end() ? nullptr : it->second;
}

void SandboxEntry::RemoveSession(const ExecSession* session, const std::string& exec_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(exec_id);
  if (it == sessions_.end() || it->second.get() != session) return;
  sessions_.erase(it);
  if (auto pos = std::find(session_order_.begin(), session_order_.end(), exec_id);
      pos != session_order_.end()) {
    session_order_.erase(pos);
  }
}

std::vector<std::shared_ptr<ExecSession>> SandboxEntry::Sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<ExecSession>> out;
  for (const std::string& id : session_order_) {
    if (auto it = sessions_.find(id); it != sessions_.end()) out.push_back(it->second);
  }
  return out;
}

std::vector<std::shared_ptr<ExecSession>> SandboxEntry::TakeSessions() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<ExecSession>> out;
  for (auto& [id, s] : sessions_) out.push_back(std::move(s));
  sessions_.clear();
  session_order_.clear();
  return out;
}

}  // namespace nsbox::runtime
