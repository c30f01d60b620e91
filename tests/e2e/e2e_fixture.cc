// The fixture the e2e tests share (E2eTest) and the answers' short-hands; split from
// daemon_harness.cc, which starts and stops the daemon.
#include "tests/e2e/daemon_harness.h"

#include <chrono>
#include <string>

namespace nsbox::e2e {

using std::chrono::milliseconds;

// ---- ExecResult ----

std::string Str(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return v != nullptr && v->is_string() ? std::string(v->as_string()) : "<missing>";
}

json::object Obj(const Response& r) {
  json::value v = r.Json();
  return v.is_object() ? v.as_object() : json::object{};
}

json::array Arr(const Response& r, std::string_view key) {
  json::object o = Obj(r);
  const json::value* v = o.if_contains(key);
  return v != nullptr && v->is_array() ? v->as_array() : json::array{};
}

json::value Field(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return v != nullptr ? *v : json::value("<missing>");
}

std::string ExecResult::out() const { return Str(answer, "stdout"); }
std::string ExecResult::err() const { return Str(answer, "stderr"); }
std::string ExecResult::reason() const { return Str(answer, "reason"); }
int64_t ExecResult::exit_code() const {
  const json::value* v = answer.if_contains("exitCode");
  return v != nullptr && v->is_int64() ? v->as_int64() : -1000;
}

// ---- E2eTest ----

std::unique_ptr<Daemon> E2eTest::daemon_;

void E2eTest::SetUpTestSuite() {}

void E2eTest::TearDownTestSuite() {}

void E2eTest::SetUp() {
  if (auto reason = E2eUnavailable()) {
    std::fprintf(stderr, "\n*** SKIPPED (NOT RUN): %s ***\n\n", reason->c_str());
    GTEST_SKIP() << "NOT RUN: " << *reason;
  }
  // A daemon of its own for every test: ctest runs each test in a process of its own anyway,
  // and a test then never sees another's sandboxes.
  daemon_ = std::make_unique<Daemon>();
  ASSERT_TRUE(daemon_->Start(DaemonArgs())) << daemon_->error();
  log_offset_ = 0;
  client_ = std::make_unique<Client>(daemon_->endpoint());
}

void E2eTest::TearDown() {
  if (!daemon_ || IsSkipped()) return;
  client_.reset();
  if (!daemon_->running()) {
    ADD_FAILURE() << "the daemon is not running at the end of the test: " << daemon_->error();
  } else {
    // SIGTERM: it must end every sandbox's processes and exit 0, promptly.
    EXPECT_TRUE(daemon_->Stop()) << daemon_->error();
  }
  if (HasFailure()) {
    std::fprintf(stderr, "---- daemon log during this test (%s) ----\n%s\n---- end of log ----\n",
                 daemon_->log_path().c_str(), daemon_->Log(log_offset_, 32 * 1024).c_str());
  }
  daemon_.reset();
}

// ---- E2eSandboxTest ----

void E2eSandboxTest::SetUp() {
  E2eTest::SetUp();
  if (IsSkipped() || HasFatalFailure()) return;
  id_ = NewId();
  Create(id_);
}

std::string E2eTest::SbPath(std::string_view id, std::string_view suffix) {
  // Dots too: a client's URL parser would fold a segment "." or ".." (WHATWG URL).
  std::string encoded;
  for (char c : PctEncode(id)) encoded += c == '.' ? std::string("%2E") : std::string(1, c);
  return "/v1/sandboxes/" + encoded + std::string(suffix);
}

std::string E2eTest::NewId(std::string_view hint) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->name()) + "-" + std::string(hint) + "-" + std::to_string(++id_counter_);
}

namespace {
// A request of the short-hands that got no answer in time: the daemon is stuck, and every later
// call would wait as long; the test is ended at once (gtest reports the exception as a failure
// of the test, and TearDown still runs).
Response Answered(Response r) {
  if (r.status == 0 && r.transport_error.find("timed out") != std::string::npos) {
    throw std::runtime_error("the daemon did not answer in time, test aborted: " +
                             r.transport_error);
  }
  return r;
}
}  // namespace

Response E2eTest::Create(std::string_view id, std::string_view body) {
  Response r = body.empty() ? client().Request("PUT", SbPath(id))
                            : client().Request("PUT", SbPath(id), body,
                                               {{"Content-Type", "application/json"}});
  Answered(r);
  EXPECT_TRUE(r.status == 200 || r.status == 201) << "PUT " << SbPath(id) << ": " << r.Describe();
  return r;
}

ExecResult E2eTest::Exec(std::string_view id, const json::object& request, milliseconds timeout) {
  ExecResult out;
  out.response = Answered(client().PostJson(SbPath(id, "/exec"), request, timeout));
  json::value v = out.response.Json();
  if (out.response.status == 200 && v.is_object()) out.answer = v.as_object();
  return out;
}

std::string E2eTest::Sh(std::string_view id, std::string_view command) {
  ExecResult r = Exec(id, command);
  EXPECT_EQ(r.response.status, 200) << command << ": " << r.Describe();
  EXPECT_EQ(r.exit_code(), 0) << command << ": " << r.Describe();
  return r.out();
}

Response E2eTest::PutFile(std::string_view id, std::string_view path, std::string_view bytes) {
  return Answered(client().Request("PUT", SbPath(id, "/files?path=" + PctEncode(path)), bytes,
                                   {{"Content-Type", "application/octet-stream"}}));
}

Response E2eTest::GetFile(std::string_view id, std::string_view path) {
  return Answered(client().Get(SbPath(id, "/files?path=" + PctEncode(path))));
}

Response E2eTest::Fs(std::string_view id, std::string_view verb, const json::object& body) {
  return Answered(client().PostJson(SbPath(id, "/fs/" + std::string(verb)), body));
}

void E2eTest::ExpectDaemonHealthy() {
  EXPECT_TRUE(daemon_->running()) << daemon_->error();
  Client c(daemon_->endpoint());
  Response r = c.Get("/v1/health", Scaled(milliseconds(5000)));
  EXPECT_EQ(r.status, 200) << r.Describe();
}

}  // namespace nsbox::e2e
