// runtime/exec_session: the output log of an exec (docs/exec.md): offsets over both streams, the
// memory ring, the spill file beyond it and its cap, the stream of every byte kept exactly; the
// spill written on a thread pool (as nsboxd's spill thread), read exactly before and after its
// writes end, read off the loop when only the disk has it, and its backlog said (on_spill_behind).

#include "runtime/exec_session.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace nsbox::runtime {
namespace {

class ExecSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nsbox-exec-session-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  // The sessions' last jobs (a spill file's removal, posted by a session's destructor at the end
  // of a test) first: remove_all racing one fails on the file it removed.
  void TearDown() override {
    pool_.join();
    std::filesystem::remove_all(dir_);
  }

  // With `held`, the write offload's jobs wait in held_ until RunHeld runs them (on this thread).
  std::unique_ptr<ExecSession> Make(uint64_t ring, uint64_t spill,
                                    uint64_t backlog = ExecLogLimits().spill_backlog,
                                    bool held = false) {
    ExecLogLimits limits;
    limits.ring_bytes = ring;
    limits.spill_bytes = spill;
    limits.spill_backlog = backlog;
    return std::make_unique<ExecSession>(
        io_.get_executor(),
        [this, held](std::function<void()> job) {
          if (held) {
            held_.push_back(std::move(job));
            return;
          }
          ++jobs_;
          boost::asio::post(pool_, [this, job = std::move(job)] {
            job();
            --jobs_;
          });
        },
        [this](std::function<void()> job) {
          ++disk_reads_;
          boost::asio::post(pool_, std::move(job));
        },
        "e-test", "cmd", spill_path(), limits);
  }
  std::string spill_path() const { return dir_ + "/execs/e-test.log"; }

  // Runs the loop until the spill's writes on the pool have ended and been taken in.
  void Settle(const ExecSession& s) {
    while (s.spill_pending()) {
      io_.restart();
      io_.run_one();
    }
  }
  // Runs the held jobs and what they lead to on the loop, and theirs, until none is left. The
  // loop is polled, not run: a held job keeps it busy until it has run.
  void RunHeld() {
    for (;;) {
      auto jobs = std::move(held_);
      held_.clear();
      for (auto& job : jobs) job();
      jobs.clear();
      io_.restart();
      if (io_.poll() == 0 && held_.empty()) return;
    }
  }
  // Waits until the write offload's jobs (the spill's writes and its removal) have run.
  void WaitJobs() {
    while (jobs_ > 0) std::this_thread::yield();
  }
  // Runs the loop until nothing is left for it (every job's end taken in, or ignored).
  void RunLoop() {
    io_.restart();
    io_.run();
  }

  // `count` blocks of `size` bytes, the i-th all of the letter 'a' + i % 26 and on stderr when
  // i % stderr_every == 0: appended to `s`, their bytes to `all` and each byte's stream to
  // `streams`.
  static void AppendBlocks(ExecSession& s, int count, size_t size, int stderr_every,
                           std::string* all, std::string* streams) {
    for (int i = 0; i < count; ++i) {
      const int stream = i % stderr_every == 0 ? 2 : 1;
      std::string data(size, static_cast<char>('a' + i % 26));
      s.Append(stream, data);
      *all += data;
      streams->append(data.size(), static_cast<char>('0' + stream));
    }
  }

  // Everything from `offset`, read `max` bytes at a time: the bytes, and each byte's stream.
  static void ReadAll(const ExecSession& s, uint64_t offset, size_t max, std::string* bytes,
                      std::string* streams) {
    for (;;) {
      auto pieces = s.Read(offset, max);
      if (pieces.empty()) return;
      size_t total = 0;
      for (const auto& p : pieces) {
        EXPECT_EQ(p.offset, offset);
        EXPECT_FALSE(p.data.empty());
        *bytes += p.data;
        streams->append(p.data.size(), static_cast<char>('0' + p.stream));
        offset += p.data.size();
        total += p.data.size();
      }
      EXPECT_LE(total, max);
    }
  }

  // ReadLog from `offset` on the loop, run until it has answered.
  std::vector<ExecSession::Piece> ReadLog(ExecSession& s, uint64_t offset, size_t max,
                                          const std::function<void()>& while_reading = {}) {
    std::optional<std::vector<ExecSession::Piece>> got;
    boost::asio::co_spawn(io_, s.ReadLog(offset, max),
                          [&](std::exception_ptr e, std::vector<ExecSession::Piece> pieces) {
                            if (e) std::rethrow_exception(e);
                            got = std::move(pieces);
                          });
    io_.restart();
    io_.run_one();  // up to its first wait
    if (while_reading) while_reading();
    while (!got) {
      io_.restart();
      io_.run_one();
    }
    return std::move(*got);
  }
  // The spill file's pages written to the disk and dropped from the page cache.
  void EvictSpill() {
    const int fd = ::open(spill_path().c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(::fdatasync(fd), 0);
    EXPECT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    ::close(fd);
  }

  boost::asio::io_context io_;
  int disk_reads_ = 0;                       // jobs given to the read offload
  std::atomic<int> jobs_{0};                 // jobs of the write offload not yet run
  std::vector<std::function<void()>> held_;  // Make(..., held): its write offload's jobs
  // After io_: destroyed (joined) first, while the loop its jobs post to still exists.
  boost::asio::thread_pool pool_{2};
  std::string dir_;
};

TEST_F(ExecSessionTest, SmallOutputStaysInMemory) {
  auto s = Make(4096, 1 << 20);
  s->Append(1, "hello ");
  s->Append(2, "warn\n");
  s->Append(1, "world\n");
  EXPECT_EQ(s->end(), 17u);
  EXPECT_EQ(s->oldest(), 0u);
  std::string bytes, streams;
  ReadAll(*s, 0, 1 << 20, &bytes, &streams);
  EXPECT_EQ(bytes, "hello warn\nworld\n");
  EXPECT_EQ(streams, "11111122222111111");
  bytes.clear();
  streams.clear();
  ReadAll(*s, 8, 3, &bytes, &streams);  // mid-chunk, in small reads
  EXPECT_EQ(bytes, "rn\nworld\n");
  EXPECT_FALSE(std::filesystem::exists(spill_path())) << "no spill file for a small output";
}

TEST_F(ExecSessionTest, RingSpillAndCapKeepTheNewestBytesExactly) {
  for (uint64_t spill : {uint64_t{0}, uint64_t{10000}, uint64_t{1} << 20}) {
    SCOPED_TRACE("spill " + std::to_string(spill));
    std::filesystem::remove_all(dir_ + "/execs");
    auto s = Make(4096, spill);
    std::mt19937 rng(static_cast<unsigned>(spill));
    std::string all, all_streams;
    for (int i = 0; i < 2000; ++i) {
      const int stream = (rng() % 3 == 0) ? 2 : 1;
      std::string data(1 + rng() % 200, '\0');
      for (char& c : data) c = static_cast<char>(rng());
      s->Append(stream, data);
      all += data;
      all_streams.append(data.size(), static_cast<char>('0' + stream));
    }
    EXPECT_EQ(s->end(), all.size());
    const uint64_t kept = s->end() - s->oldest();
    EXPECT_LE(kept, 4096 + spill + (64u << 10));
    if (spill == (uint64_t{1} << 20)) {
      EXPECT_EQ(s->oldest(), 0u) << "everything fits";
    }
    if (spill == 0) {
      EXPECT_LE(kept, 4096u + (64u << 10));
    } else {
      EXPECT_GE(kept, std::min<uint64_t>(all.size(), spill));
    }
    // Read while the spill's file is made and written (the waiting chunks are read from
    // memory), then once they are all on disk.
    for (bool settled : {false, true}) {
      SCOPED_TRACE(settled ? "spill written" : "spill under way");
      if (settled) Settle(*s);
      std::string bytes, streams;
      ReadAll(*s, s->oldest(), 777, &bytes, &streams);
      EXPECT_TRUE(bytes == all.substr(s->oldest())) << "the kept bytes differ";
      EXPECT_TRUE(streams == all_streams.substr(s->oldest())) << "a byte's stream differs";
    }
    if (spill != 0) {
      struct stat st {};
      ASSERT_EQ(::stat(spill_path().c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 0777, 0600u);
    }
    // An offset before the oldest kept one reads from the oldest.
    auto first = s->Read(0, 10);
    ASSERT_FALSE(first.empty());
    EXPECT_EQ(first[0].offset, s->oldest());
    s->Drop();
    EXPECT_TRUE(s->dropped());
    EXPECT_TRUE(s->Read(s->oldest(), 10).empty());
    WaitJobs();
    EXPECT_FALSE(std::filesystem::exists(spill_path())) << "Drop removes the spill file";
  }
}

TEST_F(ExecSessionTest, StreamSwitchesInTheSpillAreBounded) {
  // One-byte writes alternating between the streams: beyond the bound of switches kept, the
  // oldest spilled bytes go, and what is kept is still exact.
  auto s = Make(4096, 64u << 20);
  const size_t n = ExecLogLimits::kMaxSpillRuns + 50000;
  for (size_t i = 0; i < n; ++i) {
    s->Append(i % 2 == 0 ? 1 : 2, i % 2 == 0 ? "a" : "b");
    if (i % 10000 == 0) Settle(*s);  // the spill keeps up, as it does on a loop that runs
  }
  EXPECT_EQ(s->end(), n);
  EXPECT_GT(s->oldest(), 0u);
  EXPECT_LE(s->end() - s->oldest(), ExecLogLimits::kMaxSpillRuns + 4096 + 1);
  for (bool settled : {false, true}) {
    SCOPED_TRACE(settled ? "spill written" : "spill under way");
    if (settled) Settle(*s);
    std::string bytes, streams;
    ReadAll(*s, s->oldest(), 1 << 20, &bytes, &streams);
    ASSERT_EQ(bytes.size(), s->end() - s->oldest());
    for (size_t i = 0; i < bytes.size(); ++i) {
      const size_t at = s->oldest() + i;
      ASSERT_EQ(bytes[i], at % 2 == 0 ? 'a' : 'b') << at;
      ASSERT_EQ(streams[i], at % 2 == 0 ? '1' : '2') << at;
    }
  }
}

TEST_F(ExecSessionTest, ASpillFarBehindTheOutputLosesNothingAndSaysSo) {
  // The loop does not run while 4 MiB are appended, so no write's end is taken in: the spilled
  // chunks wait in memory, and reads find every byte there; once the loop runs, in the file.
  // Over the backlog's bound (256 KiB) the session says it is behind (nsboxd then stops reading
  // the sandbox's channel), once, and that it is not any more once the spill has caught up.
  auto s = Make(4096, 64u << 20, 256u << 10);
  std::vector<bool> said;
  s->on_spill_behind = [&](bool behind) { said.push_back(behind); };
  std::string all, all_streams;
  AppendBlocks(*s, 4096, 1024, 7, &all, &all_streams);
  EXPECT_TRUE(s->spill_pending());
  EXPECT_EQ(said, std::vector<bool>{true});
  for (bool settled : {false, true}) {
    SCOPED_TRACE(settled ? "spill written" : "spill under way");
    if (settled) Settle(*s);
    EXPECT_EQ(s->oldest(), 0u);
    std::string bytes, streams;
    ReadAll(*s, 0, 100000, &bytes, &streams);
    EXPECT_TRUE(bytes == all) << "the bytes differ";
    EXPECT_TRUE(streams == all_streams) << "a byte's stream differs";
  }
  EXPECT_EQ(said, (std::vector<bool>{true, false}));
  ASSERT_TRUE(std::filesystem::exists(spill_path()));
  const uint64_t on_disk = std::filesystem::file_size(spill_path());
  EXPECT_GE(on_disk, all.size() - 4096) << "all but the ring (at most 4096 bytes) is on disk";
  EXPECT_LT(on_disk, all.size());
}

TEST_F(ExecSessionTest, DroppedOrDestroyedWhileTheSpillIsWritten) {
  // A session dropped, or destroyed, while a job makes its spill file (the loop has not run since
  // the output came): the job's end touches nothing of a destroyed session, and the file is gone
  // once the loop and the jobs have run (ASan watches the rest).
  for (bool destroy : {false, true}) {
    SCOPED_TRACE(destroy ? "destroyed" : "dropped");
    auto s = Make(4096, 64u << 20, 64u << 10);
    std::vector<bool> said;
    s->on_spill_behind = [&](bool behind) { said.push_back(behind); };
    for (int i = 0; i < 2000; ++i) s->Append(1 + i % 2, std::string(700, 'x'));
    ASSERT_TRUE(s->spill_pending());
    EXPECT_EQ(said, std::vector<bool>{true});
    if (destroy) {
      s.reset();
    } else {
      s->Drop();
    }
    EXPECT_EQ(said, (std::vector<bool>{true, false})) << "a hold is released with the session";
    RunLoop();
    WaitJobs();
    EXPECT_FALSE(std::filesystem::exists(spill_path()));
    if (!destroy) {
      EXPECT_TRUE(s->Read(0, 10).empty());
    }
  }
}

TEST_F(ExecSessionTest, TheSpillIsReadOffTheLoopWhenItIsNotInThePageCache) {
  // ReadLog reads the page cache on the loop; what only the disk has is read by a job on the
  // read offload. Bytes and streams are exact either way; bytes dropped while such a read is
  // under way (their blocks perhaps punched to zeros) are never returned; a drop ends it empty.
  const auto byte_at = [](uint64_t o) { return static_cast<char>('a' + (o / 1024) % 26); };
  const auto stream_at = [](uint64_t o) { return (o / 1024) % 7 == 0 ? 2 : 1; };
  auto s = Make(4096, 2u << 20);
  auto append = [&](size_t blocks) {
    for (size_t i = 0; i < blocks; ++i) {
      s->Append(stream_at(s->end()), std::string(1024, byte_at(s->end())));
    }
  };
  auto check = [&](const std::vector<ExecSession::Piece>& pieces, uint64_t from) {
    ASSERT_FALSE(pieces.empty());
    EXPECT_GE(pieces.front().offset, from);
    uint64_t at = pieces.front().offset;
    for (const auto& p : pieces) {
      ASSERT_EQ(p.offset, at);
      for (size_t i = 0; i < p.data.size(); ++i, ++at) {
        ASSERT_EQ(p.data[i], byte_at(at)) << at;
        ASSERT_EQ(p.stream, stream_at(at)) << at;
      }
    }
  };
  append(1024);  // 1 MiB, all but the ring spilled
  Settle(*s);
  uint64_t offset = 0;
  while (offset < s->end()) {
    auto pieces = ReadLog(*s, offset, 100000);
    check(pieces, offset);
    offset = pieces.back().offset + pieces.back().data.size();
  }
  EXPECT_EQ(disk_reads_, 0) << "what the page cache has is read on the loop";

  EvictSpill();
  offset = 0;
  std::string streams;
  while (offset < s->end()) {
    auto pieces = ReadLog(*s, offset, 100000);
    check(pieces, offset);
    EXPECT_EQ(pieces.front().offset, offset);
    offset = pieces.back().offset + pieces.back().data.size();
  }
  EXPECT_GT(disk_reads_, 0) << "an evicted spill is read by jobs";

  // 3 MiB more while a read of offset 0 waits for the disk: the cap (2 MiB) drops what it reads.
  EvictSpill();
  const int before = disk_reads_;
  auto pieces = ReadLog(*s, 0, 100000, [&] {
    append(3072);
    Settle(*s);
  });
  EXPECT_EQ(disk_reads_, before + 1);
  EXPECT_GT(s->oldest(), 100000u);
  check(pieces, s->oldest());

  EvictSpill();
  pieces = ReadLog(*s, s->oldest(), 100000, [&] { s->Drop(); });
  EXPECT_TRUE(pieces.empty()) << "a log dropped while it is read ends the read empty";
}

TEST_F(ExecSessionTest, ARetiredRingMovesToTheSpillAndLosesNothing) {
  // After the end, RetireRing moves the ring's bytes to the spill file (nsboxd's bound on the
  // memory of ended sessions): read exactly from there, as far as the spill's cap takes them
  // without dropping a kept byte, never with a hold on the channel, and not at all without a
  // spill.
  fs::proto::ExecExit exit;
  auto fill = [](ExecSession& s, std::string* all, std::string* streams) {
    AppendBlocks(s, 100, 1024, 3, all, streams);
  };
  struct Case {
    const char* name;
    uint64_t spill;
    bool all_retired;
  };
  for (const Case& c :
       {Case{"room for all", 1u << 20, true}, Case{"a cap of 80 KiB", 80u << 10, false}}) {
    SCOPED_TRACE(c.name);
    auto s = Make(64u << 10, c.spill, 16u << 10);
    std::vector<bool> said;
    s->on_spill_behind = [&](bool behind) { said.push_back(behind); };
    std::string all, streams;
    fill(*s, &all, &streams);
    Settle(*s);
    said.clear();
    s->Ended(exit, "exited");
    const uint64_t ring_before = s->ring_size();
    ASSERT_GT(ring_before, 0u);
    s->RetireRing();
    EXPECT_TRUE(said.empty()) << "an ended session's retired ring holds no channel";
    Settle(*s);
    if (c.all_retired) {
      EXPECT_EQ(s->ring_size(), 0u);
      EXPECT_EQ(std::filesystem::file_size(spill_path()), all.size());
    } else {
      EXPECT_GT(s->ring_size(), 0u);
      EXPECT_LT(s->ring_size(), ring_before);
    }
    EXPECT_EQ(s->oldest(), 0u) << "nothing dropped";
    std::string bytes, got_streams;
    ReadAll(*s, 0, 100000, &bytes, &got_streams);
    EXPECT_TRUE(bytes == all) << "the bytes differ";
    EXPECT_TRUE(got_streams == streams) << "a byte's stream differs";
    s->Drop();
    WaitJobs();
  }

  auto none = Make(64u << 10, 0);
  std::string all, streams;
  fill(*none, &all, &streams);
  none->Ended(exit, "exited");
  const uint64_t ring = none->ring_size();
  none->RetireRing();
  EXPECT_EQ(none->ring_size(), ring) << "without a spill the ring stays in memory";
  EXPECT_FALSE(std::filesystem::exists(spill_path()));
}

TEST_F(ExecSessionTest, TheSpillFileIsMadeByAJobAndWhatWaitsForItIsKept) {
  // The spill file is made by a job of the write offload, like the writes (a creation waits for
  // the file system's journal): until it is there, the spilled bytes wait in memory and are read
  // from there. If it cannot be made, the spilled bytes go (the ring stays), and a ring to retire
  // stays in memory whole.
  auto s = Make(4096, 1u << 20, 1u << 20, /*held=*/true);
  std::string all, streams;
  AppendBlocks(*s, 40, 1000, 5, &all, &streams);
  EXPECT_EQ(held_.size(), 1u) << "one job: the file's making";
  EXPECT_FALSE(std::filesystem::exists(spill_path())) << "not made on the loop";
  EXPECT_TRUE(s->spill_pending());
  std::string bytes, got_streams;
  ReadAll(*s, 0, 100000, &bytes, &got_streams);
  EXPECT_TRUE(bytes == all && got_streams == streams) << "read from memory meanwhile";
  RunHeld();
  EXPECT_FALSE(s->spill_pending());
  EXPECT_EQ(std::filesystem::file_size(spill_path()), all.size() - s->ring_size());
  bytes.clear();
  got_streams.clear();
  ReadAll(*s, 0, 100000, &bytes, &got_streams);
  EXPECT_TRUE(bytes == all && got_streams == streams) << "read from the file and the ring";
  s->Drop();
  RunHeld();
  EXPECT_FALSE(std::filesystem::exists(spill_path()));

  // A regular file where the execs directory should be: the file cannot be made.
  std::filesystem::remove_all(dir_ + "/execs");
  { std::ofstream(dir_ + "/execs") << "not a directory"; }
  auto failing = Make(4096, 1u << 20, 1u << 20, /*held=*/true);
  for (int i = 0; i < 10; ++i) failing->Append(1 + i % 2, std::string(1000, 'x'));
  RunHeld();
  EXPECT_EQ(failing->oldest(), failing->end() - failing->ring_size()) << "the spilled bytes went";
  EXPECT_GT(failing->ring_size(), 0u);

  fs::proto::ExecExit exit;
  auto retiring = Make(64u << 10, 1u << 20, 1u << 20, /*held=*/true);
  for (int i = 0; i < 10; ++i) retiring->Append(1, std::string(1000, 'y'));
  retiring->Ended(exit, "exited");
  retiring->RetireRing();
  EXPECT_EQ(retiring->ring_size(), 10000u) << "nothing leaves the ring before the file is made";
  RunHeld();
  EXPECT_EQ(retiring->ring_size(), 10000u) << "nor when it cannot be made";
  EXPECT_EQ(retiring->oldest(), 0u);
  bytes.clear();
  got_streams.clear();
  ReadAll(*retiring, 0, 100000, &bytes, &got_streams);
  EXPECT_EQ(bytes, std::string(10000, 'y'));
}

// Where a stream's last bytes before an offset lie, in the ring and in the spill (by its runs),
// past the other stream's bytes between them: the issue 44 case, stdout "ab\xe2\x82", stderr
// "err\n", stdout "\xac\n".
TEST_F(ExecSessionTest, StreamTailFindsAStreamsLastBytesPastTheOtherStream) {
  using Spans = std::vector<std::pair<uint64_t, size_t>>;
  auto spans = [](const std::vector<ExecSession::Span>& in) {
    Spans out;
    for (const auto& s : in) out.emplace_back(s.offset, s.len);
    return out;
  };
  for (uint64_t ring : {uint64_t{4096}, uint64_t{4}}) {
    auto s = Make(ring, 1 << 20);
    s->Append(1, "ab\xe2\x82");
    s->Append(2, "err\n");
    s->Append(1, "\xac\n");
    Settle(*s);
    SCOPED_TRACE(s->spilled_bytes() > 0 ? "spilled" : "in the ring");
    EXPECT_EQ(spans(s->StreamTail(1, 8, 3)), (Spans{{1, 3}}));
    EXPECT_EQ(spans(s->StreamTail(1, 5, 3)), (Spans{{1, 3}}));
    EXPECT_EQ(spans(s->StreamTail(2, 8, 3)), (Spans{{5, 3}}));
    EXPECT_EQ(spans(s->StreamTail(1, 10, 3)), (Spans{{3, 1}, {8, 2}}));
    EXPECT_EQ(spans(s->StreamTail(1, 9, 3)), (Spans{{2, 2}, {8, 1}}));
    EXPECT_EQ(spans(s->StreamTail(2, 4, 3)), Spans{}) << "no stderr before it";
    EXPECT_EQ(spans(s->StreamTail(1, 1, 3)), (Spans{{0, 1}}));
    EXPECT_EQ(spans(s->StreamTail(1, 99, 3)), (Spans{{3, 1}, {8, 2}})) << "past the end";
  }
  // Only what is kept: the spill's cap dropped the oldest bytes.
  auto s = Make(4, 6);
  s->Append(1, "abcd");
  s->Append(2, "efgh");
  s->Append(1, "ij");
  s->Append(2, "kl");
  Settle(*s);
  ASSERT_GT(s->oldest(), 0u);
  for (const auto& span : s->StreamTail(1, s->end(), 3)) EXPECT_GE(span.offset, s->oldest());
}

TEST_F(ExecSessionTest, StartAndEnd) {
  auto s = Make(4096, 0);
  EXPECT_FALSE(s->started());
  s->Started(42);
  EXPECT_TRUE(s->started());
  EXPECT_EQ(s->pid(), 42u);
  fs::proto::ExecExit x;
  x.exit_code = 3;
  s->Ended(x, "exited");
  EXPECT_TRUE(s->ended());
  EXPECT_EQ(s->exit().exit_code, 3);
  EXPECT_EQ(s->reason(), "exited");
}

}  // namespace
}  // namespace nsbox::runtime
