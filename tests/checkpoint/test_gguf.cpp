// The GGUF reader: every block type's dequantization against ggml's own Python package (gguf.quants.dequantize on
// random blocks: tests/oracle/gguf_oracle.py blocks), a file the package wrote (metadata, tensor infos, values), and
// files written by hand here with one fault each (truncation, a bad magic, a type not read, a range past the end).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "checkpoint_test_util.h"
#include "dtensor/checkpoint/gguf.h"
#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/core/error.h"
#include "harness/subprocess.h"

namespace ckpt = dtensor::checkpoint;

namespace {

const std::map<std::string, std::string> kPythonEnv = {
    {"OMP_NUM_THREADS", "1"}, {"HF_HUB_OFFLINE", "1"}, {"TRANSFORMERS_VERBOSITY", "error"}};

// A GGUF file's bytes, written field by field (version 3, alignment 32).
struct GgufBytes {
  std::string header, data;
  uint64_t n_tensors = 0, n_kv = 0;
  std::string infos, kvs;

  template <class T>
  static void put(std::string& s, T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  static void put_string(std::string& s, const std::string& v) {
    put<uint64_t>(s, v.size());
    s += v;
  }
  void kv_string(const std::string& key, const std::string& v) {
    put_string(kvs, key);
    put<uint32_t>(kvs, 8);
    put_string(kvs, v);
    ++n_kv;
  }
  void kv_u32(const std::string& key, uint32_t v) {
    put_string(kvs, key);
    put<uint32_t>(kvs, 4);
    put<uint32_t>(kvs, v);
    ++n_kv;
  }
  // A tensor of `ne` (ggml order) and type, with `bytes` of data at the next aligned offset (offset_shift moves it).
  void tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, const std::string& bytes,
              int64_t offset_shift = 0) {
    while (data.size() % 32 != 0) data += '\0';
    put_string(infos, name);
    put<uint32_t>(infos, ne.size());
    for (uint64_t d : ne) put<uint64_t>(infos, d);
    put<uint32_t>(infos, type);
    put<uint64_t>(infos, data.size() + offset_shift);
    data += bytes;
    ++n_tensors;
  }
  std::string file(uint32_t magic = 0x46554747) const {
    std::string s;
    put<uint32_t>(s, magic);
    put<uint32_t>(s, 3);
    put<uint64_t>(s, n_tensors);
    put<uint64_t>(s, n_kv);
    s += kvs + infos;
    while (s.size() % 32 != 0) s += '\0';
    return s + data;
  }
};

std::string write(const std::string& name, const std::string& bytes) {
  const std::string path = dtensor::testing::fresh_dir("gguf") + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string floats(std::vector<float> v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4); }

std::string open_error(const std::string& path) {
  try {
    ckpt::GgufFile::open(path);
  } catch (const dtensor::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Gguf, EveryBlockTypeDequantizesAsGgmlsPackage) {
  const std::string out = dtensor::testing::fresh_dir("gguf_blocks") + "/blocks.safetensors";
  const auto made = dtensor::testing::run_process(
      {DTENSOR_PYTHON, DTENSOR_SOURCE_DIR "/tests/oracle/gguf_oracle.py", "blocks", out}, kPythonEnv, 300);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto ref = ckpt::SafetensorsFile::open(out);
  const std::vector<std::pair<std::string, ckpt::GgmlType>> types = {
      {"Q8_0", ckpt::GgmlType::Q8_0}, {"Q4_0", ckpt::GgmlType::Q4_0}, {"Q4_1", ckpt::GgmlType::Q4_1},
      {"Q5_0", ckpt::GgmlType::Q5_0}, {"Q4_K", ckpt::GgmlType::Q4_K}, {"Q5_K", ckpt::GgmlType::Q5_K},
      {"Q6_K", ckpt::GgmlType::Q6_K}};
  for (const auto& [name, type] : types) {
    const at::Tensor raw = ref.view(*ref.find("raw." + name)).contiguous();
    const at::Tensor want = ref.view(*ref.find("deq." + name));
    at::Tensor got = at::empty(want.sizes(), at::kFloat);
    for (int64_t r = 0; r < raw.size(0); ++r) {
      ckpt::dequantize_row(static_cast<uint32_t>(type), raw[r].data_ptr<uint8_t>(), got[r].data_ptr<float>(),
                           want.size(1));
    }
    // The same fp32 products in the same order: equal, bit for bit.
    EXPECT_TRUE(at::equal(got, want)) << name << ": max diff " << (got - want).abs().max().item<float>();
    EXPECT_EQ(raw.size(1), want.size(1) / ckpt::ggml_block_size(static_cast<uint32_t>(type)) *
                               ckpt::ggml_block_bytes(static_cast<uint32_t>(type))) << name;
  }
}

TEST(Gguf, ReadsMetadataTensorsAndValues) {
  GgufBytes g;
  g.kv_string("general.architecture", "llama");
  g.kv_u32("llama.block_count", 7);
  g.tensor("a", {3, 2}, 0, floats({1, 2, 3, 4, 5, 6}));  // F32, torch shape [2, 3]
  std::string q8(34, '\0');                                 // one Q8_0 block: d = 0.5 (fp16 0x3800), q = -16..15
  q8[0] = 0x00, q8[1] = 0x38;
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<char>(j - 16);
  g.tensor("b", {32}, 8, q8);
  const std::string path = write("ok.gguf", g.file());
  const auto f = ckpt::GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.string("general.architecture"), "llama");
  EXPECT_EQ(f.integer("llama.block_count"), 7);
  EXPECT_EQ(f.number("llama.block_count"), 7.0);
  ASSERT_EQ(f.tensors().size(), 2u);
  const auto* a = f.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(at::equal(f.dequantize(*a, at::kFloat), at::arange(1, 7, at::kFloat).view({2, 3})));
  EXPECT_TRUE(at::equal(f.dequantize(*f.find("b"), at::kFloat), (at::arange(32, at::kFloat) - 16) * 0.5));
  EXPECT_EQ(f.dequantize(*a, at::kBFloat16).scalar_type(), at::kBFloat16);
  // Typed access names the key and what it is.
  try {
    f.integer("general.architecture");
    ADD_FAILURE() << "no error";
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'general.architecture' is a string, not an integer"), std::string::npos) << e.what();
  }
  try {
    f.string("llama.context_length");
    ADD_FAILURE() << "no error";
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'llama.context_length' is missing"), std::string::npos) << e.what();
  }
}

TEST(Gguf, RefusesBadFilesByName) {
  GgufBytes g;
  g.kv_string("general.architecture", "llama");
  g.tensor("w", {4}, 0, floats({1, 2, 3, 4}));
  const std::string good = g.file();
  EXPECT_NE(open_error(write("magic.gguf", g.file(0x12345678))).find("not a GGUF file"), std::string::npos);
  for (size_t cut : {size_t{2}, size_t{20}, size_t{60}, good.size() - 4}) {  // inside the header, the infos, the data
    const std::string e = open_error(write("cut.gguf", good.substr(0, cut)));
    EXPECT_TRUE(e.find("truncated") != std::string::npos || e.find("runs past the end") != std::string::npos ||
                e.find("not a GGUF file") != std::string::npos)
        << cut << ": " << e;
  }
  GgufBytes iq;
  iq.tensor("iq", {32}, 20, std::string(18, '\0'));  // IQ4_NL: sized, not read
  const auto f = ckpt::GgufFile::open(write("iq.gguf", iq.file()));
  try {
    f.dequantize(f.tensors()[0], at::kFloat);
    ADD_FAILURE() << "no error";
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'iq' is of type IQ4_NL, which is not read"), std::string::npos) << e.what();
  }
  GgufBytes misaligned;
  misaligned.tensor("m", {4}, 0, floats({1, 2, 3, 4}), /*offset_shift=*/4);
  EXPECT_NE(open_error(write("misaligned.gguf", misaligned.file())).find("not aligned"), std::string::npos);
  GgufBytes rows;
  rows.tensor("r", {33}, 8, std::string(34, '\0'));  // Q8_0 rows of 33 values: not whole blocks
  EXPECT_NE(open_error(write("rows.gguf", rows.file())).find("not a multiple of its block of 32"), std::string::npos);
}
