#include "rank_io.h"

#include <unistd.h>

#include <cerrno>

namespace tprun {
namespace {

// Writes all of s with as few write() calls as possible (one, for anything
// a pipe or terminal accepts at once), so lines never interleave.
void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // e.g. EPIPE: nobody is listening, drop the output
    off += static_cast<size_t>(n);
  }
}

void emit_line(const Rank& r, const Stream& s, const char* data, size_t len,
               bool prefix) {
  std::string line;
  if (prefix) line = "[rank" + std::to_string(r.global) + "]: ";
  line.append(data, len);
  if (line.empty() || line.back() != '\n') line += '\n';
  write_all(s.out_fd, line);
}

// Relays complete lines in s.buf; at EOF (flush=true) the remainder too.
// Overlong lines are cut so a rank cannot grow the buffer without bound.
void relay_lines(const Rank& r, Stream& s, bool flush, bool prefix) {
  constexpr size_t kMaxLine = 64 * 1024;
  size_t start = 0;
  for (;;) {
    size_t nl = s.buf.find('\n', start);
    if (nl == std::string::npos) {
      if (s.buf.size() - start < kMaxLine) break;
      nl = start + kMaxLine - 1;
    }
    emit_line(r, s, s.buf.data() + start, nl + 1 - start, prefix);
    start = nl + 1;
  }
  if (flush && start < s.buf.size())
    emit_line(r, s, s.buf.data() + start, s.buf.size() - start, prefix);
  s.buf.erase(0, flush ? s.buf.size() : start);
}


}  // namespace

void close_stream(const Rank& r, Stream& s, bool prefix) {
  relay_lines(r, s, /*flush=*/true, prefix);
  close(s.fd);
  s.fd = -1;
}

void read_stream(const Rank& r, Stream& s, bool prefix) {
  char buf[65536];
  ssize_t n;
  do n = read(s.fd, buf, sizeof buf); while (n < 0 && errno == EINTR);
  if (n <= 0) { close_stream(r, s, prefix); return; }  // EOF or error
  s.buf.append(buf, static_cast<size_t>(n));
  relay_lines(r, s, /*flush=*/false, prefix);
}

}  // namespace tprun
