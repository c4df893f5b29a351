// Pipeline schedules as data (torch.distributed.pipelining's schedules.py: _Action, _ComputationType, the action
// lists _PipelineScheduleRuntime executes). A schedule is, for every pp rank, the ordered list of what that rank does
// in one step: compute actions on its stages' microbatches and the sends and receives between stages.
//
//   Action   "<stage><kind><microbatch>", PyTorch's text: 0F3 (stage 0's forward of microbatch 3), 1B0 (full
//            backward), 1I0 / 1W0 (zero bubble's backward split: the input's gradient, then the weights'),
//            0SEND_F3 / 1RECV_F3 (the activation of stage 0 -> 1), 1SEND_B0 / 0RECV_B0 (its gradient back).
//
// Stages are numbered 0..S-1 in model order; a rank holds S / pp of them: stage s is on rank s % pp ("loop", every
// schedule but the V-shaped ones). Single-stage schedules (GPipe, 1F1B, ZBH1) have S = pp; Interleaved1F1B has
// S = pp * v (v stages per rank, Megatron's virtual pipeline).
//
//   GPipe            all forwards, then all backwards (in microbatch order): bubble (p-1)/(m+p-1), m activations held
//   1F1B             p-1-r warmup forwards on rank r, then one forward one backward: the same bubble, p-r held
//   Interleaved1F1B  1F1B over v chunks per rank (Megatron's order: rounds of p microbatches): bubble / v
//   ZBH1             1F1B with each backward split in I (sent upstream at once) and W (deferred by r
//                    microbatches on rank r, into the cool-down's idle time): zero bubble's H1 (Qi et al., 2023)
//
// Every schedule runs each stage's backwards in microbatch order, so the gradients accumulate in the same order as
// gradient accumulation over the same microbatches at pp 1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtensor::pp {

enum class ActionType { FORWARD, FULL_BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, SEND_F, RECV_F, SEND_B, RECV_B };

struct Action {
  int stage = 0;
  ActionType type = ActionType::FORWARD;
  int microbatch = 0;

  std::string to_string() const;  // "0F3", "1SEND_B0"
  // The inverse of to_string; throws dtensor::Error naming a malformed action.
  static Action parse(const std::string& text);
  bool operator==(const Action& o) const = default;
};

enum class ScheduleKind { GPipe, OneFOneB, Interleaved1F1B, ZBH1 };
// "GPipe" | "1F1B" | "Interleaved1F1B" | "ZBH1" (PyTorch's class names without "Schedule"; ZBH1 is ours); anything
// else throws dtensor::Error naming the ones there are.
ScheduleKind schedule_from_string(const std::string& name);
std::string to_string(ScheduleKind kind);

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int pp = 1;               // ranks of the pipeline
  int stages_per_rank = 1;  // v: > 1 only for Interleaved1F1B
  int microbatches = 1;     // m

  int num_stages() const { return pp * stages_per_rank; }
  int stage_rank(int stage) const { return stage % pp; }
  std::vector<int> stages_of(int rank) const;  // the stages rank holds, in model order
  // Throws dtensor::Error for degrees that do not fit (v > 1 other than Interleaved1F1B, m not a multiple of pp for
  // Interleaved1F1B as Megatron's order needs, non-positive sizes).
  void check() const;
};

// The compute actions of every rank (F, B, or F, I, W), in the order each rank runs them.
std::vector<std::vector<Action>> compute_actions(const ScheduleSpec& spec);
// PyTorch's _add_send_recv: the same lists with each forward's output sent after it to the next stage's rank (and
// received there just before the forward that needs it), and each backward's input gradient sent back likewise. A
// hand-off between two stages of one rank needs neither.
std::vector<std::vector<Action>> with_communication(const std::vector<std::vector<Action>>& compute,
                                                    const ScheduleSpec& spec);
// Every rank's full program: with_communication(compute_actions(spec), spec), checked by validate.
std::vector<std::vector<Action>> rank_programs(const ScheduleSpec& spec);

// Throws dtensor::Error naming the first fault: a compute action missing or repeated (each stage runs F, and B or
// I + W, of every microbatch exactly once, on its own rank), a backward before its forward (or before the next
// stage's backward of that microbatch), a stage's forwards or backwards out of microbatch order, an unmatched send or recv, or a
// deadlock (some rank waits on a recv whose send never comes: the programs are simulated with sends that never
// block and receives that do).
void validate(const std::vector<std::vector<Action>>& programs, const ScheduleSpec& spec);

// The step simulated with each compute action's cost (in any unit; communication free): when every rank is busy and
// idle, from the action lists alone (llama_plan --pp and the measured idle time compare with it).
struct ActionCosts {
  double forward = 1, backward_input = 1, backward_weight = 1;  // a full backward costs input + weight
};
struct Simulation {
  double makespan = 0;             // the step's length
  std::vector<double> busy;        // per rank: time computing
  double bubble_fraction = 0;      // 1 - sum(busy) / (pp * makespan): the idle share of the step
  std::vector<int> peak_activations;  // per rank: most microbatches whose forward ran and whose backward did not
};
Simulation simulate(const std::vector<std::vector<Action>>& programs, const ScheduleSpec& spec,
                    const ActionCosts& costs = {});

}  // namespace dtensor::pp
