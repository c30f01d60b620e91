// runtime/listing: nsboxd's fs/readdir answers on their way (issue 44): JSON made a few entries
// at a time from nsbox-init's frames, names checked in order, the sandbox's channel held while
// too much waits for the client and the answer cut short when it stalls, and the daemon-wide
// budget of listings in flight.

#include "runtime/listing.h"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/utf8.h"
#include "fs/protocol.h"

namespace nsbox::runtime {
namespace {
namespace asio = boost::asio;
namespace proto = fs::proto;
using namespace std::chrono_literals;

std::string Frame(const std::vector<std::pair<std::string, uint8_t>>& entries) {
  proto::ReaddirReply r;
  for (const auto& [name, type] : entries) r.entries.push_back({name, type});
  return proto::Encode(r);
}

class ListingTest : public ::testing::Test {
 protected:
  std::shared_ptr<ListingStream> Make(bool typed, ListingLimits limits = {}) {
    return std::make_shared<ListingStream>(
        io_.get_executor(), typed, limits, [this] { ++holds_; }, [this] { ++releases_; });
  }
  void Poll() {
    io_.restart();
    io_.poll();
  }
  asio::io_context io_;
  int holds_ = 0;
  int releases_ = 0;
};

TEST_F(ListingTest, FramesBecomeJsonItemsInOrder) {
  auto s = Make(false);
  EXPECT_FALSE(s->started());
  s->Part(Frame({{"a", 0}, {"b\"\\", 0}}));
  EXPECT_TRUE(s->started());
  EXPECT_TRUE(s->any_part());
  s->Part(Frame({{"c\xff", 1}}));
  s->Done(fs::Unit{});
  EXPECT_FALSE(s->single());
  std::string json = "[" + s->TakeJson(1 << 20) + "]";
  EXPECT_TRUE(s->finished());
  EXPECT_FALSE(s->failed());
  EXPECT_EQ(json, "[\"a\",\"b\\\"\\\\\",\"c\xef\xbf\xbd\"]");
  // Every name as Boost.JSON writes it, whatever path made it.
  auto t = Make(false);
  std::vector<std::pair<std::string, uint8_t>> names;
  for (std::string n : {"\x01ctl", "\x7f-del", "a b", "caf\xc3\xa9", "d\tt", "e\xe2\x80\xa8",
                        "f\xf0\x9f\x98\x80", "g\xc3", "h/"}) {
    if (n != "h/") names.push_back({n, 0});
  }
  std::sort(names.begin(), names.end());
  t->Part(Frame(names));
  t->Done(fs::Unit{});
  boost::json::array want;
  for (const auto& [n, type] : names) want.emplace_back(utf8::DecodeLossy(n));
  EXPECT_EQ("[" + t->TakeJson(1 << 20) + "]", boost::json::serialize(want));
  EXPECT_NO_THROW(boost::json::parse(json));
  Poll();
}

TEST_F(ListingTest, TypedEntriesCarryTheirTypeAndTheExactBytesOfAnInvalidName) {
  auto s = Make(true);
  s->Part(Frame({{"d", 1}, {"f", 0}, {"l", 2}, {"x\xff", 3}}));
  s->Done(fs::Unit{});
  EXPECT_TRUE(s->single());
  EXPECT_EQ(s->TakeJson(1 << 20),
            "{\"name\":\"d\",\"type\":\"directory\"},{\"name\":\"f\",\"type\":\"file\"},"
            "{\"name\":\"l\",\"type\":\"symlink\"},{\"name\":\"x\xef\xbf\xbd\",\"nameBase64\":"
            "\"eP8=\",\"type\":\"other\"}");
  Poll();
}

// A few entries at a time: each call stops once about `max` bytes are made, entries whole.
TEST_F(ListingTest, TakenInPiecesWithCommasBetweenThem) {
  auto s = Make(false);
  std::vector<std::pair<std::string, uint8_t>> entries;
  std::string expected;
  for (int i = 0; i < 1000; ++i) {
    char name[16];
    std::snprintf(name, sizeof name, "n%05d", i);
    entries.push_back({name, 0});
    expected += std::string(i ? "," : "") + "\"" + name + "\"";
  }
  s->Part(Frame(entries));
  s->Done(fs::Unit{});
  std::string all;
  int calls = 0;
  while (!s->finished()) {
    std::string piece = s->TakeJson(100);
    EXPECT_LE(piece.size(), 100u + 10);
    all += piece;
    ASSERT_LT(++calls, 2000);
  }
  EXPECT_EQ(all, expected);
  EXPECT_GT(calls, 50);
  Poll();
}

// What a compromised nsbox-init could send: names out of order or twice (across frames too), a
// frame that is not a listing. The answer fails; nothing past the fault is made.
TEST_F(ListingTest, NamesOutOfOrderOrMalformedFramesFail) {
  for (const auto& frames : std::vector<std::vector<std::string>>{
           {Frame({{"b", 0}, {"a", 0}})},
           {Frame({{"a", 0}}), Frame({{"a", 0}})},
           {Frame({{"b", 0}}), Frame({{"a", 0}})},
           {std::string("\x01\x00\x00\x00\x01\x00\x00\x00/\x00", 10)},
           {std::string("\x02\x00\x00\x00", 4)}}) {
    auto s = Make(false);
    for (const auto& f : frames) s->Part(f);
    s->Done(fs::Unit{});
    std::string json = s->TakeJson(1 << 20);
    ASSERT_TRUE(s->failed());
    EXPECT_EQ(s->failed()->err, EPROTO) << s->failed()->message;
    EXPECT_EQ(json.find("\"a\",\"a\""), std::string::npos);
  }
  Poll();
}

// Past the window the channel is held, under half of it released; a listing abandoned releases
// what it holds and keeps nothing more.
TEST_F(ListingTest, TheChannelIsHeldWhileTooMuchWaits) {
  ListingLimits limits;
  limits.window = 4096;
  auto s = Make(false, limits);
  std::vector<std::pair<std::string, uint8_t>> entries;
  for (int i = 0; i < 200; ++i) entries.push_back({"name-" + std::to_string(1000 + i), 0});
  const std::string frame = Frame(entries);  // about 2.6 KiB
  s->Part(frame);
  EXPECT_EQ(holds_, 0);
  entries.clear();
  for (int i = 0; i < 200; ++i) entries.push_back({"name-" + std::to_string(2000 + i), 0});
  s->Part(Frame(entries));
  EXPECT_EQ(holds_, 1);
  s->TakeJson(1000);
  EXPECT_EQ(releases_, 0) << "still over half the window";
  while (s->TakeJson(1000).size() > 0 && releases_ == 0) {
  }
  EXPECT_EQ(releases_, 1);
  entries.clear();
  for (int i = 0; i < 400; ++i) entries.push_back({"name-" + std::to_string(3000 + i), 0});
  s->Part(Frame(entries));
  EXPECT_EQ(holds_, 2);
  s->Abandon();
  EXPECT_EQ(releases_, 2);
  s->Part(Frame({{"z", 0}}));
  EXPECT_EQ(s->TakeJson(1 << 20), "");
  Poll();
}

TEST_F(ListingTest, AClientThatTakesNothingWhileTheChannelIsHeldIsCutOff) {
  ListingLimits limits;
  limits.window = 16;
  limits.stall = 50ms;
  auto s = Make(false, limits);
  bool stalled = false;
  s->on_stall = [&] { stalled = true; };
  s->Part(Frame({{"aaaaaaaaaaaaaaaaaaaa", 0}}));
  EXPECT_EQ(holds_, 1);
  const auto start = std::chrono::steady_clock::now();
  while (!stalled && std::chrono::steady_clock::now() - start < 5s) {
    io_.restart();
    io_.run_one_for(100ms);
  }
  EXPECT_TRUE(stalled);
  ASSERT_TRUE(s->failed());
  EXPECT_EQ(s->failed()->err, ETIMEDOUT);
  s->Abandon();
  EXPECT_EQ(releases_, 1);
  Poll();
}

TEST_F(ListingTest, TheBudgetAdmitsAsManyAsFitAndTheNextWhenOneLeaves) {
  ListingLimits limits;
  limits.budget = 3 * limits.Reserve();
  limits.admission = 200ms;
  ListingBudget budget(io_.get_executor(), limits);
  EXPECT_EQ(budget.max_in_flight(), 3u);
  std::vector<std::optional<bool>> entered(5);
  auto enter = [&](int i) {
    asio::co_spawn(
        io_, [&, i]() -> asio::awaitable<void> { entered[i] = co_await budget.Enter(); },
        asio::detached);
  };
  for (int i = 0; i < 4; ++i) enter(i);
  Poll();
  EXPECT_EQ(entered[0], true);
  EXPECT_EQ(entered[2], true);
  EXPECT_FALSE(entered[3].has_value()) << "the fourth waits";
  budget.Leave();
  Poll();
  EXPECT_EQ(entered[3], true) << "in the place of the one that left";
  EXPECT_EQ(budget.in_flight(), 3u);
  enter(4);
  io_.restart();
  io_.run_for(1s);
  EXPECT_EQ(entered[4], false) << "no room within the admission time";
  EXPECT_EQ(budget.in_flight(), 3u);
}

}  // namespace
}  // namespace nsbox::runtime
