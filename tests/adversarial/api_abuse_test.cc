// Group "API abuse" (docs/security.md): the daemon's HTTP surface under hostile clients. TCP
// without or with a wrong token, oversized bodies and headers, request smuggling shapes, JSON
// bombs, ids and URLs that look like paths, another sandbox's exec id, an unprivileged host user
// at the socket, and create/delete/exec racing on one id. Each answer is exact, the daemon
// survives, and nothing the attack asked for happens (the control: the same request done
// properly does it).

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "tests/adversarial/fixture.h"

namespace nsbox::adversarial {
namespace {

class ApiAbuseTest : public AdversarialTest {
 protected:
  Endpoint Tcp() const { return Endpoint::Tcp("127.0.0.1", tcp_port()); }

  // Sends `bytes` on a fresh connection and returns every answer's status in order, then
  // "<EOF>" if the daemon closed the connection, or "<open>" if it kept it open (nothing more
  // came for 500 ms).
  std::vector<std::string> Raw(const std::string& bytes) {
    std::vector<std::string> out;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", daemon().socket_path().c_str());
    // SAFETY: sockaddr_un is the address of an AF_UNIX socket.
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(fd);
      return {"<connect failed>"};
    }
    // Written from a thread: the daemon may answer (and stop reading) before all of it is sent.
    std::thread writer([fd, &bytes] {
      size_t off = 0;
      while (off < bytes.size()) {
        ssize_t n = send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
    });
    std::string in;
    bool eof = false;
    for (;;) {
      pollfd p = {fd, POLLIN, 0};
      if (poll(&p, 1, 500) <= 0) break;
      char buf[65536];
      ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) {
        eof = true;
        break;
      }
      in.append(buf, static_cast<size_t>(n));
    }
    shutdown(fd, SHUT_RDWR);
    writer.join();
    close(fd);
    Scan("raw answers", in);
    // The answers: a status line, headers with a Content-Length, the body.
    size_t pos = 0;
    while (pos < in.size()) {
      size_t end = in.find("\r\n\r\n", pos);
      if (in.compare(pos, 9, "HTTP/1.1 ") != 0 || end == std::string::npos) {
        out.push_back("<garbage>");
        break;
      }
      out.push_back(in.substr(pos + 9, 3));
      size_t cl = in.find("Content-Length: ", pos);
      size_t len = cl != std::string::npos && cl < end ? std::stoul(in.substr(cl + 16)) : 0;
      pos = end + 4 + len;
    }
    out.push_back(eof ? "<EOF>" : "<open>");
    return out;
  }

  bool Exists(const std::string& id) { return Call("GET", SbPath(id)).status == 200; }
};

// ---- authentication ----

// Every route over TCP without a token, or with a wrong one in any shape: 401, and nothing
// happens (the PUT creates nothing, the exec runs nothing). Control: the right token works.
TEST_F(ApiAbuseTest, TcpWithoutOrWithAWrongTokenDoesNothing) {
  const std::string id = NewSandbox("victim");
  Sh(id, "true");
  const std::vector<std::pair<std::string, std::string>> routes = {
      {"GET", "/v1/health"},
      {"GET", "/metrics"},
      {"GET", "/v1/sandboxes"},
      {"PUT", SbPath("created-without-token")},
      {"GET", SbPath(id)},
      {"POST", SbPath(id, "/exec")},
      {"PUT", SbPath(id, "/files?path=%2Fworkspace%2Fowned")},
      {"GET", SbPath(id, "/files?path=%2Fetc%2Fhostname")},
      {"POST", SbPath(id, "/fs/readdir")},
      {"POST", SbPath(id, "/stop")},
      {"DELETE", SbPath(id)},
      {"GET", "/v1/images"},
      {"GET", "/nope"}};
  const std::string body = "{\"command\":\"touch /workspace/owned\",\"path\":\"/\"}";
  const std::vector<Headers> wrong = {
      {},
      {{"Authorization", "Bearer"}},
      {{"Authorization", "Bearer "}},
      {{"Authorization", "Bearer " + bearer().substr(0, bearer().size() - 1)}},
      {{"Authorization", "Bearer " + bearer() + "x"}},
      {{"Authorization", "Basic " + bearer()}},
      {{"Authorization", "Bearer" + bearer()}},
      {{"Authorization", "Bearer " + bearer().substr(1)}},
      {{"Authorization", bearer()}},
      {{"Authorization", "Bearer " + std::string(bearer().size(), 'a')}},
      {{"X-Token", bearer()}}};
  for (const auto& headers : wrong) {
    Client c(Tcp());
    for (const auto& [method, target] : routes) {
      SCOPED_TRACE(method + " " + target);
      Headers h = headers;
      h.emplace_back("Content-Type", "application/json");
      Response r = c.Request(method, target, body, h);
      ScanResponse("tcp", r);
      EXPECT_EQ(r.status, 401) << r.Describe();
      EXPECT_EQ(r.ErrorCode(), "unauthorized");
    }
  }
  // The token in the query string is no token either.
  Client q(Tcp());
  EXPECT_EQ(q.Get("/v1/health?token=" + bearer()).status, 401);
  EXPECT_FALSE(Exists("created-without-token"));
  EXPECT_EQ(Sh(id, "test -e /workspace/owned; echo $?"), "1\n");
  EXPECT_EQ(Str(Obj(Call("GET", SbPath(id))), "state"), "running") << "stop did nothing";
  // Control: the right token does it, the scheme in any case and with more than one space
  // (RFC 9110 §11.1 and §11.4: "bearer" is "Bearer", 1*SP before the credentials).
  Client right(Tcp(), bearer());
  EXPECT_EQ(right.Get("/v1/health").status, 200);
  for (const std::string& value : {"bearer " + bearer(), "Bearer  " + bearer()}) {
    EXPECT_EQ(Client(Tcp()).Request("GET", "/v1/health", "", {{"Authorization", value}}).status,
              200)
        << value;
  }
  EXPECT_EQ(right.PostJson(SbPath(id, "/exec"), json::object{{"command", "touch /workspace/owned"}})
                .status,
            200);
  EXPECT_EQ(Sh(id, "test -e /workspace/owned; echo $?"), "0\n") << "control";
}

// An unprivileged host user can see the socket path but not use it, nor read the state.
// Control: root (the socket's group, mode 0660) connects and reads.
TEST_F(ApiAbuseTest, UnprivilegedHostUserGetsNothing) {
  const std::string id = NewSandbox("private");
  Sh(id, "echo secret > /workspace/s");
  const std::string ws_file = daemon().SandboxDir(id) + "/workspace/s";
  ASSERT_EQ(e2e::ReadHostFile(ws_file), "secret\n") << "control: root reads it";
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(pipefd[0]);
    // nobody: no supplementary groups, then gid and uid.
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(100);
    std::string out;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", daemon().socket_path().c_str());
    // SAFETY: sockaddr_un is the address of an AF_UNIX socket.
    int rc = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    out += std::string("connect=") + (rc == 0 ? "0" : strerrorname_np(errno)) + "\n";
    DIR* d = opendir((daemon().state_dir() + "/sandboxes").c_str());
    out += std::string("list_state=") + (d != nullptr ? "0" : strerrorname_np(errno)) + "\n";
    int f = open(ws_file.c_str(), O_RDONLY);
    out += std::string("read_workspace=") + (f >= 0 ? "0" : strerrorname_np(errno)) + "\n";
    int t = open((daemon().dir() + "/token").c_str(), O_RDONLY);
    out += std::string("read_token=") + (t >= 0 ? "0" : strerrorname_np(errno)) + "\n";
    (void)!write(pipefd[1], out.data(), out.size());
    _exit(0);
  }
  close(pipefd[1]);
  char buf[512];
  ssize_t n = read(pipefd[0], buf, sizeof buf);
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_GT(n, 0);
  KeyValues kv = ParseKeyValues(std::string(buf, static_cast<size_t>(n)));
  EXPECT_EQ(Get(kv, "connect"), "EACCES");
  EXPECT_EQ(Get(kv, "list_state"), "EACCES");
  EXPECT_EQ(Get(kv, "read_workspace"), "EACCES");
  EXPECT_EQ(Get(kv, "read_token"), "EACCES");
  struct stat st;
  ASSERT_EQ(stat(daemon().socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(Call("GET", "/v1/health").status, 200) << "control: root connects";
}

// What `argv` prints when run as the unprivileged user nobody (65534, no groups), or
// "exec=<errno>" when it cannot even be executed.
std::string RunAsNobody(const std::vector<std::string>& argv) {
  int out[2];
  if (pipe(out) != 0) return "pipe failed";
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    close(out[0]);
    dup2(out[1], 1);
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(100);
    char* const env[] = {nullptr};
    // SAFETY: execve does not write through argv; the cast only fits its prototype.
    execve(cargv[0], cargv.data(), env);
    std::printf("exec=%s\n", strerrorname_np(errno));
    std::fflush(stdout);
    _exit(0);
  }
  close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;)
    text.append(buf, static_cast<size_t>(n));
  close(out[0]);
  waitpid(pid, nullptr, 0);
  return text;
}

// One ustar member (regular file or directory) for a hand-made image tarball.
std::string TarMember(const std::string& name, const std::string& data, unsigned mode,
                      char type = '0') {
  char h[512] = {};
  std::snprintf(h, 100, "%s", name.c_str());
  std::snprintf(h + 100, 8, "%07o", mode);
  std::snprintf(h + 108, 8, "%07o", 0);
  std::snprintf(h + 116, 8, "%07o", 0);
  std::snprintf(h + 124, 12, "%011o", static_cast<unsigned>(type == '0' ? data.size() : 0));
  std::snprintf(h + 136, 12, "%011o", 0);
  h[156] = type;
  std::memcpy(h + 257, "ustar", 6);
  std::memcpy(h + 263, "00", 2);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(h + 148, 8, "%06o", sum);
  std::string out(h, sizeof h);
  if (type == '0') {
    out += data;
    out.append((512 - data.size() % 512) % 512, '\0');
  }
  return out;
}

// A sandbox plants a setuid copy of a program in its own workspace (it owns the directory and
// may chmod it 0755), and an imported image carries a setuid file: on the host both are setuid
// to the uid that owns every sandbox's files. An unprivileged host user must not be able to run
// them (every sandbox's directory and every image's content is 0700), and even run as root the
// plant's uid cannot open another sandbox's file. Control: root runs them: the plant is real.
TEST_F(ApiAbuseTest, SetuidFilesOfSandboxesAreOutOfHostUsersReach) {
  const std::string planter = NewSandbox("planter");
  const std::string victim = NewSandbox("victim");
  Sh(victim, "echo victim-secret > /workspace/secret");
  InstallTools(planter);
  Sh(planter, std::string("chmod 0755 /workspace && cp ") + kJailAttacker +
                  " /workspace/w && chmod 4755 /workspace/w");
  const std::string planted = daemon().SandboxDir(planter) + "/workspace/w";
  const std::string secret = daemon().SandboxDir(victim) + "/workspace/secret";
  struct stat st;
  ASSERT_EQ(stat(planted.c_str(), &st), 0);
  EXPECT_NE(st.st_mode & S_ISUID, 0u) << "control: the plant is setuid on the host";
  KeyValues as_root = ParseKeyValues(RunOnHost({planted, "whoami", secret}));
  EXPECT_EQ(Get(as_root, "euid"), "1610612736") << "control";
  // Every sandbox's directory is 0700 and root's: even that uid cannot reach another sandbox's
  // files (before the fix it opened the victim's: "0").
  EXPECT_EQ(Get(as_root, "open[" + secret + "]"), "EACCES") << "the plant reached another sandbox";
  EXPECT_EQ(RunAsNobody({planted, "whoami", secret}), "exec=EACCES\n")
      << "a host user ran the sandbox's setuid plant";

  // The same through an image.
  const std::string tar = TarMember("bin/", "", 0755, '5') +
                          TarMember("bin/sh", e2e::ReadHostFile(kAttackerBin), 0755) +
                          TarMember("suid", e2e::ReadHostFile(kAttackerBin), 04755) +
                          std::string(1024, '\0');
  Response imported = Call("POST", "/v1/images/adv-suid", tar,
                           {{"Content-Type", "application/x-tar"}}, milliseconds(60000));
  ASSERT_EQ(imported.status, 201) << imported.Describe();
  const std::string image_file =
      daemon().state_dir() + "/images/content/" + Str(Obj(imported), "id") + "/rootfs/suid";
  ASSERT_EQ(stat(image_file.c_str(), &st), 0) << image_file;
  EXPECT_EQ(Get(ParseKeyValues(RunOnHost({image_file, "whoami"})), "euid"), "1610612736")
      << "control";
  EXPECT_EQ(RunAsNobody({image_file, "whoami", secret}), "exec=EACCES\n")
      << "a host user ran an image's setuid file";
  EXPECT_EQ(Call("DELETE", "/v1/images/adv-suid").status, 204);
}

// Image tarballs that try to write outside the image: `..`, entries through a symlink, hard
// links to host files, device nodes. Refused (invalid_image) or confined; the host unchanged.
TEST_F(ApiAbuseTest, ImageTarballEntriesStayInTheImage) {
  const std::string sh = TarMember("bin/", "", 0755, '5') + TarMember("bin/sh", "#!x\n", 0755);
  auto link = [](const std::string& name, const std::string& target, char type) {
    std::string m = TarMember(name, "", 0777, type);
    std::snprintf(&m[157], 100, "%s", target.c_str());
    std::memset(&m[148], ' ', 8);
    unsigned sum = 0;
    for (size_t i = 0; i < 512; ++i) sum += static_cast<unsigned char>(m[i]);
    std::snprintf(&m[148], 8, "%06o", sum);
    return m;
  };
  const std::string end(1024, '\0');
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"dotdot", TarMember("../../../../../tmp/nsbox-adv-evil", "evil", 0644)},
      {"through-symlink", link("l", "/tmp", '2') + TarMember("l/nsbox-adv-evil", "evil", 0644)},
      {"through-relative-symlink",
       link("u", "../../../../../../tmp", '2') + TarMember("u/nsbox-adv-evil", "evil", 0644)},
      {"hardlink-absolute", link("h", "/etc/hostname", '1')},
      {"hardlink-dotdot", link("h", "../../../../etc/hostname", '1')},
      {"hardlink-through-symlink", link("l", "/etc", '2') + link("h", "l/hostname", '1')},
  };
  int n = 0;
  for (const auto& [what, members] : refused) {
    SCOPED_TRACE(what);
    const std::string name = "adv-evil-" + std::to_string(++n);
    Response r = Call("POST", "/v1/images/" + name, sh + members + end,
                      {{"Content-Type", "application/x-tar"}}, milliseconds(60000));
    EXPECT_EQ(r.status, 400) << r.Describe();
    EXPECT_EQ(r.ErrorCode(), "invalid_image") << r.Describe();
    EXPECT_EQ(Call("GET", "/v1/images/" + name).status, 404);
  }
  // An absolute name is taken as relative to the image's root; a device node is skipped.
  std::string dev = TarMember("evilblk", "", 0600, '4');
  Response ok = Call("POST", "/v1/images/adv-confined",
                     sh + TarMember("/tmp/nsbox-adv-evil", "inside", 0644) + dev + end,
                     {{"Content-Type", "application/x-tar"}}, milliseconds(60000));
  ASSERT_EQ(ok.status, 201) << ok.Describe();
  EXPECT_EQ(Arr(ok, "warnings").size(), 1u) << ok.Describe();
  const std::string root =
      daemon().state_dir() + "/images/content/" + Str(Obj(ok), "id") + "/rootfs";
  EXPECT_EQ(e2e::ReadHostFile(root + "/tmp/nsbox-adv-evil"), "inside");
  EXPECT_NE(access((root + "/evilblk").c_str(), F_OK), 0);
  EXPECT_NE(access("/tmp/nsbox-adv-evil", F_OK), 0) << "an entry reached the host's /tmp";
  EXPECT_EQ(Call("DELETE", "/v1/images/adv-confined").status, 204);
}

// ---- sizes ----

// JSON bodies over 1 MiB: 413 before the body is read (by Content-Length, also a huge one), or
// as soon as a chunked body passes the limit. Control: a body just under it is served.
TEST_F(ApiAbuseTest, OversizedBodiesAreRefused) {
  const std::string id = NewSandbox();
  const std::string stdin_ok(1000000, 's');
  ExecResult ok = Exec(id, json::object{{"command", "wc -c"}, {"stdin", stdin_ok}});
  EXPECT_EQ(ok.out(), "1000000\n") << "control";
  Response big = Call(
      "POST", SbPath(id, "/exec"),
      json::serialize(json::object{{"command", "wc -c"}, {"stdin", std::string(1100000, 's')}}),
      {{"Content-Type", "application/json"}});
  EXPECT_EQ(big.status, 413) << big.Describe();
  EXPECT_EQ(big.ErrorCode(), "payload_too_large");
  // A Content-Length of a terabyte, with no body sent: answered at once.
  RawConnection raw(daemon().endpoint());
  ASSERT_TRUE(raw.Send("POST " + SbPath(id, "/exec") +
                       " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: 1000000000000\r\n\r\n"));
  Response r = raw.ReadResponse(milliseconds(2000));
  EXPECT_EQ(r.status, 413) << r.Describe();
  // Chunked, growing past 1 MiB.
  RawConnection chunked(daemon().endpoint());
  std::string req = "POST " + SbPath(id, "/fs/exists") +
                    " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string piece(65536, ' ');
  ASSERT_TRUE(chunked.Send(req));
  for (int i = 0; i < 20; ++i) {
    if (!chunked.Send("10000\r\n" + piece + "\r\n")) break;
  }
  Response c = chunked.ReadResponse(milliseconds(5000));
  EXPECT_EQ(c.status, 413) << c.Describe();
  EXPECT_EQ(Sh(id, "echo alive"), "alive\n");
}

// Headers over 64 KiB (one big one, 10,000 small ones, a long URL): 431. Control: 60 KiB passes.
TEST_F(ApiAbuseTest, OversizedHeadersAreRefused) {
  EXPECT_EQ(
      Raw("GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(60000, 'a') + "\r\n\r\n"),
      (std::vector<std::string>{"200", "<open>"}))
      << "control";
  EXPECT_EQ(
      Raw("GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(70000, 'a') + "\r\n\r\n"),
      (std::vector<std::string>{"431", "<EOF>"}));
  std::string many = "GET /v1/health HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 10000; ++i) many += "X-" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(Raw(many + "\r\n"), (std::vector<std::string>{"431", "<EOF>"}));
  EXPECT_EQ(Raw("GET /v1/" + std::string(70000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n"),
            (std::vector<std::string>{"431", "<EOF>"}));
}

// ---- request smuggling ----

// Shapes a front end and nsboxd might read differently. Each is refused with 400 and the
// connection closed, and the request smuggled behind it (a PUT of a new sandbox) never runs.
// Control: the same PUT pipelined behind a well-formed request does run.
TEST_F(ApiAbuseTest, RequestSmugglingShapesAreRefused) {
  const std::string body = "{\"path\":\"/\"}";
  int n = 0;
  auto smuggled = [&](std::string* name) {
    *name = "smuggled-" + std::to_string(++n);
    return "PUT /v1/sandboxes/" + *name + " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
  };
  const std::string id = NewSandbox();
  const std::string post = "POST " + SbPath(id, "/fs/exists") + " HTTP/1.1\r\nHost: x\r\n";
  const std::vector<std::pair<std::string, std::string>> shapes = {
      {"CL and TE: chunked", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
      {"two different CLs", "Content-Length: 12\r\nContent-Length: 0\r\n\r\n" + body},
      {"TE: chunked, identity", "Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n"},
      {"TE: identity and CL", "Transfer-Encoding: identity\r\nContent-Length: 12\r\n\r\n" + body},
      {"TE: xchunked and CL", "Transfer-Encoding: xchunked\r\nContent-Length: 12\r\n\r\n" + body},
      {"CL: +12", "Content-Length: +12\r\n\r\n" + body},
      {"CL: 1 2", "Content-Length: 1 2\r\n\r\n" + body},
      {"CL: -1", "Content-Length: -1\r\n\r\n"},
      {"CL overflow", "Content-Length: 99999999999999999999999\r\n\r\n"},
      {"space before colon", "Content-Length : 12\r\n\r\n" + body},
      {"CR inside a value", "X-A: a\rContent-Length: 12\r\n\r\n" + body},
      {"NUL inside a value", std::string("X-A: a\0b\r\nContent-Length: 12\r\n\r\n", 33) + body},
      {"chunk size overflow",
       "Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff1\r\nabc\r\n0\r\n\r\n"},
      {"bare LF chunks", "Transfer-Encoding: chunked\r\n\r\nc\n" + body + "\n0\n\n"},
  };
  for (const auto& [what, rest] : shapes) {
    SCOPED_TRACE(what);
    std::string name;
    const std::string smug = smuggled(&name);
    std::vector<std::string> got = Raw(post + rest + smug);
    EXPECT_EQ(got, (std::vector<std::string>{"400", "<EOF>"}));
    EXPECT_FALSE(Exists(name)) << "the smuggled request ran";
  }
  // Control: pipelined behind a well-formed request, the PUT runs.
  std::string name;
  const std::string smug = smuggled(&name);
  EXPECT_EQ(Raw(post + "Content-Length: 12\r\n\r\n" + body + smug),
            (std::vector<std::string>{"200", "201", "<open>"}));
  EXPECT_TRUE(Exists(name)) << "control";
}

// Not HTTP/1.1 at all, or a method nobody routes: exact answers, the daemon unharmed.
TEST_F(ApiAbuseTest, StrangeRequestLinesAndMethods) {
  EXPECT_EQ(Raw("GET /v1/health\r\n\r\n"), (std::vector<std::string>{"400", "<EOF>"}));
  EXPECT_EQ(Raw("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), (std::vector<std::string>{"400", "<EOF>"}));
  EXPECT_EQ(Raw(std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11)),
            (std::vector<std::string>{"400", "<EOF>"}));
  EXPECT_EQ(Raw("GET /v1/health HTTP/1.0\r\n\r\n"), (std::vector<std::string>{"200", "<EOF>"}));
  EXPECT_EQ(Raw("TRACE /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"),
            (std::vector<std::string>{"405", "<open>"}));
  EXPECT_EQ(Raw("FOO /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"),
            (std::vector<std::string>{"405", "<open>"}));
  EXPECT_EQ(Raw("CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: x\r\n\r\n"),
            (std::vector<std::string>{"404", "<open>"}));
  // Absolute form is this daemon's own route (RFC 9112 §3.2.2), never a request forwarded to the
  // authority it names.
  EXPECT_EQ(Raw("GET http://127.0.0.1:22/v1/health HTTP/1.1\r\nHost: x\r\n\r\n"),
            (std::vector<std::string>{"200", "<open>"}));
  EXPECT_EQ(Raw("GET http://127.0.0.1:22/ HTTP/1.1\r\nHost: x\r\n\r\n"),
            (std::vector<std::string>{"404", "<open>"}));
  EXPECT_EQ(Raw("OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"),
            (std::vector<std::string>{"404", "<open>"}));
  // 200 pipelined requests in one write: 200 answers, in order.
  std::string many;
  for (int i = 0; i < 200; ++i) many += "GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n";
  std::vector<std::string> got = Raw(many);
  EXPECT_EQ(got.size(), 201u);
  EXPECT_EQ(std::count(got.begin(), got.end(), "200"), 200);
}

// ---- JSON and ids ----

// JSON bombs and wrong shapes: 400 invalid_request each, never a crash (the daemon's pid is
// checked after the case). Control: the well-formed request is served.
TEST_F(ApiAbuseTest, JsonBombsAndWrongShapes) {
  const std::string id = NewSandbox();
  auto post = [&](const std::string& body) {
    return Call("POST", SbPath(id, "/exec"), body, {{"Content-Type", "application/json"}});
  };
  EXPECT_EQ(post("{\"command\":\"echo ok\"}").status, 200) << "control";
  const std::vector<std::string> bad = {
      std::string(100000, '[') + std::string(100000, ']'),
      "{\"command\":" + std::string(50000, '[') + "\"x\"" + std::string(50000, ']') + "}",
      std::string(200000, '{'),
      "{\"command\":\"echo\",\"env\":" + std::string(5000, '{') + "}",
      "{\"command\":123}",
      "{\"command\":null}",
      "{\"command\":[\"echo\"]}",
      "{\"command\":\"echo\",\"timeoutMs\":-1}",
      "{\"command\":\"echo\",\"timeoutMs\":1e309}",
      "{\"command\":\"echo\",\"timeoutMs\":18446744073709551616}",
      "{\"command\":\"echo\",\"env\":{\"A\\u0000B\":\"c\"}}",
      "{\"command\":\"echo\",\"env\":{\"\":\"c\"}}",
      "{\"command\":\"echo\",\"env\":[1]}",
      "{\"command\":\"a\\u0000b\"}",
      "{\"command\":\"\xff\xfe\"}",
      "{\"command\":\"echo\"",
      "[]",
      "null",
      "",
  };
  for (const std::string& body : bad) {
    SCOPED_TRACE(body.substr(0, 80));
    Response r = post(body);
    EXPECT_EQ(r.status, 400) << r.Describe();
    EXPECT_EQ(r.ErrorCode(), "invalid_request") << r.Describe();
  }
  EXPECT_EQ(Sh(id, "echo alive"), "alive\n");
}

// Ids that look like paths (.., /, long, control characters): refused or hashed, never a path on
// the host. Control: every accepted id is one directory under state/sandboxes.
TEST_F(ApiAbuseTest, IdsThatLookLikePaths) {
  const std::vector<std::string> accepted = {"..",
                                             ".",
                                             "../../../../tmp/x",
                                             "a/../../b",
                                             "/",
                                             std::string(256, 'i'),
                                             "\xe2\x80\xae"
                                             "evil"};
  for (const std::string& id : accepted) {
    SCOPED_TRACE(PctEncode(id));
    Response r = Call("PUT", SbPath(id));
    EXPECT_EQ(r.status, 201) << r.Describe();
    const std::string dir = daemon().SandboxDir(id);
    EXPECT_EQ(dir.rfind(daemon().state_dir() + "/sandboxes/", 0), 0u) << dir;
    EXPECT_EQ(dir.find('/', daemon().state_dir().size() + 11), std::string::npos) << dir;
  }
  for (const std::string& id : {std::string(257, 'i'), std::string("a\nb"), std::string("a\0b", 3),
                                std::string("\x7f"), std::string(""), std::string("\xff")}) {
    SCOPED_TRACE(PctEncode(id));
    Response r = Call("PUT", SbPath(id));
    EXPECT_TRUE(r.status == 400 || r.status == 404) << r.Describe();
    if (r.status == 400) {
      EXPECT_EQ(r.ErrorCode(), "invalid_request");
    }
  }
  EXPECT_EQ(daemon().SandboxDirs().size(), accepted.size());
  EXPECT_NE(access("/tmp/x", F_OK), 0);
  // URL-level traversal.
  EXPECT_EQ(Call("GET", "/v1/sandboxes/../health").status, 404);
  EXPECT_EQ(Call("GET", "/v1/sandboxes/%zz").status, 400);
}

// An exec id of another sandbox, given to this sandbox's kill route: 404, and the other's
// command runs on. Control: killed through its own sandbox, it ends "cancelled".
TEST_F(ApiAbuseTest, AnotherSandboxsExecCannotBeKilled) {
  const std::string mine = NewSandbox("mine");
  const std::string theirs = NewSandbox("theirs");
  NdjsonStream s(daemon().endpoint(), "POST", SbPath(theirs, "/exec"),
                 "{\"command\":\"echo started; sleep 3; echo finished\"}");
  ASSERT_EQ(s.status(), 200);
  auto start = s.Next();
  ASSERT_TRUE(start.has_value());
  const std::string exec_id = Str(*start, "execId");
  Response wrong = Call("DELETE", SbPath(mine, "/execs/" + exec_id));
  EXPECT_EQ(wrong.status, 404) << wrong.Describe();
  EXPECT_TRUE(Arr(Call("GET", SbPath(mine, "/execs")), "execs").empty());
  Response list = Call("GET", SbPath(theirs, "/execs"));
  EXPECT_EQ(Arr(list, "execs").size(), 1u) << list.Describe();
  Response right = Call("DELETE", SbPath(theirs, "/execs/" + exec_id));
  EXPECT_EQ(right.status, 202) << "control";
  std::vector<json::object> rest = s.ReadAll();
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(Str(rest.back(), "reason"), "cancelled");
}

// ---- races ----

// PUT, exec, writeFile and DELETE of one id from 8 threads, 10,000 requests in all: every answer
// is one of the allowed ones (never 500), every 201 is matched by exactly one 204 of DELETE, and
// nothing is left behind (the after-case check).
TEST_F(ApiAbuseTest, ConcurrentCreateDeleteExecOnOneId) {
  const std::string id = "race-" + NewId();
  const std::string path = SbPath(id);
  std::atomic<int> created{0}, deleted{0}, total{0};
  std::mutex mu;
  std::map<std::string, int> seen;
  std::string unexpected;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  auto worker = [&](int t) {
    Client c(daemon().endpoint());
    for (int i = 0; total.fetch_add(1) < 10000 && Clock::now() < deadline; ++i) {
      const int op = (t + i) % 4;
      Response r;
      std::string what;
      if (op == 0) {
        r = c.Request("PUT", path);
        what = "PUT " + std::to_string(r.status);
        if (r.status == 201) ++created;
      } else if (op == 1) {
        r = c.PostJson(path + "/exec", json::object{{"command", "echo $((1+1))"}});
        what = "exec " + std::to_string(r.status);
        if (r.status == 200) {
          const json::object o = Obj(r);
          what += " " + Str(o, "reason");
        }
      } else if (op == 2) {
        r = c.Request("PUT", path + "/files?path=f", "data",
                      {{"Content-Type", "application/octet-stream"}});
        what = "write " + std::to_string(r.status);
      } else {
        r = c.Delete(path);
        what = "DELETE " + std::to_string(r.status);
        if (r.status == 204) ++deleted;
      }
      if (r.status >= 400) what += " " + r.ErrorCode();
      std::lock_guard<std::mutex> lock(mu);
      ++seen[what];
      const bool ok = what == "PUT 200" || what == "PUT 201" || what == "exec 200 exited" ||
                      what == "exec 200 stopped" || what == "exec 404 sandbox_not_found" ||
                      what == "write 204" || what == "write 404 sandbox_not_found" ||
                      what == "write 503 sandbox_unavailable" ||
                      what == "exec 503 sandbox_unavailable" || what == "DELETE 204" ||
                      what == "DELETE 404 sandbox_not_found";
      if (!ok && unexpected.size() < 4000) unexpected += what + ": " + r.Describe() + "\n";
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  std::string summary;
  for (const auto& [k, v] : seen) summary += k + " x" + std::to_string(v) + "\n";
  std::fprintf(stderr, "%d requests:\n%s", std::min(total.load(), 10000), summary.c_str());
  EXPECT_EQ(unexpected, "") << summary;
  const bool exists_now = Exists(id);
  EXPECT_EQ(created.load(), deleted.load() + (exists_now ? 1 : 0)) << summary;
  EXPECT_GT(created.load(), 10) << "control: the race created and deleted many times";
  EXPECT_GE(std::min(total.load(), 10000), 10000) << "fewer than 10,000 requests in 60 s";
}

}  // namespace
}  // namespace nsbox::adversarial
