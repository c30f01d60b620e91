// The image importer on arbitrary tarballs (a root file system, `docker save`, an OCI layout, each
// possibly compressed): images::internal::UnpackImage into a fresh rootfs directory, which is
// then removed. Whatever the entries, nothing is written outside the temp dir (checked by
// ASan/UBSan for memory, and by the importer's own fd-relative writes for paths; the suite's
// ApiAbuseTest.ImageTarballEntriesStayInTheImage checks those outcomes).

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "images/import.h"

namespace {

std::string g_dir;
int g_dir_fd = -1;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char tmpl[] = "/tmp/nsbox-fuzz-image-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) std::abort();
  g_dir = tmpl;
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(g_dir, ec);
  });
  g_dir_fd = open(g_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  return g_dir_fd < 0 ? 1 : 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  namespace internal = nsbox::images::internal;
  const std::string source = g_dir + "/input.tar";
  FILE* f = fopen(source.c_str(), "we");
  if (f == nullptr) std::abort();
  if (size > 0 && fwrite(bytes, 1, size, f) != size) std::abort();
  fclose(f);
  mkdir((g_dir + "/work").c_str(), 0700);
  mkdir((g_dir + "/rootfs").c_str(), 0755);
  int work = open((g_dir + "/work").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int rootfs = open((g_dir + "/rootfs").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (work < 0 || rootfs < 0) std::abort();
  nsbox::isolate::IdMapping ids;
  // As the daemon maps an image: 65536 ids from the documented default base.
  ids.uid = {0, nsbox::isolate::kDefaultIdBase, nsbox::isolate::kDefaultIdCount};
  ids.gid = ids.uid;
  // A fuzzer's input may declare gigabytes: the importer's own budget bounds what it writes, as
  // the daemon's does (docs/images.md "Limits"), here to 64 MiB.
  nsbox::images::ImportLimits limits = nsbox::images::ImportLimits::Unlimited();
  limits.max_bytes = uint64_t{64} << 20;
  limits.max_bytes_source = "fuzz_image";
  nsbox::images::ImportBudget budget(limits, g_dir);
  (void)internal::UnpackImage(source, work, rootfs, ids, {}, budget);
  close(work);
  close(rootfs);
  (void)internal::RemoveTreeAt(g_dir_fd, "rootfs", "rootfs");
  (void)internal::RemoveTreeAt(g_dir_fd, "work", "work");
  return 0;
}
