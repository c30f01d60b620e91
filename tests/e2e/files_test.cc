// api.md's file endpoints: the raw GET/PUT of bytes and the fs/ verbs (stat, readdir, exists,
// mkdir, rm) with Node's semantics and errno codes, relative paths, and paths that cannot leave
// the jail however they are spelled.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

using std::chrono::milliseconds;

// A file-system error: status, errno code, a message that names the errno and the path (Node's
// wording: "ENOENT: no such file or directory, open '/workspace/a.txt'", or for rm of a
// directory ERR_FS_EISDIR's "Path is a directory: rm returned EISDIR ..."); error.path (when
// given) the absolute path.
void ExpectFsError(const Response& r, int status, std::string_view code, std::string_view abs,
                   std::string_view what) {
  EXPECT_EQ(r.status, status) << what << ": " << r.Describe();
  EXPECT_EQ(r.ErrorCode(), code) << what << ": " << r.Describe();
  const std::string msg = r.ErrorMessage();
  EXPECT_NE(msg.find(code), std::string::npos)
      << what << ": the message should name the errno: " << r.Describe();
  if (!abs.empty()) {
    EXPECT_NE(msg.find(abs), std::string::npos)
        << what << ": message should name " << abs << ": " << r.Describe();
    json::object e = Obj(r)["error"].is_object() ? Obj(r)["error"].as_object() : json::object{};
    if (e.contains("path")) {
      EXPECT_EQ(Str(e, "path"), abs) << what << ": " << r.Describe();
    }
  }
}

std::vector<std::string> Names(const Response& r) {
  std::vector<std::string> out;
  json::object o = Obj(r);
  if (!o.contains("entries") || !o.at("entries").is_array()) return {"<no entries>"};
  for (const auto& v : o.at("entries").as_array()) {
    out.push_back(v.is_string()   ? std::string(v.as_string())
                  : v.is_object() ? Str(v.as_object(), "name")
                                  : "<bad>");
  }
  return out;
}

class FilesTest : public E2eSandboxTest {
 protected:
  Response Stat(const std::string& p) { return Fs(id_, "stat", json::object{{"path", p}}); }
  bool Exists(const std::string& p) {
    Response r = Fs(id_, "exists", json::object{{"path", p}});
    EXPECT_EQ(r.status, 200) << p << ": " << r.Describe();
    json::value v = Obj(r)["exists"];
    EXPECT_TRUE(v.is_bool()) << r.Describe();
    return v.is_bool() && v.as_bool();
  }
  // The host path of a file of this sandbox's workspace.
  std::string HostWorkspace() { return daemon().SandboxDir(id_) + "/workspace"; }
};

// ---- raw files ----

TEST_F(FilesTest, RoundTripBinaryEmptyAndLarge) {
  std::string all;
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  }
  ASSERT_EQ(PutFile(id_, "/workspace/bin.dat", all).status, 204);
  Response g = GetFile(id_, "/workspace/bin.dat");
  ASSERT_EQ(g.status, 200) << g.Describe();
  EXPECT_EQ(g.Header("content-type"), "application/octet-stream");
  EXPECT_EQ(g.body, all);
  EXPECT_EQ(ReadHostFile(HostWorkspace() + "/bin.dat"), all) << "not in the workspace on disk";
  EXPECT_EQ(Sh(id_, "wc -c < /workspace/bin.dat"), "1024\n");

  Response empty = PutFile(id_, "/workspace/empty", "");
  ASSERT_EQ(empty.status, 204) << empty.Describe();
  Response ge = GetFile(id_, "/workspace/empty");
  EXPECT_EQ(ge.status, 200) << ge.Describe();
  EXPECT_EQ(ge.body, "");
  EXPECT_EQ(Obj(Stat("/workspace/empty"))["size"], json::value(0));

  std::string big(10 * 1000 * 1000, '\0');
  std::mt19937 rng(42);
  for (auto& c : big) c = static_cast<char>(rng());
  Response pb = PutFile(id_, "/workspace/big", big);
  ASSERT_EQ(pb.status, 204) << pb.Describe();
  Response gb = GetFile(id_, "/workspace/big");
  ASSERT_EQ(gb.status, 200);
  EXPECT_EQ(gb.body.size(), big.size());
  EXPECT_TRUE(gb.body == big) << "10 MB came back different";
  EXPECT_EQ(Sh(id_, "wc -c < /workspace/big"), "10000000\n");
  // Replacing shrinks it.
  ASSERT_EQ(PutFile(id_, "/workspace/big", "small").status, 204);
  EXPECT_EQ(GetFile(id_, "/workspace/big").body, "small");
}

TEST_F(FilesTest, PutCreatesParentsAndKeepsOrSetsMode) {
  ASSERT_EQ(PutFile(id_, "/workspace/a/b/c/d.txt", "deep").status, 204);
  EXPECT_EQ(Sh(id_, "cat a/b/c/d.txt; stat -c '%a %u' a/b/c/d.txt a/b"), "deep644 0\n755 0\n");
  Sh(id_, "printf old > x.sh; chmod 0751 x.sh");
  ASSERT_EQ(PutFile(id_, "x.sh", "new").status, 204);
  EXPECT_EQ(Sh(id_, "cat x.sh; stat -c ' %a' x.sh"), "new 751\n");
  // ?mode= sets the permission bits (octal), on a new file and over an existing one's.
  auto put_mode = [&](const std::string& path, const std::string& mode, const std::string& bytes) {
    return client().Request("PUT", SbPath(id_, "/files?path=" + path + "&mode=" + mode), bytes);
  };
  ASSERT_EQ(put_mode("run.sh", "755", "#!/bin/sh\necho ran\n").status, 204);
  EXPECT_EQ(Sh(id_, "./run.sh; stat -c %a run.sh"), "ran\n755\n");
  ASSERT_EQ(put_mode("x.sh", "0600", "newer").status, 204);
  EXPECT_EQ(Sh(id_, "cat x.sh; stat -c ' %a' x.sh"), "newer 600\n");
  ASSERT_EQ(put_mode("s", "4750", "").status, 204);
  EXPECT_EQ(Sh(id_, "stat -c %a s"), "4750\n");
  for (const std::string bad : {"9", "10000", "rwx", "", "-1", "0x1ed"}) {
    Response r = put_mode("x.sh", bad, "never");
    EXPECT_EQ(r.status, 400) << "mode=" << bad << ": " << r.Describe();
    EXPECT_EQ(r.ErrorCode(), "invalid_request") << "mode=" << bad;
  }
  EXPECT_EQ(Sh(id_, "cat x.sh; stat -c ' %a' x.sh"), "newer 600\n");
  // /root too.
  ASSERT_EQ(PutFile(id_, "/root/.config/app.json", "{}").status, 204);
  EXPECT_EQ(Sh(id_, "cat ~/.config/app.json"), "{}");
  EXPECT_EQ(ReadHostFile(daemon().SandboxDir(id_) + "/home/.config/app.json"), "{}");
}

TEST_F(FilesTest, PutFollowsSymlinks) {
  Sh(id_,
     "printf target > target.txt; ln -s target.txt link; ln -s new.txt dangling; mkdir d; "
     "ln -s d dirlink");
  ASSERT_EQ(PutFile(id_, "/workspace/link", "through").status, 204);
  EXPECT_EQ(Sh(id_, "cat target.txt; test -L link && echo ' still a link'"),
            "through still a link\n");
  ASSERT_EQ(PutFile(id_, "/workspace/dangling", "created").status, 204);
  EXPECT_EQ(Sh(id_, "cat new.txt; test -L dangling && echo ' still a link'"),
            "created still a link\n");
  ASSERT_EQ(PutFile(id_, "/workspace/dirlink/in.txt", "in").status, 204);
  EXPECT_EQ(Sh(id_, "cat d/in.txt"), "in");
  Response st = Stat("/workspace/link");
  EXPECT_EQ(Field(Obj(st), "isSymbolicLink"), json::value(true)) << st.Describe();
}

TEST_F(FilesTest, ErrorStatusesAndCodes) {
  Sh(id_, "mkdir dir; printf x > file; mkfifo fifo; ln -s /dev/null devlink; ln -s nowhere dangle");
  ExpectFsError(GetFile(id_, "/workspace/missing.txt"), 404, "ENOENT", "/workspace/missing.txt",
                "GET missing");
  ExpectFsError(GetFile(id_, "missing.txt"), 404, "ENOENT", "/workspace/missing.txt",
                "GET relative missing");
  ExpectFsError(GetFile(id_, "/workspace/dir"), 400, "EISDIR", "", "GET dir");
  ExpectFsError(PutFile(id_, "/workspace/dir", "x"), 400, "EISDIR", "", "PUT dir");
  ExpectFsError(GetFile(id_, "/workspace/dangle"), 404, "ENOENT", "", "GET dangling");
  ExpectFsError(GetFile(id_, "/workspace/file/sub"), 400, "ENOTDIR", "", "GET through a file");
  ExpectFsError(PutFile(id_, "/workspace/file/sub", "x"), 400, "ENOTDIR", "", "PUT through file");
  // Not regular files: answered at once, never a hang.
  const auto t0 = std::chrono::steady_clock::now();
  ExpectFsError(GetFile(id_, "/workspace/fifo"), 400, "EINVAL", "", "GET fifo");
  ExpectFsError(GetFile(id_, "/dev/null"), 400, "EINVAL", "", "GET device");
  ExpectFsError(GetFile(id_, "/workspace/devlink"), 400, "EINVAL", "", "GET link to device");
  ExpectFsError(GetFile(id_, "/dev/zero"), 400, "EINVAL", "", "GET /dev/zero");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(5000));
  // A file name over NAME_MAX.
  ExpectFsError(GetFile(id_, "/workspace/" + std::string(300, 'n')), 400, "ENAMETOOLONG", "",
                "GET long name");
  ExpectFsError(Stat("/workspace/" + std::string(300, 'n')), 400, "ENAMETOOLONG", "",
                "stat long name");
  // Paths over PATH_MAX, also longer than a frame to nsbox-init carries (64 KiB): ENAMETOOLONG
  // from every verb, never a malformed request.
  for (size_t n : {size_t{5000}, size_t{70000}}) {
    const std::string long_path = "/workspace/" + std::string(n, 'n');
    const std::string what = "a path of " + std::to_string(n) + " bytes: ";
    if (n < 60000) {  // the raw endpoints' URL holds at most 64 KiB of target
      ExpectFsError(GetFile(id_, long_path), 400, "ENAMETOOLONG", "", what + "GET");
      ExpectFsError(PutFile(id_, long_path, "x"), 400, "ENAMETOOLONG", "", what + "PUT");
    }
    ExpectFsError(Stat(long_path), 400, "ENAMETOOLONG", "", what + "stat");
    // Each names the syscall Node's verb would fail in (rm looks at the path first: lstat).
    for (const auto& [verb, syscall] :
         {std::pair{"readdir", "scandir"}, std::pair{"mkdir", "mkdir"}, std::pair{"rm", "lstat"}}) {
      Response r = Fs(id_, verb, json::object{{"path", long_path}});
      ExpectFsError(r, 400, "ENAMETOOLONG", "", what + verb);
      EXPECT_EQ(Str(Field(Obj(r), "error").as_object(), "syscall"), syscall) << r.Describe();
    }
    EXPECT_FALSE(Exists(long_path)) << what;
  }
  // An empty path: Node's ENOENT, named by each verb's syscall; rm with force succeeds.
  const std::pair<const char*, const char*> empty_cases[] = {
      {"stat", "stat ''"}, {"readdir", "scandir ''"}, {"mkdir", "mkdir ''"}, {"rm", "lstat ''"}};
  for (const auto& [verb, named] : empty_cases) {
    Response r = Fs(id_, verb, json::object{{"path", ""}});
    ExpectFsError(r, 404, "ENOENT", "", std::string("empty path: ") + verb);
    EXPECT_NE(r.ErrorMessage().find(named), std::string::npos) << r.Describe();
  }
  EXPECT_EQ(Fs(id_, "rm", json::object{{"path", ""}, {"force", true}}).status, 204);
  EXPECT_FALSE(Exists(""));
  // A symlink loop.
  Sh(id_, "ln -s loop1 loop2; ln -s loop2 loop1");
  ExpectFsError(GetFile(id_, "/workspace/loop1"), 400, "ELOOP", "", "GET loop");
  ExpectFsError(Stat("/workspace/loop1"), 400, "ELOOP", "", "stat loop");
  // The path query parameter is required.
  Response nopath = client().Get(SbPath(id_, "/files"));
  EXPECT_EQ(nopath.status, 400) << nopath.Describe();
  EXPECT_EQ(nopath.ErrorCode(), "invalid_request");
  ExpectDaemonHealthy();
}

// Where a file exists but the file API will not use it, the error says why: a model reads it.
TEST_F(FilesTest, ErrorsSayWhyAnExistingFileCannotBeUsed) {
  Sh(id_, "mkfifo fifo");
  Response fifo = GetFile(id_, "fifo");
  ExpectFsError(fifo, 400, "EINVAL", "/workspace/fifo", "GET a FIFO");
  EXPECT_NE(fifo.ErrorMessage().find("a FIFO: the file API reads and writes regular files only"),
            std::string::npos)
      << fifo.Describe();
  Response dev = PutFile(id_, "/dev/null", "x");
  ExpectFsError(dev, 400, "EINVAL", "/dev/null", "PUT a device");
  EXPECT_NE(dev.ErrorMessage().find("a character device"), std::string::npos) << dev.Describe();
  // A file of /proc is there (stat says so), but no new file can be made beside it to replace it
  // with: EPERM, not the ENOENT of the temporary file's open.
  ASSERT_EQ(Stat("/proc/uptime").status, 200);
  Response proc = PutFile(id_, "/proc/uptime", "x");
  ExpectFsError(proc, 403, "EPERM", "/proc/uptime", "PUT a /proc file");
  EXPECT_NE(proc.ErrorMessage().find("cannot write into this one"), std::string::npos)
      << proc.Describe();
  ExpectDaemonHealthy();
}

// ---- fs verbs ----

TEST_F(FilesTest, StatDescribesTargetAndLink) {
  Sh(id_,
     "printf 12345 > f; mkdir d; ln -s f lf; ln -s d ld; ln -s nowhere dangle; touch -d "
     "'2020-01-02 03:04:05.678 UTC' old");
  Response f = Stat("/workspace/f");
  ASSERT_EQ(f.status, 200) << f.Describe();
  json::object o = Obj(f);
  EXPECT_EQ(Field(o, "isFile"), json::value(true));
  EXPECT_EQ(Field(o, "isDirectory"), json::value(false));
  EXPECT_EQ(Field(o, "isSymbolicLink"), json::value(false));
  EXPECT_EQ(Field(o, "size"), json::value(5));
  ASSERT_TRUE(o.contains("mtimeMs") && o.at("mtimeMs").is_number()) << f.Describe();
  const double now_ms =
      std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  EXPECT_NEAR(o.at("mtimeMs").to_number<double>(), now_ms, 60000.0);

  json::object old = Obj(Stat("old"));
  EXPECT_NEAR(Field(old, "mtimeMs").to_number<double>(), 1577934245678.0, 1.0)
      << json::serialize(old);

  json::object d = Obj(Stat("/workspace/d"));
  EXPECT_EQ(Field(d, "isDirectory"), json::value(true));
  EXPECT_EQ(Field(d, "isFile"), json::value(false));

  json::object lf = Obj(Stat("/workspace/lf"));
  EXPECT_EQ(Field(lf, "isFile"), json::value(true)) << json::serialize(lf);
  EXPECT_EQ(Field(lf, "isSymbolicLink"), json::value(true));
  EXPECT_EQ(Field(lf, "size"), json::value(5));
  json::object ld = Obj(Stat("ld"));
  EXPECT_EQ(Field(ld, "isDirectory"), json::value(true));
  EXPECT_EQ(Field(ld, "isSymbolicLink"), json::value(true));

  // Node's Stats.mode: the target's type and permission bits.
  EXPECT_EQ(Field(o, "mode"), json::value(S_IFREG | 0644)) << f.Describe();
  EXPECT_EQ(Field(d, "mode"), json::value(S_IFDIR | 0755)) << json::serialize(d);
  EXPECT_EQ(Field(lf, "mode"), json::value(S_IFREG | 0644)) << json::serialize(lf);

  ExpectFsError(Stat("/workspace/dangle"), 404, "ENOENT", "/workspace/dangle", "dangling");
  ExpectFsError(Stat("/workspace/missing"), 404, "ENOENT", "/workspace/missing", "missing");
  ExpectFsError(Stat("/workspace/f/x"), 400, "ENOTDIR", "", "through a file");
}

TEST_F(FilesTest, ReaddirSortedWithTypes) {
  Sh(id_, "mkdir -p top/dir; cd top; touch b a B _ z.txt .hidden; ln -s a link; mkfifo pipe");
  Response r = Fs(id_, "readdir", json::object{{"path", "/workspace/top"}});
  ASSERT_EQ(r.status, 200) << r.Describe();
  const std::vector<std::string> sorted = {".hidden", "B",    "_",    "a",    "b",
                                           "dir",     "link", "pipe", "z.txt"};
  EXPECT_EQ(Names(r), sorted);
  for (const auto& v : Arr(r, "entries")) EXPECT_TRUE(v.is_string());

  Response t = Fs(id_, "readdir", json::object{{"path", "top"}, {"withTypes", true}});
  ASSERT_EQ(t.status, 200) << t.Describe();
  EXPECT_EQ(Names(t), sorted);
  std::map<std::string, std::string> types;
  for (const auto& v : Arr(t, "entries")) {
    ASSERT_TRUE(v.is_object()) << t.Describe();
    types[Str(v.as_object(), "name")] = Str(v.as_object(), "type");
    EXPECT_FALSE(v.as_object().contains("nameBase64")) << "only for names that are not UTF-8";
  }
  EXPECT_EQ(types["a"], "file");
  EXPECT_EQ(types["dir"], "directory");
  EXPECT_EQ(types["link"], "symlink");
  EXPECT_EQ(types["pipe"], "other");

  Response empty = Fs(id_, "readdir", json::object{{"path", "top/dir"}});
  EXPECT_TRUE(Names(empty).empty()) << empty.Describe();
  ExpectFsError(Fs(id_, "readdir", json::object{{"path", "top/a"}}), 400, "ENOTDIR",
                "/workspace/top/a", "readdir a file");
  ExpectFsError(Fs(id_, "readdir", json::object{{"path", "nope"}}), 404, "ENOENT",
                "/workspace/nope", "readdir missing");
  // A symlink to a directory is followed.
  Sh(id_, "ln -s top/dir dl; touch top/dir/x");
  EXPECT_EQ(Names(Fs(id_, "readdir", json::object{{"path", "dl"}})), std::vector<std::string>{"x"});
}

// A listing larger than one frame of the control channel (4 MiB) comes in parts: 40,000 names
// of 120 bytes are ≈ 5 MiB of names.
TEST_F(FilesTest, ReaddirOfADirectoryLargerThanAFrame) {
  Sh(id_,
     "mkdir big && cd big && seq -f '%0120g' 1 40000 | xargs touch && mkdir "
     "zzzz-a-directory-last");
  for (bool typed : {false, true}) {
    Response r = Fs(id_, "readdir", json::object{{"path", "big"}, {"withTypes", typed}});
    ASSERT_EQ(r.status, 200) << r.Describe().substr(0, 500);
    const std::vector<std::string> names = Names(r);
    ASSERT_EQ(names.size(), 40001u);
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
    EXPECT_EQ(names.front(), std::string(119, '0') + "1");
    EXPECT_EQ(names[39999], std::string(115, '0') + "40000");
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
    if (typed) {
      EXPECT_EQ(Str(Arr(r, "entries").back().as_object(), "type"), "directory");
      EXPECT_EQ(Str(Arr(r, "entries").front().as_object(), "type"), "file");
    }
  }
  ExpectDaemonHealthy();
}

TEST_F(FilesTest, NonUtf8NamesViaBase64) {
  Sh(id_, "mkdir raw; touch raw/$'\\xff\\xfe' raw/ok");
  Response t = Fs(id_, "readdir", json::object{{"path", "raw"}, {"withTypes", true}});
  ASSERT_EQ(t.status, 200) << t.Describe();
  std::string b64;
  for (const auto& v : Arr(t, "entries")) {
    const json::object& e = v.as_object();
    if (Str(e, "name") == "ok") {
      EXPECT_FALSE(e.contains("nameBase64"));
    } else {
      EXPECT_EQ(Str(e, "name"), "\xEF\xBF\xBD\xEF\xBF\xBD") << t.Describe();
      b64 = Str(e, "nameBase64");
    }
  }
  EXPECT_EQ(b64, Base64Encode("\xff\xfe"));
  const std::string raw_path = Base64Encode("/workspace/raw/\xff\xfe");
  Response st = Fs(id_, "stat", json::object{{"pathBase64", raw_path}});
  EXPECT_EQ(st.status, 200) << st.Describe();
  EXPECT_EQ(Field(Obj(st), "isFile"), json::value(true));
  Response ex = Fs(id_, "exists", json::object{{"pathBase64", raw_path}});
  EXPECT_EQ(Obj(ex)["exists"], json::value(true)) << ex.Describe();
  Response rm = Fs(id_, "rm", json::object{{"pathBase64", raw_path}});
  EXPECT_EQ(rm.status, 204) << rm.Describe();
  EXPECT_EQ(Names(Fs(id_, "readdir", json::object{{"path", "raw"}})),
            std::vector<std::string>{"ok"});
}

TEST_F(FilesTest, ExistsNeverErrs) {
  Sh(id_,
     "touch f; mkdir d; ln -s f lf; ln -s d ld; ln -s nowhere dangle; ln -s l1 l2; "
     "ln -s l2 l1");
  EXPECT_TRUE(Exists("/workspace/f"));
  EXPECT_TRUE(Exists("f"));
  EXPECT_TRUE(Exists("/workspace/d"));
  EXPECT_TRUE(Exists("lf"));
  EXPECT_TRUE(Exists("ld"));
  EXPECT_TRUE(Exists("/"));
  EXPECT_FALSE(Exists("dangle"));
  EXPECT_FALSE(Exists("missing"));
  EXPECT_FALSE(Exists("f/x"));
  EXPECT_FALSE(Exists("l1"));
  EXPECT_FALSE(Exists(std::string(5000, 'x')));
}

TEST_F(FilesTest, MkdirLikeNode) {
  auto mkdir = [&](const std::string& p, bool recursive) {
    return Fs(id_, "mkdir", json::object{{"path", p}, {"recursive", recursive}});
  };
  Sh(id_, "touch file; ln -s nowhere dangle");
  EXPECT_EQ(mkdir("new", false).status, 204);
  EXPECT_EQ(Sh(id_, "stat -c %a new"), "755\n");
  ExpectFsError(mkdir("new", false), 409, "EEXIST", "/workspace/new", "existing dir");
  ExpectFsError(mkdir("file", false), 409, "EEXIST", "/workspace/file", "existing file");
  ExpectFsError(mkdir("a/b", false), 404, "ENOENT", "/workspace/a/b", "missing parent");
  EXPECT_EQ(mkdir("a/b/c", true).status, 204);
  EXPECT_TRUE(Exists("a/b/c"));
  EXPECT_EQ(mkdir("a/b/c", true).status, 204) << "an existing directory is fine";
  EXPECT_EQ(mkdir("new", true).status, 204);
  ExpectFsError(mkdir("file", true), 409, "EEXIST", "", "recursive on a file");
  ExpectFsError(mkdir("dangle", true), 404, "ENOENT", "", "recursive on a dangling symlink");
  ExpectFsError(mkdir("file/sub/x", true), 400, "ENOTDIR", "", "a file on the way");
  // Without "recursive" at all: not recursive.
  ExpectFsError(Fs(id_, "mkdir", json::object{{"path", "x/y"}}), 404, "ENOENT", "",
                "recursive omitted");
}

TEST_F(FilesTest, RmLikeNode) {
  auto rm = [&](const std::string& p, bool recursive, bool force) {
    return Fs(id_, "rm", json::object{{"path", p}, {"recursive", recursive}, {"force", force}});
  };
  Sh(id_,
     "touch f; mkdir -p tree/sub empty /tmp/outside; touch tree/sub/x /tmp/outside/keep; "
     "ln -s /tmp/outside tree/sub/link; ln -s empty linkdir");
  EXPECT_EQ(rm("f", false, false).status, 204);
  EXPECT_FALSE(Exists("f"));
  ExpectFsError(rm("f", false, false), 404, "ENOENT", "/workspace/f", "missing");
  EXPECT_EQ(rm("f", false, true).status, 204) << "force: a missing path is fine";
  EXPECT_EQ(rm("no/such/deep", true, true).status, 204);
  ExpectFsError(rm("empty", false, false), 400, "EISDIR", "", "a directory without recursive");
  ExpectFsError(rm("tree", false, true), 400, "EISDIR", "", "force does not imply recursive");
  // A symlink to a directory is removed itself, without recursive.
  EXPECT_EQ(rm("linkdir", false, false).status, 204);
  EXPECT_TRUE(Exists("empty"));
  EXPECT_EQ(rm("tree", true, false).status, 204);
  EXPECT_FALSE(Exists("tree"));
  EXPECT_EQ(Sh(id_, "ls /tmp/outside"), "keep\n") << "rm followed a symlink inside the tree";
  EXPECT_EQ(rm("empty", true, false).status, 204);
  EXPECT_EQ(Sh(id_, "ls -A /workspace"), "");
}

// ---- paths ----

TEST_F(FilesTest, RelativePathsResolveAgainstCwd) {
  ASSERT_EQ(PutFile(id_, "rel/a.txt", "rel").status, 204);
  EXPECT_EQ(Sh(id_, "cat /workspace/rel/a.txt"), "rel");
  EXPECT_EQ(GetFile(id_, "./rel/../rel/./a.txt").body, "rel");
  EXPECT_EQ(Field(Obj(Stat("rel//a.txt")), "size"), json::value(3));
  // A sandbox whose cwd is /root.
  const std::string home = NewId("home");
  ASSERT_EQ(client().PutJson(SbPath(home), json::object{{"cwd", "/root"}}).status, 201);
  ASSERT_EQ(PutFile(home, "x.txt", "home").status, 204);
  EXPECT_EQ(Sh(home, "cat /root/x.txt"), "home");
  EXPECT_EQ(ReadHostFile(daemon().SandboxDir(home) + "/home/x.txt"), "home");
  Response rd = Fs(home, "readdir", json::object{{"path", "."}});
  std::vector<std::string> names = Names(rd);
  EXPECT_NE(std::find(names.begin(), names.end(), "x.txt"), names.end()) << rd.Describe();
  // ".." above / stays at /.
  EXPECT_EQ(GetFile(home, "../../../../root/x.txt").body, "home");
}

TEST_F(FilesTest, DotDotAndSymlinksCannotEscapeTheJail) {
  // A file on the host, outside any sandbox, that must stay out of reach.
  const std::string secret_dir = daemon().dir() + "/secret";
  ASSERT_EQ(::mkdir(secret_dir.c_str(), 0755), 0);
  {
    FILE* f = std::fopen((secret_dir + "/host.txt").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("host secret", f);
    std::fclose(f);
  }
  const std::string ws = HostWorkspace();
  ASSERT_FALSE(daemon().SandboxDir(id_).empty());
  // The host path of the secret, as relative from the workspace on the host.
  std::string up;
  for (size_t i = 0; i < 12; ++i) up += "../";
  const std::string via_dots = up + secret_dir.substr(1) + "/host.txt";
  Response g = GetFile(id_, via_dots);
  EXPECT_EQ(g.status, 404) << g.Describe();
  EXPECT_EQ(g.body.find("host secret"), std::string::npos);

  Sh(id_,
     "ln -s / rootlink; ln -s ../../../../../../../.. uplink; ln -s " + secret_dir + " abslink");
  for (const std::string& p : {"rootlink" + secret_dir + "/host.txt",
                               "uplink" + secret_dir + "/host.txt", std::string("abslink/host.txt"),
                               "/workspace/uplink" + ws + "/../../../../secret/host.txt"}) {
    Response r = GetFile(id_, p);
    EXPECT_EQ(r.status, 404) << p << ": " << r.Describe();
    EXPECT_EQ(r.body.find("host secret"), std::string::npos) << p;
    EXPECT_FALSE(Exists(p)) << p;
    Response st = Stat(p);
    EXPECT_EQ(st.status, 404) << p << ": " << st.Describe();
  }
  // Writes through them land in the jail (or fail), never on the host.
  for (const std::string& p :
       {"rootlink" + secret_dir + "/written.txt", "uplink" + secret_dir + "/written.txt",
        std::string("abslink/written.txt"),
        via_dots.substr(0, via_dots.rfind('/')) + "/written.txt"}) {
    PutFile(id_, p, "escaped");
    Fs(id_, "mkdir", json::object{{"path", p + ".d"}, {"recursive", true}});
    Fs(id_, "rm", json::object{{"path", secret_dir + "/host.txt"}, {"force", true}});
  }
  struct stat st;
  EXPECT_NE(lstat((secret_dir + "/written.txt").c_str(), &st), 0) << "a write escaped the jail";
  EXPECT_NE(lstat((secret_dir + "/written.txt.d").c_str(), &st), 0) << "a mkdir escaped";
  EXPECT_EQ(ReadHostFile(secret_dir + "/host.txt"), "host secret") << "an rm escaped the jail";
  // A symlink to / is the jail's root: the workspace is reachable through it.
  ASSERT_EQ(PutFile(id_, "mine.txt", "mine").status, 204);
  EXPECT_EQ(GetFile(id_, "rootlink/workspace/mine.txt").body, "mine");
  EXPECT_EQ(GetFile(id_, "uplink/workspace/mine.txt").body, "mine");
  EXPECT_EQ(GetFile(id_, "/../../workspace/mine.txt").body, "mine");
  // Another sandbox's workspace is not reachable by its host path.
  const std::string other = NewId("other");
  Create(other);
  ASSERT_EQ(PutFile(other, "theirs.txt", "theirs").status, 204);
  const std::string their_ws = daemon().SandboxDir(other) + "/workspace/theirs.txt";
  EXPECT_EQ(GetFile(id_, "rootlink" + their_ws).status, 404);
  EXPECT_EQ(GetFile(id_, up + their_ws.substr(1)).status, 404);
}

}  // namespace
}  // namespace nsbox::e2e
