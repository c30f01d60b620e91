// api.md's service and sandbox endpoints, and its bad-input contract, driven over the daemon's
// real Unix socket (and TCP with a bearer token): statuses, error codes, what is on disk, and
// that no error crashes the daemon or leaks a file descriptor.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

using std::chrono::milliseconds;

// Every error answer: the status, a JSON body with error.code and a non-empty message.
void ExpectError(const Response& r, int status, std::string_view code, std::string_view what) {
  EXPECT_EQ(r.status, status) << what << ": " << r.Describe();
  EXPECT_EQ(r.ErrorCode(), code) << what << ": " << r.Describe();
  EXPECT_FALSE(r.ErrorMessage().empty()) << what << ": error.message is empty: " << r.Describe();
  EXPECT_NE(r.Header("content-type").find("application/json"), std::string::npos)
      << what << ": " << r.Describe();
}

// Checks the shape of a sandbox object of api.md.
void ExpectSandbox(const json::object& sb, std::string_view id, std::string_view cwd) {
  EXPECT_EQ(Str(sb, "id"), id) << json::serialize(sb);
  const std::string state = Str(sb, "state");
  EXPECT_TRUE(state == "running" || state == "stopped") << json::serialize(sb);
  EXPECT_EQ(Str(sb, "image"), "host") << json::serialize(sb);
  EXPECT_EQ(Str(sb, "cwd"), cwd) << json::serialize(sb);
  EXPECT_TRUE(std::regex_match(Str(sb, "createdAt"),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")))
      << json::serialize(sb);
  EXPECT_TRUE(sb.contains("limits") && sb.at("limits").is_object()) << json::serialize(sb);
  EXPECT_EQ(Str(sb, "network"), "none") << json::serialize(sb);
}

class ApiTest : public E2eTest {};

// ---- service ----

TEST_F(ApiTest, HealthAnswersOkAndVersion) {
  Response r = client().Get("/v1/health");
  ASSERT_EQ(r.status, 200) << r.Describe();
  EXPECT_NE(r.Header("content-type").find("application/json"), std::string::npos);
  json::object o = Obj(r);
  ASSERT_TRUE(o.contains("ok")) << r.Describe();
  EXPECT_EQ(o.at("ok"), json::value(true)) << r.Describe();
  EXPECT_FALSE(Str(o, "version").empty());
  EXPECT_NE(Str(o, "version"), "<missing>") << r.Describe();
  // Keep-alive: a second request on the same connection.
  EXPECT_EQ(client().Get("/v1/health").status, 200);
}

TEST_F(ApiTest, SocketIsMode0660) {
  struct stat st;
  ASSERT_EQ(stat(daemon().socket_path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
}

TEST_F(ApiTest, MetricsIsPrometheusText) {
  const std::string id = NewId();
  Create(id);
  Sh(id, "true");
  Response r = client().Get("/metrics");
  ASSERT_EQ(r.status, 200) << r.Describe();
  EXPECT_EQ(r.Header("content-type").rfind("text/plain", 0), 0u) << r.Describe();
  EXPECT_NE(r.body.find("# TYPE "), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("# HELP "), std::string::npos) << r.body;
  // Latency histograms.
  EXPECT_NE(r.body.find("_bucket{"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("le=\"+Inf\""), std::string::npos) << r.body;
  // Every sample line is "name{labels} value" or "name value".
  std::regex sample(R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})? [-+0-9.eEInfaN]+( \d+)?$)");
  size_t start = 0;
  while (start < r.body.size()) {
    size_t end = r.body.find('\n', start);
    if (end == std::string::npos) end = r.body.size();
    std::string line = r.body.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line[0] == '#') continue;
    EXPECT_TRUE(std::regex_match(line, sample)) << "not a Prometheus sample: " << line;
  }
}

// ---- create, get, list ----

TEST_F(ApiTest, PutCreatesThenFindsAndIgnoresOptions) {
  const std::string id = NewId();
  Response created = client().PutJson(
      SbPath(id), json::object{{"cwd", "/root"}, {"env", json::object{{"FOO", "bar"}}}});
  ASSERT_EQ(created.status, 201) << created.Describe();
  json::object sb = Obj(created);
  ExpectSandbox(sb, id, "/root");

  Response again = client().PutJson(
      SbPath(id), json::object{{"cwd", "/tmp"}, {"env", json::object{{"FOO", "other"}}}});
  ASSERT_EQ(again.status, 200) << again.Describe();
  json::object sb2 = Obj(again);
  ExpectSandbox(sb2, id, "/root");
  EXPECT_EQ(Str(sb2, "createdAt"), Str(sb, "createdAt"));

  // Without a body, too.
  Response third = client().Request("PUT", SbPath(id));
  EXPECT_EQ(third.status, 200) << third.Describe();

  // The creation options hold, the later ones were ignored.
  EXPECT_EQ(Sh(id, "pwd; echo $FOO"), "/root\nbar\n");
  EXPECT_EQ(daemon().SandboxDirs().size(), 1u);
}

TEST_F(ApiTest, PutWithoutBodyUsesDefaults) {
  const std::string id = NewId();
  Response r = client().Request("PUT", SbPath(id));
  ASSERT_EQ(r.status, 201) << r.Describe();
  ExpectSandbox(Obj(r), id, "/workspace");
  EXPECT_EQ(Sh(id, "pwd"), "/workspace\n");
}

TEST_F(ApiTest, GetOneAndList) {
  const std::string a = NewId("a"), b = NewId("b");
  json::object ca = Obj(Create(a));
  Create(b);
  Response one = client().Get(SbPath(a));
  ASSERT_EQ(one.status, 200) << one.Describe();
  json::object got = Obj(one);
  ExpectSandbox(got, a, "/workspace");
  EXPECT_EQ(Str(got, "createdAt"), Str(ca, "createdAt"));

  Response all = client().Get("/v1/sandboxes");
  ASSERT_EQ(all.status, 200) << all.Describe();
  json::object o = Obj(all);
  ASSERT_TRUE(o.contains("sandboxes") && o.at("sandboxes").is_array()) << all.Describe();
  std::multiset<std::string> ids;
  for (const auto& v : o.at("sandboxes").as_array()) {
    ASSERT_TRUE(v.is_object());
    ExpectSandbox(v.as_object(), Str(v.as_object(), "id"), "/workspace");
    ids.insert(Str(v.as_object(), "id"));
  }
  EXPECT_EQ(ids, (std::multiset<std::string>{a, b}));
}

TEST_F(ApiTest, EmptyListIsAnEmptyArray) {
  Response all = client().Get("/v1/sandboxes");
  ASSERT_EQ(all.status, 200) << all.Describe();
  json::object o = Obj(all);
  ASSERT_TRUE(o.contains("sandboxes") && o.at("sandboxes").is_array()) << all.Describe();
  EXPECT_TRUE(o.at("sandboxes").as_array().empty());
}

// ---- ids ----

TEST_F(ApiTest, InvalidIdsAre400AndCreateNothing) {
  const std::vector<std::string> bad = {
      std::string(257, 'a'),
      "a\x01"
      "b",
      "tab\there",
      "new\nline",
      "nul" + std::string(1, '\0') + "x",
      "del\x7f",
      "\x1f",
      "c1\xc2\x85",
      "bad\xff",
      "trunc\xc3",
      "overlong\xc0\xaf",
      "surrogate\xed\xa0\x80",
      "\xf8\x88\x80\x80\x80",
  };
  for (const std::string& id : bad) {
    SCOPED_TRACE("id " + PctEncode(id));
    ExpectError(client().Request("PUT", SbPath(id)), 400, "invalid_request", "PUT");
    ExpectError(client().Get(SbPath(id)), 400, "invalid_request", "GET");
    ExpectError(client().PostJson(SbPath(id, "/exec"), json::object{{"command", "true"}}), 400,
                "invalid_request", "exec");
    ExpectError(client().Delete(SbPath(id)), 400, "invalid_request", "DELETE");
  }
  // The message names the character and where it is.
  for (const auto& [id, shown] : std::vector<std::pair<std::string, std::string>>{
           {std::string("a\x01") + "z", "(0x01 at byte 1)"},
           {"c1\xc2\x85", "(U+0085 at byte 2)"}}) {
    Response r = client().Request("PUT", SbPath(id));
    EXPECT_NE(r.ErrorMessage().find(shown), std::string::npos) << r.Describe();
  }
  // The empty id.
  ExpectError(client().Request("PUT", "/v1/sandboxes/"), 400, "invalid_request", "PUT empty id");
  EXPECT_TRUE(daemon().SandboxDirs().empty());
  Response all = client().Get("/v1/sandboxes");
  EXPECT_EQ(Obj(all)["sandboxes"].as_array().size(), 0u) << all.Describe();
  ExpectDaemonHealthy();
}

TEST_F(ApiTest, IdOf256BytesIsValid) {
  // 256 bytes, multi-byte characters included: 2 + 254.
  const std::string id = "\xc3\xa9" + std::string(254, 'x');
  ASSERT_EQ(id.size(), 256u);
  Response r = client().Request("PUT", SbPath(id));
  ASSERT_EQ(r.status, 201) << r.Describe();
  EXPECT_EQ(Str(Obj(r), "id"), id);
  EXPECT_EQ(client().Get(SbPath(id)).status, 200);
}

TEST_F(ApiTest, IdsWithSlashesDotsAndUnicodeAreDistinctSandboxes) {
  const std::vector<std::string> ids = {
      "conv/42", "conv", "..",   ".",        "../..",       "../../etc", "a/../b",
      "b",       "%2F",  "100%", "日本語-🎉", "a b?c#d&e=f", "sandboxes", "~root",
  };
  for (const auto& id : ids) {
    Response r = client().Request("PUT", SbPath(id));
    ASSERT_EQ(r.status, 201) << "id " << id << ": " << r.Describe();
    EXPECT_EQ(Str(Obj(r), "id"), id);
    // Each gets a file with its own id.
    Response put = PutFile(id, "/workspace/id.txt", id);
    EXPECT_EQ(put.status, 204) << "id " << id << ": " << put.Describe();
  }
  for (const auto& id : ids) {
    Response g = client().Get(SbPath(id));
    EXPECT_EQ(g.status, 200) << "id " << id << ": " << g.Describe();
    EXPECT_EQ(Str(Obj(g), "id"), id);
    Response f = GetFile(id, "/workspace/id.txt");
    EXPECT_EQ(f.status, 200) << f.Describe();
    EXPECT_EQ(f.body, id) << "sandboxes share a workspace";
  }
  // One directory each, named by a hash: no id appears as a host file name.
  std::vector<std::string> dirs = daemon().SandboxDirs();
  EXPECT_EQ(dirs.size(), ids.size());
  for (const auto& d : dirs) {
    for (const auto& id : ids) {
      if (id.size() > 2) {
        EXPECT_EQ(d.find(id), std::string::npos) << d << " holds id " << id;
      }
    }
    EXPECT_NE(d, "..");
    EXPECT_NE(d, ".");
  }
  for (const auto& id : ids) EXPECT_FALSE(daemon().SandboxDir(id).empty()) << id;
  // Nothing appeared on the host by the ids' names.
  for (const auto& e : {"/etc/b", "/etc/conv"}) {
    struct stat st;
    EXPECT_NE(lstat(e, &st), 0) << e << " was created on the host";
  }
  // The list holds each exactly once.
  std::multiset<std::string> listed;
  for (const auto& v : Arr(client().Get("/v1/sandboxes"), "sandboxes")) {
    listed.insert(Str(v.as_object(), "id"));
  }
  EXPECT_EQ(listed, std::multiset<std::string>(ids.begin(), ids.end()));
  // A slash that is not encoded is a path separator, not part of an id: no such route.
  Response raw = client().Get("/v1/sandboxes/conv/42");
  EXPECT_EQ(raw.status, 404) << raw.Describe();
}

// ---- unknown things ----

TEST_F(ApiTest, UnknownSandboxIs404SandboxNotFound) {
  const std::string id = NewId("missing");
  const std::string p = SbPath(id);
  ExpectError(client().Get(p), 404, "sandbox_not_found", "GET");
  ExpectError(client().Delete(p), 404, "sandbox_not_found", "DELETE");
  ExpectError(client().Request("POST", p + "/stop"), 404, "sandbox_not_found", "stop");
  ExpectError(client().PostJson(p + "/exec", json::object{{"command", "true"}}), 404,
              "sandbox_not_found", "exec");
  ExpectError(client().Get(p + "/execs"), 404, "sandbox_not_found", "execs");
  ExpectError(client().Delete(p + "/execs/e-1"), 404, "sandbox_not_found", "cancel");
  ExpectError(GetFile(id, "/workspace/a"), 404, "sandbox_not_found", "GET file");
  ExpectError(PutFile(id, "/workspace/a", "x"), 404, "sandbox_not_found", "PUT file");
  for (const char* verb : {"stat", "readdir", "exists", "mkdir", "rm"}) {
    ExpectError(Fs(id, verb, json::object{{"path", "/workspace"}}), 404, "sandbox_not_found", verb);
  }
  // Streaming exec, too.
  NdjsonStream s(daemon().endpoint(), "POST", p + "/exec", R"({"command":"true"})");
  EXPECT_EQ(s.status(), 404) << s.error();
  // None of them created it.
  EXPECT_EQ(client().Get(p).status, 404);
  EXPECT_TRUE(daemon().SandboxDirs().empty());
}

TEST_F(ApiTest, UnknownRouteIs404NotFound) {
  const std::string id = NewId();
  Create(id);
  for (const char* target : {"/", "/v1", "/v1/", "/v2/health", "/v1/nope", "/v1/healthz",
                             "/metricsx", "/v1/sandboxes/x/y/z/w"}) {
    ExpectError(client().Get(target), 404, "not_found", target);
  }
  ExpectError(client().Get(SbPath(id, "/nope")), 404, "not_found", "sandbox subroute");
  ExpectError(client().PostJson(SbPath(id, "/fs/chmod"), json::object{{"path", "a"}}), 404,
              "not_found", "fs/chmod");
  ExpectError(client().PostJson(SbPath(id, "/fs"), json::object{{"path", "a"}}), 404, "not_found",
              "fs");
  // An exec id that is not running: exec.md's code, not the unknown route's.
  ExpectError(client().Delete(SbPath(id, "/execs/e-doesnotexist")), 404, "exec_not_found",
              "cancel of an unknown exec");
}

// RFC 9112 §3.2.2: a server MUST accept a request target in absolute form; it is routed on its
// path and query (the scheme in any case). One that is malformed is a 400.
TEST_F(ApiTest, AbsoluteFormTargetsAreRoutedOnTheirPath) {
  const std::string id = NewId();
  Create(id);
  Response health = client().Get("http://x/v1/health");
  EXPECT_EQ(health.status, 200) << health.Describe();
  EXPECT_EQ(Field(Obj(health), "ok"), json::value(true)) << health.Describe();
  EXPECT_EQ(client().Get("HTTP://localhost:7711/metrics").status, 200);
  Response one = client().Get("https://[::1]:1" + SbPath(id));
  EXPECT_EQ(Str(Obj(one), "id"), id) << one.Describe();
  Response put = client().Request("PUT", "http://x" + SbPath(id, "/files?path=a%20b"), "abs");
  EXPECT_EQ(put.status, 204) << put.Describe();
  EXPECT_EQ(client().Get(SbPath(id, "/files?path=a+b")).body, "abs");
  EXPECT_EQ(client().Get("http://x:80" + SbPath(id, "/files?path=a%20b")).body, "abs");
  // An empty path is "/" (RFC 9112 §3.2.1), which is no route.
  ExpectError(client().Get("http://x"), 404, "not_found", "empty path");
  ExpectError(client().Get("http://x?y=1"), 404, "not_found", "empty path with a query");
  ExpectError(client().Get("http://x/v1/nope"), 404, "not_found", "unknown route");
  for (const char* bad : {"http:/v1/health", "http:///v1/health", "http://:80/v1/health",
                          "http://user@x/v1/health", "ftp://x/v1/health", "http://x:y/v1/health",
                          "http://[::1/v1/health", "http://x/v1/health#top"}) {
    ExpectError(client().Get(bad), 400, "invalid_request", bad);
  }
  ExpectDaemonHealthy();
}

TEST_F(ApiTest, WrongMethodIs405) {
  const std::string id = NewId();
  Create(id);
  ASSERT_EQ(client().Request("PUT", SbPath(id, "/files?path=a"), "kept").status, 204);
  struct Case {
    const char* method;
    std::string target;
  };
  const std::vector<Case> cases = {
      {"POST", "/v1/health"},
      {"DELETE", "/v1/health"},
      {"POST", "/metrics"},
      {"DELETE", "/v1/sandboxes"},
      {"PUT", "/v1/sandboxes"},
      {"POST", "/v1/sandboxes"},
      {"POST", SbPath(id)},
      {"PATCH", SbPath(id)},
      {"GET", SbPath(id, "/exec")},
      {"PUT", SbPath(id, "/exec")},
      {"GET", SbPath(id, "/stop")},
      {"DELETE", SbPath(id, "/stop")},
      {"POST", SbPath(id, "/execs")},
      {"POST", SbPath(id, "/files?path=a")},
      {"DELETE", SbPath(id, "/files?path=a")},
      {"GET", SbPath(id, "/fs/stat")},
      {"PUT", SbPath(id, "/fs/readdir")},
      {"GET", SbPath(id, "/fs/exists")},
      {"DELETE", SbPath(id, "/fs/rm")},
      // Methods whose names are parts of an allowed one's: never taken for it.
      {"T", SbPath(id, "/files?path=a")},
      {"UT", SbPath(id, "/files?path=a")},
      {"PU", SbPath(id)},
      {"ELETE", SbPath(id)},
      {"P", SbPath(id, "/exec")},
      {"OST", SbPath(id, "/fs/rm")},
      {"GE", SbPath(id, "/execs")},
  };
  for (const auto& c : cases) {
    ExpectError(client().Request(c.method, c.target), 405, "method_not_allowed",
                std::string(c.method) + " " + c.target);
  }
  // Nothing was deleted or changed by them.
  EXPECT_EQ(client().Get(SbPath(id)).status, 200);
  EXPECT_EQ(client().Get(SbPath(id, "/files?path=a")).body, "kept");
}

// RFC 9110 §8.6: a 204 carries no Content-Length; the connection serves the next request.
TEST_F(ApiTest, NoContentAnswersHaveNoLength) {
  const std::string id = NewId();
  Create(id);
  std::vector<Response> answers;
  answers.push_back(client().Request("PUT", SbPath(id, "/files?path=a"), "x"));
  answers.push_back(client().PostJson(SbPath(id, "/fs/mkdir"), json::object{{"path", "d"}}));
  answers.push_back(client().Delete(SbPath(id)));
  for (const Response& r : answers) {
    EXPECT_EQ(r.status, 204) << r.Describe();
    EXPECT_EQ(r.headers.count("content-length"), 0u) << r.Describe();
  }
  EXPECT_EQ(client().Get("/v1/health").status, 200);
}

// Flue's contract: never silently ignore an option. An unknown key of a body is a 400 that names
// it, and nothing is done.
TEST_F(ApiTest, UnknownOptionsAreRefusedNotIgnored) {
  const std::string id = NewId();
  Create(id);
  ASSERT_EQ(client().Request("PUT", SbPath(id, "/files?path=keep"), "x").status, 204);
  struct Case {
    std::string target;
    json::object body;
  };
  const std::string fresh = NewId();
  const std::vector<Case> cases = {
      {SbPath(fresh), {{"bogus", 1}}},
      {SbPath(id), {{"cwd", "/workspace"}, {"memoryBytes", 1}}},
      {SbPath(id, "/exec"), {{"command", "touch /workspace/ran"}, {"timeout", 5}}},
      {SbPath(id, "/fs/rm"), {{"path", "keep"}, {"dryRun", true}}},
      {SbPath(id, "/fs/mkdir"), {{"path", "made"}, {"mode", 448}}},
      {SbPath(id, "/fs/readdir"), {{"path", "/workspace"}, {"recursive", true}}},
      {SbPath(id, "/fs/stat"), {{"path", "keep"}, {"bigint", true}}},
      {SbPath(id, "/fs/exists"), {{"path", "keep"}, {"withTypes", true}}},
  };
  for (const Case& c : cases) {
    const std::string method =
        c.target.find("/fs/") == std::string::npos && c.target.find("/exec") == std::string::npos
            ? "PUT"
            : "POST";
    Response r = client().Request(method, c.target, json::serialize(c.body),
                                  {{"Content-Type", "application/json"}});
    EXPECT_EQ(r.status, 400) << c.target << ": " << r.Describe();
    EXPECT_EQ(r.ErrorCode(), "invalid_request") << c.target;
    const std::string key = std::string(c.body.rbegin()->key());
    EXPECT_NE(r.ErrorMessage().find("unknown option \"" + key + "\""), std::string::npos)
        << r.Describe();
  }
  EXPECT_EQ(client().Get(SbPath(fresh)).status, 404) << "a refused PUT created nothing";
  EXPECT_EQ(Sh(id, "ls /workspace"), "keep\n") << "a refused request did something";
}

// The same for a query: a parameter that the route does not take is a 400 naming it and the ones
// it takes, a repeated one is a 400 (never the last one silently), and nothing is done.
TEST_F(ApiTest, UnknownOrRepeatedQueryParametersAreRefused) {
  const std::string id = NewId();
  Create(id);
  ASSERT_EQ(client().Request("PUT", SbPath(id, "/files?path=keep"), "x").status, 204);
  struct Case {
    std::string method;
    std::string target;
    std::string message;  // a part of error.message
  };
  const std::vector<Case> cases = {
      {"PUT", SbPath(id, "/files?path=t1&mdoe=700"),
       "unknown query parameter \"mdoe\" for PUT /v1/sandboxes/{id}/files (path, pathBase64, "
       "mode)"},
      {"PUT", SbPath(id, "/files?path=t2&mode=700&path=t3"),
       "query parameter \"path\" is given more than once"},
      {"PUT", SbPath(id, "/files?path=t4&mode=%zz"), "malformed percent-encoding in the query"},
      {"GET", SbPath(id, "/files?path=keep&mode=644"),
       "unknown query parameter \"mode\" for GET /v1/sandboxes/{id}/files (path, pathBase64)"},
      {"GET", SbPath(id, "/files?path=keep&path=keep"), "is given more than once"},
      {"GET", SbPath(id, "/execs?all=1&al=1"), "unknown query parameter \"al\""},
      {"GET", SbPath(id, "/execs/e-none/output?follow=1&folow=1"),
       "unknown query parameter \"folow\" for GET /v1/sandboxes/{id}/execs/{execId}/output "
       "(offset, follow, encoding)"},
      {"GET", "/v1/health?verbose=1",
       "unknown query parameter \"verbose\" for GET /v1/health, "
       "which takes none"},
      {"GET", "/metrics?x", "unknown query parameter \"x\""},
      {"DELETE", SbPath(id, "?force=1"), "unknown query parameter \"force\""},
      {"POST", SbPath(id, "/fs/mkdir?recursive=1"), "unknown query parameter \"recursive\""},
  };
  for (const Case& k : cases) {
    Response r = client().Request(
        k.method, k.target, k.target.find("/fs/") != std::string::npos ? R"({"path":"m"})" : "");
    ExpectError(r, 400, "invalid_request", k.method + " " + k.target);
    EXPECT_NE(r.ErrorMessage().find(k.message), std::string::npos)
        << k.method << " " << k.target << ": " << r.Describe();
  }
  EXPECT_EQ(client().Get(SbPath(id)).status, 200) << "a refused DELETE deleted";
  EXPECT_EQ(Sh(id, "ls /workspace"), "keep\n") << "a refused request did something";
  // What clients send still works: an escaped key, '+' for a space, an empty pair.
  EXPECT_EQ(client().Request("PUT", SbPath(id, "/files?p%61th=a+b&&mode=700&"), "y").status, 204);
  EXPECT_EQ(Sh(id, "stat -c %a 'a b'"), "700\n");
  EXPECT_EQ(client().Get(SbPath(id, "/files?pathBase64=") + PctEncode(Base64Encode("a b"))).body,
            "y");
}

// A limit the API takes is one a sandbox can start with: pids 1 (nsbox-init alone) is refused
// at the PUT, not accepted and then answered 503 at every use; the largest CPU limit starts.
TEST_F(ApiTest, LimitsThePutTakesAreLimitsASandboxStartsWith) {
  const std::string refused = NewId();
  Response one = client().Request("PUT", SbPath(refused),
                                  json::serialize(json::object{{"limits", {{"pids", 1}}}}),
                                  {{"Content-Type", "application/json"}});
  EXPECT_EQ(one.status, 400) << one.Describe();
  EXPECT_EQ(one.ErrorCode(), "invalid_request");
  EXPECT_NE(one.ErrorMessage().find("\"pids\""), std::string::npos) << one.Describe();
  EXPECT_EQ(client().Get(SbPath(refused)).status, 404) << "a refused PUT created nothing";
  for (const json::object& limits :
       {json::object{{"pids", 2}}, json::object{{"cpus", 4096}}, json::object{{"cpus", 0.01}}}) {
    const std::string id = NewId();
    Response put =
        client().Request("PUT", SbPath(id), json::serialize(json::object{{"limits", limits}}),
                         {{"Content-Type", "application/json"}});
    ASSERT_EQ(put.status, 201) << json::serialize(limits) << ": " << put.Describe();
    // nsbox-init's own threads count in the pids limit: right after the start they may leave
    // no pid for a command of a sandbox limited to 2 (which then fails to start, and says so);
    // they end within seconds.
    ExecResult r;
    const auto deadline = std::chrono::steady_clock::now() + milliseconds(10000);
    do {
      r = Exec(id, "echo started");
      ASSERT_EQ(r.response.status, 200) << json::serialize(limits) << ": " << r.Describe();
      if (r.exit_code() == 0) break;
      EXPECT_NE(r.err().find("pids limit"), std::string::npos) << r.Describe();
      std::this_thread::sleep_for(milliseconds(200));
    } while (std::chrono::steady_clock::now() < deadline);
    EXPECT_EQ(r.out(), "started\n") << json::serialize(limits) << ": " << r.Describe();
  }
}

// ---- malformed input ----

TEST_F(ApiTest, MalformedJsonIs400) {
  const std::string id = NewId();
  Create(id);
  const Headers json_type = {{"Content-Type", "application/json"}};
  const std::vector<std::string> bodies = {
      "{",
      "not json",
      "{\"command\": \"echo hi\"",  // truncated
      "{\"command\": \"ech",        // truncated inside a string
      "{\"command\": 42}",
      "{\"command\": null}",
      "[]",
      "\"echo\"",
      "{}",
      "{\"command\": \"true\", \"timeoutMs\": \"soon\"}",
      "{\"command\": \"true\", \"env\": [\"A=1\"]}",
      "{\"command\": \"true\", \"env\": {\"A\": 1}}",
      "{\"command\": \"true\", \"cwd\": 7}",
      "{\"command\": \"true\", \"stdin\": {}}",
      "{\"command\": \"true\"} trailing",
      "{\"command\": \"\xff\"}",  // invalid UTF-8 in JSON
  };
  for (const auto& body : bodies) {
    ExpectError(client().Request("POST", SbPath(id, "/exec"), body, json_type), 400,
                "invalid_request", "exec body " + body);
  }
  Response not_utf8 =
      client().Request("POST", SbPath(id, "/exec"), "{\"command\": \"\xff\"}", json_type);
  EXPECT_NE(not_utf8.ErrorMessage().find("not UTF-8"), std::string::npos) << not_utf8.Describe();
  // Where the parse stopped: inside the body, or at its end when it is cut short.
  Response bad_byte =
      client().Request("POST", SbPath(id, "/exec"), "{\"command\": tru}", json_type);
  EXPECT_NE(bad_byte.ErrorMessage().find("at byte 12"), std::string::npos) << bad_byte.Describe();
  Response cut = client().Request("POST", SbPath(id, "/exec"), "{\"command\": \"ech", json_type);
  EXPECT_NE(cut.ErrorMessage().find("at its end (byte 16)"), std::string::npos) << cut.Describe();
  Response extra =
      client().Request("POST", SbPath(id, "/exec"), "{\"command\": \"true\"} trailing", json_type);
  EXPECT_NE(extra.ErrorMessage().find("at byte 20"), std::string::npos) << extra.Describe();
  for (const char* verb : {"stat", "readdir", "exists", "mkdir", "rm"}) {
    for (const std::string body : {"{", "{}", "{\"path\": 5}", "[\"/workspace\"]"}) {
      ExpectError(client().Request("POST", SbPath(id, std::string("/fs/") + verb), body, json_type),
                  400, "invalid_request", std::string(verb) + " body " + body);
    }
  }
  // A sandbox PUT with a bad body creates nothing.
  const std::string other = NewId("other");
  for (const std::string body : {"{", "{\"cwd\": 5}", "{\"limits\": {\"memoryBytes\": \"lots\"}}",
                                 "[1]", "{\"env\": {\"A\": 5}}", "{\"image\": 5}"}) {
    ExpectError(client().Request("PUT", SbPath(other), body, json_type), 400, "invalid_request",
                "PUT body " + body);
  }
  ExpectError(client().Get(SbPath(other)), 404, "sandbox_not_found", "after bad PUTs");
  EXPECT_EQ(daemon().SandboxDirs().size(), 1u);
  // The connection and the daemon still work.
  EXPECT_EQ(Sh(id, "echo ok"), "ok\n");
}

// A lone UTF-16 surrogate escape, which JavaScript's JSON.stringify writes for a string cut in the
// middle of a pair: U+FFFD (EF BF BD), as Node's child_process and fs write such a string, in a
// command, its environment and a path; a pair is kept whole, and a body with a lone surrogate and
// a real mistake is still refused.
TEST_F(ApiTest, ALoneSurrogateEscapeIsUfffdAsNodeWritesIt) {
  const std::string id = NewId();
  Create(id);
  const Headers json_type = {{"Content-Type", "application/json"}};
  Response r = client().Request(
      "POST", SbPath(id, "/exec"),
      R"({"command": "printf '%s|%s|%s' 'a\ud800b' \"$V\" '\ud83d\ude00' | od -An -tx1",)"
      R"( "env": {"V": "\udc00"}})",
      json_type);
  ASSERT_EQ(r.status, 200) << r.Describe();
  std::string hex = Str(Obj(r), "stdout");
  hex.erase(std::remove(hex.begin(), hex.end(), '\n'), hex.end());
  EXPECT_EQ(hex, " 61 ef bf bd 62 7c ef bf bd 7c f0 9f 98 80") << r.Describe();
  Response made = client().Request("POST", SbPath(id, "/fs/mkdir"),
                                   R"({"path": "/workspace/d\udbff"})", json_type);
  EXPECT_EQ(made.status, 204) << made.Describe();
  EXPECT_EQ(Sh(id, "ls /workspace | od -An -tx1 | tr -d '\\n'"), " 64 ef bf bd 0a");
  ExpectError(
      client().Request("POST", SbPath(id, "/exec"), R"({"command": "\ud800", })", json_type), 400,
      "invalid_request", "a lone surrogate and a trailing comma");
}

TEST_F(ApiTest, JsonBodyOver1MiBIs413) {
  const std::string id = NewId();
  Create(id);
  const Headers json_type = {{"Content-Type", "application/json"}};
  // One byte over: 1 MiB + 1.
  const std::string prefix = "{\"command\":\"wc -c\",\"stdin\":\"";
  const std::string suffix = "\"}";
  std::string over =
      prefix + std::string((1 << 20) + 1 - prefix.size() - suffix.size(), 'x') + suffix;
  ASSERT_EQ(over.size(), (1u << 20) + 1);
  ExpectError(client().Request("POST", SbPath(id, "/exec"), over, json_type), 413,
              "payload_too_large", "exec 1 MiB + 1");
  // Exactly 1 MiB is accepted.
  std::string exact = prefix + std::string((1 << 20) - prefix.size() - suffix.size(), 'x') + suffix;
  ASSERT_EQ(exact.size(), 1u << 20);
  Response ok = client().Request("POST", SbPath(id, "/exec"), exact, json_type);
  ASSERT_EQ(ok.status, 200) << ok.Describe();
  EXPECT_EQ(Str(Obj(ok), "stdout"),
            std::to_string((1 << 20) - prefix.size() - suffix.size()) + "\n");

  // A PUT of a sandbox with a huge body creates nothing.
  const std::string other = NewId("other");
  std::string big = "{\"env\":{\"A\":\"" + std::string(2 << 20, 'y') + "\"}}";
  ExpectError(client().Request("PUT", SbPath(other), big, json_type), 413, "payload_too_large",
              "PUT 2 MiB");
  EXPECT_EQ(client().Get(SbPath(other)).status, 404);
  ExpectError(client().Request("POST", SbPath(id, "/fs/stat"), big, json_type), 413,
              "payload_too_large", "stat 2 MiB");

  // "read no further": a Content-Length of 1 GiB with only a few bytes sent is refused at once.
  RawConnection raw(daemon().endpoint());
  ASSERT_TRUE(raw.connected()) << raw.error();
  ASSERT_TRUE(raw.Send("POST " + SbPath(id, "/exec") +
                       " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: 1073741824\r\n\r\n{\"command\":\"true\",\"stdin\":\""));
  Response early = raw.ReadResponse(milliseconds(5000));
  ExpectError(early, 413, "payload_too_large", "Content-Length 1 GiB");

  // Chunked, without a length: refused once over the limit.
  RawConnection chunked(daemon().endpoint());
  std::string req = "POST " + SbPath(id, "/exec") +
                    " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n";
  ASSERT_TRUE(chunked.Send(req));
  std::string piece(64 * 1024, 'z');
  char size_line[32];
  std::snprintf(size_line, sizeof(size_line), "%zx\r\n", piece.size());
  bool sent_all = true;
  for (int i = 0; i < 24 && sent_all; ++i) {
    sent_all = chunked.Send(std::string(size_line) + piece + "\r\n", milliseconds(5000));
  }
  Response r = chunked.ReadResponse(milliseconds(5000));
  ExpectError(r, 413, "payload_too_large", "chunked 1.5 MiB");
  ExpectDaemonHealthy();
}

TEST_F(ApiTest, PathWithNulIs400ButExistsIsFalse) {
  const std::string id = NewId();
  Create(id);
  const std::string nul_path = std::string("/workspace/a") + '\0' + "b";
  for (const char* verb : {"stat", "readdir", "mkdir", "rm"}) {
    ExpectError(Fs(id, verb, json::object{{"path", nul_path}}), 400, "invalid_request", verb);
  }
  Response ex = Fs(id, "exists", json::object{{"path", nul_path}});
  ASSERT_EQ(ex.status, 200) << ex.Describe();
  EXPECT_EQ(Obj(ex)["exists"], json::value(false)) << ex.Describe();
  ExpectError(GetFile(id, nul_path), 400, "invalid_request", "GET file");
  ExpectError(PutFile(id, nul_path, "x"), 400, "invalid_request", "PUT file");
  Response exec = Exec(id, json::object{{"command", "true"}, {"cwd", nul_path}}).response;
  EXPECT_TRUE(exec.status == 400 || (exec.status == 200 && Obj(exec)["exitCode"] == 1))
      << exec.Describe();
  // A sandbox's cwd: the message says what is wrong with it.
  Response made = client().PutJson(SbPath(NewId()), json::object{{"cwd", nul_path}});
  ExpectError(made, 400, "invalid_request", "PUT with a cwd that has a NUL");
  EXPECT_NE(made.ErrorMessage().find("NUL"), std::string::npos) << made.Describe();
  // Nothing named a or a\0b appeared.
  EXPECT_EQ(Sh(id, "ls -A /workspace"), "");
}

// ---- robustness: errors and broken connections leak nothing ----

TEST_F(ApiTest, BadRequestsNeitherCrashNorLeakFds) {
  const std::string id = NewId();
  Create(id);
  Sh(id, "true");
  PutFile(id, "/workspace/f", "x");
  ASSERT_TRUE(WaitPoolFull(client()));  // refilled after the sandbox took its jail
  client().Disconnect();
  std::this_thread::sleep_for(milliseconds(200));
  const int baseline = daemon().CountFds();
  ASSERT_GT(baseline, 0);
  const std::string exec_path = SbPath(id, "/exec");

  for (int round = 0; round < 3; ++round) {
    Client c = NewClient();
    c.Request("PUT", "/v1/sandboxes/" + std::string(300, 'x'));
    c.Get(SbPath("nope-" + std::to_string(round)));
    c.Get("/v1/nope");
    c.Request("POST", "/v1/health");
    c.Request("POST", exec_path, "{", {{"Content-Type", "application/json"}});
    c.Request("POST", exec_path, std::string(2 << 20, '{'), {{"Content-Type", "application/json"}});
    c.PostJson(SbPath(id, "/fs/stat"), json::object{{"path", std::string("a\0b", 3)}});
    c.Get(SbPath(id, "/files?path=/workspace/missing"));
    c.Get(SbPath(id, "/files?path=/workspace"));
    c.PostJson(SbPath(id, "/fs/rm"), json::object{{"path", "/workspace/missing"}});

    // Raw abuses on fresh connections.
    const std::vector<std::string> garbage = {
        "GARBAGE\r\n\r\n",
        "GET /v1/health HTTP/1.1\r\nBad Header Line\r\n\r\n",
        "GET /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        "POST /v1/health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  // a TLS ClientHello
    };
    for (const auto& g : garbage) {
      RawConnection raw(daemon().endpoint());
      raw.Send(g);
      Response r = raw.ReadResponse(milliseconds(3000));
      if (r.status != 0) {
        EXPECT_GE(r.status, 400) << PctEncode(g) << ": " << r.Describe();
        EXPECT_LT(r.status, 500) << PctEncode(g) << ": " << r.Describe();
      }
      EXPECT_TRUE(raw.WaitClosed(milliseconds(5000)))
          << "the daemon kept a connection open after " << PctEncode(g);
    }
    // A header line of 1 MiB.
    {
      RawConnection raw(daemon().endpoint());
      raw.Send(
          "GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(1 << 20, 'h') + "\r\n\r\n",
          milliseconds(5000));
      Response r = raw.ReadResponse(milliseconds(3000));
      if (r.status != 0) {
        EXPECT_GE(r.status, 400) << r.Describe();
      }
      raw.WaitClosed(milliseconds(5000));
    }
    // Hang-ups: mid-request line, mid-headers, mid-body (JSON and upload), after the request.
    for (const std::string& part :
         {std::string("GET /v1/hea"), std::string("PUT " + SbPath(id) + " HTTP/1.1\r\nHost: x\r\n"),
          "POST " + exec_path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"comm",
          "PUT " + SbPath(id, "/files?path=/workspace/up") +
              " HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + std::string(5000, 'u'),
          "POST " + exec_path +
              " HTTP/1.1\r\nHost: x\r\nContent-Length: 18\r\n\r\n{\"command\":\"true\"}"}) {
      RawConnection raw(daemon().endpoint());
      raw.Send(part);
      std::this_thread::sleep_for(milliseconds(20));
      raw.Close();
    }
    // A truncated body followed by EOF (half-close): a 400 or a close, never a hang.
    {
      RawConnection raw(daemon().endpoint());
      raw.Send("POST " + exec_path +
               " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
               "100\r\n\r\n{\"command\": \"tr");
      raw.ShutdownWrite();
      Response r = raw.ReadResponse(milliseconds(5000));
      if (r.status != 0) {
        EXPECT_EQ(r.status, 400) << r.Describe();
      }
      EXPECT_TRUE(raw.WaitClosed(milliseconds(5000)));
    }
  }
  ExpectDaemonHealthy();
  // The half-sent upload created nothing.
  Response up = Fs(id, "exists", json::object{{"path", "/workspace/up"}});
  EXPECT_EQ(Obj(up)["exists"], json::value(false)) << up.Describe();
  EXPECT_TRUE(WaitPoolFull(client()));
  client().Disconnect();
  // fds are closed asynchronously: give the daemon a moment.
  int now = -1;
  for (int i = 0; i < 50; ++i) {
    now = daemon().CountFds();
    if (std::abs(now - baseline) <= 5) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_LE(std::abs(now - baseline), 5) << "fds: " << baseline << " before, " << now << " after\n"
                                         << daemon().DescribeFds();
  EXPECT_EQ(daemon().SandboxDirs().size(), 1u);
}

TEST_F(ApiTest, SlowClientDoesNotBlockOthers) {
  // A client that sent half a request and stalls must not delay anyone else.
  std::vector<std::unique_ptr<RawConnection>> stalled;
  for (int i = 0; i < 20; ++i) {
    stalled.push_back(std::make_unique<RawConnection>(daemon().endpoint()));
    stalled.back()->Send("GET /v1/health HTTP/1.1\r\nHost: x\r\n");
  }
  RawConnection upload(daemon().endpoint());
  const std::string id = NewId();
  Create(id);
  upload.Send("PUT " + SbPath(id, "/files?path=/workspace/slow") +
              " HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nabc");
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) ASSERT_EQ(client().Get("/v1/health").status, 200);
  EXPECT_EQ(Sh(id, "echo hi"), "hi\n");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(3000));
}

// ---- concurrency and scale ----

TEST_F(ApiTest, ConcurrentPutsOfOneIdCreateOneSandbox) {
  const std::string id = NewId("race");
  constexpr int kThreads = 32;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<Response> answers(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      Client c = NewClient();
      c.Get("/v1/health");  // connected before the race
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      answers[i] = c.Request("PUT", SbPath(id));
    });
  }
  while (ready.load() < kThreads) std::this_thread::sleep_for(milliseconds(1));
  go = true;
  for (auto& t : threads) t.join();
  int created = 0, found = 0;
  std::set<std::string> created_at;
  for (const auto& r : answers) {
    if (r.status == 201) ++created;
    if (r.status == 200) ++found;
    EXPECT_TRUE(r.status == 200 || r.status == 201) << r.Describe();
    created_at.insert(Str(Obj(r), "createdAt"));
  }
  EXPECT_EQ(created, 1);
  EXPECT_EQ(found, kThreads - 1);
  EXPECT_EQ(created_at.size(), 1u) << "the answers describe different sandboxes";
  EXPECT_EQ(daemon().SandboxDirs().size(), 1u);
  EXPECT_FALSE(daemon().SandboxDir(id).empty());
  EXPECT_EQ(Sh(id, "echo one"), "one\n");
}

TEST_F(ApiTest, TwoHundredSandboxesCreatedListedUsedDeleted) {
  constexpr int kCount = 200;
  constexpr int kThreads = 4;
  // The pool's jail started and waiting (docs/daemon.md "The pool"): a start under way holds
  // more fds for a moment.
  ASSERT_TRUE(WaitPoolFull(client()));
  client().Disconnect();
  const std::set<std::string> cgroups_before = FindNsboxCgroups();
  const int fds_before = daemon().CountFds();
  std::vector<std::string> ids;
  for (int i = 0; i < kCount; ++i) ids.push_back("many-" + std::to_string(i));
  std::atomic<int> failures{0};
  auto parallel = [&](auto fn) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        Client c = NewClient();
        for (int i = t; i < kCount; i += kThreads) {
          if (!fn(c, i)) failures.fetch_add(1);
        }
      });
    }
    for (auto& th : threads) th.join();
  };
  parallel([&](Client& c, int i) {
    Response r = c.Request("PUT", SbPath(ids[i]));
    EXPECT_EQ(r.status, 201) << ids[i] << ": " << r.Describe();
    return r.status == 201;
  });
  ASSERT_EQ(failures.load(), 0);
  Response all = client().Get("/v1/sandboxes");
  ASSERT_EQ(all.status, 200);
  std::set<std::string> listed;
  for (const auto& v : Arr(all, "sandboxes")) listed.insert(Str(v.as_object(), "id"));
  EXPECT_EQ(listed, std::set<std::string>(ids.begin(), ids.end()));
  EXPECT_EQ(daemon().SandboxDirs().size(), static_cast<size_t>(kCount));

  parallel([&](Client& c, int i) {
    Response r =
        c.PostJson(SbPath(ids[i], "/exec"), json::object{{"command", "echo " + std::to_string(i)}});
    json::object o = Obj(r);
    bool ok = r.status == 200 && Str(o, "stdout") == std::to_string(i) + "\n";
    EXPECT_TRUE(ok) << ids[i] << ": " << r.Describe();
    return ok;
  });
  EXPECT_EQ(failures.load(), 0);

  parallel([&](Client& c, int i) {
    Response r = c.Delete(SbPath(ids[i]), milliseconds(10000));
    EXPECT_EQ(r.status, 204) << ids[i] << ": " << r.Describe();
    return r.status == 204;
  });
  EXPECT_EQ(failures.load(), 0);
  all = client().Get("/v1/sandboxes");
  EXPECT_TRUE(Obj(all)["sandboxes"].as_array().empty()) << all.Describe();
  EXPECT_TRUE(daemon().SandboxDirs().empty());
  EXPECT_TRUE(WaitPoolFull(client()));
  client().Disconnect();
  // The cgroups and fds of 200 deleted sandboxes go asynchronously, after their inits exit. A
  // 5 s wait failed once on a loaded 2-CPU machine (the assertion that failed was not kept), so
  // this waits up to 20 s; a leak still fails, only later.
  std::vector<std::string> left;
  int fds = -1;
  for (int i = 0; i < 200; ++i) {
    left = NewNsboxCgroups(cgroups_before);
    fds = daemon().CountFds();
    if (left.empty() && std::abs(fds - fds_before) <= 5) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_TRUE(left.empty()) << "cgroups left: " << left.size() << ", first " << left[0];
  EXPECT_LE(std::abs(fds - fds_before), 5) << fds_before << " -> " << fds << "\n"
                                           << daemon().DescribeFds();
  int inits = 0;
  for (const auto& p : Descendants(daemon().pid())) inits += p.comm == "nsbox-init" ? 1 : 0;
  EXPECT_EQ(inits, 0) << "sandbox inits left under the daemon";
}

// ---- TCP ----

class TcpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto reason = E2eUnavailable()) GTEST_SKIP() << "NOT RUN: " << *reason;
  }

  const std::string token = "s3cret-token-0123456789abcdef";

  // Starts `d` on its Unix socket and on a free TCP port with `token` (a 0600 file), plus
  // `extra` arguments; sets `*tcp` to the TCP endpoint. Call with ASSERT_NO_FATAL_FAILURE.
  void StartWithToken(Daemon& d, const std::vector<std::string>& extra, Endpoint* tcp) {
    const std::string token_file = d.dir() + "/token";
    FILE* f = std::fopen(token_file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "%s\n", token.c_str());
    std::fclose(f);
    chmod(token_file.c_str(), 0600);
    const uint16_t port = FreeTcpPort();
    ASSERT_NE(port, 0);
    std::vector<std::string> args = {"--listen", "127.0.0.1:" + std::to_string(port),
                                     "--token-file", token_file};
    args.insert(args.end(), extra.begin(), extra.end());
    ASSERT_TRUE(d.Start(args)) << d.error();
    *tcp = Endpoint::Tcp("127.0.0.1", port);
  }
};

TEST_F(TcpTest, BearerTokenIsRequired) {
  Daemon d;
  Endpoint tcp;
  ASSERT_NO_FATAL_FAILURE(StartWithToken(d, {}, &tcp));

  Client none(tcp);
  ExpectError(none.Get("/v1/health"), 401, "unauthorized", "no token");
  ExpectError(none.Request("PUT", "/v1/sandboxes/tcp"), 401, "unauthorized", "no token PUT");
  ExpectError(none.Get("/v1/nope"), 401, "unauthorized", "no token, unknown route");
  Client wrong(tcp, "s3cret-token-0123456789abcdeX");
  ExpectError(wrong.Get("/v1/health"), 401, "unauthorized", "wrong token, same length");
  Client shorter(tcp, "s3cret");
  ExpectError(shorter.Get("/v1/health"), 401, "unauthorized", "prefix of the token");
  Client longer(tcp, token + "x");
  ExpectError(longer.Get("/v1/health"), 401, "unauthorized", "token plus a byte");
  Client basic(tcp);
  ExpectError(basic.Request("GET", "/v1/health", "", {{"Authorization", "Basic " + token}}), 401,
              "unauthorized", "Basic scheme");
  EXPECT_TRUE(Client(d.endpoint()).Get("/v1/sandboxes/tcp").status == 404);

  Client right(tcp, token);
  EXPECT_EQ(right.Get("/v1/health").status, 200);
  Response created = right.Request("PUT", "/v1/sandboxes/tcp");
  EXPECT_EQ(created.status, 201) << created.Describe();
  Response exec = right.PostJson("/v1/sandboxes/tcp/exec", json::object{{"command", "echo tcp"}});
  EXPECT_EQ(Str(Obj(exec), "stdout"), "tcp\n") << exec.Describe();
  // The Unix socket needs no token.
  EXPECT_EQ(Client(d.endpoint()).Get("/v1/sandboxes/tcp").status, 200);
  EXPECT_TRUE(d.Stop()) << d.error() << "\n" << d.Log();
}

// RFC 9110 §11.1: the auth scheme is case-insensitive ("bearer", "BEARER"); the token itself is
// compared exactly. §15.5.2: every 401 carries WWW-Authenticate, naming the Bearer scheme.
TEST_F(TcpTest, TheSchemeIsCaseInsensitiveAndEvery401NamesIt) {
  Daemon d;
  Endpoint tcp;
  ASSERT_NO_FATAL_FAILURE(StartWithToken(d, {}, &tcp));
  Client c(tcp);
  for (const std::string& value :
       {"bearer " + token, "BEARER " + token, "bEaReR " + token, "Bearer  " + token}) {
    Response r = c.Request("GET", "/v1/health", "", {{"Authorization", value}});
    EXPECT_EQ(r.status, 200) << value << ": " << r.Describe();
  }
  std::string upper = token;
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  struct Case {
    std::string what;
    Headers headers;
    std::string target;
  };
  const std::vector<Case> refused = {
      {"no token", {}, "/v1/health"},
      {"no token, unknown route", {}, "/v1/nope"},
      {"wrong token", {{"Authorization", "Bearer not-the-token-0123456789"}}, "/v1/health"},
      {"the token in other case", {{"Authorization", "bearer " + upper}}, "/v1/health"},
      {"Basic scheme", {{"Authorization", "Basic " + token}}, "/v1/health"},
      {"scheme without a space", {{"Authorization", "Bearer" + token}}, "/v1/health"},
      {"a proxy path without token or cookie", {}, "/v1/sandboxes/x/ports/3000/http/"},
  };
  for (const Case& k : refused) {
    Response r = c.Request("GET", k.target, "", k.headers);
    ExpectError(r, 401, "unauthorized", k.what);
    EXPECT_EQ(r.Header("www-authenticate").rfind("Bearer", 0), 0u)
        << k.what << ": " << r.Describe();
  }
  EXPECT_TRUE(d.Stop()) << d.error() << "\n" << d.Log();
}

// A target in absolute form is served over TCP as any other: with the token only, and a malformed
// one is not told apart from a good one before the token is shown.
TEST_F(TcpTest, AbsoluteFormTargetsNeedTheTokenToo) {
  Daemon d;
  Endpoint tcp;
  ASSERT_NO_FATAL_FAILURE(StartWithToken(d, {}, &tcp));
  Client none(tcp);
  ExpectError(none.Get("http://x/v1/health"), 401, "unauthorized", "no token");
  ExpectError(none.Get("http://user@x/v1/health"), 401, "unauthorized", "malformed, no token");
  Client right(tcp, token);
  EXPECT_EQ(right.Get("http://x/v1/health").status, 200);
  ExpectError(right.Get("http://user@x/v1/health"), 400, "invalid_request", "malformed");
  EXPECT_TRUE(d.Stop()) << d.error() << "\n" << d.Log();
}

// --auth-timeout: a TCP connection has that long from its accept to send a request with the token.
// Silent, dribbling and wrong-token connections are closed then; one that has shown the token
// stays, also through a request that outlasts the deadline; the Unix socket has no deadline.
TEST_F(TcpTest, ConnectionsThatDoNotShowTheTokenAreClosedAtTheAuthTimeout) {
  Daemon d;
  Endpoint tcp;
  ASSERT_NO_FATAL_FAILURE(StartWithToken(d, {"--auth-timeout", "1"}, &tcp));
  ASSERT_EQ(Client(tcp, token).Request("PUT", "/v1/sandboxes/late").status, 201);
  const auto start = std::chrono::steady_clock::now();
  auto ms_since_start = [&start] {
    return std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start)
        .count();
  };
  const std::string with_token = "Authorization: Bearer " + token + "\r\n";
  const std::string health = "GET /v1/health HTTP/1.1\r\nHost: x\r\n";

  RawConnection silent(tcp);
  RawConnection dribbling(tcp);
  ASSERT_TRUE(dribbling.Send(health + "X-Slow: "));
  RawConnection wrong(tcp);
  ASSERT_TRUE(wrong.Send(health + "Authorization: Bearer not-the-token-at-all\r\n\r\n"));
  EXPECT_EQ(wrong.ReadResponse().status, 401);
  RawConnection right(tcp);
  ASSERT_TRUE(right.Send(health + with_token + "\r\n"));
  EXPECT_EQ(right.ReadResponse().status, 200);
  RawConnection slow_request(tcp);
  const std::string exec_body = R"({"command":"sleep 1.6; echo late"})";
  ASSERT_TRUE(slow_request.Send("POST /v1/sandboxes/late/exec HTTP/1.1\r\nHost: x\r\n" +
                                with_token + "Content-Type: application/json\r\nContent-Length: " +
                                std::to_string(exec_body.size()) + "\r\n\r\n" + exec_body));
  RawConnection local(d.endpoint());

  EXPECT_FALSE(silent.WaitClosed(milliseconds(300))) << "closed before its time";
  for (int i = 0; i < 6; ++i) {  // the dribbler keeps sending, a byte every 100 ms
    (void)dribbling.Send("a", milliseconds(100));
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_TRUE(silent.WaitClosed(milliseconds(4000))) << "a connection that sent nothing";
  EXPECT_GE(ms_since_start(), 900) << "closed before its time";
  EXPECT_TRUE(dribbling.WaitClosed(milliseconds(4000))) << "a header that never ends";
  EXPECT_TRUE(wrong.WaitClosed(milliseconds(4000))) << "a connection with a wrong token";

  Response late = slow_request.ReadResponse(milliseconds(10000));
  EXPECT_EQ(late.status, 200) << late.Describe();
  EXPECT_NE(late.body.find("late\\n"), std::string::npos) << late.Describe();
  EXPECT_GE(ms_since_start(), 1500);
  // Past the deadline: the connections that showed the token, and the Unix socket's, still serve.
  ASSERT_TRUE(right.Send(health + with_token + "\r\n"));
  EXPECT_EQ(right.ReadResponse().status, 200) << "a connection that showed the token";
  ASSERT_TRUE(slow_request.Send(health + with_token + "\r\n"));
  EXPECT_EQ(slow_request.ReadResponse().status, 200);
  ASSERT_TRUE(local.Send(health + "\r\n"));
  EXPECT_EQ(local.ReadResponse().status, 200) << "the Unix socket has no deadline";
  EXPECT_TRUE(d.Stop()) << d.error() << "\n" << d.Log();
}

TEST_F(TcpTest, AuthTimeoutOutOfRangeRefusesToStart) {
  Daemon d;
  for (const char* bad : {"0", "3601", "-1", "soon"}) {
    int code = d.RunToExit({"--auth-timeout", bad});
    EXPECT_NE(code, 0) << bad;
    EXPECT_NE(code, -1) << bad << ": it kept running";
  }
}

TEST_F(TcpTest, ListenWithoutTokenFileRefusesToStart) {
  Daemon d;
  const uint16_t port = FreeTcpPort();
  int code = d.RunToExit({"--listen", "127.0.0.1:" + std::to_string(port)});
  EXPECT_NE(code, 0);
  EXPECT_NE(code, -1) << "it kept running";
  const std::string log = d.Log();
  EXPECT_NE(log.find("token"), std::string::npos) << log;
  // Nothing listens on the port.
  Client c(Endpoint::Tcp("127.0.0.1", port));
  EXPECT_EQ(c.Get("/v1/health", milliseconds(2000)).status, 0);
}

TEST_F(TcpTest, MissingOrEmptyTokenFileRefusesToStart) {
  Daemon d;
  const uint16_t port = FreeTcpPort();
  int code = d.RunToExit({"--listen", "127.0.0.1:" + std::to_string(port), "--token-file",
                          d.dir() + "/no-such-token"});
  EXPECT_NE(code, 0);
  EXPECT_NE(code, -1) << "it kept running";
  const std::string empty = d.dir() + "/empty-token";
  FILE* f = std::fopen(empty.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  code = d.RunToExit({"--listen", "127.0.0.1:" + std::to_string(port), "--token-file", empty});
  EXPECT_NE(code, 0) << "an empty token would let anyone in";
  EXPECT_NE(code, -1) << "it kept running";
}

// A --listen that is not HOST:PORT is refused before the daemon makes anything: no state
// directory, no socket file left behind.
TEST_F(TcpTest, ABadListenAddressLeavesNothing) {
  Daemon d;
  const std::string token_file = d.dir() + "/token";
  FILE* f = std::fopen(token_file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("0123456789abcdef0123456789abcdef", f);
  std::fclose(f);
  ASSERT_EQ(::chmod(token_file.c_str(), 0600), 0);
  for (const char* bad : {"bogus", "127.0.0.1", "127.0.0.1:99999", "[::1:7711"}) {
    int code = d.RunToExit({"--listen", bad, "--token-file", token_file});
    EXPECT_NE(code, 0) << bad;
    EXPECT_NE(code, -1) << bad << ": it kept running";
    EXPECT_NE(d.Log().find("--listen"), std::string::npos) << bad << ": " << d.Log();
    struct stat st {};
    EXPECT_NE(::stat(d.socket_path().c_str(), &st), 0) << bad << ": a socket file was left";
    EXPECT_NE(::stat(d.state_dir().c_str(), &st), 0) << bad << ": the state directory was made";
  }
}

}  // namespace
}  // namespace nsbox::e2e
