// runtime/exec_events: the NDJSON output events of an exec's log (docs/exec.md): offsets and
// ends of the raw bytes, characters never split, and a re-attach at an event's end that
// continues exactly, also when a character was split by the other stream's output (issue 44).

#include "runtime/exec_events.h"

#include <boost/json.hpp>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace nsbox::runtime {
namespace {
namespace json = boost::json;

using Piece = ExecSession::Piece;

// The events of `pieces`, then Finish's, as "stream@offset-end:data" (base64 data as it is).
std::vector<std::string> Events(EventEncoder& encoder, const std::vector<Piece>& pieces) {
  std::vector<std::string> out;
  auto text = [](const json::object& o) {
    const char* key = o.contains("data") ? "data" : "dataBase64";
    return std::string(o.at("type").as_string()) + "@" +
           std::to_string(o.at("offset").as_uint64()) + "-" +
           std::to_string(o.at("end").as_uint64()) + ":" + std::string(o.at(key).as_string());
  };
  for (const Piece& p : pieces) {
    if (auto o = encoder.Encode(p)) out.push_back(text(*o));
  }
  for (const json::object& o : encoder.Finish()) out.push_back(text(o));
  return out;
}

// printf "ab\xe2\x82"; echo err >&2; printf "\xac\n": the euro sign's bytes are 2-3 and 8-9.
const std::vector<Piece> kSplit = {{0, 1, "ab\xe2\x82"}, {4, 2, "err\n"}, {8, 1, "\xac\n"}};

TEST(ExecEventsTest, ACharacterSplitByTheOtherStreamGoesWholeWithItsExactEnd) {
  EventEncoder encoder(false);
  EXPECT_EQ(Events(encoder, kSplit), (std::vector<std::string>{"stdout@0-2:ab", "stderr@4-8:err\n",
                                                               "stdout@2-10:\xe2\x82\xac\n"}));
}

// A client that got the first two events re-attaches at the greatest end it has (8): the held
// bytes before it (StreamTail's spans, read from the log) start stdout again, and the euro sign
// comes whole, as it would have; nothing is sent twice.
TEST(ExecEventsTest, AReattachAtTheGreatestEndContinuesExactly) {
  EventEncoder encoder(false);
  encoder.Resume(1, {{1, 1, "b\xe2\x82"}});
  encoder.Resume(2, {{5, 2, "rr\n"}});
  EXPECT_EQ(Events(encoder, {kSplit[2]}), (std::vector<std::string>{"stdout@2-10:\xe2\x82\xac\n"}));
  // At 2 (after the first event only): nothing was held, the log from there is all new.
  EventEncoder at2(false);
  at2.Resume(1, {{0, 1, "ab"}});
  EXPECT_EQ(Events(at2, {{2, 1, "\xe2\x82"}, kSplit[1], kSplit[2]}),
            (std::vector<std::string>{"stderr@4-8:err\n", "stdout@2-10:\xe2\x82\xac\n"}));
}

// The held bytes themselves split between two pieces around the other stream's.
TEST(ExecEventsTest, HeldBytesFromSeveralPiecesKeepTheirFirstOffsetAndLastEnd) {
  EventEncoder encoder(false);
  EXPECT_EQ(
      Events(encoder, {{0, 1, "\xe2"}, {1, 2, "x"}, {2, 1, "\x82"}, {3, 2, "y"}, {4, 1, "\xac"}}),
      (std::vector<std::string>{"stderr@1-2:x", "stderr@3-4:y", "stdout@0-5:\xe2\x82\xac"}));
  EventEncoder resumed(false);
  resumed.Resume(1, {{0, 1, "\xe2"}, {2, 1, "\x82"}});
  EXPECT_EQ(Events(resumed, {{4, 1, "\xac"}}),
            (std::vector<std::string>{"stdout@0-5:\xe2\x82\xac"}));
}

// Output that is not UTF-8: the replacement characters, with the raw bytes' offsets; what is
// still held at the end goes out as U+FFFD with its own offset and end.
TEST(ExecEventsTest, InvalidBytesAndAnUnfinishedCharacterAtTheEnd) {
  EventEncoder encoder(false);
  EXPECT_EQ(Events(encoder, {{0, 1, "a\xff"}, {2, 2, "e"}, {3, 1, "\xe2\x82"}}),
            (std::vector<std::string>{"stdout@0-2:a\xef\xbf\xbd", "stderr@2-3:e",
                                      "stdout@3-5:\xef\xbf\xbd"}));
}

TEST(ExecEventsTest, Base64EventsCarryExactlyTheirBytes) {
  EventEncoder encoder(true);
  encoder.Resume(1, {{1, 1, "b\xe2\x82"}});  // ignored: base64 never holds bytes back
  EXPECT_EQ(
      Events(encoder, kSplit),
      (std::vector<std::string>{"stdout@0-4:YWLigg==", "stderr@4-8:ZXJyCg==", "stdout@8-10:rAo="}));
}

TEST(ExecEventsTest, StreamCutKeepsCharactersAndGroupsWhole) {
  StreamCut text(false);
  EXPECT_EQ(text.Next("ab\xe2"), "ab");
  EXPECT_EQ(text.held(), 1u);
  EXPECT_EQ(text.Next("\x82\xac!"), "\xe2\x82\xac!");
  EXPECT_EQ(text.Finish(), "");
  StreamCut b64(true);
  EXPECT_EQ(b64.Next("abcd"), "abc");
  EXPECT_EQ(b64.Finish(), "d");
}

}  // namespace
}  // namespace nsbox::runtime
