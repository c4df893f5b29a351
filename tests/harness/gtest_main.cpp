// The gtest binaries' main: gtest's own, plus what lets scripts/test.sh run the second backend's pass on the tests
// that use a backend and only those.
//
// The README's test command runs every ctest entry twice: on the shared-memory backend, then with
// DTENSOR_BACKEND=gloo. A test suite that never builds a process group (a tokenizer, a config parser, a dry run on
// a fake world) runs the same code both times. So:
//   - DTENSOR_TEST_RECORD_BACKEND_SUITES=FILE: each suite that made a real dtensor::World (threads as ranks) or
//     launched a process (tprun, a tool) while it ran appends "KEY<TAB>SUITE" to FILE. KEY is the binary and its
//     --gtest_filter, so each ctest entry reads back its own suites.
//   - DTENSOR_TEST_ONLY_BACKEND_SUITES=FILE: run only the suites FILE lists for this binary and filter (none: no
//     test). A missing FILE is an error, never a silent empty run.
// The count is the library's (dtensor::detail::real_worlds_created) and the harness's (processes_started); a
// suite's SetUpTestSuite runs between its start and end events, so a world made there counts too.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <set>
#include <string>

#include "dtensor/mesh/process_group.h"
#include "harness/subprocess.h"
#include "harness/temp_dir.h"

namespace {

int64_t backend_uses() { return dtensor::detail::real_worlds_created() + dtensor::testing::processes_started(); }

// The tests' temporary directories go when the binary ends.
class TempDirs : public ::testing::Environment {
 public:
  void TearDown() override { dtensor::testing::remove_temp_dirs(); }
};

class BackendSuiteRecorder : public ::testing::EmptyTestEventListener {
 public:
  BackendSuiteRecorder(std::string path, std::string key) : path_(std::move(path)), key_(std::move(key)) {}
  void OnTestSuiteStart(const ::testing::TestSuite&) override { at_start_ = backend_uses(); }
  void OnTestSuiteEnd(const ::testing::TestSuite& suite) override {
    if (backend_uses() == at_start_) return;
    std::ofstream out(path_, std::ios::app);  // one short line per write: appends from several binaries stay whole
    out << key_ << '\t' << suite.name() << '\n';
  }

 private:
  std::string path_, key_;
  int64_t at_start_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new TempDirs);
  std::string binary = argv[0];
  binary = binary.substr(binary.find_last_of('/') + 1);
  const std::string key = binary + " " + GTEST_FLAG_GET(filter);
  if (const char* path = std::getenv("DTENSOR_TEST_RECORD_BACKEND_SUITES"); path && *path) {
    ::testing::UnitTest::GetInstance()->listeners().Append(new BackendSuiteRecorder(path, key));
  }
  if (const char* path = std::getenv("DTENSOR_TEST_ONLY_BACKEND_SUITES"); path && *path) {
    std::ifstream in(path);
    if (!in) {
      std::cerr << "error: DTENSOR_TEST_ONLY_BACKEND_SUITES: cannot read '" << path << "'\n";
      return 2;
    }
    std::set<std::string> suites;
    for (std::string line; std::getline(in, line);) {
      const auto tab = line.find('\t');
      if (tab != std::string::npos && line.substr(0, tab) == key) suites.insert(line.substr(tab + 1));
    }
    std::string filter;
    for (const auto& s : suites) filter += (filter.empty() ? "" : ":") + s + ".*";
    GTEST_FLAG_SET(filter, filter.empty() ? "-*" : filter);
    std::printf("[%s] %zu suites that use a process group (recorded on the first backend's pass)\n", binary.c_str(),
                suites.size());
  }
  return RUN_ALL_TESTS();
}
