// The safetensors reader and writer: a round trip of every dtype, header checks (truncation, bad JSON, ranges
// that do not fit), and the CRC-32 being zlib's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint_test_util.h"
#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/core/error.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using namespace dtensor::testing;
namespace ckpt = dtensor::checkpoint;
namespace fs = std::filesystem;

TEST(Safetensors, RoundTripEveryDtype) {
  const std::string path = fresh_dir("st") + "/x.safetensors";
  std::vector<at::Tensor> values = {seeded_randn(1, {3, 4}), seeded_randn(2, {5}).to(at::kBFloat16),
                                    seeded_randn(3, {2, 2}).to(at::kHalf), seeded_randn(4, {}).to(at::kDouble),
                                    at::arange(6, at::kLong).view({2, 3}), at::arange(4, at::kInt),
                                    at::zeros({0, 3}), at::tensor({1, 0}).to(at::kBool)};
  std::vector<ckpt::TensorInfo> layout;
  for (size_t i = 0; i < values.size(); ++i) layout.push_back({"t" + std::to_string(i), values[i].scalar_type(), values[i].sizes().vec()});
  ckpt::SafetensorsWriter writer(path, layout, {{"format", "pt"}});
  for (const auto& v : values) writer.write(v.t().t());  // any strides
  const auto result = writer.finish();
  EXPECT_EQ(result.size, static_cast<int64_t>(fs::file_size(path)));

  auto f = ckpt::SafetensorsFile::open(path);
  EXPECT_EQ(f.crc32(), result.crc32);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  for (size_t i = 0; i < values.size(); ++i) {
    const auto* stored = f.find("t" + std::to_string(i));
    ASSERT_NE(stored, nullptr);
    EXPECT_TRUE(at::equal(f.view(*stored), values[i])) << i;
  }
}

TEST(Safetensors, Crc32IsZlibs) {
  const std::string text = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(ckpt::crc32_update(0, text.data(), text.size()), 0x414FA339u);
  // Continuing over pieces (and unaligned starts) gives the same value.
  uint32_t c = ckpt::crc32_update(0, text.data(), 5);
  c = ckpt::crc32_update(c, text.data() + 5, text.size() - 5);
  EXPECT_EQ(c, 0x414FA339u);
  EXPECT_EQ(ckpt::crc32_update(c, nullptr, 0), c);  // an empty tensor's bytes change nothing
}

TEST(Safetensors, BadFilesGiveClearErrors) {
  const std::string dir = fresh_dir("stbad");
  auto write_raw = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
    return dir + "/" + name;
  };
  auto header = [](const std::string& json) {
    std::string len(8, '\0');
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
    return len + json;
  };
  auto msg = [](const std::string& path) { return error_of([&] { ckpt::SafetensorsFile::open(path); }); };
  EXPECT_NE(msg(write_raw("short", "abc")).find("truncated"), std::string::npos);
  EXPECT_NE(msg(write_raw("json", header("{not json"))).find("not JSON"), std::string::npos);
  EXPECT_NE(msg(write_raw("range", header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})") + "1234")).find("truncated"),
            std::string::npos);
  EXPECT_NE(msg(write_raw("size", header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})") + "12345678")).find("do not hold 12"),
            std::string::npos);
  EXPECT_NE(msg(write_raw("dtype", header(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})") + "1")).find("unknown safetensors dtype"),
            std::string::npos);
  EXPECT_NE(msg(dir + "/absent").find("cannot open"), std::string::npos);
}
