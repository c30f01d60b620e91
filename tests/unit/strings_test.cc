// base/strings: EscapeControl and Quote, what every name from an image or from inside a sandbox
// goes through before it reaches a terminal or a log line (issue 53).

#include "base/strings.h"

#include <string>

#include <gtest/gtest.h>

namespace nsbox {
namespace {

TEST(EscapeControl, PrintableTextAndUtf8AreUnchanged) {
  EXPECT_EQ(EscapeControl("usr/share/doc/café/naïve 日本 \\ 'x'"),
            "usr/share/doc/café/naïve 日本 \\ 'x'");
  EXPECT_FALSE(NeedsEscape("usr/share/doc/café/naïve 日本"));
  EXPECT_EQ(EscapeControl(""), "");
}

TEST(EscapeControl, TerminalSequencesBecomeVisible) {
  // OSC 0 (set the window title), BEL, CSI 2 J (clear the screen): the device node name.
  const std::string name = "dev/\x1b]0;PWNED\x07\x1b[2J";
  EXPECT_TRUE(NeedsEscape(name));
  EXPECT_EQ(EscapeControl(name), "dev/\\x1b]0;PWNED\\x07\\x1b[2J");
  EXPECT_EQ(EscapeControl(std::string("a\0b\x7f", 4)), "a\\x00b\\x7f");
}

TEST(EscapeControl, ANewlineCannotForgeALogLine) {
  EXPECT_EQ(EscapeControl("dev/a\nnsbox: info: FORGED\r\tx"), "dev/a\\nnsbox: info: FORGED\\r\\tx");
}

TEST(EscapeControl, C1ControlsBidiOverridesAndInvalidBytes) {
  // U+009B (CSI as one character), U+202E (right-to-left override), U+2066 (an isolate).
  EXPECT_EQ(EscapeControl("a\xc2\x9b"
                          "2Jb"),
            "a\\xc2\\x9b2Jb");
  EXPECT_EQ(EscapeControl("exe\xe2\x80\xaetxt.sh"), "exe\\xe2\\x80\\xaetxt.sh");
  EXPECT_EQ(EscapeControl("\xe2\x81\xa6x"), "\\xe2\\x81\\xa6x");
  // A raw C1 byte (0x9b: CSI for an 8-bit terminal) and bytes that start no UTF-8 sequence.
  EXPECT_EQ(EscapeControl("a\x9b"
                          "2J\xff\xc3"),
            "a\\x9b2J\\xff\\xc3");
  // Overlongs and surrogates are not UTF-8 either.
  EXPECT_EQ(EscapeControl("\xc0\xaf\xed\xa0\x80"), "\\xc0\\xaf\\xed\\xa0\\x80");
  // Neighbours of the escaped ranges are left alone.
  EXPECT_EQ(EscapeControl("\xc2\xa0\xe2\x80\xa9\xe2\x81\xaa"), "\xc2\xa0\xe2\x80\xa9\xe2\x81\xaa");
}

TEST(Quote, QuotesEscapesAndCutsShort) {
  EXPECT_EQ(Quote("etc/passwd"), "'etc/passwd'");
  EXPECT_EQ(Quote("a\x1b[2J"), "'a\\x1b[2J'");
  const std::string huge(1000032, 'n');
  const std::string q = Quote(huge);
  EXPECT_EQ(q, "'" + std::string(256, 'n') + "'... (1000032 bytes)");
  EXPECT_EQ(Quote(std::string(256, 'x')), "'" + std::string(256, 'x') + "'");
}

}  // namespace
}  // namespace nsbox
