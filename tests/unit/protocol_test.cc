#include "fs/protocol.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace nsbox::fs::proto {
namespace {

TEST(Protocol, HeaderIsLittleEndianAndSixteenBytes) {
  std::string f = EncodeFrame(Type::kStat, 0x0102030405060708ull, "ab");
  ASSERT_EQ(f.size(), kHeaderSize + 2);
  EXPECT_EQ(f.substr(0, 4), std::string("\x02\x00\x00\x00", 4));
  EXPECT_EQ(f.substr(4, 4), std::string("\x0e\x00\x00\x00", 4));
  EXPECT_EQ(f.substr(8, 8), std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8));
  Header h = DecodeHeader(f.data());
  EXPECT_EQ(h.size, 2u);
  EXPECT_EQ(h.type, Type::kStat);
  EXPECT_EQ(h.tag, 0x0102030405060708ull);
}

TEST(Protocol, ExecRequestRoundTrips) {
  ExecRequest in;
  in.command = "echo 'hi'\n";
  in.cwd = "/workspace/sub";
  in.env = {"A=1", "EMPTY=", std::string("BIN=\xff\x00x", 7)};
  in.stdin_data = std::string("\0in", 3);
  in.timeout_ms = 30000;
  in.output_limit = 123;
  in.argv = {"/bin/true", "--version"};
  ExecRequest out;
  ASSERT_TRUE(Decode(Encode(in), &out));
  EXPECT_EQ(out.command, in.command);
  EXPECT_EQ(out.cwd, in.cwd);
  EXPECT_EQ(out.env, in.env);
  EXPECT_EQ(out.stdin_data, in.stdin_data);
  EXPECT_EQ(out.timeout_ms, 30000u);
  EXPECT_EQ(out.output_limit, 123u);
  EXPECT_EQ(out.argv, in.argv);
  EXPECT_FALSE(out.stdin_stream);
  EXPECT_FALSE(out.tty.has_value());
  in.stdin_data.reset();
  in.stdin_stream = true;
  in.tty = TtySize{40, 120};
  ASSERT_TRUE(Decode(Encode(in), &out));
  EXPECT_FALSE(out.stdin_data.has_value());
  EXPECT_TRUE(out.stdin_stream);
  ASSERT_TRUE(out.tty.has_value());
  EXPECT_EQ(*out.tty, (TtySize{40, 120}));
}

TEST(Protocol, TerminalSizesOutOfRangeAreRefused) {
  for (TtySize size : {TtySize{0, 80}, TtySize{24, 0}, TtySize{4097, 80}, TtySize{24, 60000}}) {
    ExecResize resize{7, size};
    ExecResize out;
    EXPECT_FALSE(Decode(Encode(resize), &out)) << size.rows << "x" << size.cols;
    ExecRequest req{"true", "/", {}, std::nullopt, 0, 1, {}, false, size};
    ExecRequest req_out;
    EXPECT_FALSE(Decode(Encode(req), &req_out)) << size.rows << "x" << size.cols;
  }
  ExecResize resize{7, TtySize{4096, 1}};
  ExecResize out;
  ASSERT_TRUE(Decode(Encode(resize), &out));
  EXPECT_EQ(out.exec_tag, 7u);
  EXPECT_EQ(out.size, (TtySize{4096, 1}));
}

TEST(Protocol, ExecInputRoundTripsAndIsBounded) {
  ExecInput in{42, std::string("a\0b", 3), true};
  ExecInput out;
  ASSERT_TRUE(Decode(Encode(in), &out));
  EXPECT_EQ(out.exec_tag, 42u);
  EXPECT_EQ(out.data, in.data);
  EXPECT_TRUE(out.close);
  in.data.assign(kMaxInputChunk, 'x');
  ASSERT_TRUE(Decode(Encode(in), &out));
  in.data.push_back('x');
  EXPECT_FALSE(Decode(Encode(in), &out));
}

TEST(Protocol, ExecExitCarriesOnlyTheUsageItHas) {
  ExecExit e;
  e.usage.cpu_user_us = 1000000;
  e.usage.memory_peak_bytes = 200ull << 20;
  e.usage.io_write_bytes = 0;
  ExecExit out;
  ASSERT_TRUE(Decode(Encode(e), &out));
  EXPECT_EQ(out.usage, e.usage);
  EXPECT_FALSE(out.usage.cpu_system_us.has_value());
  EXPECT_FALSE(out.usage.pids_peak.has_value());
  ASSERT_TRUE(out.usage.io_write_bytes.has_value());  // a measured zero stays a zero
  std::string bad = Encode(ExecExit{});
  bad.back() = static_cast<char>(1u << 6);  // a mask bit beyond the six fields
  EXPECT_FALSE(Decode(bad, &out));
}

TEST(Protocol, EveryMessageRoundTrips) {
  Hello h;
  h.init_seccomp = std::string(16, '\1');
  h.capabilities = 0xa80025fb;
  h.last_cap = 40;
  h.rlimits = {{7, 1024, 65536}};
  h.shell = "/bin/bash";
  Hello h2;
  ASSERT_TRUE(Decode(Encode(h), &h2));
  EXPECT_EQ(h2.init_seccomp, h.init_seccomp);
  EXPECT_EQ(h2.rlimits.size(), 1u);
  EXPECT_EQ(h2.rlimits[0].hard, 65536u);
  EXPECT_EQ(h2.shell, "/bin/bash");
  EXPECT_FALSE(h2.adoption.has_value());
  h.adoption = Adoption{"box-1", "127.0.1.1\tbox-1\n", "box-1\n", 32u << 20};
  ASSERT_TRUE(Decode(Encode(h), &h2));
  ASSERT_TRUE(h2.adoption.has_value());
  EXPECT_EQ(h2.adoption->hostname, "box-1");
  EXPECT_EQ(h2.adoption->etc_hosts, "127.0.1.1\tbox-1\n");
  EXPECT_EQ(h2.adoption->etc_hostname, "box-1\n");
  EXPECT_EQ(h2.adoption->tmpfs_size, 32u << 20);
  EXPECT_FALSE(h2.adoption->ahead);
  h.adoption->ahead = true;
  ASSERT_TRUE(Decode(Encode(h), &h2));
  EXPECT_TRUE(h2.adoption->ahead);
  // An adoption names its sandbox: an empty hostname, or one over 64 bytes, is malformed.
  h.adoption->hostname = "";
  EXPECT_FALSE(Decode(Encode(h), &h2));
  h.adoption->hostname = std::string(65, 'a');
  EXPECT_FALSE(Decode(Encode(h), &h2));
  h.adoption.reset();

  ExecExit e{-1, 9, 6, true, false, true, 812, {}};
  ExecExit e2;
  ASSERT_TRUE(Decode(Encode(e), &e2));
  EXPECT_EQ(e2.exit_code, -1);
  EXPECT_EQ(e2.signal, 9);
  EXPECT_EQ(e2.reason, 6);
  EXPECT_TRUE(e2.timed_out);
  EXPECT_TRUE(e2.cancelled);
  EXPECT_EQ(e2.duration_ms, 812u);

  StatReply s{true, false, true, 4096, 1700000000123.456, 0100755};
  StatReply s2;
  ASSERT_TRUE(Decode(Encode(s), &s2));
  EXPECT_EQ(s2.mode, 0100755u);
  EXPECT_TRUE(s2.is_file);
  EXPECT_FALSE(s2.is_directory);
  EXPECT_TRUE(s2.is_symbolic_link);
  EXPECT_DOUBLE_EQ(s2.mtime_ms, 1700000000123.456);

  ReaddirReply d;
  d.entries = {{"a.txt", 0}, {std::string("\xff\xfe", 2), 3}};
  ReaddirReply d2;
  ASSERT_TRUE(Decode(Encode(d), &d2));
  ASSERT_EQ(d2.entries.size(), 2u);
  EXPECT_EQ(d2.entries[1].name, std::string("\xff\xfe", 2));

  ErrorReply er{2, "open", "/workspace/a", "ENOENT: no such file or directory, open '/workspace/a'",
                false};
  ErrorReply er2;
  ASSERT_TRUE(Decode(Encode(er), &er2));
  EXPECT_EQ(er2.message, er.message);

  RmRequest rm{"/x", true, true};
  RmRequest rm2;
  ASSERT_TRUE(Decode(Encode(rm), &rm2));
  EXPECT_TRUE(rm2.recursive && rm2.force);
}

TEST(Protocol, RefusesTruncatedTrailingAndOutOfRangePayloads) {
  std::string ok =
      Encode(ExecRequest{"true", "/", {}, std::nullopt, 0, 1, {}, false, std::nullopt});
  ExecRequest out;
  for (size_t n = 0; n < ok.size(); ++n) {
    EXPECT_FALSE(Decode(ok.substr(0, n), &out)) << n;
  }
  EXPECT_FALSE(Decode(ok + "x", &out));
  // A length prefix far beyond the payload.
  std::string huge("\xff\xff\xff\x7f", 4);
  PathRequest p;
  EXPECT_FALSE(Decode(huge, &p));
  // Booleans are 0 or 1.
  std::string bad_bool = Encode(MkdirRequest{"/a", true});
  bad_bool.back() = 2;
  MkdirRequest m;
  EXPECT_FALSE(Decode(bad_bool, &m));
  // Output streams are 1 or 2; entry types 0..3.
  ExecOutput o;
  EXPECT_FALSE(Decode(Encode(ExecOutput{3, "x"}), &o));
  ReaddirReply d;
  EXPECT_FALSE(Decode(Encode(ReaddirReply{{{"a", 9}}}), &d));
  // A write's mode: permission bits only, or "keep".
  WriteRequest w;
  ASSERT_TRUE(Decode(Encode(WriteRequest{"/a", 04755}), &w));
  EXPECT_EQ(w.mode, 04755u);
  ASSERT_TRUE(Decode(Encode(WriteRequest{"/a"}), &w));
  EXPECT_EQ(w.mode, WriteRequest::kKeepMode);
  EXPECT_FALSE(Decode(Encode(WriteRequest{"/a", 010000}), &w));
  EXPECT_FALSE(Decode(Encode(WriteRequest{"/a", 0100644}), &w));
}

// nsboxd reads a listing's frames entry by entry as it streams them (runtime/listing.h): the
// cursor takes exactly what Decode takes, every prefix and bad entry refused as Decode refuses it.
TEST(Protocol, ReaddirCursorReadsWhatDecodeReads) {
  auto entries = [](std::string_view payload, bool* ok) {
    std::vector<std::pair<std::string, uint8_t>> out;
    ReaddirCursor cursor(payload);
    std::string_view name;
    uint8_t type = 0;
    while (cursor.Next(&name, &type)) out.emplace_back(std::string(name), type);
    *ok = cursor.ok();
    return out;
  };
  const std::string good = Encode(ReaddirReply{{{"a", 0}, {"bb\xff", 1}, {"c", 3}}});
  bool ok = false;
  EXPECT_EQ(entries(good, &ok),
            (std::vector<std::pair<std::string, uint8_t>>{{"a", 0}, {"bb\xff", 1}, {"c", 3}}));
  EXPECT_TRUE(ok);
  EXPECT_TRUE(entries(Encode(ReaddirReply{}), &ok).empty());
  EXPECT_TRUE(ok);
  for (size_t n = 0; n < good.size(); ++n) {
    entries(good.substr(0, n), &ok);
    EXPECT_FALSE(ok) << n;
  }
  entries(good + "x", &ok);
  EXPECT_FALSE(ok);
  for (const auto& bad : std::vector<ReaddirReply>{{{{"a", 9}}},
                                                   {{{".", 0}}},
                                                   {{{"..", 0}}},
                                                   {{{"a/b", 0}}},
                                                   {{{"", 0}}},
                                                   {{{std::string("a\0b", 3), 0}}},
                                                   {{{std::string(256, 'n'), 0}}}}) {
    ReaddirReply d;
    const std::string payload = Encode(bad);
    EXPECT_FALSE(Decode(payload, &d));
    entries(payload, &ok);
    EXPECT_FALSE(ok) << bad.entries[0].name.size();
  }
}

TEST(Protocol, ExecOutputFastPathsMatchTheGeneralEncoding) {
  std::string data("\xff\x00out", 5);
  std::string general = EncodeFrame(Type::kExecOutput, 9, Encode(ExecOutput{2, data}));
  EXPECT_EQ(EncodeExecOutputFrame(9, 2, data), general);
  uint8_t stream = 0;
  std::string_view view;
  const std::string payload = general.substr(kHeaderSize);  // the view points into it
  ASSERT_TRUE(DecodeExecOutputView(payload, &stream, &view));
  EXPECT_EQ(stream, 2);
  EXPECT_EQ(view, data);
  EXPECT_FALSE(DecodeExecOutputView(general.substr(kHeaderSize, general.size() - kHeaderSize - 1),
                                    &stream, &view));
}

TEST(FrameReader, ReassemblesFramesFedByteByByte) {
  std::string stream = EncodeFrame(Type::kPing, 1, "") + EncodeFrame(Type::kStat, 2, "payload") +
                       EncodeFrame(Type::kPing, 3, "");
  FrameReader r;
  std::vector<uint64_t> tags;
  for (char c : stream) {
    r.Feed(std::string_view(&c, 1));
    while (auto f = r.Next()) {
      tags.push_back(f->header.tag);
      if (f->header.tag == 2) {
        EXPECT_EQ(f->payload, "payload");
      }
    }
  }
  EXPECT_EQ(tags, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(r.buffered(), 0u);
}

TEST(FrameReader, SkipsAnOversizedPayloadAndGoesOn) {
  char header[kHeaderSize];
  EncodeHeader({kMaxPayload + 10, Type::kExec, 7}, header);
  std::string stream(header, kHeaderSize);
  stream += std::string(kMaxPayload + 10, 'x');
  stream += EncodeFrame(Type::kPing, 8, "");
  FrameReader r;
  std::vector<std::pair<uint64_t, bool>> seen;
  for (size_t i = 0; i < stream.size(); i += 65536) {
    r.Feed(std::string_view(stream).substr(i, 65536));
    while (auto f = r.Next()) seen.emplace_back(f->header.tag, f->oversized);
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], std::make_pair(uint64_t{7}, true));
  EXPECT_EQ(seen[1], std::make_pair(uint64_t{8}, false));
}

}  // namespace
}  // namespace nsbox::fs::proto
