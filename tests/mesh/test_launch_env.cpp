#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "dtensor/mesh/launch_env.h"

namespace {

// Sets the launcher variables for one test and restores the environment after it.
class EnvScope {
 public:
  explicit EnvScope(const std::map<std::string, std::string>& vars) {
    for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                          "DTENSOR_TIMEOUT_SEC"}) {
      if (const char* v = std::getenv(k)) saved_[k] = v;
      unsetenv(k);
    }
    for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  }
  ~EnvScope() {
    for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                          "DTENSOR_TIMEOUT_SEC"}) {
      unsetenv(k);
    }
    for (const auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
};

std::string error_of(const std::map<std::string, std::string>& vars) {
  EnvScope scope(vars);
  try {
    dtensor::LaunchEnv::from_environ();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

const std::map<std::string, std::string> kGood = {{"RANK", "1"},        {"WORLD_SIZE", "4"},
                                                   {"LOCAL_RANK", "1"},  {"LOCAL_WORLD_SIZE", "2"},
                                                   {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29501"}};

std::map<std::string, std::string> with(std::map<std::string, std::string> m, const std::string& k,
                                        const std::string& v) {
  if (v.empty()) m.erase(k);
  else m[k] = v;
  return m;
}

}  // namespace

TEST(LaunchEnv, ReadsTorchrunVariables) {
  EnvScope scope(kGood);
  auto env = dtensor::LaunchEnv::from_environ();
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29501);
}

TEST(LaunchEnv, LocalVariablesDefaultToGlobalOnes) {
  EnvScope scope(with(with(kGood, "LOCAL_RANK", ""), "LOCAL_WORLD_SIZE", ""));
  auto env = dtensor::LaunchEnv::from_environ();
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
}

TEST(LaunchEnv, MissingVariablesAreNamed) {
  for (const char* k : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    std::string e = error_of(with(kGood, k, ""));
    EXPECT_NE(e.find(std::string(k) + " is not set"), std::string::npos) << e;
    EXPECT_NE(e.find("tprun"), std::string::npos) << e;
  }
}

TEST(LaunchEnv, InconsistentValuesAreRejected) {
  EXPECT_NE(error_of(with(kGood, "RANK", "4")).find("RANK=4 is outside [0, WORLD_SIZE=4)"), std::string::npos);
  EXPECT_NE(error_of(with(kGood, "RANK", "-1")).find("RANK=-1"), std::string::npos);
  EXPECT_NE(error_of(with(kGood, "WORLD_SIZE", "0")).find("WORLD_SIZE=0"), std::string::npos);
  EXPECT_NE(error_of(with(kGood, "RANK", "one")).find("RANK='one' is not an integer"), std::string::npos);
  EXPECT_NE(error_of(with(kGood, "LOCAL_RANK", "2")).find("LOCAL_RANK=2"), std::string::npos);
  EXPECT_NE(error_of(with(kGood, "LOCAL_WORLD_SIZE", "8")).find("LOCAL_WORLD_SIZE=8"), std::string::npos);
  EXPECT_NE(error_of(with(kGood, "MASTER_PORT", "70000")).find("MASTER_PORT=70000"), std::string::npos);
  EXPECT_NE(error_of(with(kGood, "MASTER_PORT", "80x")).find("not an integer"), std::string::npos);
}

TEST(LaunchEnv, TimeoutFromEnvironment) {
  EnvScope scope(std::map<std::string, std::string>{{"DTENSOR_TIMEOUT_SEC", "2.5"}});
  EXPECT_DOUBLE_EQ(dtensor::timeout_seconds_from_environ(300), 2.5);
  setenv("DTENSOR_TIMEOUT_SEC", "soon", 1);
  EXPECT_THROW(dtensor::timeout_seconds_from_environ(300), std::runtime_error);
  unsetenv("DTENSOR_TIMEOUT_SEC");
  EXPECT_DOUBLE_EQ(dtensor::timeout_seconds_from_environ(300), 300);
}
