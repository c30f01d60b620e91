#include "base/base64.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <random>
#include <string>

namespace nsbox {
namespace {

// RFC 4648 section 10.
TEST(Base64Test, TheRfcVectors) {
  const std::pair<std::string, std::string> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [bytes, text] : vectors) {
    EXPECT_EQ(Base64Encode(bytes), text);
    auto decoded = Base64Decode(text);
    ASSERT_TRUE(decoded.ok()) << text << ": " << decoded.error().message();
    EXPECT_EQ(*decoded, bytes);
  }
}

TEST(Base64Test, EveryByteAndEveryLengthGoesRoundTrip) {
  std::mt19937 rng(42);
  for (size_t len = 0; len < 300; ++len) {
    std::string bytes(len, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    const std::string text = Base64Encode(bytes);
    EXPECT_EQ(text.size(), (len + 2) / 3 * 4);
    auto decoded = Base64Decode(text);
    ASSERT_TRUE(decoded.ok()) << len;
    EXPECT_EQ(*decoded, bytes) << len;
  }
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(Base64Decode(Base64Encode(all)).value(), all);
  // The two characters beyond the alphabet's letters and digits.
  EXPECT_EQ(Base64Encode("\xfb\xff"), "+/8=");
}

TEST(Base64Test, ShortOrMissingPaddingIsRead) {
  EXPECT_EQ(Base64Decode("Zg").value(), "f");
  EXPECT_EQ(Base64Decode("Zg=").value(), "f");
  EXPECT_EQ(Base64Decode("Zm8").value(), "fo");
  EXPECT_EQ(Base64Decode("Zm9vYmE").value(), "fooba");
}

TEST(Base64Test, MalformedTextIsEinvalWithItsOffset) {
  const std::pair<std::string, std::string> bad[] = {
      {"Zm9v!mFy", "offset 4"},   // not in the alphabet
      {"Zm9v YmFy", "offset 4"},  // nor is a space
      {std::string("Zm\0v", 4), "offset 2"},
      {"Zg==Zm9v", "offset 2"},  // padding before the end
      {"Zm9vY", "offset 4"},     // one character over: no byte can end there
      {"Zg===", "offset 2"},     // three '='
      {"=", "offset 0"},         // padding of nothing
      {"Zm9v=", "offset 4"},     // nor of a whole group
      {"Zm8==", "offset 3"},     // one '=' too many
      {"Zm9v-_", "offset 4"},    // the URL-safe alphabet is not this one
  };
  for (const auto& [text, where] : bad) {
    auto decoded = Base64Decode(text);
    ASSERT_FALSE(decoded.ok()) << text;
    EXPECT_EQ(decoded.error().code(), EINVAL) << text;
    EXPECT_NE(decoded.error().message().find(where), std::string::npos)
        << text << ": " << decoded.error().message();
  }
}

}  // namespace
}  // namespace nsbox
