#pragma once

// nsbox-net's nftables ruleset (libnftables): one table `inet nsbox_<tag>` per daemon, a chain
// per sandbox with a network, the sets of addresses its resolver learned, and counters. The
// rules are written as nft commands and applied in one atomic batch per change
// (docs/network.md "The filter").

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "net/policy.h"

struct nft_ctx;

namespace nsbox::net {

struct FirewallConfig {
  std::string tag;     // the table is nsbox_<tag>; interfaces start with nsb<tag>
  uint32_t range = 0;  // the daemon's range (host byte order)
  uint8_t range_prefix = 16;
  uint32_t gateway = 0;    // the resolver and gateway, the range's first address
  uint16_t log_group = 0;  // NFLOG group of the refusals
};

class NftElements;

class Firewall {
 public:
  static Result<Firewall> Create(const FirewallConfig& config);
  Firewall(Firewall&& other) noexcept;
  Firewall& operator=(Firewall&&) = delete;
  ~Firewall();

  // Removes the table (a dead predecessor's, or this one's at exit); no error when absent.
  Status RemoveTable();
  // The table, its hooks and the masquerade of the range.
  Status Install();
  // A sandbox's chain, counters and sets, and its interface's entry in the dispatch maps.
  Status AddSandbox(int slot, const std::string& interface, uint32_t address,
                    const NetworkPolicy& policy);
  // Its rules replaced, and what its resolver learned forgotten, in one batch.
  Status ReplacePolicy(int slot, uint32_t address, const NetworkPolicy& policy);
  Status RemoveSandbox(int slot, const std::string& interface);
  // Opens `addresses` to the sandbox for `seconds` (all ports, or only `ports`).
  Status Learn(int slot, const std::vector<uint32_t>& addresses, uint32_t seconds,
               const std::vector<uint16_t>& ports, bool all_ports);
  struct Counts {
    uint64_t allowed = 0;
    uint64_t refused = 0;
  };
  // By slot.
  Result<std::map<int, Counts>> Counters();
  // Whether nftables is usable here: a scratch table made and removed.
  static Status Probe();

  const std::string& table() const { return table_; }

 private:
  Firewall(nft_ctx* ctx, std::unique_ptr<NftElements> elements, FirewallConfig config);
  // Runs nft commands (one atomic batch); the error carries nft's message.
  Status Run(const std::string& commands, std::string* output = nullptr);
  std::string Rules(int slot, uint32_t address, const NetworkPolicy& policy) const;

  nft_ctx* ctx_ = nullptr;
  std::unique_ptr<NftElements> elements_;  // the learned sets' writes (nft_elements.h)
  FirewallConfig config_;
  std::string table_;      // "inet nsbox_<tag>"
  std::string if_prefix_;  // "nsb<tag>"
};

}  // namespace nsbox::net
