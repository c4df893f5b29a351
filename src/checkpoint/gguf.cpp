// GGUF: the header and tensor infos parsed with every length and range checked before anything is read past them, a
// read-only private memory map, and each tensor dequantized on request (gguf_quants.cpp holds the block formats).
#include "dtensor/checkpoint/gguf.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <set>

#include "dtensor/core/error.h"

namespace dtensor::checkpoint {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DTENSOR_ERROR("dtensor: GGUF file '", path, "': ", what);
}

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kMaxCount = uint64_t{1} << 32;

// A cursor over the mapped header: every read checks that its bytes are inside the file.
struct Reader {
  const std::string& path;
  const uint8_t* base;
  uint64_t size;
  uint64_t pos = 0;

  const uint8_t* take(uint64_t n, const char* what) {
    if (n > size - pos) fail(path, std::string("truncated: ") + what + " runs past the end of the file");
    const uint8_t* p = base + pos;
    pos += n;
    return p;
  }
  template <class T>
  T scalar(const char* what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }
  std::string string(const char* what) {
    const uint64_t n = scalar<uint64_t>(what);
    const uint8_t* p = take(n, what);
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  GgufValue value(GgufValue::Type type, const std::string& key, int depth = 0) {
    using T = GgufValue::Type;
    GgufValue v;
    v.type = type;
    switch (type) {
      case T::u8: v.integer = scalar<uint8_t>("a value"); break;
      case T::i8: v.integer = scalar<int8_t>("a value"); break;
      case T::u16: v.integer = scalar<uint16_t>("a value"); break;
      case T::i16: v.integer = scalar<int16_t>("a value"); break;
      case T::u32: v.integer = scalar<uint32_t>("a value"); break;
      case T::i32: v.integer = scalar<int32_t>("a value"); break;
      case T::u64: v.integer = static_cast<int64_t>(scalar<uint64_t>("a value")); break;
      case T::i64: v.integer = scalar<int64_t>("a value"); break;
      case T::f32: v.number = scalar<float>("a value"); break;
      case T::f64: v.number = scalar<double>("a value"); break;
      case T::boolean: v.boolean = scalar<uint8_t>("a value") != 0; break;
      case T::string: v.string = string("a string value"); break;
      case T::array: {
        if (depth > 0) fail(path, "metadata '" + key + "': an array of arrays");
        v.element_type = value_type(key);
        const uint64_t n = scalar<uint64_t>("an array's length");
        if (n > size - pos) fail(path, "metadata '" + key + "': an array of " + std::to_string(n) + " elements");
        v.array.reserve(n);
        for (uint64_t i = 0; i < n; ++i) v.array.push_back(value(v.element_type, key, depth + 1));
        break;
      }
    }
    return v;
  }
  GgufValue::Type value_type(const std::string& key) {
    const uint32_t t = scalar<uint32_t>("a value type");
    if (t > static_cast<uint32_t>(GgufValue::Type::f64)) {
      fail(path, "metadata '" + key + "' has value type " + std::to_string(t) + ", which GGUF does not define");
    }
    return static_cast<GgufValue::Type>(t);
  }
};

const char* kind_name(GgufValue::Type t) {
  using T = GgufValue::Type;
  switch (t) {
    case T::f32: case T::f64: return "a float";
    case T::boolean: return "a bool";
    case T::string: return "a string";
    case T::array: return "an array";
    default: return "an integer";
  }
}
bool is_integer(GgufValue::Type t) {
  using T = GgufValue::Type;
  return t == T::u8 || t == T::i8 || t == T::u16 || t == T::i16 || t == T::u32 || t == T::i32 || t == T::u64 ||
         t == T::i64;
}

}  // namespace

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

struct GgufFile::Impl {
  std::string path;
  uint32_t version = 0;
  int64_t size = 0;
  void* map = nullptr;
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensor> tensors;
  std::map<std::string, size_t> index;
  ~Impl() {
    if (map != nullptr) munmap(map, static_cast<size_t>(size));
  }
};

GgufFile GgufFile::open(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  impl->size = st.st_size;
  if (impl->size > 0) {
    impl->map = mmap(nullptr, static_cast<size_t>(impl->size), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (impl->map == MAP_FAILED) {
      impl->map = nullptr;
      ::close(fd);
      fail(path, std::string("cannot map: ") + std::strerror(errno));
    }
  }
  ::close(fd);
  Reader r{path, static_cast<const uint8_t*>(impl->map), static_cast<uint64_t>(impl->size)};
  if (impl->size < 4 || r.scalar<uint32_t>("the magic") != kMagic) fail(path, "not a GGUF file (no \"GGUF\" magic)");
  impl->version = r.scalar<uint32_t>("the version");
  if (impl->version != 2 && impl->version != 3) {
    fail(path, "GGUF version " + std::to_string(impl->version) + " is not read (versions 2 and 3 are)");
  }
  const uint64_t n_tensors = r.scalar<uint64_t>("the tensor count"), n_kv = r.scalar<uint64_t>("the metadata count");
  if (n_tensors > kMaxCount || n_kv > kMaxCount) fail(path, "implausible tensor or metadata count");
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = r.string("a metadata key");
    const GgufValue::Type type = r.value_type(key);
    GgufValue v = r.value(type, key);
    if (!impl->metadata.emplace(key, std::move(v)).second) fail(path, "metadata key '" + key + "' appears twice");
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = r.string("a tensor name");
    const uint32_t n_dims = r.scalar<uint32_t>("a tensor's rank");
    if (n_dims == 0 || n_dims > 4) fail(path, "tensor '" + t.name + "' has " + std::to_string(n_dims) + " dimensions (1-4)");
    std::vector<int64_t> ne(n_dims);
    for (auto& d : ne) {
      const uint64_t v = r.scalar<uint64_t>("a tensor's dimensions");
      if (v > (uint64_t{1} << 40)) fail(path, "tensor '" + t.name + "' has a dimension of " + std::to_string(v));
      d = static_cast<int64_t>(v);
    }
    t.shape.assign(ne.rbegin(), ne.rend());
    t.type = r.scalar<uint32_t>("a tensor's type");
    t.offset = static_cast<int64_t>(r.scalar<uint64_t>("a tensor's offset"));
    const int64_t block = ggml_block_size(t.type);
    if (block > 0) {
      if (ne[0] % block != 0) {
        fail(path, "tensor '" + t.name + "' (" + ggml_type_name(t.type) + ") has rows of " + std::to_string(ne[0]) +
                       " values, not a multiple of its block of " + std::to_string(block));
      }
      t.nbytes = t.numel() / block * ggml_block_bytes(t.type);
    } else {
      t.nbytes = -1;  // a type whose block ggml_block_size does not know: refused when read
    }
    if (!impl->index.emplace(t.name, impl->tensors.size()).second) fail(path, "tensor '" + t.name + "' appears twice");
    impl->tensors.push_back(std::move(t));
  }
  uint64_t alignment = 32;
  if (auto it = impl->metadata.find("general.alignment"); it != impl->metadata.end()) {
    if (!is_integer(it->second.type) || it->second.integer <= 0 || (it->second.integer & (it->second.integer - 1)) != 0) {
      fail(path, "general.alignment is not a power of two");
    }
    alignment = static_cast<uint64_t>(it->second.integer);
  }
  const uint64_t data_start = (r.pos + alignment - 1) / alignment * alignment;
  for (auto& t : impl->tensors) {
    if (static_cast<uint64_t>(t.offset) % alignment != 0) {
      fail(path, "tensor '" + t.name + "' is at offset " + std::to_string(t.offset) + ", not aligned to " +
                     std::to_string(alignment));
    }
    t.offset += static_cast<int64_t>(data_start);
    if (t.nbytes >= 0 && (t.offset > impl->size || t.nbytes > impl->size - t.offset)) {
      fail(path, "tensor '" + t.name + "' (" + std::to_string(t.nbytes) + " bytes at " + std::to_string(t.offset) +
                     ") runs past the end of the file (" + std::to_string(impl->size) + " bytes): truncated?");
    }
  }
  GgufFile file;
  file.impl_ = std::move(impl);
  return file;
}

const std::string& GgufFile::path() const { return impl_->path; }
uint32_t GgufFile::version() const { return impl_->version; }
const std::map<std::string, GgufValue>& GgufFile::metadata() const { return impl_->metadata; }
const std::vector<GgufTensor>& GgufFile::tensors() const { return impl_->tensors; }

const GgufValue* GgufFile::find_metadata(const std::string& key) const {
  auto it = impl_->metadata.find(key);
  return it == impl_->metadata.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::find(const std::string& name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? nullptr : &impl_->tensors[it->second];
}

namespace {
const GgufValue& need(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find_metadata(key);
  if (v == nullptr) fail(f.path(), "metadata key '" + key + "' is missing");
  return *v;
}
[[noreturn]] void wrong_kind(const GgufFile& f, const std::string& key, const GgufValue& v, const char* wanted) {
  fail(f.path(), "metadata '" + key + "' is " + kind_name(v.type) + ", not " + wanted);
}
}  // namespace

int64_t GgufFile::integer(const std::string& key) const {
  const GgufValue& v = need(*this, key);
  if (!is_integer(v.type)) wrong_kind(*this, key, v, "an integer");
  return v.integer;
}
double GgufFile::number(const std::string& key) const {
  const GgufValue& v = need(*this, key);
  if (is_integer(v.type)) return static_cast<double>(v.integer);
  if (v.type != GgufValue::Type::f32 && v.type != GgufValue::Type::f64) wrong_kind(*this, key, v, "a number");
  return v.number;
}
const std::string& GgufFile::string(const std::string& key) const {
  const GgufValue& v = need(*this, key);
  if (v.type != GgufValue::Type::string) wrong_kind(*this, key, v, "a string");
  return v.string;
}
const std::vector<GgufValue>& GgufFile::array(const std::string& key) const {
  const GgufValue& v = need(*this, key);
  if (v.type != GgufValue::Type::array) wrong_kind(*this, key, v, "an array");
  return v.array;
}

at::Tensor GgufFile::raw(const GgufTensor& t) const {
  if (t.nbytes < 0) fail(path(), "tensor '" + t.name + "' is of type " + ggml_type_name(t.type) + ", which is not read");
  auto keep = impl_;
  uint8_t* p = static_cast<uint8_t*>(impl_->map) + t.offset;
  return at::from_blob(p, {t.nbytes}, [keep](void*) {}, at::TensorOptions().dtype(at::kByte));
}

void GgufFile::release(const GgufTensor& t) const {
  if (t.nbytes <= 0) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(impl_->map) + static_cast<uintptr_t>(t.offset);
  const uintptr_t lo = begin / page * page, hi = begin + static_cast<uintptr_t>(t.nbytes);
  madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);  // advice: a failure costs memory, not correctness
}

std::pair<at::Tensor, at::Tensor> GgufFile::q4_0_parts(const GgufTensor& t, int64_t begin, int64_t end) const {
  if (t.type != static_cast<uint32_t>(GgmlType::Q4_0) || t.shape.size() != 2 || begin < 0 || begin > end ||
      end > t.shape[0]) {
    fail(path(), "tensor '" + t.name + "' (" + ggml_type_name(t.type) + ") has no Q4_0 rows [" + std::to_string(begin) +
                     ", " + std::to_string(end) + ")");
  }
  // A block: fp16 d, then 16 bytes of values (ggml's block_q4_0).
  const int64_t blocks = t.shape[1] / 32;
  const at::Tensor b = raw(t).view({t.shape[0], blocks, 18}).narrow(0, begin, end - begin);
  at::Tensor q = b.narrow(2, 2, 16).contiguous().view({end - begin, blocks * 16});
  at::Tensor d = b.narrow(2, 0, 2).contiguous().view(at::kHalf).view({end - begin, blocks});
  return {q, d};
}

at::Tensor GgufFile::dequantize(const GgufTensor& t, at::ScalarType dtype) const {
  return dequantize(t, dtype, 0, t.shape[0]);
}

at::Tensor GgufFile::dequantize(const GgufTensor& t, at::ScalarType dtype, int64_t begin, int64_t end) const {
  if (begin < 0 || end > t.shape[0] || begin > end || (t.shape.size() == 1 && (begin != 0 || end != t.shape[0]))) {
    fail(path(), "tensor '" + t.name + "': rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                     ") of " + std::to_string(t.shape[0]) + " (a 1-D tensor is read whole)");
  }
  if (!ggml_type_supported(t.type)) {
    fail(path(), "tensor '" + t.name + "' is of type " + ggml_type_name(t.type) +
                     ", which is not read (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K are)");
  }
  const at::Tensor bytes = raw(t);
  const auto type = static_cast<GgmlType>(t.type);
  std::vector<int64_t> shape = t.shape;
  shape[0] = end - begin;
  // The unquantized types as they lie, then cast (a copy either way: the caller owns the result).
  if (type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16) {
    const at::ScalarType stored = type == GgmlType::F32 ? at::kFloat : type == GgmlType::F16 ? at::kHalf : at::kBFloat16;
    return bytes.view(stored).view(t.shape).narrow(0, begin, end - begin).to(dtype, /*non_blocking=*/false, /*copy=*/true);
  }
  // Blocks: each row of ne[0] values is whole blocks; rows dequantize in parallel in fp32, each chunk of rows cast
  // to `dtype` as it is done (no fp32 copy of the whole tensor).
  // Rows of ne[0] values per dim-0 index (a 1-D tensor is one row, read whole).
  const int64_t row = t.shape.back(), per_index = t.shape.size() == 1 ? 0 : t.numel() / t.shape[0] / row;
  const int64_t first = begin * per_index, rows = t.shape.size() == 1 ? 1 : (end - begin) * per_index;
  const int64_t row_bytes = row / ggml_block_size(t.type) * ggml_block_bytes(t.type);
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
  const uint8_t* src = bytes.data_ptr<uint8_t>() + first * row_bytes;
  at::Tensor flat = out.view({rows, row});
  at::parallel_for(0, rows, 16, [&](int64_t b, int64_t e) {
    constexpr int64_t kChunk = 16;
    std::vector<float> buf(static_cast<size_t>(kChunk * row));
    for (int64_t i = b; i < e; i += kChunk) {
      const int64_t n = std::min(kChunk, e - i);
      for (int64_t r = 0; r < n; ++r) dequantize_row(t.type, src + (i + r) * row_bytes, buf.data() + r * row, row);
      const at::Tensor chunk = at::from_blob(buf.data(), {n, row}, at::TensorOptions().dtype(at::kFloat));
      flat.narrow(0, i, n).copy_(chunk);
    }
  });
  return out;
}

}  // namespace dtensor::checkpoint
