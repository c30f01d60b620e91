#include "base/utf8.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace nsbox::utf8 {
namespace {

const std::string R = "\xEF\xBF\xBD";  // U+FFFD

// Bytes from hex digits, spaces ignored: Hex("e2 82 ac") == "\xE2\x82\xAC".
std::string Hex(std::string_view hex) {
  std::string out;
  int high = -1;
  for (char c : hex) {
    if (c == ' ') continue;
    const int v = c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
    if (high < 0) {
      high = v;
    } else {
      out.push_back(static_cast<char>(high << 4 | v));
      high = -1;
    }
  }
  return out;
}

void AppendCodePoint(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | cp >> 6));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | cp >> 12));
    out->push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | cp >> 18));
    out->push_back(static_cast<char>(0x80 | (cp >> 12 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The WHATWG Encoding Standard's UTF-8 decoder, transcribed step by step as an independent
// reference (https://encoding.spec.whatwg.org/#utf-8-decoder), with code points re-encoded.
std::string ReferenceDecode(std::string_view bytes) {
  std::string out;
  uint32_t code_point = 0;
  int needed = 0, seen = 0;
  uint8_t lower = 0x80, upper = 0xBF;
  for (size_t i = 0; i < bytes.size();) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    if (needed == 0) {
      ++i;
      if (b <= 0x7F) {
        out.push_back(static_cast<char>(b));
      } else if (b >= 0xC2 && b <= 0xDF) {
        needed = 1;
        code_point = b & 0x1F;
      } else if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) lower = 0xA0;
        if (b == 0xED) upper = 0x9F;
        needed = 2;
        code_point = b & 0xF;
      } else if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) lower = 0x90;
        if (b == 0xF4) upper = 0x8F;
        needed = 3;
        code_point = b & 0x7;
      } else {
        out += R;
      }
      continue;
    }
    if (b < lower || b > upper) {
      // Error; the byte is "prepended to the stream": processed again, not consumed.
      code_point = 0;
      needed = seen = 0;
      lower = 0x80;
      upper = 0xBF;
      out += R;
      continue;
    }
    ++i;
    lower = 0x80;
    upper = 0xBF;
    code_point = code_point << 6 | (b & 0x3F);
    if (++seen == needed) {
      AppendCodePoint(code_point, &out);
      code_point = 0;
      needed = seen = 0;
    }
  }
  if (needed != 0) out += R;  // end of queue while a sequence is open
  return out;
}

// Expected values below were checked against Node 20's Buffer.from(hex, 'hex').toString('utf8').
TEST(Utf8, ValidInputIsUnchanged) {
  for (const std::string& s :
       {std::string(), std::string("hello\n"), std::string("a\0b", 3), Hex("c2 80"), Hex("df bf"),
        Hex("e0 a0 80"), Hex("ed 9f bf"), Hex("ee 80 80"), Hex("ef bf bf"), Hex("f0 90 80 80"),
        Hex("f4 8f bf bf"), std::string("h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80")}) {
    EXPECT_TRUE(IsValid(s)) << s;
    EXPECT_EQ(DecodeLossy(s), s);
  }
}

TEST(Utf8, MaximalSubpartsBecomeOneReplacementEach) {
  // Unicode 15, Table 3-8: U+FFFD for maximal subparts.
  EXPECT_EQ(DecodeLossy(Hex("61 f1 80 80 e1 80 c2 62 80 63 80 bf 64")),
            "a" + R + R + R + "b" + R + "c" + R + R + "d");
  // F0 needs 90..BF next: 80 is not a subpart of anything, so each byte is its own error.
  EXPECT_EQ(DecodeLossy(Hex("f0 80 80")), R + R + R);
  // A valid prefix cut by a byte that cannot continue it: one U+FFFD, then the byte itself.
  EXPECT_EQ(DecodeLossy(Hex("e2 82") + "A"), R + "A");
  EXPECT_EQ(DecodeLossy(Hex("f0 9f 98 41")), R + "A");
  EXPECT_EQ(DecodeLossy(Hex("f0 9f e2 82 ac")), R + "\xE2\x82\xAC");
  EXPECT_EQ(DecodeLossy(Hex("80")), R);
  EXPECT_EQ(DecodeLossy(Hex("bf 80")), R + R);
  EXPECT_EQ(DecodeLossy(Hex("fe")), R);
  EXPECT_EQ(DecodeLossy(Hex("ff")), R);
}

TEST(Utf8, SurrogatesAreInvalid) {
  EXPECT_EQ(DecodeLossy(Hex("ed a0 80")), R + R + R);                       // U+D800
  EXPECT_EQ(DecodeLossy(Hex("ed bf bf")), R + R + R);                       // U+DFFF
  EXPECT_EQ(DecodeLossy(Hex("ed a0 bd ed b8 80")), R + R + R + R + R + R);  // CESU-8 pair
  EXPECT_FALSE(IsValid(Hex("ed a0 80")));
}

TEST(Utf8, OverlongsAreInvalid) {
  EXPECT_EQ(DecodeLossy(Hex("c0 af")), R + R);
  EXPECT_EQ(DecodeLossy(Hex("c1 bf")), R + R);
  EXPECT_EQ(DecodeLossy(Hex("e0 80 af")), R + R + R);
  EXPECT_EQ(DecodeLossy(Hex("e0 9f bf")), R + R + R);
  EXPECT_EQ(DecodeLossy(Hex("f0 8f bf bf")), R + R + R + R);
  EXPECT_EQ(DecodeLossy(Hex("c0 80")), R + R);  // "modified UTF-8" NUL
  EXPECT_FALSE(IsValid(Hex("c0 af")));
  EXPECT_FALSE(IsValid(Hex("e0 80 af")));
  EXPECT_FALSE(IsValid(Hex("f0 80 80 80")));
}

TEST(Utf8, AboveU10FFFFIsInvalid) {
  EXPECT_EQ(DecodeLossy(Hex("f4 90 80 80")), R + R + R + R);
  EXPECT_EQ(DecodeLossy(Hex("f5 80 80 80")), R + R + R + R);
  EXPECT_EQ(DecodeLossy(Hex("f7 bf bf bf")), R + R + R + R);
  EXPECT_EQ(DecodeLossy(Hex("f8 88 80 80 80")), R + R + R + R + R);
  EXPECT_FALSE(IsValid(Hex("f4 90 80 80")));
}

TEST(Utf8, TruncatedAtTheEndIsOneReplacement) {
  EXPECT_EQ(DecodeLossy(Hex("c3")), R);
  EXPECT_EQ(DecodeLossy(Hex("e2 82")), R);
  EXPECT_EQ(DecodeLossy(Hex("f0 9f 98")), R);
  EXPECT_EQ(DecodeLossy("ok" + Hex("f0 90")), "ok" + R);
  EXPECT_FALSE(IsValid(Hex("e2 82")));
}

TEST(Utf8, IncompleteTailLength) {
  EXPECT_EQ(IncompleteTailLength(""), 0u);
  EXPECT_EQ(IncompleteTailLength("abc"), 0u);
  EXPECT_EQ(IncompleteTailLength("a" + Hex("c3")), 1u);
  EXPECT_EQ(IncompleteTailLength("a" + Hex("e2 82")), 2u);
  EXPECT_EQ(IncompleteTailLength("a" + Hex("f0 9f 98")), 3u);
  EXPECT_EQ(IncompleteTailLength(Hex("e2 82 ac")), 0u);     // complete
  EXPECT_EQ(IncompleteTailLength(Hex("f0 9f 98 80")), 0u);  // complete
  EXPECT_EQ(IncompleteTailLength(Hex("f0 80")), 0u);        // already an error
  EXPECT_EQ(IncompleteTailLength(Hex("ed a0")), 0u);        // a surrogate can never complete
  EXPECT_EQ(IncompleteTailLength(Hex("ed 9f")), 2u);
  EXPECT_EQ(IncompleteTailLength(Hex("f4 8f")), 2u);
  EXPECT_EQ(IncompleteTailLength(Hex("f4 90")), 0u);
  EXPECT_EQ(IncompleteTailLength(Hex("c0")), 0u);
  EXPECT_EQ(IncompleteTailLength(Hex("f5")), 0u);
  EXPECT_EQ(IncompleteTailLength(Hex("80 80 80")), 0u);
  EXPECT_EQ(IncompleteTailLength(Hex("e2 82 e2")), 1u);  // the error ends at the second e2
}

// Bytes with the interesting ones over-represented: every lead class, the edges of the narrowed
// continuation ranges, and plain ASCII.
const std::vector<uint8_t> kInteresting = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0,
                                           0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xED,
                                           0xEF, 0xF0, 0xF1, 0xF4, 0xF5, 0xFF};

TEST(Utf8, MatchesTheReferenceDecoderOnEveryShortInput) {
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      const std::string s = {static_cast<char>(a), static_cast<char>(b)};
      ASSERT_EQ(DecodeLossy(s), ReferenceDecode(s)) << a << " " << b;
      ASSERT_EQ(DecodeLossy(s.substr(0, 1)), ReferenceDecode(s.substr(0, 1)));
      ASSERT_EQ(IsValid(s), ReferenceDecode(s) == s && s.find(R) == std::string::npos);
    }
  }
  for (uint8_t a : kInteresting) {
    for (uint8_t b : kInteresting) {
      for (uint8_t c : kInteresting) {
        for (uint8_t d : kInteresting) {
          const std::string s = {static_cast<char>(a), static_cast<char>(b), static_cast<char>(c),
                                 static_cast<char>(d)};
          ASSERT_EQ(DecodeLossy(s), ReferenceDecode(s));
          ASSERT_EQ(DecodeLossy(s.substr(0, 3)), ReferenceDecode(s.substr(0, 3)));
        }
      }
    }
  }
}

std::string RandomBytes(std::mt19937& rng, size_t max_len) {
  std::uniform_int_distribution<size_t> len_dist(0, max_len);
  std::uniform_int_distribution<int> pick(0, 3);
  std::uniform_int_distribution<size_t> interesting(0, kInteresting.size() - 1);
  std::uniform_int_distribution<int> any(0, 255);
  std::uniform_int_distribution<int> cp_dist(0, 0x10FFFF);
  std::string s;
  const size_t len = len_dist(rng);
  while (s.size() < len) {
    switch (pick(rng)) {
      case 0:
        s.push_back(static_cast<char>(any(rng)));
        break;
      case 1:
        s.push_back(static_cast<char>(kInteresting[interesting(rng)]));
        break;
      default: {  // a well-formed character, so that valid sequences are common
        uint32_t cp = static_cast<uint32_t>(cp_dist(rng));
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
        AppendCodePoint(cp, &s);
        break;
      }
    }
  }
  return s;
}

// Feeds `pieces` to a StreamDecoder and a StreamSplitter and checks the contract of both.
void CheckStream(const std::string& whole, const std::vector<std::string_view>& pieces) {
  const std::string expected = DecodeLossy(whole);
  StreamDecoder decoder;
  StreamSplitter splitter;
  std::string text, raw, raw_decoded_piecewise;
  size_t fed = 0;
  for (std::string_view piece : pieces) {
    const std::string t = decoder.Feed(piece);
    ASSERT_TRUE(IsValid(t));
    text += t;
    const std::string r = splitter.Feed(piece);
    fed += piece.size();
    raw += r;
    // Never more than 3 bytes held back, and every piece decodes on its own to its share of the
    // whole text: no character is split across two pieces.
    ASSERT_LE(fed - raw.size(), 3u);
    raw_decoded_piecewise += DecodeLossy(r);
    ASSERT_EQ(DecodeLossy(r), t);
  }
  text += decoder.Finish();
  const std::string last = splitter.Finish();
  raw += last;
  raw_decoded_piecewise += DecodeLossy(last);
  ASSERT_EQ(text, expected) << testing::PrintToString(whole);
  ASSERT_EQ(raw, whole);
  ASSERT_EQ(raw_decoded_piecewise, expected);
}

TEST(Utf8, StreamDecoderEqualsDecodeLossyWhereverTheInputIsCut) {
  std::mt19937 rng(20261130);
  for (int round = 0; round < 600; ++round) {
    const std::string whole = RandomBytes(rng, 14);
    ASSERT_EQ(DecodeLossy(whole), ReferenceDecode(whole));
    const std::string_view w = whole;
    for (size_t i = 0; i <= w.size(); ++i) {
      CheckStream(whole, {w.substr(0, i), w.substr(i)});
      for (size_t j = i; j <= w.size(); ++j) {
        CheckStream(whole, {w.substr(0, i), w.substr(i, j - i), w.substr(j)});
      }
    }
  }
}

TEST(Utf8, StreamDecoderOneByteAtATime) {
  std::mt19937 rng(7);
  for (int round = 0; round < 2000; ++round) {
    const std::string whole = RandomBytes(rng, 40);
    std::vector<std::string_view> bytes;
    for (size_t i = 0; i < whole.size(); ++i) bytes.push_back(std::string_view(whole).substr(i, 1));
    CheckStream(whole, bytes);
  }
}

TEST(Utf8, FinishFlushesAndResets) {
  StreamDecoder decoder;
  EXPECT_EQ(decoder.Feed("x" + Hex("f0 9f")), "x");
  EXPECT_EQ(decoder.Feed(Hex("98")), "");
  EXPECT_EQ(decoder.Finish(), R);
  EXPECT_EQ(decoder.Finish(), "");
  EXPECT_EQ(decoder.Feed(Hex("80")), R);  // a new stream: a lone continuation byte
  EXPECT_EQ(decoder.Feed(Hex("e2 82")), "");
  EXPECT_EQ(decoder.Feed(Hex("ac")), "\xE2\x82\xAC");
  EXPECT_EQ(decoder.Finish(), "");
}

TEST(Utf8, LoneSurrogateEscapesBecomeUfffd) {
  EXPECT_EQ(ReplaceLoneSurrogateEscapes(R"({"a": "x\ud800y"})"), R"({"a": "x\ufffdy"})");
  EXPECT_EQ(ReplaceLoneSurrogateEscapes(R"(["\uDC00", "\ud83d"])"), R"(["\ufffd", "\ufffd"])");
  // A high one followed by another high one, or by a non-surrogate escape: each alone.
  EXPECT_EQ(ReplaceLoneSurrogateEscapes(R"("\ud800\ud800\ude00")"), R"("\ufffd\ud800\ude00")");
  EXPECT_EQ(ReplaceLoneSurrogateEscapes(R"("\ud800\u0041")"), R"("\ufffd\u0041")");
  // Pairs, other escapes, an escaped backslash before a u, and text outside strings: unchanged.
  for (const std::string same :
       {R"({"a": "\ud83d\ude00"})", R"("\\ud800")", R"("\"\ud83d\ude00")",
        R"({"\u0041": 1, "b": "\n\t\u00e9"})", "ud800 \\ud800", R"("\u12")"}) {
    EXPECT_EQ(ReplaceLoneSurrogateEscapes(same), same) << same;
  }
  // A cut escape at the end stays for the parser to refuse.
  EXPECT_EQ(ReplaceLoneSurrogateEscapes(R"("\ud8)"), R"("\ud8)");
}

}  // namespace
}  // namespace nsbox::utf8
