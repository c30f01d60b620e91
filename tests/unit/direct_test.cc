// Which commands nsbox-init runs without bash (exec/direct.h), and what it gives them. That the
// program then sees what bash would have given it is checked against bash itself, in a real
// sandbox, by the integration case InitExecTest.DirectCommandsSeeWhatBashWouldGiveThem.

#include "exec/direct.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace nsbox::exec {
namespace {

using Words = std::vector<std::string>;

const std::vector<std::string> kBaseEnv = {
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "USER=root",
    "LOGNAME=root",
    "SHELL=/bin/bash",
    "HOSTNAME=box",
    "LANG=C.UTF-8",
    "TERM=xterm-256color",
    "TMPDIR=/tmp"};

// A file system where these files are executables.
auto Executables(std::set<std::string> files) {
  return [files = std::move(files)](const std::string& path) { return files.count(path) != 0; };
}

std::optional<DirectCommand> Direct(std::string_view command,
                                    std::vector<std::string> env = kBaseEnv,
                                    std::string_view shell = "/bin/bash") {
  return DirectForm(command, shell, env,
                    Executables({"/usr/bin/ls", "/usr/bin/python3", "/bin/ls", "/usr/bin/env",
                                 "/usr/local/bin/node", "/bin/true"}));
}

TEST(PlainWords, SplitsWordsOfSafeCharacters) {
  EXPECT_EQ(PlainWords("/bin/true"), Words({"/bin/true"}));
  EXPECT_EQ(PlainWords("  ls\t-la   src/a_b.c  "), Words({"ls", "-la", "src/a_b.c"}));
  EXPECT_EQ(PlainWords("make CC=gcc -j4 a+b,c:d@e"), Words({"make", "CC=gcc", "-j4", "a+b,c:d@e"}));
  EXPECT_EQ(PlainWords("date +%s"), Words({"date", "+%s"}));
  EXPECT_EQ(PlainWords("./run.sh --x=1"), Words({"./run.sh", "--x=1"}));
}

TEST(PlainWords, LeavesEverythingWithShellSyntaxToBash) {
  for (const char* command :
       {"",       "   ",    "ls *.c", "ls ?",         "ls [ab]", "echo $HOME", "ls ~",
        "ls ~/x", "a && b", "a; b",   "a | b",        "a > f",   "a < f",      "a &",
        "'ls'",   "\"ls\"", "ls\\ x", "ls\nrm -rf /", "a\rb",    "ls {a,b}",   "ls #c",
        "(ls)",   "ls `x`", "a!b",    "ls ^x",        "ls\x01",  "ls \xc3\xa9"}) {
    EXPECT_FALSE(PlainWords(command).has_value()) << command;
  }
}

TEST(PlainWords, LeavesAssignmentsJobsKeywordsAndBuiltinsToBash) {
  for (const char* command :
       {"FOO=1 ls",  "=x", "%1",      "a%b",      "true",       "echo hi", "cd /",
        "[ -f x ]",  "if", "time ls", "exec ls",  "command ls", "kill 1",  "printf x",
        "test -e x", ".",  ":",       "source x", "exit 3",     "wait",    "coproc x"}) {
    EXPECT_FALSE(PlainWords(command).has_value()) << command;
  }
  // Words that only contain a builtin's name are programs.
  EXPECT_TRUE(PlainWords("truex").has_value());
  EXPECT_TRUE(PlainWords("/bin/true").has_value());
  EXPECT_TRUE(PlainWords("./echo").has_value());
  EXPECT_TRUE(PlainWords("ls true").has_value());
}

TEST(DirectForm, SearchesPathAsBashDoes) {
  auto d = Direct("python3 x.py -v");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->file, "/usr/bin/python3");
  EXPECT_EQ(d->argv, Words({"python3", "x.py", "-v"}));
  d = Direct("ls");  // the first directory of PATH that has it
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->file, "/usr/bin/ls");
  d = Direct("node");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->file, "/usr/local/bin/node");
  // Not found: bash says "command not found".
  EXPECT_FALSE(Direct("nosuchprogram").has_value());
  // A path is executed as it is, from the command's directory; what fails there, bash reports.
  d = Direct("./build.sh all");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->file, "./build.sh");
  EXPECT_EQ(d->argv, Words({"./build.sh", "all"}));
  d = Direct("/opt/missing");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->file, "/opt/missing");
}

TEST(DirectForm, GivesTheEnvironmentBashWould) {
  auto d = Direct("/bin/true");
  ASSERT_TRUE(d.has_value());
  std::vector<std::string> want = kBaseEnv;
  want.push_back("SHLVL=0");
  want.push_back("_=/bin/true");
  EXPECT_EQ(d->env, want);

  std::vector<std::string> env = kBaseEnv;
  env.push_back("SHLVL=3");
  env.push_back("_=/something/else");
  env.push_back("CI=1");
  env.push_back("EMPTY=");
  env.push_back("A-B=kept");  // bash passes names it cannot use on
  d = Direct("ls", env);
  ASSERT_TRUE(d.has_value());
  want = kBaseEnv;
  want.insert(want.end(), {"SHLVL=3", "CI=1", "EMPTY=", "A-B=kept", "_=/usr/bin/ls"});
  EXPECT_EQ(d->env, want);
}

TEST(DirectForm, LeavesEnvironmentsBashWouldChangeToBash) {
  for (const char* extra : {"BASH_ENV=/x",
                            "BASH_FUNC_ls%%=() { :; }",
                            "BASHOPTS=x",
                            "BASH=x",
                            "ENV=/x",
                            "SHELLOPTS=xtrace",
                            "POSIXLY_CORRECT=1",
                            "EXECIGNORE=*",
                            "PWD=/x",
                            "OLDPWD=/x",
                            "IFS=x",
                            "PS1=x",
                            "PS4=x",
                            "OPTIND=3",
                            "RANDOM=1",
                            "PPID=1",
                            "LINENO=1",
                            "SHLVL=abc",
                            "SHLVL=007",
                            "SHLVL=-1",
                            "SHLVL=999",
                            "SHLVL=",
                            "=noname",
                            "NOEQUALS",
                            "HOME=/twice"}) {
    std::vector<std::string> env = kBaseEnv;
    env.push_back(extra);
    EXPECT_FALSE(Direct("/bin/true", env).has_value()) << extra;
  }
  for (const char* path :
       {"PATH=/usr/bin:", "PATH=:/usr/bin", "PATH=bin:/usr/bin", "PATH=/a::/b"}) {
    std::vector<std::string> env = kBaseEnv;
    env.front() = path;
    EXPECT_FALSE(Direct("/bin/true", env).has_value()) << path;
  }
  std::vector<std::string> no_path(kBaseEnv.begin() + 1, kBaseEnv.end());
  EXPECT_FALSE(Direct("/bin/true", no_path).has_value()) << "bash's own default PATH";
  std::vector<std::string> ok = kBaseEnv;
  ok.push_back("SHLVL=998");
  EXPECT_TRUE(Direct("/bin/true", ok).has_value());
}

TEST(DirectForm, OnlyForBash) {
  EXPECT_TRUE(Direct("/bin/true", kBaseEnv, "/usr/bin/bash").has_value());
  EXPECT_FALSE(Direct("/bin/true", kBaseEnv, "/bin/sh").has_value());
  EXPECT_FALSE(Direct("/bin/true", kBaseEnv, "/bin/dash").has_value());
  EXPECT_FALSE(Direct("/bin/true", kBaseEnv, "/bin/notbash").has_value());
}

}  // namespace
}  // namespace nsbox::exec
