// The differential test: one battery of file verbs run by fs/file_ops on one temp tree and by
// Node 20's fs/promises (as Flue's local() uses it) on an identical one; every result (value or
// error code, syscall and message) and the trees left behind must match. Skips loudly without
// `node`. Only cases where Node stays inside the tree are in the battery (no escaping links, no
// FIFO reads: Node would hang), and both paths are run: openat2 and the forced walk.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fs/file_ops.h"

namespace nsbox::fs {
namespace {

namespace stdfs = std::filesystem;

struct Op {
  std::string verb;  // read write stat readdir readdirT exists mkdir rm
  std::string path;
  bool recursive = false;
  bool force = false;
  std::string content;
};

std::vector<Op> Battery() {
  std::vector<Op> ops;
  auto add = [&ops](std::string verb, std::string path, bool r = false, bool f = false,
                    std::string c = "") {
    ops.push_back({verb, path, r, f, c});
  };
  for (const char* p : {"/f", "/lf", "/d", "/ld", "/m", "/f/x", "/dang", "/loop1", "/d/a"}) {
    add("read", p);
    add("stat", p);
    add("exists", p);
    add("readdir", p);
  }
  add("stat", "/fifo");
  add("readdir", "/fifo");
  add("stat", "/");
  add("readdirT", "/");
  add("readdirT", "/d");
  for (const char* p : {"/f", "/d", "/dang", "/", "/m/x", "/f/x", "/ld/new", "/lf"}) {
    add("mkdir", p);
  }
  for (const char* p :
       {"/f", "/d", "/ld", "/lf", "/dang", "/dang/x", "/f/x/y", "/f/x", "/m/x/y", "/", "/dsub"}) {
    add("mkdir", p, true);
  }
  add("write", "/d", false, false, "x");
  add("write", "/ld", false, false, "x");
  add("write", "/f/x", false, false, "x");
  add("write", "/n/e/w", false, false, "new");
  add("write", "/lf", false, false, "through the link");
  add("write", "/dang", false, false, "made at nope");
  add("write", "/dsub", false, false, "x");
  add("write", "/loop1", false, false, "x");
  add("write", "/d/a", false, false, "");
  add("read", "/nope");
  add("read", "/f");
  add("read", "/n/e/w");
  add("rm", "/d");
  add("rm", "/d", false, true);
  add("rm", "/m");
  add("rm", "/m", true);
  add("rm", "/m", false, true);
  add("rm", "/m/x", false, true);
  add("rm", "/f/x");
  add("rm", "/f/x", false, true);
  add("rm", "/ld/nothing");
  add("rm", "/ld");
  add("rm", "/lf");
  add("rm", "/loop1");
  add("rm", "/d", true);
  add("rm", "/n", true, true);
  add("readdir", "/");
  return ops;
}

// The same tree on both sides: relative links only, so Node stays inside it too.
void BuildTree(const std::string& dir) {
  auto put = [&](const std::string& p, const std::string& c) {
    std::ofstream(dir + p, std::ios::binary) << c;
  };
  put("/f", "hello");
  stdfs::create_directories(dir + "/d/sub");
  put("/d/a", "A");
  stdfs::create_symlink("d", dir + "/ld");
  stdfs::create_symlink("f", dir + "/lf");
  stdfs::create_symlink("nope", dir + "/dang");
  stdfs::create_symlink("sub/t", dir + "/dsub");
  stdfs::create_symlink("loop2", dir + "/loop1");
  stdfs::create_symlink("loop1", dir + "/loop2");
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0644), 0);
}

std::string Hex(const std::string& s) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

const char* TypeName(EntryType t) {
  switch (t) {
    case EntryType::kFile:
      return "file";
    case EntryType::kDirectory:
      return "directory";
    case EntryType::kSymlink:
      return "symlink";
    case EntryType::kOther:
      return "other";
  }
  return "?";
}

std::string Ours(int root, const Op& op) {
  auto err = [](const FsError& e) {
    return "ERR " + std::string(e.node_err_fs_eisdir ? "ERR_FS_EISDIR" : "") + " " + e.syscall +
           " " + e.message;
  };
  if (op.verb == "read") {
    FsOutcome<OpenedFile> f = OpenForRead(root, op.path);
    if (!f.ok()) return err(f.error());
    std::string data(f.value().size, '\0');
    if (::read(f.value().fd.get(), data.data(), data.size()) != static_cast<ssize_t>(data.size())) {
      return "short read";
    }
    return "OK " + Hex(data);
  }
  if (op.verb == "write") {
    FsOutcome<Unit> r = WriteWholeFile(root, op.path, op.content);
    return r.ok() ? "OK " : err(r.error());
  }
  if (op.verb == "stat") {
    FsOutcome<StatInfo> s = Stat(root, op.path);
    if (!s.ok()) return err(s.error());
    return "OK " + std::to_string(s.value().is_file) + std::to_string(s.value().is_directory) +
           std::to_string(s.value().is_symbolic_link) + " " + std::to_string(s.value().size);
  }
  if (op.verb == "readdir" || op.verb == "readdirT") {
    FsOutcome<std::vector<DirEntry>> r = Readdir(root, op.path);
    if (!r.ok()) return err(r.error());
    std::string out = "OK ";
    for (const DirEntry& e : r.value()) {
      out += e.name;
      if (op.verb == "readdirT") out += std::string(":") + TypeName(e.type);
      out += "|";
    }
    return out;
  }
  if (op.verb == "exists") return Exists(root, op.path) ? "OK true" : "OK false";
  if (op.verb == "mkdir") {
    FsOutcome<Unit> r = Mkdir(root, op.path, op.recursive);
    return r.ok() ? "OK " : err(r.error());
  }
  FsOutcome<Unit> r = Rm(root, op.path, op.recursive, op.force);
  return r.ok() ? "OK " : err(r.error());
}

// Node's side, as Flue's local() drives fs/promises: writeFile retries once after mkdir -p of
// the parent on ENOENT; stat is stat then lstat; exists is a stat that never throws.
constexpr char kNodeScript[] = R"JS(
import fs from 'node:fs/promises';
import path from 'node:path';
import { readFileSync } from 'node:fs';
const base = process.argv[2];
const ops = readFileSync(process.argv[3], 'utf8').trim().split('\n').map(l => JSON.parse(l));
const scrub = s => s.split(base + '/').join('/').split(base).join('/');
const cmp = (a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b));
const out = [];
for (const op of ops) {
  const p = base + op.path;
  try {
    let v = '';
    if (op.verb === 'read') v = (await fs.readFile(p)).toString('hex');
    else if (op.verb === 'write') {
      try { await fs.writeFile(p, op.content); } catch (e) {
        if (e.code !== 'ENOENT') throw e;
        await fs.mkdir(path.dirname(p), { recursive: true });
        await fs.writeFile(p, op.content);
      }
    } else if (op.verb === 'stat') {
      const s = await fs.stat(p); const l = await fs.lstat(p);
      v = `${+s.isFile()}${+s.isDirectory()}${+l.isSymbolicLink()} ${s.size}`;
    } else if (op.verb === 'readdir') {
      v = (await fs.readdir(p)).sort(cmp).map(n => n + '|').join('');
    } else if (op.verb === 'readdirT') {
      const type = e => e.isFile() ? 'file' : e.isDirectory() ? 'directory' :
                        e.isSymbolicLink() ? 'symlink' : 'other';
      v = (await fs.readdir(p, { withFileTypes: true })).sort((a, b) => cmp(a.name, b.name))
              .map(e => `${e.name}:${type(e)}|`).join('');
    } else if (op.verb === 'exists') {
      v = await fs.stat(p).then(() => 'true', () => 'false');
    } else if (op.verb === 'mkdir') await fs.mkdir(p, { recursive: op.recursive });
    else await fs.rm(p, { recursive: op.recursive, force: op.force });
    out.push('OK ' + v);
  } catch (e) {
    const flag = e.code === 'ERR_FS_EISDIR' ? 'ERR_FS_EISDIR' : '';
    out.push(`ERR ${flag} ${e.syscall} ${scrub(e.message)}`);
  }
}
console.log(out.join('\n'));
)JS";

// "path type [content|target]" for everything under `dir`, sorted; links are not followed.
std::vector<std::string> DumpTree(const std::string& dir) {
  std::vector<std::string> lines;
  for (auto it = stdfs::recursive_directory_iterator(dir);
       it != stdfs::recursive_directory_iterator(); ++it) {
    std::string rel = it->path().string().substr(dir.size());
    stdfs::file_status st = it->symlink_status();
    std::string line = rel;
    if (stdfs::is_symlink(st)) {
      line += " link " + stdfs::read_symlink(it->path()).string();
    } else if (stdfs::is_directory(st)) {
      line += " dir";
    } else if (stdfs::is_regular_file(st)) {
      std::ifstream in(it->path(), std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      line += " file " + ss.str();
    } else {
      line += " other";
    }
    lines.push_back(line);
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

class FileOpsNodeTest : public ::testing::TestWithParam<bool> {};

INSTANTIATE_TEST_SUITE_P(Resolution, FileOpsNodeTest, ::testing::Values(true, false),
                         [](const auto& param_info) {
                           return param_info.param ? "openat2" : "walk";
                         });

TEST_P(FileOpsNodeTest, SameResultsAsNodeFsPromises) {
  if (::system("node --version >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "SKIPPED: `node` is not installed; the differential test needs Node 20";
  }
  SetOpenat2ForTesting(GetParam());
  char tmpl[] = "/tmp/nsbox-file-ops-node-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string base = tmpl;
  struct RemoveAtEnd {
    std::string dir;
    ~RemoveAtEnd() {
      SetOpenat2ForTesting(true);
      std::error_code ec;
      stdfs::remove_all(dir, ec);
    }
  } cleanup{base};
  const std::string ours_dir = base + "/ours", node_dir = base + "/node";
  stdfs::create_directories(ours_dir);
  stdfs::create_directories(node_dir);
  BuildTree(ours_dir);
  BuildTree(node_dir);

  const std::vector<Op> ops = Battery();
  {
    std::ofstream script(base + "/battery.mjs");
    script << kNodeScript;
    std::ofstream lines(base + "/ops.jsonl");
    for (const Op& op : ops) {
      lines << R"({"verb":")" << op.verb << R"(","path":")" << op.path << R"(","recursive":)"
            << (op.recursive ? "true" : "false") << R"(,"force":)" << (op.force ? "true" : "false")
            << R"(,"content":")" << op.content << "\"}\n";
    }
  }
  std::string cmd = "node " + base + "/battery.mjs " + node_dir + " " + base + "/ops.jsonl";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string node_out;
  char buf[4096];
  size_t n;
  while ((n = ::fread(buf, 1, sizeof(buf), pipe)) > 0) node_out.append(buf, n);
  ASSERT_EQ(::pclose(pipe), 0) << node_out;
  std::vector<std::string> node_lines;
  std::istringstream in(node_out);
  for (std::string line; std::getline(in, line);) node_lines.push_back(line);
  ASSERT_EQ(node_lines.size(), ops.size()) << node_out;

  UniqueFd root(::open(ours_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(root.valid());
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    EXPECT_EQ(Ours(root.get(), op), node_lines[i])
        << "#" << i << " " << op.verb << " " << op.path << (op.recursive ? " recursive" : "")
        << (op.force ? " force" : "");
  }
  EXPECT_EQ(DumpTree(ours_dir), DumpTree(node_dir));
}

}  // namespace
}  // namespace nsbox::fs
