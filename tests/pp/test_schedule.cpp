// Pipeline schedules as data (dtensor/pp/schedule.h): the action lists, their checks and their simulated bubble.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dtensor/core/error.h"
#include "dtensor/pp/schedule.h"
#include "harness/multi_rank.h"

using dtensor::pp::Action;
using dtensor::pp::ActionType;
using dtensor::pp::ScheduleKind;
using dtensor::pp::ScheduleSpec;

namespace {

std::string text(const std::vector<Action>& program) {
  std::string out;
  for (const auto& a : program) out += (out.empty() ? "" : " ") + a.to_string();
  return out;
}

std::vector<ScheduleSpec> all_specs() {
  std::vector<ScheduleSpec> out;
  for (int p = 1; p <= 4; ++p) {
    for (int m = 1; m <= 9; ++m) {
      for (auto k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZBH1}) out.push_back({k, p, 1, m});
      for (int v = 1; v <= 3; ++v) {
        if (m % p == 0) out.push_back({ScheduleKind::Interleaved1F1B, p, v, m});
      }
    }
  }
  return out;
}

}  // namespace

TEST(PipelineSchedule, ActionsReadAndWritePyTorchsText) {
  for (const char* s : {"0F3", "1B0", "12I7", "2W0", "0SEND_F3", "1RECV_F3", "1SEND_B0", "0RECV_B10"}) {
    EXPECT_EQ(Action::parse(s).to_string(), s);
  }
  EXPECT_EQ(Action::parse("3RECV_B2"), (Action{3, ActionType::RECV_B, 2}));
  EXPECT_NE(dtensor::testing::error_of([] { Action::parse("0X1"); }).find("unknown kind 'X'"), std::string::npos);
  EXPECT_NE(dtensor::testing::error_of([] { Action::parse("F1"); }).find("is not <stage>"), std::string::npos);
  EXPECT_EQ(dtensor::pp::schedule_from_string("Interleaved1F1B"), ScheduleKind::Interleaved1F1B);
  EXPECT_NE(dtensor::testing::error_of([] { dtensor::pp::schedule_from_string("DualPipe"); })
                .find("unknown pipeline schedule 'DualPipe' (GPipe, 1F1B, Interleaved1F1B, ZBH1)"),
            std::string::npos);
}

TEST(PipelineSchedule, OneFOneBAtTwoStagesIsTheTextbookOrder) {
  const auto programs = dtensor::pp::rank_programs({ScheduleKind::OneFOneB, 2, 1, 4});
  EXPECT_EQ(text(programs[0]),
            "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0F2 0SEND_F2 0RECV_B1 0B1 0F3 0SEND_F3 0RECV_B2 0B2 0RECV_B3 0B3");
  EXPECT_EQ(text(programs[1]),
            "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F2 1F2 1B2 1SEND_B2 1RECV_F3 1F3 1B3 1SEND_B3");
  // Interleaved: rank 0 holds stages 0 and 2 of 4; its warmup is 2 (p - 1) + (v - 1) p = 4 forwards.
  const auto inter = dtensor::pp::compute_actions({ScheduleKind::Interleaved1F1B, 2, 2, 4});
  EXPECT_EQ(text(inter[0]), "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");
  // ZBH1: I at once, W deferred by r microbatches on rank r.
  const auto zb = dtensor::pp::compute_actions({ScheduleKind::ZBH1, 2, 1, 3});
  EXPECT_EQ(text(zb[0]), "0F0 0F1 0I0 0W0 0F2 0I1 0W1 0I2 0W2");
  EXPECT_EQ(text(zb[1]), "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1W2");
}

TEST(PipelineSchedule, EveryScheduleIsCompleteInOrderAndFreeOfDeadlock) {
  for (const auto& spec : all_specs()) {
    const std::string what = dtensor::pp::to_string(spec.kind) + " p" + std::to_string(spec.pp) + " v" +
                             std::to_string(spec.stages_per_rank) + " m" + std::to_string(spec.microbatches);
    EXPECT_EQ(dtensor::testing::error_of([&] { dtensor::pp::rank_programs(spec); }), "") << what;
  }
}

TEST(PipelineSchedule, TheBubbleIsTheTextbooksAndInterleavingAndZeroBubbleShrinkIt) {
  // F = 1, B = 2 (I 1 + W 1): 1F1B and GPipe idle (p - 1) / (m + p - 1) of the step.
  for (int p : {2, 4}) {
    for (int m : {p, 2 * p, 4 * p}) {
      const double textbook = static_cast<double>(p - 1) / (m + p - 1);
      for (auto k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
        const ScheduleSpec spec{k, p, 1, m};
        const auto sim = dtensor::pp::simulate(dtensor::pp::rank_programs(spec), spec);
        EXPECT_NEAR(sim.bubble_fraction, textbook, 1e-12) << dtensor::pp::to_string(k) << " p" << p << " m" << m;
        EXPECT_DOUBLE_EQ(sim.makespan, 3.0 * (m + p - 1));
        // Activations held: GPipe all m; 1F1B p - r on rank r.
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(sim.peak_activations[static_cast<size_t>(r)], k == ScheduleKind::GPipe ? m : std::min(m, p - r));
        }
      }
      const ScheduleSpec one{ScheduleKind::OneFOneB, p, 1, m}, zb{ScheduleKind::ZBH1, p, 1, m};
      const ScheduleSpec inter{ScheduleKind::Interleaved1F1B, p, 2, m};
      const double b1 = dtensor::pp::simulate(dtensor::pp::rank_programs(one), one).bubble_fraction;
      // Interleaved over v = 2 chunks of half the layers: half the costs per action.
      const double bi = dtensor::pp::simulate(dtensor::pp::rank_programs(inter), inter, {0.5, 0.5, 0.5}).bubble_fraction;
      const double bz = dtensor::pp::simulate(dtensor::pp::rank_programs(zb), zb).bubble_fraction;
      EXPECT_LT(bi, b1) << "p" << p << " m" << m;
      EXPECT_LT(bz, b1) << "p" << p << " m" << m;
    }
  }
}

TEST(PipelineSchedule, FaultsAreNamed) {
  using dtensor::testing::error_of;
  const ScheduleSpec spec{ScheduleKind::OneFOneB, 2, 1, 2};
  auto programs = dtensor::pp::rank_programs(spec);
  // Rank 1 waits for the gradient of microbatch 1 before it runs its forward: rank 0 waits on rank 1's gradient of 0.
  auto bad = programs;
  bad[0] = {Action::parse("0F0"), Action::parse("0SEND_F0"), Action::parse("0RECV_B0"), Action::parse("0B0"),
            Action::parse("0F1"), Action::parse("0SEND_F1"), Action::parse("0RECV_B1"), Action::parse("0B1")};
  bad[1] = {Action::parse("1RECV_F1"), Action::parse("1RECV_F0"), Action::parse("1F0"), Action::parse("1B0"),
            Action::parse("1SEND_B0"), Action::parse("1F1"), Action::parse("1B1"), Action::parse("1SEND_B1")};
  EXPECT_NE(error_of([&] { dtensor::pp::validate(bad, spec); }).find("deadlocks: rank 0 waits at 0RECV_B0"),
            std::string::npos)
      << error_of([&] { dtensor::pp::validate(bad, spec); });
  auto missing = programs;
  missing[1].pop_back();
  missing[1].pop_back();  // 1B1 1SEND_B1
  EXPECT_NE(error_of([&] { dtensor::pp::validate(missing, spec); }).find("never runs stage 1's input gradient of "
                                                                          "microbatch 1"),
            std::string::npos)
      << error_of([&] { dtensor::pp::validate(missing, spec); });
  auto swapped = dtensor::pp::compute_actions({ScheduleKind::GPipe, 1, 1, 2});
  std::swap(swapped[0][2], swapped[0][3]);
  EXPECT_NE(error_of([&] { dtensor::pp::validate(swapped, {ScheduleKind::GPipe, 1, 1, 2}); })
                .find("runs the backward of microbatch 1 where microbatch 0's is next"),
            std::string::npos);
  auto forwards = dtensor::pp::compute_actions({ScheduleKind::GPipe, 1, 1, 2});
  std::swap(forwards[0][0], forwards[0][1]);
  EXPECT_NE(error_of([&] { dtensor::pp::validate(forwards, {ScheduleKind::GPipe, 1, 1, 2}); })
                .find("runs the forward of microbatch 1 where microbatch 0's is next"),
            std::string::npos);
  EXPECT_NE(error_of([] { dtensor::pp::compute_actions({ScheduleKind::Interleaved1F1B, 2, 2, 3}); })
                .find("3 microbatches is not a multiple of pp 2"),
            std::string::npos);
  EXPECT_NE(error_of([] { dtensor::pp::compute_actions({ScheduleKind::OneFOneB, 2, 2, 4}); })
                .find("runs one stage per rank, not 2"),
            std::string::npos);
}
