// images/tar_stream: every tar the importer reads goes through TarStream, which refuses what tar
// readers disagree on (issue 53) and bounds every header and name as it is read. The tars here
// are written byte by byte, as an attacker would; each refusal has its control, the honest form
// of the same member, read as GNU tar and Python's tarfile read it.

#include "images/tar_stream.h"

#include <archive.h>
#include <archive_entry.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/common/image_builder.h"
#include "tests/common/raw_tar.h"

namespace nsbox::images::internal {
namespace {

using testutil::raw_tar::File;
using testutil::raw_tar::Header;
using testutil::raw_tar::kEnd;
using testutil::raw_tar::Padded;
using testutil::raw_tar::Special;
constexpr std::string_view kUstar = testutil::raw_tar::kUstarMagic;
constexpr std::string_view kGnu = testutil::raw_tar::kGnuMagic;
std::string Rec(std::string_view key, std::string_view value) {
  return testutil::raw_tar::Record(key, value);
}

// The tar's bytes, handed out in chunks (a layer's blob read in place).
class MemorySource : public ByteSource {
 public:
  MemorySource(std::string data, size_t chunk, bool skip)
      : data_(std::move(data)), chunk_(chunk), skip_(skip) {}
  Result<std::string> Head(size_t n) override { return data_.substr(0, n); }
  Result<size_t> Read(const void** out) override {
    const size_t n = std::min(chunk_, data_.size() - pos_);
    *out = data_.data() + pos_;
    pos_ += n;
    return n;
  }
  uint64_t Skip(uint64_t n) override {
    if (!skip_) return 0;
    n = std::min<uint64_t>(n, data_.size() - pos_);
    pos_ += n;
    return n;
  }

 private:
  std::string data_;
  size_t chunk_;
  bool skip_;
  size_t pos_ = 0;
};

struct Read {
  std::vector<std::string> names;
  std::string error;  // "" when the whole tar was read
};

// Every member's name as TarStream gives it, its data skipped (as the outer tar's scan does)
// or read (as a layer's unpacking does).
Read ReadTar(const std::string& tar, size_t chunk = 4096, bool skip = false) {
  Read out;
  MemorySource source(tar, chunk, skip);
  auto stream = TarStream::Open(&source, "test.tar");
  if (!stream.ok()) {
    out.error = stream.error().message();
    return out;
  }
  for (;;) {
    struct archive_entry* e = nullptr;
    auto more = (*stream)->Next(&e);
    if (!more.ok()) {
      out.error = more.error().message();
      return out;
    }
    if (!*more) return out;
    out.names.emplace_back(archive_entry_pathname(e));
    if (skip) {
      archive_read_data_skip((*stream)->archive());
      continue;
    }
    const void* data;
    size_t size;
    la_int64_t offset;
    int rc;
    while ((rc = archive_read_data_block((*stream)->archive(), &data, &size, &offset)) ==
           ARCHIVE_OK) {
    }
    if (rc != ARCHIVE_EOF) {
      out.error = archive_error_string((*stream)->archive());
      return out;
    }
  }
}

using Names = std::vector<std::string>;

TEST(TarStream, ThePaxNameWins) {
  const std::string tar =
      Special('x', Rec("path", "usr/share/doc/pax-name")) + File("etc/ustar-name") + kEnd;
  for (bool skip : {false, true}) {
    Read r = ReadTar(tar, 4096, skip);
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.names, Names{"usr/share/doc/pax-name"});
  }
}

// The member: a pax path of 1,000,032 bytes, which libarchive drops with a warning (it
// then names the member by its ustar name) while GNU tar and Python read it. Refused as the pax
// header is read, before libarchive holds it.
TEST(TarStream, AnOversizedPaxHeaderIsRefusedNotReplacedByTheUstarName) {
  const std::string tar =
      Special('x', Rec("path", "usr/share/doc/" + std::string(1000032 - 14, 'n'))) +
      File("etc/ustar-name") + kEnd;
  Read r = ReadTar(tar);
  EXPECT_EQ(r.names, Names{});
  EXPECT_NE(r.error.find("a pax header of 1000046 bytes, more than the 262144 nsbox reads"),
            std::string::npos)
      << r.error;
  // Control: a pax header just under the bound is read, its name too long for Linux refused by
  // name (not by falling back to the ustar name).
  const std::string path = "usr/share/doc/" + std::string(3900, 'n');
  Read big = ReadTar(Special('x', Rec("path", path) + Rec("comment", std::string(250000, 'c'))) +
                     File("etc/ustar-name") + kEnd);
  EXPECT_NE(big.error.find("its path has a component of 3900 bytes"), std::string::npos)
      << big.error;
  Read ok = ReadTar(Special('x', Rec("path", std::string(255, 'a') + "/" + std::string(255, 'b')) +
                                     Rec("comment", std::string(250000, 'c'))) +
                    File("etc/ustar-name") + kEnd);
  EXPECT_EQ(ok.error, "");
  EXPECT_EQ(ok.names, Names{std::string(255, 'a') + "/" + std::string(255, 'b')});
}

TEST(TarStream, PathsPastLinuxBoundsAreRefused) {
  std::string path;
  while (path.size() < 4095) path += std::string(200, 'p') + "/";
  path.resize(4095);
  Read ok = ReadTar(Special('x', Rec("path", path)) + File("x") + kEnd);
  EXPECT_EQ(ok.error, "");
  Read too_long = ReadTar(Special('x', Rec("path", path + "q")) + File("x") + kEnd);
  EXPECT_NE(too_long.error.find("its path has 4096 bytes, more than the 4095 of a Linux path"),
            std::string::npos)
      << too_long.error;
  // A GNU long name is bounded as it is read.
  Read gnu = ReadTar(Special('L', std::string(5000, 'l') + '\0', "././@LongLink") +
                     Header("x", 0, '0', kGnu) + kEnd);
  EXPECT_NE(gnu.error.find("a GNU long name of 5001 bytes, more than the 4096 nsbox reads"),
            std::string::npos)
      << gnu.error;
  Read gnu_ok = ReadTar(Special('L', std::string(200, 'l') + "/x" + '\0', "././@LongLink") +
                        Header("x", 0, '0', kGnu) + kEnd);
  EXPECT_EQ(gnu_ok.error, "");
  EXPECT_EQ(gnu_ok.names, Names{std::string(200, 'l') + "/x"});
  // A link target, too.
  Read link = ReadTar(Special('x', Rec("linkpath", std::string(4096, 'k'))) +
                      Header("l", 0, '2', kUstar, std::string(100, 'k')) + kEnd);
  EXPECT_NE(link.error.find("a symlink target of 4096 bytes"), std::string::npos) << link.error;
  Read link_ok = ReadTar(Special('x', Rec("linkpath", std::string(4095, 'k'))) +
                         Header("l", 0, '2', kUstar, std::string(100, 'k')) + kEnd);
  EXPECT_EQ(link_ok.error, "");
}

// Members whose name three readers read three ways (libarchive, GNU tar, Python's tarfile).
TEST(TarStream, MembersNamedTwiceAreRefused) {
  const std::string pax = Special('x', Rec("path", "pax-name"));
  const std::string pax2 = Special('x', Rec("path", "second-pax-name"));
  const std::string longname = Special('L', std::string("long-name") + '\0', "././@LongLink");
  const std::string longname2 = Special('L', std::string("long-two") + '\0', "././@LongLink");
  const std::string longlink = Special('K', std::string("long-link") + '\0', "././@LongLink");
  const std::string member = File("ustar-name");
  struct Case {
    const char* what;
    std::string tar;
  };
  for (const Case& c : {Case{"two pax headers", pax + pax2 + member},
                        Case{"a GNU long name, then a pax header", longname + pax + member},
                        Case{"a pax header, then a GNU long name", pax + longname + member},
                        Case{"two GNU long names", longname + longname2 + member},
                        Case{"a GNU long link and a pax header", longlink + pax + member}}) {
    SCOPED_TRACE(c.what);
    Read r = ReadTar(c.tar + kEnd);
    EXPECT_EQ(r.names, Names{});
    EXPECT_NE(r.error.find("for one member"), std::string::npos) << r.error;
  }
  // Controls: one of each is read, and a long name with a long link is GNU tar's own way.
  EXPECT_EQ(ReadTar(pax + member + kEnd).names, Names{"pax-name"});
  EXPECT_EQ(ReadTar(longname + member + kEnd).names, Names{"long-name"});
  Read both = ReadTar(longname + longlink + Header("l", 0, '2', kGnu, "short") + kEnd);
  EXPECT_EQ(both.error, "");
  EXPECT_EQ(both.names, Names{"long-name"});
}

// GNU tar and Python apply a global header's records to every member after it; libarchive
// ignores them. Only a comment (git archive's commit id) means nothing to any of them.
TEST(TarStream, GlobalHeadersThatSetAnythingAreRefused) {
  for (const char* key : {"path", "uid", "mtime", "linkpath"}) {
    SCOPED_TRACE(key);
    Read r = ReadTar(Special('g', Rec(key, "4242"), "GlobalHead") + File("a") + kEnd);
    EXPECT_NE(r.error.find(std::string("a global pax header sets '") + key + "'"),
              std::string::npos)
        << r.error;
  }
  Read git = ReadTar(Special('g', Rec("comment", "4b825dc642cb6eb9a060e54bf8d69288fbee4904"),
                             "pax_global_header") +
                     File("a") + kEnd);
  EXPECT_EQ(git.error, "");
  EXPECT_EQ(git.names, Names{"a"});
}

TEST(TarStream, FramingReadersDisagreeOnIsRefused) {
  struct Case {
    const char* what;
    std::string tar;
    const char* error;
  };
  const std::string smuggled = Header("smuggled", 0);
  for (const Case& c : {
           Case{"a symlink with data", Header("l", 512, '2', kUstar, "t") + smuggled + kEnd,
                "bytes of data follow it"},
           Case{"a directory with data", Header("d/", 512, '5') + smuggled + kEnd,
                "bytes of data follow it"},
           Case{"a hard link with data", Header("h", 512, '1', kUstar, "a") + smuggled + kEnd,
                "bytes of data follow it"},
           Case{"a pax size on a FIFO",
                Special('x', Rec("size", "512")) + Header("f", 0, '6') + smuggled + kEnd,
                "bytes of data follow it"},
           // libarchive drops a target given only in a pax header or a GNU long link.
           Case{"a symlink whose target is only in its pax header",
                Special('x', Rec("linkpath", "/etc/shadow")) + Header("l", 0, '2') + kEnd,
                "ustar link name is empty"},
           Case{"a hard link whose target is only in its pax header",
                File("a") + Special('x', Rec("linkpath", "a")) + Header("h", 0, '1') + kEnd,
                "ustar link name is empty"},
           Case{"a symlink whose target is only in a GNU long link",
                Special('K', std::string(150, 'k') + '\0', "././@LongLink") +
                    Header("l", 0, '2', kGnu) + kEnd,
                "ustar link name is empty"},
           Case{"a volume label", Header("label", 0, 'V') + File("a") + kEnd, "of type 'V'"},
           Case{"a GNU dump directory", Header("d", 0, 'D') + kEnd, "of type 'D'"},
           Case{"Solaris ACLs", Header("a", 0, 'A') + File("a") + kEnd, "of type 'A'"},
           Case{"a size Python reads as a literal",
                Header("a", 0, '0', kUstar, "",
                       [](std::string& h) { std::memcpy(&h[124], "0o17\0\0\0\0\0\0\0\0", 12); }) +
                    kEnd,
                "size field"},
           Case{"a size with an underscore",
                Header("a", 0, '0', kUstar, "",
                       [](std::string& h) { std::memcpy(&h[124], "1_0\0\0\0\0\0\0\0\0\0", 12); }) +
                    kEnd,
                "size field"},
           Case{"a prefix in a GNU header",
                Header("a", 0, '0', kGnu, "", [](std::string& h) { h[345] = 'p'; }) + kEnd,
                "prefix field"},
           // libarchive reads a regular file named with a final '/' as a directory and its data
           // as the next header; Python reads a file and skips its data.
           Case{"a file that libarchive reads as a directory", Header("f/", 512) + smuggled + kEnd,
                "framing is ambiguous"},
       }) {
    SCOPED_TRACE(c.what);
    Read r = ReadTar(c.tar);
    EXPECT_NE(r.error.find(c.error), std::string::npos) << r.error;
    EXPECT_EQ(std::count(r.names.begin(), r.names.end(), "smuggled"), 0);
  }
  // Controls: the same members as honest tools write them.
  Read ok =
      ReadTar(Header("l", 0, '2', kUstar, "t") + Header("d/", 0, '5') +
              Header("h", 0, '1', kUstar, "l") + Header("f", 0, '6') + File("a", "data") + kEnd);
  EXPECT_EQ(ok.error, "");
  EXPECT_EQ(ok.names, (Names{"l", "d/", "h", "f", "a"}));
}

TEST(TarStream, NamesAreKeptAsBytesWhateverTheirCharset) {
  const std::string tar = Special('x', Rec("path", "etc/café")) + File("u") +
                          Special('x', Rec("path", "etc/bad\xff")) + File("v") +
                          File("etc/ustar-\xc3\xa9") + kEnd;
  Read r = ReadTar(tar);
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.names, (Names{"etc/café", "etc/bad\xff", "etc/ustar-\xc3\xa9"}));
  // A malformed pax record is refused (libarchive would ignore the rest of the header).
  Read bad = ReadTar(Special('x', "garbage\n") + File("m") + kEnd);
  EXPECT_NE(bad.error.find("a malformed pax header"), std::string::npos) << bad.error;
}

// Old GNU sparse members (extension blocks after the header) and GNU sparse 1.0 (the map at the
// start of the data): the audit's framing is libarchive's.
TEST(TarStream, SparseMembersAreFramedAsLibarchiveFramesThem) {
  // Five chunks of 512 bytes every 8 KiB: four in the header, one in an extension block.
  std::string header = Header("sparse", 5 * 512, 'S', kGnu, "", [](std::string& h) {
    for (int i = 0; i < 4; ++i) {
      std::snprintf(&h[386 + 24 * i], 12, "%011o", i * 8192);
      std::snprintf(&h[386 + 24 * i + 12], 12, "%011o", 512);
    }
    h[482] = 1;  // isextended
    std::snprintf(&h[483], 12, "%011o", 4 * 8192 + 512);
  });
  std::string extension(512, '\0');
  std::snprintf(&extension[0], 12, "%011o", 4 * 8192);
  std::snprintf(&extension[12], 12, "%011o", 512);
  const std::string old_gnu = header + extension + std::string(5 * 512, 's') + File("after");
  const std::string map = Padded("1\n8192\n512\n");
  const std::string sparse10 =
      Special('x', Rec("GNU.sparse.major", "1") + Rec("GNU.sparse.minor", "0") +
                       Rec("GNU.sparse.name", "sparse10") + Rec("GNU.sparse.realsize", "8704")) +
      Header("GNUSparseFile.0/sparse10", map.size() + 512) + map + std::string(512, 't') +
      File("after10");
  for (bool skip : {false, true}) {
    SCOPED_TRACE(skip ? "skipped" : "read");
    Read r = ReadTar(old_gnu + sparse10 + kEnd, 4096, skip);
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.names, (Names{"sparse", "after", "sparse10", "after10"}));
  }
}

// A compressed tar is decompressed before the audit sees it: the same refusals, the same names;
// chunks of any size (a header split across two reads) give the same answers.
TEST(TarStream, CompressedAndChunkedTarsGiveTheSameAnswers) {
  const std::string good = Special('x', Rec("path", "usr/share/doc/pax-name")) +
                           File("etc/ustar-name") + File("b", std::string(3000, 'b')) + kEnd;
  const std::string bad =
      File("a") + Special('g', Rec("path", "x"), "GlobalHead") + File("b") + kEnd;
  for (auto compression : {testutil::Compression::kGzip, testutil::Compression::kZstd}) {
    Read r = ReadTar(testutil::Compress(good, compression));
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.names, (Names{"usr/share/doc/pax-name", "b"}));
    Read refused = ReadTar(testutil::Compress(bad, compression));
    EXPECT_NE(refused.error.find("a global pax header sets 'path'"), std::string::npos)
        << refused.error;
  }
  for (size_t chunk : {1, 7, 511, 513}) {
    SCOPED_TRACE(chunk);
    EXPECT_EQ(ReadTar(good, chunk).names, (Names{"usr/share/doc/pax-name", "b"}));
    EXPECT_EQ(ReadTar(good, chunk, /*skip=*/true).names, (Names{"usr/share/doc/pax-name", "b"}));
    EXPECT_NE(ReadTar(bad, chunk).error.find("global pax header"), std::string::npos);
  }
}

// What libarchive's own pax writer makes (every image the tests build) reads unchanged: long
// names, xattrs twice over, hard links, a trailer of zero blocks.
TEST(TarStream, LibarchivesOwnTarsReadWhole) {
  using testutil::File;
  const std::string long_name = std::string(150, 'd') + "/" + std::string(200, 'f');
  const std::string tar = testutil::MakeTar(
      {testutil::Dir("etc"), File("etc/motd", "hi\n").Xattr("user.x", std::string(3000, 'v')),
       File(long_name, "long"), testutil::Hardlink("etc/motd2", "etc/motd"),
       testutil::Symlink("bin", "usr/bin")});
  Read r = ReadTar(tar);
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.names, (Names{"etc/", "etc/motd", long_name, "etc/motd2", "bin"}));
}

}  // namespace
}  // namespace nsbox::images::internal
