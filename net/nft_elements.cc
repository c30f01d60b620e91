#include "net/nft_elements.h"

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <cstring>

namespace nsbox::net {

Result<std::unique_ptr<NftElements>> NftElements::Open() {
  mnl_socket* s = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
  if (s == nullptr) return Error::Sys("socket", "NETLINK_NETFILTER", errno);
  if (mnl_socket_bind(s, 0, MNL_SOCKET_AUTOPID) != 0) {
    const int err = errno;
    mnl_socket_close(s);
    return Error::Sys("bind", "NETLINK_NETFILTER", err);
  }
  // A kernel that never answers must not hang the resolver: a receive gives up after 5 s. An
  // error answer carries only the failed message's header, not the whole message back.
  timeval limit{5, 0};
  const int one = 1;
  if (::setsockopt(mnl_socket_get_fd(s), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit) != 0 ||
      ::setsockopt(mnl_socket_get_fd(s), SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof one) != 0) {
    const int err = errno;
    mnl_socket_close(s);
    return Error::Sys("setsockopt", "NETLINK_NETFILTER socket", err);
  }
  return std::unique_ptr<NftElements>(new NftElements(s));
}

NftElements::~NftElements() { mnl_socket_close(socket_); }

std::string NftElements::Ipv4Key(uint32_t address) {
  const uint32_t be = htonl(address);
  return std::string(reinterpret_cast<const char*>(&be), sizeof be);
}

std::string NftElements::Ipv4PortKey(uint32_t address, uint16_t port) {
  const uint16_t be = htons(port);
  std::string key = Ipv4Key(address);
  key.append(reinterpret_cast<const char*>(&be), sizeof be);
  key.append(2, '\0');  // each field of a concatenation takes a multiple of 4 bytes
  return key;
}

Status NftElements::Refresh(const std::string& table, const std::string& set,
                            const std::vector<std::string>& keys, uint64_t timeout_ms) {
  if (keys.empty()) return Ok();
  // A netlink attribute's length is 16 bits: the element list of one message stays well under
  // 64 KiB (≈ 32 bytes a key) by writing a long answer's keys in parts.
  constexpr size_t kMaxKeys = 1024;
  if (keys.size() > kMaxKeys) {
    for (size_t at = 0; at < keys.size(); at += kMaxKeys) {
      const size_t end = std::min(keys.size(), at + kMaxKeys);
      NSBOX_TRY(Refresh(table, set, std::vector<std::string>(keys.begin() + at, keys.begin() + end),
                        timeout_ms));
    }
    return Ok();
  }
  if (seq_ == 0) seq_ = static_cast<uint32_t>(::time(nullptr));
  // Three messages of at most ~64 bytes per key, plus headers and names.
  size_t size = 512 + 3 * (table.size() + set.size());
  for (const auto& k : keys) size += 3 * (64 + k.size());
  // libmnl's batch may run past its limit by one message: twice the room.
  std::vector<char> buf(2 * size);
  mnl_nlmsg_batch* batch = mnl_nlmsg_batch_start(buf.data(), size);
  if (batch == nullptr) return Error::Sys("mnl_nlmsg_batch_start", set, errno);
  bool fits = true;
  auto header = [&](uint16_t type, uint16_t flags, uint8_t family, uint16_t res_id) {
    nlmsghdr* nlh = mnl_nlmsg_put_header(mnl_nlmsg_batch_current(batch));
    nlh->nlmsg_type = type;
    nlh->nlmsg_flags = NLM_F_REQUEST | flags;
    nlh->nlmsg_seq = seq_++;
    auto* g = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
    g->nfgen_family = family;
    g->version = NFNETLINK_V0;
    g->res_id = htons(res_id);
    return nlh;
  };
  header(NFNL_MSG_BATCH_BEGIN, 0, AF_UNSPEC, NFNL_SUBSYS_NFTABLES);
  fits = mnl_nlmsg_batch_next(batch) && fits;
  const uint32_t first_seq = seq_;
  auto elements = [&](uint16_t msg, uint16_t flags, bool with_timeout) {
    nlmsghdr* nlh = header((NFNL_SUBSYS_NFTABLES << 8) | msg, flags | NLM_F_ACK, NFPROTO_INET, 0);
    mnl_attr_put_strz(nlh, NFTA_SET_ELEM_LIST_TABLE, table.c_str());
    mnl_attr_put_strz(nlh, NFTA_SET_ELEM_LIST_SET, set.c_str());
    nlattr* list = mnl_attr_nest_start(nlh, NFTA_SET_ELEM_LIST_ELEMENTS);
    for (const auto& key : keys) {
      nlattr* element = mnl_attr_nest_start(nlh, NFTA_LIST_ELEM);
      nlattr* key_attr = mnl_attr_nest_start(nlh, NFTA_SET_ELEM_KEY);
      mnl_attr_put(nlh, NFTA_DATA_VALUE, key.size(), key.data());
      mnl_attr_nest_end(nlh, key_attr);
      if (with_timeout) mnl_attr_put_u64(nlh, NFTA_SET_ELEM_TIMEOUT, htobe64(timeout_ms));
      mnl_attr_nest_end(nlh, element);
    }
    mnl_attr_nest_end(nlh, list);
    fits = mnl_nlmsg_batch_next(batch) && fits;
  };
  elements(NFT_MSG_NEWSETELEM, NLM_F_CREATE, false);
  elements(NFT_MSG_DELSETELEM, 0, false);
  elements(NFT_MSG_NEWSETELEM, NLM_F_CREATE, true);
  const uint32_t acks_due = seq_ - first_seq;
  header(NFNL_MSG_BATCH_END, 0, AF_UNSPEC, NFNL_SUBSYS_NFTABLES);
  fits = mnl_nlmsg_batch_next(batch) && fits;

  const std::string what = "set " + set + " of table " + table;
  if (!fits) {
    mnl_nlmsg_batch_stop(batch);
    return Error::Msg("netlink: " + std::to_string(keys.size()) + " elements for " + what +
                      " overflow the batch");
  }
  const ssize_t sent =
      mnl_socket_sendto(socket_, mnl_nlmsg_batch_head(batch), mnl_nlmsg_batch_size(batch));
  mnl_nlmsg_batch_stop(batch);
  if (sent < 0) return Error::Sys("netlink send", what, errno);

  // One answer per message of the batch (nfnetlink delivers them all at its end): an ack, or
  // the error of the message that failed (the batch is then undone as a whole).
  std::vector<char> reply(MNL_SOCKET_BUFFER_SIZE);
  uint32_t answered = 0;
  int first_error = 0;
  while (answered < acks_due) {
    const ssize_t n = mnl_socket_recvfrom(socket_, reply.data(), reply.size());
    if (n < 0) return Error::Sys("netlink receive", what, errno);
    int len = static_cast<int>(n);
    for (auto* nlh = reinterpret_cast<const nlmsghdr*>(reply.data()); mnl_nlmsg_ok(nlh, len);
         nlh = mnl_nlmsg_next(nlh, &len)) {
      if (nlh->nlmsg_type != NLMSG_ERROR || nlh->nlmsg_seq < first_seq ||
          nlh->nlmsg_seq >= first_seq + acks_due) {
        continue;  // not an answer to this batch (a late one of an earlier, failed call)
      }
      if (nlh->nlmsg_len < mnl_nlmsg_size(sizeof(nlmsgerr))) {
        return Error::Msg("netlink: a truncated answer for " + what);
      }
      const auto* err = static_cast<const nlmsgerr*>(mnl_nlmsg_get_payload(nlh));
      if (err->error != 0 && first_error == 0) first_error = -err->error;
      ++answered;
    }
  }
  if (first_error != 0) return Error::Sys("nf_tables set elements", what, first_error);
  return Ok();
}

}  // namespace nsbox::net
