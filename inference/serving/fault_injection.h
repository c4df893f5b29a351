// A test hook for the serving engine's failure paths (tests/inference/serve_fault_test.py), read once from the
// environment:
//
//   DTENSOR_SERVE_FAULT=forward:N:R    rank R's N-th engine step (from 1) throws inside the forward, before any
//                                      collective; R = all: every rank's
//   DTENSOR_SERVE_FAULT=output:N       rank 0 throws while turning step N's logits into the first scored sequence's
//                                      token (a failure that touches one request)
//
// Unset or empty: no fault, one comparison per step. A malformed value throws std::invalid_argument naming it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace serve {

struct FaultInjection {
  enum class Where { kNone, kForward, kOutput };
  Where where = Where::kNone;
  int64_t step = 0;
  int rank = -1;  // kForward: the rank that throws; -1: every rank

  static FaultInjection from_env() {
    FaultInjection f;
    const char* v = std::getenv("DTENSOR_SERVE_FAULT");
    if (v == nullptr || *v == '\0') return f;
    const std::string s = v;
    auto bad = [&] {
      return std::invalid_argument("DTENSOR_SERVE_FAULT='" + s + "': expected forward:STEP:RANK (RANK a number or all) or output:STEP");
    };
    const size_t a = s.find(':');
    if (a == std::string::npos) throw bad();
    const std::string kind = s.substr(0, a);
    const size_t b = s.find(':', a + 1);
    try {
      f.step = std::stoll(s.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1));
      if (kind == "forward" && b != std::string::npos) {
        const std::string r = s.substr(b + 1);
        f.rank = r == "all" ? -1 : std::stoi(r);
        f.where = Where::kForward;
      } else if (kind == "output" && b == std::string::npos) {
        f.where = Where::kOutput;
      }
    } catch (const std::logic_error&) {
      throw bad();
    }
    if (f.where == Where::kNone || f.step < 1) throw bad();
    return f;
  }
  bool forward_fault(int64_t step_no, int my_rank) const {
    return where == Where::kForward && step_no == step && (rank < 0 || rank == my_rank);
  }
  bool output_fault(int64_t step_no) const { return where == Where::kOutput && step_no == step; }
};

}  // namespace serve
