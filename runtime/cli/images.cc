#include "runtime/cli/commands.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/strings.h"
#include "base/unique_fd.h"
#include "images/store.h"
#include "runtime/cli/client.h"
#include "runtime/units.h"

namespace nsbox::runtime::cli {

namespace {

std::string ImageTarget(const std::string& name) { return "/v1/images/" + PercentEncode(name); }

// An import's error as the user is shown it: the API's image_exists names its query parameter
// (?replace=1), where the CLI's way is --replace, and image_too_large the request's maxBytes,
// which is --max-bytes.
std::string ImportErrorText(std::string_view code, std::string message) {
  if (code == "image_too_large") {
    constexpr std::string_view kParam = "maxBytes of the request";
    if (size_t at = message.find(kParam); at != std::string::npos) {
      message.replace(at, kParam.size(), "--max-bytes");
    }
    return message;
  }
  if (code != "image_exists") return message;
  constexpr std::string_view kQuery = "?replace=1";
  if (size_t at = message.find(kQuery); at != std::string::npos) {
    return message.replace(at, kQuery.size(), "--replace");
  }
  return message + " (replace it with --replace)";
}

}  // namespace

int ImportImage(const Options& o, ApiClient& client) {
  const std::string what = "image import " + o.image_name;
  if (auto reason = images::InvalidImageNameReason(o.image_name)) {
    return Fail(what, *reason, kExitUsage);
  }
  std::optional<uint64_t> max_bytes;
  if (!o.image_max_bytes.empty()) {
    auto bytes = ParseBytes("--max-bytes", o.image_max_bytes);
    if (!bytes.ok()) return Fail(what, bytes.error().message(), kExitUsage);
    if (*bytes == 0) return Fail(what, "--max-bytes '0': at least 1 byte", kExitUsage);
    max_bytes = *bytes;
  }
  UniqueFd fd(::open(o.image_source.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) return Fail(what, Error::Sys("open", o.image_source, errno).message());
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return Fail(what, Error::Sys("fstat", o.image_source, errno).message());
  }
  ProgressLine line;
  if (S_ISDIR(st.st_mode)) {
    // An OCI layout directory goes to the daemon as one tar, made in an unnamed temp file.
    const char* tmpdir = std::getenv("TMPDIR");
    const std::string dir = tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp";
    UniqueFd tar(::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    if (!tar.valid()) return Fail(what, Error::Sys("open", dir + " (O_TMPFILE)", errno).message());
    auto packed = images::WriteTarOfDirectory(
        o.image_source, tar.get(), [&](const images::ImportProgress& p) {
          line.Show("packing " + o.image_source + ": " + Mebibytes(p.bytes_read));
        });
    if (!packed.ok()) return Fail(what, packed.error().message());
    if (::lseek(tar.get(), 0, SEEK_SET) != 0) {
      return Fail(what, Error::Sys("lseek", dir, errno).message());
    }
    fd = std::move(tar);
    if (::fstat(fd.get(), &st) != 0) return Fail(what, Error::Sys("fstat", dir, errno).message());
  } else if (!S_ISREG(st.st_mode)) {
    return Fail(what, o.image_source + " is neither a file nor a directory", kExitUsage);
  }

  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::optional<json::object> image;
  std::string import_error;
  ApiClient::UploadOptions upload;
  upload.on_sent = [&](uint64_t sent) {
    line.Show("uploading " + Mebibytes(sent) + " of " + Mebibytes(size) + " (" +
              std::to_string(size == 0 ? 100 : sent * 100 / size) + "%)");
  };
  upload.on_line = [&](std::string_view text) -> Status {
    boost::system::error_code ec;
    json::value v = json::parse(text, ec);
    const json::object* event = ec ? nullptr : v.if_object();
    if (event == nullptr) return Error(EPROTO, "the daemon sent a line that is not JSON");
    const std::string type = JsonText(*event, "type");
    if (type == "progress") {
      const std::string phase = JsonText(*event, "phase");
      if (phase == "layer") {
        line.Show("importing: layer " + JsonText(*event, "layer") + " of " +
                  JsonText(*event, "layers"));
      } else {
        line.Show("importing: " + phase);
      }
    } else if (type == "image" && event->contains("image") && event->at("image").is_object()) {
      image = event->at("image").get_object();
    } else if (type == "error") {
      const json::value* e = event->if_contains("error");
      import_error = e != nullptr && e->is_object()
                         ? ImportErrorText(JsonText(e->get_object(), "code"),
                                           JsonText(e->get_object(), "message"))
                         : std::string("the import failed");
    }
    return Ok();
  };
  std::string target = ImageTarget(o.image_name);
  std::string query;
  if (o.replace) query += "&replace=1";
  if (max_bytes) query += "&maxBytes=" + std::to_string(*max_bytes);
  if (!query.empty()) target += "?" + query.substr(1);
  auto answer = client.Upload(Method::kPost, target, fd.get(), upload);
  line.Done();
  if (answer.ok() && !answer->ok()) {
    ApiErrorBody e = answer->error();
    return Fail(what, ImportErrorText(e.code, std::move(e.message)));
  }
  answer = Check(client, std::move(answer));
  if (!answer.ok()) return Fail(what, answer.error().message());
  if (!import_error.empty()) return Fail(what, import_error);
  if (!image) return Fail(what, "the daemon's answer ended without the image");
  if (o.json) {
    std::printf("%s\n", json::serialize(*image).c_str());
  } else {
    const auto text = [&](std::string_view key) { return EscapeControl(JsonText(*image, key)); };
    std::printf("%s imported: %s, %s layer%s, %s files, %s (id %s)\n", o.image_name.c_str(),
                text("format").c_str(), text("layers").c_str(),
                JsonText(*image, "layers") == "1" ? "" : "s", text("files").c_str(),
                image->contains("sizeBytes") && image->at("sizeBytes").is_number()
                    ? Mebibytes(image->at("sizeBytes").to_number<uint64_t>()).c_str()
                    : "-",
                text("id").c_str());
  }
  if (const json::value* warnings = image->if_contains("warnings");
      warnings != nullptr && warnings->is_array()) {
    for (const json::value& w : warnings->get_array()) {
      if (w.is_string()) {
        std::fprintf(stderr, "nsbox: %s: note: %s\n", what.c_str(),
                     EscapeControl(w.get_string()).c_str());
      }
    }
  }
  return 0;
}

int ListImages(const Options& o, ApiClient& client) {
  auto answer = Check(client, client.Call(Method::kGet, "/v1/images"));
  if (!answer.ok()) return Fail("image ls", answer.error().message());
  if (o.json) {
    PrintBody(*answer);
    return 0;
  }
  auto parsed = answer->Json();
  const json::object* top = parsed.ok() ? parsed->if_object() : nullptr;
  const json::value* list = top != nullptr ? top->if_contains("images") : nullptr;
  if (list == nullptr || !list->is_array()) {
    return Fail("image ls", "the daemon's answer has no \"images\" list");
  }
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"host", "host", "-", "-", "(built in: the host's /usr, read-only)"});
  for (const json::value& item : list->get_array()) {
    if (!item.is_object()) continue;
    const json::object& i = item.get_object();
    const json::value* used = i.if_contains("usedBy");
    rows.push_back(
        {JsonText(i, "name"), JsonText(i, "format"), JsonText(i, "layers"),
         i.contains("sizeBytes") && i.at("sizeBytes").is_number()
             ? Mebibytes(i.at("sizeBytes").to_number<uint64_t>())
             : "-",
         JsonText(i, "importedAt") + "  " +
             std::to_string(used != nullptr && used->is_array() ? used->get_array().size() : 0) +
             " sandboxes"});
  }
  std::sort(rows.begin() + 1, rows.end());
  rows.insert(rows.begin(), {"NAME", "FORMAT", "LAYERS", "SIZE", "IMPORTED"});
  PrintTable(rows);
  return 0;
}

int InspectImage(const Options& o, ApiClient& client) {
  auto answer = Check(client, client.Call(Method::kGet, ImageTarget(o.image_name)));
  if (!answer.ok()) return Fail("image inspect " + o.image_name, answer.error().message());
  PrintBody(*answer);
  return 0;
}

int RemoveImages(const Options& o, ApiClient& client) {
  int rc = 0;
  for (const std::string& name : o.image_names) {
    auto answer = Check(client, client.Call(Method::kDelete, ImageTarget(name)));
    if (!answer.ok()) {
      rc = Fail("image rm " + name, answer.error().message());
      if (client.connect_failed()) break;
      continue;
    }
    std::printf("%s\n", name.c_str());
  }
  return rc;
}

}  // namespace nsbox::runtime::cli
