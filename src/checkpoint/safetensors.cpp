// safetensors: header parsing with every range checked before any data is touched, a read-only memory map,
// and a one-pass writer (header, then tensors in layout order) that checksums what it writes.
#include "dtensor/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "dtensor/core/error.h"

namespace dtensor::checkpoint {
namespace {

const std::vector<std::pair<std::string, at::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<std::string, at::ScalarType>> table = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16}, {"I64", at::kLong},
      {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},   {"U8", at::kByte},       {"BOOL", at::kBool}};
  return table;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DTENSOR_ERROR("dtensor: checkpoint: ", path, ": ", what);
}

std::string errno_text() { return std::strerror(errno); }

constexpr int64_t kMaxHeader = 100 << 20;  // the safetensors library's own bound

}  // namespace

std::string safetensors_dtype(at::ScalarType dtype) {
  for (const auto& [name, t] : dtype_table()) {
    if (t == dtype) return name;
  }
  throw DTENSOR_ERROR("dtensor: checkpoint: dtype ", c10::toString(dtype), " has no safetensors name");
}

at::ScalarType scalar_type_from_safetensors(const std::string& name) {
  for (const auto& [n, t] : dtype_table()) {
    if (n == name) return t;
  }
  throw DTENSOR_ERROR("dtensor: checkpoint: unknown safetensors dtype '", name, "'");
}

int64_t TensorInfo::nbytes() const {
  int64_t n = static_cast<int64_t>(c10::elementSize(dtype));
  for (int64_t s : shape) n *= s;
  return n;
}

// ------------------------------------------------------------------------------------------------ reading
struct SafetensorsFile::Impl {
  std::string path;
  int64_t size = 0;
  int64_t data_start = 0;  // 8 + header length
  void* map = nullptr;     // the whole file (nullptr when empty)
  std::vector<StoredTensor> tensors;
  std::map<std::string, std::string> metadata;
  ~Impl() {
    if (map != nullptr) munmap(map, static_cast<size_t>(size));
  }
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open: " + errno_text());
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    fail(path, "cannot stat: " + errno_text());
  }
  impl->size = st.st_size;
  if (impl->size > 0) {
    // Writable and private: a tensor loaded in place (LoadOptions::map_in_place) may be written; its pages are then
    // copied, the file is never changed.
    impl->map = mmap(nullptr, static_cast<size_t>(impl->size), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (impl->map == MAP_FAILED) {
      impl->map = nullptr;
      ::close(fd);
      fail(path, "cannot map: " + errno_text());
    }
  }
  ::close(fd);
  const auto* bytes = static_cast<const unsigned char*>(impl->map);
  if (impl->size < 8) fail(path, "truncated: " + std::to_string(impl->size) + " bytes, shorter than the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > static_cast<uint64_t>(kMaxHeader) || static_cast<int64_t>(n) > impl->size - 8) {
    fail(path, "truncated or not safetensors: header length " + std::to_string(n) + " in a file of " +
                   std::to_string(impl->size) + " bytes");
  }
  impl->data_start = 8 + static_cast<int64_t>(n);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(reinterpret_cast<const char*>(bytes) + 8, reinterpret_cast<const char*>(bytes) + 8 + n);
  } catch (const std::exception& e) {
    fail(path, std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");
  const int64_t data_size = impl->size - impl->data_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) fail(path, "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) fail(path, "__metadata__[\"" + m.key() + "\"] is not a string");
        impl->metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    StoredTensor t;
    t.info.name = it.key();
    try {
      t.info.dtype = scalar_type_from_safetensors(it->at("dtype").get<std::string>());
      t.info.shape = it->at("shape").get<std::vector<int64_t>>();
      const auto offsets = it->at("data_offsets").get<std::vector<int64_t>>();
      if (offsets.size() != 2) fail(path, "tensor '" + t.info.name + "': data_offsets must have two entries");
      t.begin = offsets[0];
      t.end = offsets[1];
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail(path, "tensor '" + t.info.name + "': bad header entry: " + e.what());
    }
    for (int64_t s : t.info.shape) {
      if (s < 0) fail(path, "tensor '" + t.info.name + "': negative size");
    }
    if (t.begin < 0 || t.end < t.begin || t.end - t.begin != t.info.nbytes()) {
      fail(path, "tensor '" + t.info.name + "': data_offsets [" + std::to_string(t.begin) + ", " +
                     std::to_string(t.end) + ") do not hold " + std::to_string(t.info.nbytes()) + " bytes");
    }
    if (t.end > data_size) {
      fail(path, "truncated: tensor '" + t.info.name + "' ends at data byte " + std::to_string(t.end) +
                     " but the file has " + std::to_string(data_size) + " data bytes");
    }
    impl->tensors.push_back(std::move(t));
  }
  std::sort(impl->tensors.begin(), impl->tensors.end(),
            [](const StoredTensor& a, const StoredTensor& b) { return a.begin < b.begin; });
  SafetensorsFile f;
  f.impl_ = std::move(impl);
  return f;
}

const std::string& SafetensorsFile::path() const { return impl_->path; }
int64_t SafetensorsFile::file_size() const { return impl_->size; }
const std::vector<StoredTensor>& SafetensorsFile::tensors() const { return impl_->tensors; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return impl_->metadata; }

const StoredTensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : impl_->tensors) {
    if (t.info.name == name) return &t;
  }
  return nullptr;
}

at::Tensor SafetensorsFile::view(const StoredTensor& stored) const {
  if (stored.info.nbytes() == 0) return at::empty(stored.info.shape, at::TensorOptions().dtype(stored.info.dtype));
  auto* base = static_cast<char*>(impl_->map) + impl_->data_start + stored.begin;
  auto keep = impl_;  // the mapping lives as long as any view of it
  return at::from_blob(base, stored.info.shape, [keep](void*) {}, at::TensorOptions().dtype(stored.info.dtype));
}

void SafetensorsFile::release_pages(const StoredTensor& stored) const {
  if (impl_->map == nullptr || stored.info.nbytes() == 0) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(impl_->map) + static_cast<uintptr_t>(impl_->data_start + stored.begin);
  const uintptr_t end = begin + static_cast<uintptr_t>(stored.info.nbytes());
  const uintptr_t first = begin / page * page, last = (end + page - 1) / page * page;  // whole pages (a neighbour's
  // share of an edge page is faulted in again if it is read later: the mapping is read-only, nothing is lost)
  madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

uint32_t SafetensorsFile::crc32() const {
  return impl_->size == 0 ? 0 : crc32_update(0, impl_->map, static_cast<size_t>(impl_->size));
}

// ------------------------------------------------------------------------------------------------ writing
SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorInfo> layout,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), layout_(std::move(layout)) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& t : layout_) {
    if (t.name == "__metadata__" || header.contains(t.name)) fail(path, "tensor name '" + t.name + "' used twice");
    header[t.name] = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-aligned, as the safetensors library pads
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path, "cannot create: " + errno_text());
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xFF);
  write_bytes(len, 8);
  write_bytes(text.data(), static_cast<int64_t>(text.size()));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::write_bytes(const void* data, int64_t n) {
  crc_ = crc32_update(crc_, data, static_cast<size_t>(n));
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, static_cast<size_t>(std::min<int64_t>(n, int64_t{1} << 30)));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(path_, "write failed: " + errno_text());
    }
    p += w;
    n -= w;
    written_ += w;
  }
}

void SafetensorsWriter::write(const at::Tensor& tensor) {
  if (next_ >= layout_.size()) fail(path_, "more tensors written than the layout holds");
  const TensorInfo& t = layout_[next_];
  if (tensor.scalar_type() != t.dtype || tensor.sizes().vec() != t.shape || !tensor.device().is_cpu()) {
    fail(path_, "tensor '" + t.name + "' does not match its layout entry");
  }
  const at::Tensor c = tensor.contiguous();
  write_bytes(c.data_ptr(), t.nbytes());
  ++next_;
}

SafetensorsWriter::Result SafetensorsWriter::finish(bool sync) {
  if (next_ != layout_.size()) fail(path_, "finished after " + std::to_string(next_) + " of " + std::to_string(layout_.size()) + " tensors");
  if (sync && ::fsync(fd_) != 0) fail(path_, "fsync failed: " + errno_text());
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail(path_, "close failed: " + errno_text());
  }
  fd_ = -1;
  return {written_, crc_};
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  if (n == 0) return crc;  // zlib reads a null buffer (an empty tensor's data) as "give the initial value"
  return static_cast<uint32_t>(::crc32_z(crc, static_cast<const Bytef*>(data), n));
}

}  // namespace dtensor::checkpoint
