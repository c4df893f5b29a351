#include "dtensor/pp/schedule.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <tuple>

#include "dtensor/core/error.h"

namespace dtensor::pp {

namespace {

const char* kind_text(ActionType t) {
  switch (t) {
    case ActionType::FORWARD: return "F";
    case ActionType::FULL_BACKWARD: return "B";
    case ActionType::BACKWARD_INPUT: return "I";
    case ActionType::BACKWARD_WEIGHT: return "W";
    case ActionType::SEND_F: return "SEND_F";
    case ActionType::RECV_F: return "RECV_F";
    case ActionType::SEND_B: return "SEND_B";
    case ActionType::RECV_B: return "RECV_B";
  }
  return "?";
}

bool is_compute(ActionType t) {
  return t == ActionType::FORWARD || t == ActionType::FULL_BACKWARD || t == ActionType::BACKWARD_INPUT ||
         t == ActionType::BACKWARD_WEIGHT;
}

Action act(int stage, ActionType t, int mb) { return Action{stage, t, mb}; }

// 1F1B's order on one stage: `warmup` forwards, then forward/backward pairs, then the remaining backwards. With
// `split`, each backward is I, and W follows the I of `defer` microbatches later (the rest at the end). ZBH1 defers by
// the rank: the later ranks, whose I's the gradient chain upstream waits on, run their W's after them; rank 0, which
// waits most, fills its waits with W's at once.
std::vector<Action> one_f_one_b(int stage, int m, int warmup, bool split, int defer) {
  std::vector<Action> out;
  const ActionType back = split ? ActionType::BACKWARD_INPUT : ActionType::FULL_BACKWARD;
  int next_w = 0;
  auto backward = [&](int mb) {
    out.push_back(act(stage, back, mb));
    if (split && mb - next_w >= defer) out.push_back(act(stage, ActionType::BACKWARD_WEIGHT, next_w++));
  };
  for (int i = 0; i < warmup; ++i) out.push_back(act(stage, ActionType::FORWARD, i));
  for (int i = 0; i < m - warmup; ++i) {
    out.push_back(act(stage, ActionType::FORWARD, warmup + i));
    backward(i);
  }
  for (int i = std::max(0, m - warmup); i < m; ++i) backward(i);
  while (split && next_w < m) out.push_back(act(stage, ActionType::BACKWARD_WEIGHT, next_w++));
  return out;
}

// Megatron's interleaved order on rank r (v chunks, m a multiple of p): the k-th forward is chunk (k / p) % v's
// microbatch (k / (p v)) p + k % p; backwards take the chunks in reverse. Warmup: 2 (p - 1 - r) + (v - 1) p.
std::vector<Action> interleaved(const ScheduleSpec& s, int r) {
  const int p = s.pp, v = s.stages_per_rank, m = s.microbatches, total = m * v;
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto fwd = [&](int k) { return act(((k / p) % v) * p + r, ActionType::FORWARD, mb_of(k)); };
  auto bwd = [&](int k) { return act((v - 1 - (k / p) % v) * p + r, ActionType::FULL_BACKWARD, mb_of(k)); };
  const int warmup = std::min(total, 2 * (p - 1 - r) + (v - 1) * p);
  std::vector<Action> out;
  for (int k = 0; k < warmup; ++k) out.push_back(fwd(k));
  for (int i = 0; i < total - warmup; ++i) {
    out.push_back(fwd(warmup + i));
    out.push_back(bwd(i));
  }
  for (int i = std::max(0, total - warmup); i < total; ++i) out.push_back(bwd(i));
  return out;
}

using Key = std::tuple<int, int, int>;  // (stage, class, microbatch): class 0 forward, 1 input grad, 2 weight grad
Key key(int stage, int cls, int mb) { return {stage, cls, mb}; }

}  // namespace

std::string Action::to_string() const { return std::to_string(stage) + kind_text(type) + std::to_string(microbatch); }

Action Action::parse(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  size_t j = text.size();
  while (j > i && std::isdigit(static_cast<unsigned char>(text[j - 1]))) --j;
  DTENSOR_CHECK(i > 0 && j < text.size() && j > i, "dtensor: pipeline action '", text,
                "' is not <stage><F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B><microbatch>");
  const std::string kind = text.substr(i, j - i);
  for (ActionType t : {ActionType::FORWARD, ActionType::FULL_BACKWARD, ActionType::BACKWARD_INPUT,
                       ActionType::BACKWARD_WEIGHT, ActionType::SEND_F, ActionType::RECV_F, ActionType::SEND_B,
                       ActionType::RECV_B}) {
    if (kind == kind_text(t)) return Action{std::stoi(text.substr(0, i)), t, std::stoi(text.substr(j))};
  }
  throw DTENSOR_ERROR("dtensor: pipeline action '", text, "' has the unknown kind '", kind,
                      "' (F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B)");
}

ScheduleKind schedule_from_string(const std::string& name) {
  if (name == "GPipe") return ScheduleKind::GPipe;
  if (name == "1F1B") return ScheduleKind::OneFOneB;
  if (name == "Interleaved1F1B") return ScheduleKind::Interleaved1F1B;
  if (name == "ZBH1") return ScheduleKind::ZBH1;
  throw DTENSOR_ERROR("dtensor: unknown pipeline schedule '", name, "' (GPipe, 1F1B, Interleaved1F1B, ZBH1)");
}

std::string to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe: return "GPipe";
    case ScheduleKind::OneFOneB: return "1F1B";
    case ScheduleKind::Interleaved1F1B: return "Interleaved1F1B";
    case ScheduleKind::ZBH1: return "ZBH1";
  }
  return "?";
}

std::vector<int> ScheduleSpec::stages_of(int rank) const {
  std::vector<int> out;
  for (int s = rank; s < num_stages(); s += pp) out.push_back(s);
  return out;
}

void ScheduleSpec::check() const {
  DTENSOR_CHECK(pp >= 1 && stages_per_rank >= 1 && microbatches >= 1, "dtensor: pipeline schedule ", to_string(kind),
                ": pp ", pp, ", stages per rank ", stages_per_rank, " and microbatches ", microbatches,
                " must be positive");
  DTENSOR_CHECK(stages_per_rank == 1 || kind == ScheduleKind::Interleaved1F1B, "dtensor: pipeline schedule ",
                to_string(kind), " runs one stage per rank, not ", stages_per_rank, " (Interleaved1F1B runs several)");
  DTENSOR_CHECK(kind != ScheduleKind::Interleaved1F1B || microbatches % pp == 0, "dtensor: Interleaved1F1B takes "
                "microbatches in rounds of pp: ", microbatches, " microbatches is not a multiple of pp ", pp);
}

std::vector<std::vector<Action>> compute_actions(const ScheduleSpec& spec) {
  spec.check();
  const int p = spec.pp, m = spec.microbatches;
  std::vector<std::vector<Action>> out(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto& prog = out[static_cast<size_t>(r)];
    switch (spec.kind) {
      case ScheduleKind::GPipe:
        for (int i = 0; i < m; ++i) prog.push_back(act(r, ActionType::FORWARD, i));
        for (int i = 0; i < m; ++i) prog.push_back(act(r, ActionType::FULL_BACKWARD, i));
        break;
      case ScheduleKind::OneFOneB: prog = one_f_one_b(r, m, std::min(m, p - 1 - r), false, 0); break;
      case ScheduleKind::ZBH1: prog = one_f_one_b(r, m, std::min(m, p - 1 - r), true, r); break;
      case ScheduleKind::Interleaved1F1B: prog = interleaved(spec, r); break;
    }
  }
  return out;
}

std::vector<std::vector<Action>> with_communication(const std::vector<std::vector<Action>>& compute,
                                                    const ScheduleSpec& spec) {
  const int last = spec.num_stages() - 1;
  std::vector<std::vector<Action>> out(compute.size());
  for (size_t r = 0; r < compute.size(); ++r) {
    const int rank = static_cast<int>(r);
    for (const Action& a : compute[r]) {
      const int s = a.stage, mb = a.microbatch;
      const bool prev_remote = s > 0 && spec.stage_rank(s - 1) != rank;
      const bool next_remote = s < last && spec.stage_rank(s + 1) != rank;
      const bool backward = a.type == ActionType::FULL_BACKWARD || a.type == ActionType::BACKWARD_INPUT;
      if (a.type == ActionType::FORWARD && prev_remote) out[r].push_back(act(s, ActionType::RECV_F, mb));
      if (backward && next_remote) out[r].push_back(act(s, ActionType::RECV_B, mb));
      out[r].push_back(a);
      if (a.type == ActionType::FORWARD && next_remote) out[r].push_back(act(s, ActionType::SEND_F, mb));
      if (backward && prev_remote) out[r].push_back(act(s, ActionType::SEND_B, mb));
    }
  }
  return out;
}

std::vector<std::vector<Action>> rank_programs(const ScheduleSpec& spec) {
  auto programs = with_communication(compute_actions(spec), spec);
  validate(programs, spec);
  return programs;
}

void validate(const std::vector<std::vector<Action>>& programs, const ScheduleSpec& spec) {
  simulate(programs, spec);  // the checks live there, with the timing they need
}

Simulation simulate(const std::vector<std::vector<Action>>& programs, const ScheduleSpec& spec,
                    const ActionCosts& costs) {
  spec.check();
  const int p = spec.pp, m = spec.microbatches, S = spec.num_stages();
  DTENSOR_CHECK(static_cast<int>(programs.size()) == p, "dtensor: pipeline schedule: ", programs.size(),
                " rank programs for pp ", p);
  // Per-rank checks that need no timing: each compute action once, on its stage's rank, backwards in order.
  for (int r = 0; r < p; ++r) {
    std::set<Key> seen;
    std::map<int, int> next_backward, next_forward;  // stage -> the microbatch its next I/B (F) must be
    for (const Action& a : programs[static_cast<size_t>(r)]) {
      DTENSOR_CHECK(a.stage >= 0 && a.stage < S && a.microbatch >= 0 && a.microbatch < m, "dtensor: pipeline "
                    "schedule: rank ", r, "'s action ", a.to_string(), " names no stage of ", S, " or microbatch of ", m);
      DTENSOR_CHECK(spec.stage_rank(a.stage) == r, "dtensor: pipeline schedule: rank ", r, " runs ", a.to_string(),
                    " of stage ", a.stage, ", which lives on rank ", spec.stage_rank(a.stage));
      if (!is_compute(a.type)) continue;
      const bool backward = a.type == ActionType::FULL_BACKWARD || a.type == ActionType::BACKWARD_INPUT;
      std::vector<int> classes;
      if (a.type == ActionType::FORWARD) classes = {0};
      if (a.type == ActionType::FULL_BACKWARD) classes = {1, 2};
      if (a.type == ActionType::BACKWARD_INPUT) classes = {1};
      if (a.type == ActionType::BACKWARD_WEIGHT) classes = {2};
      for (int c : classes) {
        DTENSOR_CHECK(seen.insert(key(a.stage, c, a.microbatch)).second, "dtensor: pipeline schedule: rank ", r,
                      " runs ", a.to_string(), "'s work twice");
      }
      if (a.type == ActionType::FORWARD) {
        int& want = next_forward[a.stage];
        DTENSOR_CHECK(a.microbatch == want, "dtensor: pipeline schedule: stage ", a.stage, " runs the forward of "
                      "microbatch ", a.microbatch, " where microbatch ", want, "'s is next (forwards run in microbatch "
                      "order: the step's first carries the shapes)");
        ++want;
      }
      if (a.type != ActionType::FORWARD) {
        DTENSOR_CHECK(seen.contains(key(a.stage, 0, a.microbatch)), "dtensor: pipeline schedule: rank ", r, " runs ",
                      a.to_string(), " before its forward");
      }
      if (a.type == ActionType::BACKWARD_WEIGHT) {
        DTENSOR_CHECK(seen.contains(key(a.stage, 1, a.microbatch)), "dtensor: pipeline schedule: rank ", r, " runs ",
                      a.to_string(), " before its input gradient (I)");
      }
      if (backward) {
        int& want = next_backward[a.stage];
        DTENSOR_CHECK(a.microbatch == want, "dtensor: pipeline schedule: stage ", a.stage, " runs the backward of "
                      "microbatch ", a.microbatch, " where microbatch ", want, "'s is next (backwards run in "
                      "microbatch order, as gradient accumulation adds them)");
        ++want;
      }
    }
    for (int s : spec.stages_of(r)) {
      for (int mb = 0; mb < m; ++mb) {
        for (int c = 0; c < 3; ++c) {
          DTENSOR_CHECK(seen.contains(key(s, c, mb)), "dtensor: pipeline schedule: rank ", r, " never runs stage ", s,
                        "'s ", c == 0 ? "forward" : c == 1 ? "input gradient" : "weight gradient", " of microbatch ", mb);
        }
      }
    }
  }
  // The step in time: sends never block, a recv waits for its send, a compute action for what it reads.
  Simulation sim;
  sim.busy.assign(static_cast<size_t>(p), 0.0);
  sim.peak_activations.assign(static_cast<size_t>(p), 0);
  std::vector<size_t> pc(static_cast<size_t>(p), 0);
  std::vector<double> clock(static_cast<size_t>(p), 0.0);
  std::vector<int> live(static_cast<size_t>(p), 0);
  std::map<Key, double> done;                    // compute finished: (stage, class, mb) -> time
  std::map<std::tuple<int, int, int>, double> sent;  // (receiving stage, 0 act / 1 grad, mb) -> time
  std::set<std::tuple<int, int, int>> received;
  auto ready = [&](const Key& k, double& t) {
    auto it = done.find(k);
    if (it == done.end()) return false;
    t = std::max(t, it->second);
    return true;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      auto& prog = programs[static_cast<size_t>(r)];
      auto& i = pc[static_cast<size_t>(r)];
      double& now = clock[static_cast<size_t>(r)];
      while (i < prog.size()) {
        const Action& a = prog[i];
        const int s = a.stage, mb = a.microbatch;
        double start = now;
        bool can = true;
        switch (a.type) {
          case ActionType::SEND_F:
            DTENSOR_CHECK(s + 1 < S && spec.stage_rank(s + 1) != r, "dtensor: pipeline schedule: ", a.to_string(),
                          " sends to no other rank");
            DTENSOR_CHECK(done.contains(key(s, 0, mb)), "dtensor: pipeline schedule: ", a.to_string(),
                          " before its forward");
            sent[{s + 1, 0, mb}] = now;
            break;
          case ActionType::SEND_B:
            DTENSOR_CHECK(s > 0 && spec.stage_rank(s - 1) != r, "dtensor: pipeline schedule: ", a.to_string(),
                          " sends to no other rank");
            DTENSOR_CHECK(done.contains(key(s, 1, mb)), "dtensor: pipeline schedule: ", a.to_string(),
                          " before its backward");
            sent[{s - 1, 1, mb}] = now;
            break;
          case ActionType::RECV_F:
          case ActionType::RECV_B: {
            const int c = a.type == ActionType::RECV_F ? 0 : 1;
            auto it = sent.find({s, c, mb});
            can = it != sent.end();
            if (can) {
              now = std::max(now, it->second);
              received.insert({s, c, mb});
            }
            break;
          }
          case ActionType::FORWARD:
            if (s > 0) {
              can = spec.stage_rank(s - 1) == r ? ready(key(s - 1, 0, mb), start) : received.contains({s, 0, mb});
              DTENSOR_CHECK(spec.stage_rank(s - 1) == r || can, "dtensor: pipeline schedule: rank ", r, " runs ",
                            a.to_string(), " without receiving its input (", s, "RECV_F", mb, ")");
            }
            if (can) {
              done[key(s, 0, mb)] = now = start + costs.forward;
              sim.busy[static_cast<size_t>(r)] += costs.forward;
              auto& l = live[static_cast<size_t>(r)];
              sim.peak_activations[static_cast<size_t>(r)] = std::max(sim.peak_activations[static_cast<size_t>(r)], ++l);
            }
            break;
          case ActionType::FULL_BACKWARD:
          case ActionType::BACKWARD_INPUT:
            if (s + 1 < S) {
              can = spec.stage_rank(s + 1) == r ? ready(key(s + 1, 1, mb), start) : received.contains({s, 1, mb});
              DTENSOR_CHECK(spec.stage_rank(s + 1) == r || can, "dtensor: pipeline schedule: rank ", r, " runs ",
                            a.to_string(), " without receiving its output's gradient (", s, "RECV_B", mb, ")");
            }
            if (can) {
              const bool full = a.type == ActionType::FULL_BACKWARD;
              const double cost = costs.backward_input + (full ? costs.backward_weight : 0);
              now = start + cost;
              done[key(s, 1, mb)] = now;
              if (full) done[key(s, 2, mb)] = now;
              sim.busy[static_cast<size_t>(r)] += cost;
              if (full) --live[static_cast<size_t>(r)];
            }
            break;
          case ActionType::BACKWARD_WEIGHT:
            now += costs.backward_weight;
            done[key(s, 2, mb)] = now;
            sim.busy[static_cast<size_t>(r)] += costs.backward_weight;
            --live[static_cast<size_t>(r)];
            break;
        }
        if (!can) break;
        ++i;
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    const auto& prog = programs[static_cast<size_t>(r)];
    const size_t i = pc[static_cast<size_t>(r)];
    if (i < prog.size()) {
      throw DTENSOR_ERROR("dtensor: pipeline schedule ", to_string(spec.kind), " deadlocks: rank ", r, " waits at ",
                          prog[i].to_string(), " (action ", i, " of ", prog.size(), ") for what no rank sends");
    }
  }
  for (const auto& [k, _] : sent) {
    DTENSOR_CHECK(received.contains(k), "dtensor: pipeline schedule: stage ", std::get<0>(k), " never receives the ",
                  std::get<1>(k) == 0 ? "activation" : "gradient", " of microbatch ", std::get<2>(k), " sent to it");
  }
  for (double t : clock) sim.makespan = std::max(sim.makespan, t);
  double busy = 0;
  for (double b : sim.busy) busy += b;
  sim.bubble_fraction = sim.makespan > 0 ? 1.0 - busy / (p * sim.makespan) : 0.0;
  return sim;
}

}  // namespace dtensor::pp
