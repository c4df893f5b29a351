#include "checkpoint/atomic_dir.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "dtensor/core/error.h"

namespace fs = std::filesystem;

namespace dtensor::checkpoint::detail {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw DTENSOR_ERROR("dtensor: checkpoint: ", what, ": ", std::strerror(errno));
}

#ifndef RENAME_EXCHANGE
constexpr unsigned kRenameExchange = 1u << 1;
#else
constexpr unsigned kRenameExchange = RENAME_EXCHANGE;
#endif

}  // namespace

std::string staging_dir_for(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return (p.parent_path() / ("." + p.filename().string() + ".partial")).string();
}

void make_empty_dir(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  DTENSOR_CHECK(!ec, "dtensor: checkpoint: cannot remove '", path, "': ", ec.message());
  fs::create_directories(path, ec);
  DTENSOR_CHECK(!ec, "dtensor: checkpoint: cannot create '", path, "': ", ec.message());
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open '" + path + "' to fsync");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("fsync of '" + path + "' failed");
}

void write_file_synced(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create '" + path + "'");
  const char* p = text.data();
  size_t n = text.size();
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      fail("write to '" + path + "' failed");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("fsync of '" + path + "' failed");
}

void commit_dir(const std::string& staging, const std::string& dir) {
  fsync_path(staging);
  const std::string parent = fs::absolute(fs::path(dir)).lexically_normal().parent_path().string();
  if (fs::exists(dir)) {
    // One atomic step: readers see the old checkpoint or the new one, never neither.
    if (::syscall(SYS_renameat2, AT_FDCWD, staging.c_str(), AT_FDCWD, dir.c_str(), kRenameExchange) != 0) {
      fail("cannot exchange '" + staging + "' with '" + dir + "'");
    }
    std::error_code ec;
    fs::remove_all(staging, ec);  // the previous checkpoint; a failure here leaves only a .partial behind
  } else if (::rename(staging.c_str(), dir.c_str()) != 0) {
    fail("cannot rename '" + staging + "' to '" + dir + "'");
  }
  fsync_path(parent);
}

}  // namespace dtensor::checkpoint::detail
