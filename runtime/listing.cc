#include "runtime/listing.h"

#include <errno.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <utility>

#include "base/base64.h"
#include "base/utf8.h"

namespace nsbox::runtime {
namespace asio = boost::asio;
namespace json = boost::json;

namespace {

std::string_view EntryTypeName(uint8_t type) {
  switch (static_cast<fs::EntryType>(type)) {
    case fs::EntryType::kFile:
      return "file";
    case fs::EntryType::kDirectory:
      return "directory";
    case fs::EntryType::kSymlink:
      return "symlink";
    default:
      return "other";
  }
}

// A JSON string of `name` as Node gives it: UTF-8, invalid bytes as U+FFFD. Most names need no
// escape and are valid UTF-8: those are copied as they are (what json::serialize would write).
void AppendJsonName(std::string& out, std::string_view name, bool valid) {
  bool plain = valid;
  for (size_t i = 0; plain && i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    plain = c >= 0x20 && c != '"' && c != '\\';
  }
  if (plain) {
    out += '"';
    out += name;
    out += '"';
    return;
  }
  out += json::serialize(json::string_view(utf8::DecodeLossy(name)));
}

fs::FsError Malformed(std::string_view why) {
  fs::FsError e;
  e.err = EPROTO;
  e.syscall = "scandir";
  e.message = "nsbox-init sent " + std::string(why);
  return e;
}

}  // namespace

ListingBudget::ListingBudget(asio::any_io_executor ex, ListingLimits limits)
    : ex_(std::move(ex)),
      limits_(limits),
      max_(std::max<size_t>(1, limits.budget / limits.Reserve())) {}

asio::awaitable<bool> ListingBudget::Enter() {
  if (in_flight_ < max_ && waiters_.empty()) {
    ++in_flight_;
    co_return true;
  }
  auto timer = std::make_shared<asio::steady_timer>(ex_, limits_.admission);
  auto it = waiters_.insert(waiters_.end(), timer);
  (void)co_await timer->async_wait(asio::as_tuple(asio::use_awaitable));
  // Leave counted this one in and set the expiry to zero (and took it off the list); otherwise
  // no room came in time.
  if (timer->expiry() == asio::steady_timer::time_point()) co_return true;
  waiters_.erase(it);
  co_return false;
}

void ListingBudget::Leave() {
  --in_flight_;
  if (waiters_.empty() || in_flight_ >= max_) return;
  // The first waiter enters in this one's place; the zero expiry tells it so.
  auto timer = waiters_.front();
  waiters_.pop_front();
  ++in_flight_;
  timer->expires_at(asio::steady_timer::time_point());  // wakes its wait
}

ListingStream::ListingStream(asio::any_io_executor ex, bool with_types, ListingLimits limits,
                             std::function<void()> hold, std::function<void()> release)
    : ex_(ex),
      with_types_(with_types),
      limits_(limits),
      hold_(std::move(hold)),
      release_(std::move(release)),
      change_(ex, asio::steady_timer::time_point::max()),
      stall_timer_(ex) {}

ListingStream::~ListingStream() { Abandon(); }

void ListingStream::Part(std::string payload) {
  bool hold = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abandoned_ || error_) return;
    bytes_ += payload.size();
    ++frames_;
    queued_ += payload.size();
    parts_.push_back(std::move(payload));
    if (queued_ > limits_.window && !held_) {
      held_ = hold = true;
      held_since_ = std::chrono::steady_clock::now();
    }
  }
  if (hold) {
    hold_();
    asio::post(ex_, [self = shared_from_this()] { self->StallCheck(); });
  }
  Wake();
}

void ListingStream::Done(fs::FsOutcome<fs::Unit> outcome) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    if (!outcome.ok() && !error_) error_ = outcome.error();
  }
  Wake();
}

void ListingStream::Wake() {
  // The loop's timer is not thread-safe: the wake-up goes through the loop.
  asio::post(ex_, [self = shared_from_this()] { self->change_.cancel(); });
}

asio::awaitable<void> ListingStream::WaitChange() {
  (void)co_await change_.async_wait(asio::as_tuple(asio::use_awaitable));
}

void ListingStream::StallCheck() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!held_ || abandoned_ || error_) return;
    const auto deadline = held_since_ + limits_.stall;
    if (std::chrono::steady_clock::now() < deadline) {
      stall_timer_.expires_at(deadline);
      stall_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
        if (!ec) self->StallCheck();
      });
      return;
    }
    fs::FsError e;
    e.err = ETIMEDOUT;
    e.syscall = "scandir";
    e.message = "the client took less than half of " + std::to_string(limits_.window >> 10) +
                " KiB of the listing in " + std::to_string(limits_.stall.count()) +
                " ms, while its sandbox waited";
    error_ = std::move(e);
  }
  change_.cancel();
  if (on_stall) on_stall();
}

std::string ListingStream::TakeJson(size_t max) {
  std::string out;
  bool release = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!error_ && !parts_.empty() && out.size() < max) {
      if (!cursor_) cursor_.emplace(parts_.front());
      std::string_view name;
      uint8_t type = 0;
      if (!cursor_->Next(&name, &type)) {
        if (!cursor_->ok()) {
          error_ = Malformed("a malformed listing frame");
          break;
        }
        queued_ -= parts_.front().size();
        cursor_.reset();
        parts_.pop_front();
        continue;
      }
      // Sorted by byte value and unique, as nsbox-init's fs::Readdir gives them: passed on at
      // once, they cannot be sorted here.
      if (any_name_ && !(last_name_ < name)) {
        error_ = Malformed("a listing out of order ('" + utf8::DecodeLossy(name) + "' after '" +
                           utf8::DecodeLossy(last_name_) + "')");
        break;
      }
      last_name_.assign(name);
      any_name_ = true;
      if (items_) out += ',';
      items_ = true;
      const bool valid = utf8::IsValid(name);
      if (!with_types_) {
        AppendJsonName(out, name, valid);
        continue;
      }
      out += "{\"name\":";
      AppendJsonName(out, name, valid);
      if (!valid) {
        out += ",\"nameBase64\":\"";
        out += Base64Encode(name);
        out += '"';
      }
      out += ",\"type\":\"";
      out += EntryTypeName(type);
      out += "\"}";
    }
    if (held_ && queued_ < limits_.window / 2) {
      held_ = false;
      release = true;
    }
  }
  if (release) {
    stall_timer_.cancel();
    release_();
  }
  return out;
}

bool ListingStream::started() const {
  std::lock_guard<std::mutex> lock(mu_);
  return frames_ > 0 || done_;
}

bool ListingStream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ && parts_.empty();
}

std::optional<fs::FsError> ListingStream::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

bool ListingStream::any_part() const {
  std::lock_guard<std::mutex> lock(mu_);
  return frames_ > 0;
}

bool ListingStream::single() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ && frames_ == 1 && !error_;
}

uint64_t ListingStream::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void ListingStream::Abandon() {
  bool release = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abandoned_) return;
    abandoned_ = true;
    parts_.clear();
    cursor_.reset();
    queued_ = 0;
    release = held_;
    held_ = false;
  }
  stall_timer_.cancel();
  if (release) release_();
}

}  // namespace nsbox::runtime
