// The file verbs of api.md ("Files"), every case and every error, through fs::InitClient against
// nsbox-init in a real jail; what the verbs write is checked by commands and the other way round.

#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "fs/file_ops.h"
#include "init_fixture.h"

namespace nsbox::itest {
namespace {

using fs::EntryType;

std::vector<std::string> NamesOf(const fs::proto::ReaddirReply& r) {
  std::vector<std::string> names;
  for (const auto& e : r.entries) names.push_back(e.name);
  return names;
}

class InitFilesTest : public InitTest {};

// ---- readFile ------------------------------------------------------------------------------

TEST_F(InitFilesTest, ReadFileReadsWhatACommandWrote) {
  Sh("printf 'from a command' > cmd.txt; : > empty; ln -s cmd.txt link; "
     "yes 0123456789abcdef | head -c 1000000 > big");
  auto r = client().ReadFile("/workspace/cmd.txt");
  ASSERT_TRUE(Succeeds(r));
  EXPECT_EQ(r.value(), "from a command");
  auto empty = client().ReadFile("/workspace/empty");
  ASSERT_TRUE(Succeeds(empty));
  EXPECT_EQ(empty.value(), "");
  auto link = client().ReadFile("/workspace/link");
  ASSERT_TRUE(Succeeds(link));
  EXPECT_EQ(link.value(), "from a command");
  // Over the inline limit: it comes as an fd; every byte must be there.
  auto big = client().ReadFile("/workspace/big");
  ASSERT_TRUE(Succeeds(big));
  std::string expected;
  while (expected.size() < 1000000) expected += "0123456789abcdef\n";
  expected.resize(1000000);
  EXPECT_TRUE(big.value() == expected) << "size " << big.value().size();
  // The jail's own files, not the host's.
  auto hostname = client().ReadFile("/etc/hostname");
  ASSERT_TRUE(Succeeds(hostname));
  EXPECT_EQ(hostname.value(), "box\n");
}

TEST_F(InitFilesTest, ReadFileErrors) {
  Sh("mkdir dir; touch file");
  EXPECT_TRUE(FailsWith(client().ReadFile("/workspace/nope"), ENOENT,
                        "ENOENT: no such file or directory, open '/workspace/nope'"));
  EXPECT_TRUE(FailsWith(client().ReadFile("/workspace/nope/deeper"), ENOENT,
                        "ENOENT: no such file or directory, open '/workspace/nope/deeper'"));
  // Node opens a directory and fails in read(2): the message names no path.
  EXPECT_TRUE(FailsWith(client().ReadFile("/workspace/dir"), EISDIR,
                        "EISDIR: illegal operation on a directory, read"));
  EXPECT_TRUE(FailsWith(client().ReadFile("/workspace"), EISDIR));
  EXPECT_TRUE(FailsWith(client().ReadFile("/"), EISDIR));
  EXPECT_TRUE(FailsWith(client().ReadFile("/workspace/file/x"), ENOTDIR,
                        "ENOTDIR: not a directory, open '/workspace/file/x'"));
}

TEST_F(InitFilesTest, ReadFileRefusesFifoSocketAndDevicesWithoutHanging) {
  Sh("mkfifo fifo && ln -s fifo fifo-link && "
     "perl -MSocket -e 'socket(my $s, AF_UNIX, SOCK_STREAM, 0) or die \"socket: $!\"; "
     "bind($s, pack_sockaddr_un(\"/workspace/sock\")) or die \"bind: $!\"'");
  ASSERT_EQ(Sh("stat -c %F fifo sock"), "fifo\nsocket\n");
  for (std::string path : {"/workspace/fifo", "/workspace/fifo-link", "/workspace/sock",
                           "/dev/zero", "/dev/null", "/dev/urandom"}) {
    auto start = Clock::now();
    auto r = Within<fs::FsOutcome<std::string>>(milliseconds(1000),
                                                [this, path] { return client().ReadFile(path); });
    ASSERT_TRUE(r.has_value()) << "readFile " << path << " did not answer within 1 s";
    EXPECT_LT(Since(start).count(), 1000) << path;
    // Which kind of file it is, so that a model reading the error knows why.
    const std::string kind = path.find("fifo") != std::string::npos ? "a FIFO"
                             : path.ends_with("sock")               ? "a socket"
                                                                    : "a character device";
    EXPECT_TRUE(FailsWith(*r, EINVAL,
                          "EINVAL: invalid argument, open '" + path + "' (" + kind +
                              ": the file API reads and writes regular files only)"))
        << path;
  }
  // Nothing was opened for writing: a writer on the FIFO would still block (no reader came).
  EXPECT_EQ(Sh("stat -c %F fifo"), "fifo\n");
}

// ---- writeFile -----------------------------------------------------------------------------

TEST_F(InitFilesTest, WriteFileCreatesParentsWithRootOwnerAndDefaultModes) {
  ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/p/q/r.txt", "hello\n")));
  EXPECT_EQ(Sh("cat p/q/r.txt"), "hello\n");
  // Root inside; the new file 0644 and the new directories 0755 (umask 022).
  EXPECT_EQ(Sh("stat -c '%u:%g %a %F' p p/q p/q/r.txt"),
            "0:0 755 directory\n0:0 755 directory\n0:0 644 regular file\n");
  // On the host, that is the jail's mapped root.
  struct stat st;
  ASSERT_EQ(::stat(ws_.HostPath("p/q/r.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, MappedIds().uid.outside);
  EXPECT_EQ(st.st_gid, MappedIds().gid.outside);
  // An empty file is a file.
  ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/empty", "")));
  EXPECT_EQ(Sh("stat -c '%s %a' empty"), "0 644\n");
  // No temp file is left beside the targets.
  auto list = client().Readdir("/workspace/p/q", false);
  ASSERT_TRUE(Succeeds(list));
  EXPECT_EQ(NamesOf(list.value()), std::vector<std::string>{"r.txt"});
}

TEST_F(InitFilesTest, WriteFileReplacesKeepingTheModeAndFollowsSymlinks) {
  Sh("printf old > f && chmod 0751 f && printf t > target && ln -s target link && "
     "ln -s created-by-link dangling && mkdir sub && ln -s sub/inner.txt into-sub");
  ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/f", "new content")));
  EXPECT_EQ(Sh("cat f; echo; stat -c '%a %u:%g' f"), "new content\n751 0:0\n");
  // A symlink at the path is followed: the target changes, the link stays a link.
  ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/link", "via link")));
  EXPECT_EQ(Sh("cat target; echo; stat -c %F link; readlink link"),
            "via link\nsymbolic link\ntarget\n");
  // A dangling one names the file to create (Node's open(O_CREAT)).
  ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/dangling", "made")));
  EXPECT_EQ(Sh("cat created-by-link; echo; stat -c %F dangling"), "made\nsymbolic link\n");
  ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/into-sub", "inner")));
  EXPECT_EQ(Sh("cat sub/inner.txt"), "inner");
  // Replaced, not rewritten in place: a hard link to the old file keeps the old bytes.
  Sh("printf before > h && ln h h-old");
  ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/h", "after")));
  EXPECT_EQ(Sh("cat h; echo; cat h-old"), "after\nbefore");
}

TEST_F(InitFilesTest, WriteFileErrors) {
  Sh("mkdir -p dir/sub && touch file && mkfifo fifo");
  EXPECT_TRUE(FailsWith(client().WriteFile("/workspace/dir", "x"), EISDIR,
                        "EISDIR: illegal operation on a directory, open '/workspace/dir'"));
  EXPECT_TRUE(FailsWith(client().WriteFile("/workspace", "x"), EISDIR));
  EXPECT_TRUE(FailsWith(client().WriteFile("/", "x"), EISDIR));
  EXPECT_TRUE(FailsWith(client().WriteFile("/workspace/file/x", "x"), ENOTDIR));
  auto r = Within<fs::FsOutcome<fs::Unit>>(
      milliseconds(1000), [this] { return client().WriteFile("/workspace/fifo", "x"); });
  ASSERT_TRUE(r.has_value()) << "writeFile of a FIFO did not answer within 1 s";
  EXPECT_TRUE(FailsWith(*r, EINVAL));
  // Nothing was changed or left behind by the failures.
  EXPECT_EQ(Sh("ls -A dir; stat -c %F dir fifo file"),
            "sub\ndirectory\nfifo\nregular empty file\n");
  EXPECT_EQ(Sh("ls -A . dir | grep '[.]nsbox-' || true"), "");
}

// ---- stat ----------------------------------------------------------------------------------

TEST_F(InitFilesTest, StatDescribesTargetsAndLinks) {
  Sh("printf 12345 > f && mkdir d && ln -s f lf && ln -s d ld && ln -s nowhere dangling && "
     "mkfifo fifo && touch -d @1600000000.123456789 old");
  auto f = client().Stat("/workspace/f");
  ASSERT_TRUE(Succeeds(f));
  EXPECT_TRUE(f.value().is_file);
  EXPECT_FALSE(f.value().is_directory);
  EXPECT_FALSE(f.value().is_symbolic_link);
  EXPECT_EQ(f.value().size, 5u);

  auto d = client().Stat("/workspace/d");
  ASSERT_TRUE(Succeeds(d));
  EXPECT_FALSE(d.value().is_file);
  EXPECT_TRUE(d.value().is_directory);
  EXPECT_FALSE(d.value().is_symbolic_link);

  // isFile/isDirectory/size of the target, isSymbolicLink of the path itself.
  auto lf = client().Stat("/workspace/lf");
  ASSERT_TRUE(Succeeds(lf));
  EXPECT_TRUE(lf.value().is_file);
  EXPECT_TRUE(lf.value().is_symbolic_link);
  EXPECT_EQ(lf.value().size, 5u);
  auto ld = client().Stat("/workspace/ld");
  ASSERT_TRUE(Succeeds(ld));
  EXPECT_TRUE(ld.value().is_directory);
  EXPECT_TRUE(ld.value().is_symbolic_link);

  auto fifo = client().Stat("/workspace/fifo");
  ASSERT_TRUE(Succeeds(fifo));
  EXPECT_FALSE(fifo.value().is_file);
  EXPECT_FALSE(fifo.value().is_directory);
  EXPECT_FALSE(fifo.value().is_symbolic_link);

  EXPECT_TRUE(FailsWith(client().Stat("/workspace/dangling"), ENOENT,
                        "ENOENT: no such file or directory, stat '/workspace/dangling'"));
  EXPECT_TRUE(FailsWith(client().Stat("/workspace/missing"), ENOENT,
                        "ENOENT: no such file or directory, stat '/workspace/missing'"));
  EXPECT_TRUE(FailsWith(client().Stat("/workspace/f/x"), ENOTDIR));

  // mtimeMs: Node's sec * 1e3 + nsec / 1e6.
  auto old = client().Stat("/workspace/old");
  ASSERT_TRUE(Succeeds(old));
  EXPECT_NEAR(old.value().mtime_ms, 1600000000123.456789, 0.001);
}

TEST_F(InitFilesTest, StatMtimeMatchesWhatACommandSees) {
  ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/w", "written")));
  auto st = client().Stat("/workspace/w");
  ASSERT_TRUE(Succeeds(st));
  EXPECT_EQ(st.value().size, 7u);
  std::string secs = Sh("stat -c %Y w");
  std::string nanos = Sh("date -r w +%s%N");
  EXPECT_EQ(static_cast<long long>(st.value().mtime_ms / 1000), std::stoll(secs));
  EXPECT_NEAR(st.value().mtime_ms, static_cast<double>(std::stoll(nanos)) / 1e6, 0.001);
  // And close to now: the jail's clock is the host's.
  double now_ms = static_cast<double>(
      std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  EXPECT_NEAR(st.value().mtime_ms, now_ms, 10000.0);
}

// ---- readdir -------------------------------------------------------------------------------

TEST_F(InitFilesTest, ReaddirSortsByBytesWithoutDotEntries) {
  Sh("mkdir s && cd s && touch b a B _ a.txt Z bad && mkdir sub && "
     "printf x > \"$(printf '\\303\\251')\" && printf x > \"$(printf '\\200')\" && "
     "printf x > \"$(printf 'bad\\377name')\"");
  auto r = client().Readdir("/workspace/s", false);
  ASSERT_TRUE(Succeeds(r));
  std::vector<std::string> expected = {"B",
                                       "Z",
                                       "_",
                                       "a",
                                       "a.txt",
                                       "b",
                                       "bad",
                                       "bad\xff"
                                       "name",
                                       "sub",
                                       "\x80",
                                       "\xc3\xa9"};
  EXPECT_EQ(NamesOf(r.value()), expected);
  auto empty = client().Readdir("/workspace/s/sub", false);
  ASSERT_TRUE(Succeeds(empty));
  EXPECT_TRUE(empty.value().entries.empty());
  // Through a symlink to a directory: the directory's entries.
  Sh("ln -s s ls");
  auto via = client().Readdir("/workspace/ls", true);
  ASSERT_TRUE(Succeeds(via));
  EXPECT_EQ(NamesOf(via.value()), expected);
}

TEST_F(InitFilesTest, ReaddirWithTypes) {
  Sh("mkdir t && cd t && touch file && mkdir dir && ln -s file link-to-file && "
     "ln -s dir link-to-dir && ln -s nowhere dangling && mkfifo fifo && "
     "perl -MSocket -e 'socket(my $s, AF_UNIX, SOCK_STREAM, 0) or die; "
     "bind($s, pack_sockaddr_un(\"sock\")) or die'");
  auto r = client().Readdir("/workspace/t", true);
  ASSERT_TRUE(Succeeds(r));
  std::vector<std::pair<std::string, EntryType>> got;
  for (const auto& e : r.value().entries) got.emplace_back(e.name, EntryType(e.type));
  std::vector<std::pair<std::string, EntryType>> expected = {
      {"dangling", EntryType::kSymlink},    {"dir", EntryType::kDirectory},
      {"fifo", EntryType::kOther},          {"file", EntryType::kFile},
      {"link-to-dir", EntryType::kSymlink}, {"link-to-file", EntryType::kSymlink},
      {"sock", EntryType::kOther},
  };
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, expected[i].first);
    EXPECT_EQ(static_cast<int>(got[i].second), static_cast<int>(expected[i].second))
        << got[i].first;
  }
}

TEST_F(InitFilesTest, ReaddirErrors) {
  Sh("touch f && ln -s f lf && ln -s nowhere dangling");
  EXPECT_TRUE(FailsWith(client().Readdir("/workspace/f", false), ENOTDIR,
                        "ENOTDIR: not a directory, scandir '/workspace/f'"));
  EXPECT_TRUE(FailsWith(client().Readdir("/workspace/lf", true), ENOTDIR));
  EXPECT_TRUE(FailsWith(client().Readdir("/workspace/missing", false), ENOENT,
                        "ENOENT: no such file or directory, scandir '/workspace/missing'"));
  EXPECT_TRUE(FailsWith(client().Readdir("/workspace/dangling", false), ENOENT));
}

TEST_F(InitFilesTest, NamesThatAreNotUtf8WorkWithEveryVerb) {
  const std::string name =
      "bad\xff\xfe"
      "name";
  const std::string path = "/workspace/" + name;
  Sh("printf 'raw bytes' > \"$(printf 'bad\\377\\376name')\"");
  auto list = client().Readdir("/workspace", true);
  ASSERT_TRUE(Succeeds(list));
  bool found = false;
  for (const auto& e : list.value().entries) found |= e.name == name;
  EXPECT_TRUE(found) << "readdir lacks the exact bytes of the name";
  auto read = client().ReadFile(path);
  ASSERT_TRUE(Succeeds(read));
  EXPECT_EQ(read.value(), "raw bytes");
  auto st = client().Stat(path);
  ASSERT_TRUE(Succeeds(st));
  EXPECT_EQ(st.value().size, 9u);
  EXPECT_TRUE(client().Exists(path).value());
  ASSERT_TRUE(Succeeds(client().WriteFile(path, "rewritten")));
  EXPECT_EQ(Sh("cat \"$(printf 'bad\\377\\376name')\""), "rewritten");
  ASSERT_TRUE(Succeeds(client().Mkdir("/workspace/dir\xff", false)));
  EXPECT_EQ(Sh("stat -c %F \"$(printf 'dir\\377')\""), "directory\n");
  ASSERT_TRUE(Succeeds(client().Rm(path, false, false)));
  ASSERT_TRUE(Succeeds(client().Rm("/workspace/dir\xff", true, false)));
  EXPECT_EQ(Sh("ls -A | grep -v nsbox-probe || true"), "");
}

// ---- exists --------------------------------------------------------------------------------

TEST_F(InitFilesTest, ExistsIsNeverAnError) {
  Sh("touch f && mkdir d && ln -s f lf && ln -s d ld && ln -s nowhere dangling && "
     "ln -s loop1 loop2 && ln -s loop2 loop1 && mkfifo fifo");
  for (std::string path : {"/workspace/f", "/workspace/d", "/workspace/lf", "/workspace/ld",
                           "/workspace/fifo", "/workspace", "/", "/dev/null"}) {
    auto r = client().Exists(path);
    ASSERT_TRUE(Succeeds(r)) << path;
    EXPECT_TRUE(r.value()) << path;
  }
  for (std::string path : {"/workspace/missing", "/workspace/dangling", "/workspace/f/x",
                           "/workspace/loop1", "/workspace/missing/x"}) {
    auto r = client().Exists(path);
    ASSERT_TRUE(Succeeds(r)) << path;
    EXPECT_FALSE(r.value()) << path;
  }
}

// ---- mkdir ---------------------------------------------------------------------------------

TEST_F(InitFilesTest, MkdirWithoutRecursive) {
  Sh("touch file && mkdir existing && ln -s nowhere dangling && ln -s existing link-to-dir");
  ASSERT_TRUE(Succeeds(client().Mkdir("/workspace/new", false)));
  EXPECT_EQ(Sh("stat -c '%F %a %u:%g' new"), "directory 755 0:0\n");
  EXPECT_TRUE(FailsWith(client().Mkdir("/workspace/existing", false), EEXIST,
                        "EEXIST: file already exists, mkdir '/workspace/existing'"));
  EXPECT_TRUE(FailsWith(client().Mkdir("/workspace/file", false), EEXIST));
  EXPECT_TRUE(FailsWith(client().Mkdir("/workspace/dangling", false), EEXIST));
  EXPECT_TRUE(FailsWith(client().Mkdir("/workspace/link-to-dir", false), EEXIST));
  EXPECT_TRUE(FailsWith(client().Mkdir("/workspace/no/sub", false), ENOENT,
                        "ENOENT: no such file or directory, mkdir '/workspace/no/sub'"));
  EXPECT_TRUE(FailsWith(client().Mkdir("/workspace/file/sub", false), ENOTDIR,
                        "ENOTDIR: not a directory, mkdir '/workspace/file/sub'"));
  EXPECT_TRUE(FailsWith(client().Mkdir("/", false), EEXIST));
  // Through a symlink to a directory on the way.
  ASSERT_TRUE(Succeeds(client().Mkdir("/workspace/link-to-dir/inner", false)));
  EXPECT_EQ(Sh("stat -c %F existing/inner"), "directory\n");
  EXPECT_EQ(Sh("stat -c %F dangling"), "symbolic link\n");
}

TEST_F(InitFilesTest, MkdirRecursive) {
  Sh("touch file && mkdir existing && ln -s nowhere dangling && ln -s existing link-to-dir");
  ASSERT_TRUE(Succeeds(client().Mkdir("/workspace/a/b/c", true)));
  EXPECT_EQ(Sh("stat -c '%F %a %u:%g' a a/b a/b/c"),
            "directory 755 0:0\ndirectory 755 0:0\ndirectory 755 0:0\n");
  // Existing directories are fine, also through a symlink, also "/".
  EXPECT_TRUE(Succeeds(client().Mkdir("/workspace/a/b/c", true)));
  EXPECT_TRUE(Succeeds(client().Mkdir("/workspace/existing", true)));
  EXPECT_TRUE(Succeeds(client().Mkdir("/workspace/link-to-dir", true)));
  EXPECT_TRUE(Succeeds(client().Mkdir("/", true)));
  ASSERT_TRUE(Succeeds(client().Mkdir("/workspace/link-to-dir/x/y", true)));
  EXPECT_EQ(Sh("stat -c %F existing/x/y"), "directory\n");
  // An existing file at the path: EEXIST; a dangling symlink: ENOENT; a file on the way:
  // ENOTDIR.
  EXPECT_TRUE(FailsWith(client().Mkdir("/workspace/file", true), EEXIST,
                        "EEXIST: file already exists, mkdir '/workspace/file'"));
  auto dangling = client().Mkdir("/workspace/dangling", true);
  EXPECT_TRUE(FailsWith(dangling, ENOENT));
  if (!dangling.ok()) {
    EXPECT_EQ(dangling.error().syscall, "mkdir");
  }
  EXPECT_TRUE(FailsWith(client().Mkdir("/workspace/file/x/y", true), ENOTDIR));
  EXPECT_TRUE(FailsWith(client().Mkdir("/workspace/file/x", true), ENOTDIR));
  EXPECT_EQ(Sh("stat -c %F file dangling"), "regular empty file\nsymbolic link\n");
}

// ---- rm ------------------------------------------------------------------------------------

TEST_F(InitFilesTest, RmFilesLinksAndMissingPaths) {
  Sh("touch f && mkdir d && touch d/inside && ln -s d link-to-dir && ln -s nowhere dangling && "
     "mkfifo fifo");
  ASSERT_TRUE(Succeeds(client().Rm("/workspace/f", false, false)));
  EXPECT_FALSE(client().Exists("/workspace/f").value());
  // A symlink is removed, never its target, even one to a directory, even without recursive.
  ASSERT_TRUE(Succeeds(client().Rm("/workspace/link-to-dir", false, false)));
  ASSERT_TRUE(Succeeds(client().Rm("/workspace/dangling", false, false)));
  ASSERT_TRUE(Succeeds(client().Rm("/workspace/fifo", false, false)));
  EXPECT_EQ(Sh("ls -A d; ls -A | grep -v nsbox-probe"), "inside\nd\n");
  // Missing: ENOENT from Node's lstat, unless force.
  EXPECT_TRUE(FailsWith(client().Rm("/workspace/missing", false, false), ENOENT,
                        "ENOENT: no such file or directory, lstat '/workspace/missing'"));
  EXPECT_TRUE(FailsWith(client().Rm("/workspace/missing", true, false), ENOENT));
  EXPECT_TRUE(Succeeds(client().Rm("/workspace/missing", false, true)));
  EXPECT_TRUE(Succeeds(client().Rm("/workspace/missing/deeper", true, true)));
  // A file on the way is ENOTDIR, which force does not forgive.
  Sh("touch g");
  EXPECT_TRUE(FailsWith(client().Rm("/workspace/g/x", false, false), ENOTDIR));
  EXPECT_TRUE(FailsWith(client().Rm("/workspace/g/x", true, true), ENOTDIR));
}

TEST_F(InitFilesTest, RmDirectories) {
  Sh("mkdir -p d/a/b && touch d/a/b/f d/top && mkdir empty");
  // Node's ERR_FS_EISDIR, with or without force.
  auto r = client().Rm("/workspace/d", false, false);
  ASSERT_TRUE(FailsWith(r, EISDIR,
                        "Path is a directory: rm returned EISDIR (is a directory) /workspace/d"));
  EXPECT_TRUE(r.error().node_err_fs_eisdir);
  EXPECT_EQ(r.error().syscall, "rm");
  auto forced = client().Rm("/workspace/empty", false, true);
  ASSERT_TRUE(FailsWith(forced, EISDIR));
  EXPECT_TRUE(forced.error().node_err_fs_eisdir);
  EXPECT_EQ(Sh("find d empty | sort"), "d\nd/a\nd/a/b\nd/a/b/f\nd/top\nempty\n");
  ASSERT_TRUE(Succeeds(client().Rm("/workspace/d", true, false)));
  ASSERT_TRUE(Succeeds(client().Rm("/workspace/empty", true, true)));
  EXPECT_EQ(Sh("ls -A | grep -v nsbox-probe || true"), "");
  // The jail's root: refused before anything is removed.
  auto root = client().Rm("/", true, true);
  EXPECT_FALSE(root.ok());
  EXPECT_EQ(Sh("cat /etc/hostname; test -x /workspace/nsbox-probe && echo probe"), "box\nprobe\n");
}

TEST_F(InitFilesTest, RmRecursiveNeverFollowsSymlinksInsideTheTree) {
  Sh("mkdir -p keep/sub && printf precious > keep/sub/file && printf precious > keep/file && "
     "mkdir -p tree/a/b && touch tree/a/b/f && "
     "ln -s /workspace/keep tree/abs-to-keep && ln -s ../../../keep tree/a/b/rel-to-keep && "
     "ln -s / tree/a/to-root && ln -s ../.. tree/a/b/up && ln -s /etc tree/to-etc && "
     "ln -s /workspace/keep/file tree/a/to-file && ln -s keep link-at-top");
  ASSERT_TRUE(Succeeds(client().Rm("/workspace/tree", true, false)));
  EXPECT_FALSE(client().Exists("/workspace/tree").value());
  EXPECT_EQ(Sh("cat keep/file keep/sub/file; echo; cat /etc/hostname; "
               "test -x /workspace/nsbox-probe && echo probe"),
            "preciousprecious\nbox\nprobe\n");
  // A link at the top of an rm is itself removed, its target kept, with recursive too.
  ASSERT_TRUE(Succeeds(client().Rm("/workspace/link-at-top", true, false)));
  EXPECT_EQ(Sh("cat keep/file; test -e link-at-top || echo gone"),
            "precious"
            "gone\n");
}

// ---- files and commands see the same tree --------------------------------------------------

TEST_F(InitFilesTest, VerbsAndCommandsShareTheTreeAndOwnership) {
  ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/by-verb", "verb")));
  ASSERT_TRUE(Succeeds(client().Mkdir("/workspace/dir-by-verb", false)));
  ASSERT_TRUE(Succeeds(client().WriteFile("/root/in-home", "home")));
  ASSERT_TRUE(Succeeds(client().WriteFile("/tmp/in-tmp", "tmp")));
  EXPECT_EQ(Sh("stat -c '%u:%g' by-verb dir-by-verb /root/in-home /tmp/in-tmp; "
               "cat by-verb /root/in-home /tmp/in-tmp"),
            "0:0\n0:0\n0:0\n0:0\nverbhometmp");
  Sh("printf cmd > by-cmd && mkdir dir-by-cmd && printf h > /root/h && printf t > /tmp/t");
  auto a = client().ReadFile("/workspace/by-cmd");
  ASSERT_TRUE(Succeeds(a));
  EXPECT_EQ(a.value(), "cmd");
  EXPECT_TRUE(client().Stat("/workspace/dir-by-cmd").value().is_directory);
  EXPECT_EQ(client().ReadFile("/root/h").value(), "h");
  EXPECT_EQ(client().ReadFile("/tmp/t").value(), "t");
  // A command appends to what the verb wrote; the verb reads the result.
  Sh("printf ' more' >> by-verb");
  EXPECT_EQ(client().ReadFile("/workspace/by-verb").value(), "verb more");
}

}  // namespace
}  // namespace nsbox::itest
