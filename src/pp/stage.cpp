#include "dtensor/pp/stage.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <cstring>
#include <sstream>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/tensor/dtensor.h"

namespace dtensor::pp {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// A message's tag: the boundary between stages b and b + 1, what it carries, the microbatch. Both ends compute it.
enum class Carries { header = 0, activation = 1, gradient = 2 };
constexpr int kMaxMicrobatches = 1 << 16;
int tag_of(int boundary, Carries what, int mb) { return (boundary * 4 + static_cast<int>(what)) * kMaxMicrobatches + mb; }

constexpr int64_t kHeaderBytes = 512;

// What a receiver must know to allocate and rebuild an activation: "dtype;d0,d1,...;placements" (placements empty
// for a plain tensor, else Placement::to_string's joined by '|'), NUL-padded to kHeaderBytes.
struct Meta {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> local_shape;
  std::optional<Placements> placements;  // a DTensor's
};

at::Tensor encode(const Meta& m) {
  std::ostringstream os;
  os << static_cast<int>(m.dtype) << ";";
  for (size_t i = 0; i < m.local_shape.size(); ++i) os << (i ? "," : "") << m.local_shape[i];
  os << ";";
  if (m.placements) {
    os << "D";
    for (const auto& p : *m.placements) os << "|" << p.to_string();
  }
  const std::string s = os.str();
  DTENSOR_CHECK(static_cast<int64_t>(s.size()) < kHeaderBytes, "dtensor: pipeline activation header too long: ", s);
  at::Tensor t = at::zeros({kHeaderBytes}, at::kByte);
  std::memcpy(t.data_ptr<uint8_t>(), s.data(), s.size());
  return t;
}

Meta decode(const at::Tensor& t) {
  const std::string s(reinterpret_cast<const char*>(t.data_ptr<uint8_t>()));
  Meta m;
  std::vector<std::string> parts;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, ';');) parts.push_back(part);
  DTENSOR_CHECK(parts.size() >= 2, "dtensor: pipeline activation header '", s, "' is malformed");
  m.dtype = static_cast<at::ScalarType>(std::stoi(parts[0]));
  std::stringstream dims(parts[1]);
  for (std::string d; std::getline(dims, d, ',');) m.local_shape.push_back(std::stoll(d));
  if (parts.size() > 2 && !parts[2].empty()) {
    Placements p;
    std::stringstream pl(parts[2].substr(1));
    for (std::string x; std::getline(pl, x, '|');) {
      if (!x.empty()) p.push_back(Placement::parse(x));
    }
    m.placements = p;
  }
  return m;
}

at::Tensor local_of(const at::Tensor& t) { return is_dtensor(t) ? detail::local_tensor(t).contiguous() : t.contiguous(); }

}  // namespace

PipelineStage::PipelineStage(Forward forward, std::vector<at::Tensor> parameters, int stage_index, int num_stages,
                             ProcessGroup* group, std::optional<DeviceMesh> boundary_mesh)
    : forward_(std::move(forward)),
      stage_index_(stage_index),
      num_stages_(num_stages),
      group_(group),
      boundary_mesh_(std::move(boundary_mesh)) {
  DTENSOR_CHECK(num_stages >= 1 && stage_index >= 0 && stage_index < num_stages, "dtensor: PipelineStage ",
                stage_index, " of ", num_stages, " stages");
  for (auto& p : parameters) {
    if (p.requires_grad()) parameters_.push_back(p);
  }
}

struct PipelineSchedule::Microbatch {
  at::Tensor input_leaf;  // the received input (plain: the local shard), requiring grad; undefined on stage 0
  at::Tensor output;      // the stage's output (a DTensor where the forward made one)
  at::Tensor loss;        // the last stage's, scaled by 1/m
  at::Tensor grad_output; // received (as output's kind)
  at::Tensor grad_input;  // to send back: input_leaf's gradient
};

// One step's execution of this rank's program.
struct PipelineSchedule::Runner {
  PipelineSchedule& s;
  const std::vector<at::Tensor>& inputs;
  const std::vector<at::Tensor>& targets;
  std::map<int, PipelineStage*> local;                  // stage index -> stage
  std::map<std::pair<int, int>, Microbatch> state;      // (stage, mb)
  std::map<int, Meta> input_meta;                       // stage -> its input's header this step
  // A posted send or recv: the action it is and its peer name it if it fails (the text is built only then).
  struct Pending {
    Work work;
    at::Tensor buffer;
    Action action;
    int peer = -1;
    const char* what = "";  // more about the message ("receiving the activation's header")
  };
  std::map<std::tuple<int, int, int>, Pending> recvs;   // (stage, 0 act / 1 grad, mb)
  std::vector<Pending> sends;
  std::vector<at::Tensor> losses;
  StepStats stats;

  ProcessGroup& group_of(const PipelineStage& st) {
    DTENSOR_CHECK(st.group(), "dtensor: pipeline stage ", st.stage_index(), " sends to another rank without a group");
    return *st.group();
  }
  std::string where(const Action& a, int peer) const {
    return "pipeline stage " + std::to_string(a.stage) + " " + a.to_string() + " (pp rank " +
           std::to_string(s.pp_rank_) + ", peer pp rank " + std::to_string(peer) + ")";
  }
  [[noreturn]] void fail(const Pending& p, const std::exception& e) const {
    throw DTENSOR_ERROR("dtensor: ", where(p.action, p.peer), p.what, " failed: ", e.what());
  }
  void wait(Pending& p) {
    const auto t = Clock::now();
    try {
      p.work.wait();
    } catch (const std::exception& e) {
      fail(p, e);
    }
    stats.wait_ms += ms_since(t);
  }
  // A send or recv posted; a failure to start (a peer gone before it was posted) is named as the action's.
  Pending post(ProcessGroup& g, bool is_send, at::Tensor t, int peer, int tag, const Action& a, const char* what = "") {
    Pending p{Work(), t, a, peer, what};
    try {
      p.work = is_send ? g.send_async(t, peer, tag) : g.recv_async(t, peer, tag);
    } catch (const std::exception& e) {
      fail(p, e);
    }
    return p;
  }
  void send(PipelineStage& st, at::Tensor t, int peer_stage, int tag, const Action& a) {
    sends.push_back(post(group_of(st), true, t, s.spec_.stage_rank(peer_stage), tag, a));
    stats.bytes_sent += t.numel() * static_cast<int64_t>(t.element_size());
    ++stats.messages_sent;
  }
  // What stage `stage`'s recv of `carried` (0 activation, 1 gradient) for `mb` brought, waited for; `needing` is the
  // compute action that reads it.
  at::Tensor take(int stage, int carried, int mb, const Action& needing) {
    auto it = recvs.find({stage, carried, mb});
    DTENSOR_CHECK(it != recvs.end(), "dtensor: pipeline stage ", stage, " runs ", needing.to_string(), " without its ",
                  carried == 0 ? "RECV_F" : "RECV_B");
    wait(it->second);
    at::Tensor buffer = it->second.buffer;
    recvs.erase(it);
    return buffer;
  }

  void run(const Action& a) {
    PipelineStage& st = *local.at(a.stage);
    const int mb = a.microbatch;
    Microbatch& m = state[{a.stage, mb}];
    switch (a.type) {
      case ActionType::RECV_F: {
        ProcessGroup& g = group_of(st);
        const int peer = s.spec_.stage_rank(a.stage - 1);
        if (!input_meta.contains(a.stage)) {  // the step's first activation into this stage: its header first
          at::Tensor header = at::empty({kHeaderBytes}, at::kByte);
          Pending h = post(g, false, header, peer, tag_of(a.stage - 1, Carries::header, mb), a,
                           " receiving the activation's header");
          wait(h);
          input_meta[a.stage] = decode(header);
        }
        const Meta& meta = input_meta.at(a.stage);
        at::Tensor buf = at::empty(meta.local_shape, at::TensorOptions().dtype(meta.dtype));
        recvs[{a.stage, 0, mb}] = post(g, false, buf, peer, tag_of(a.stage - 1, Carries::activation, mb), a);
        break;
      }
      case ActionType::RECV_B: {
        ProcessGroup& g = group_of(st);
        const int peer = s.spec_.stage_rank(a.stage + 1);
        DTENSOR_CHECK(m.output.defined(), "dtensor: ", where(a, peer), " before its forward");
        at::Tensor buf = at::empty_like(local_of(m.output));
        recvs[{a.stage, 1, mb}] = post(g, false, buf, peer, tag_of(a.stage, Carries::gradient, mb), a);
        break;
      }
      case ActionType::SEND_F: {
        at::Tensor out = local_of(m.output.detach());
        if (mb == 0) {  // the step's first (every schedule runs a stage's forwards in microbatch order)
          Meta meta{out.scalar_type(), out.sizes().vec(), std::nullopt};
          if (is_dtensor(m.output)) meta.placements = placements(m.output);
          send(st, encode(meta), a.stage + 1, tag_of(a.stage, Carries::header, mb), a);
        }
        send(st, out, a.stage + 1, tag_of(a.stage, Carries::activation, mb), a);
        break;
      }
      case ActionType::SEND_B:
        DTENSOR_CHECK(m.grad_input.defined(), "dtensor: ", where(a, s.spec_.stage_rank(a.stage - 1)),
                      ": the input has no gradient (the stage's output does not depend on its input)");
        send(st, m.grad_input.contiguous(), a.stage - 1, tag_of(a.stage - 1, Carries::gradient, mb), a);
        m.grad_input = at::Tensor();
        break;
      case ActionType::FORWARD: forward(st, a, m); break;
      case ActionType::FULL_BACKWARD:
      case ActionType::BACKWARD_INPUT:
      case ActionType::BACKWARD_WEIGHT: backward(st, a, m); break;
    }
  }

  void forward(PipelineStage& st, const Action& a, Microbatch& m) {
    const int mb = a.microbatch;
    at::Tensor x;
    if (st.is_first()) {
      DTENSOR_CHECK(mb < static_cast<int>(inputs.size()), "dtensor: pipeline stage 0 has ", inputs.size(),
                    " microbatch inputs; the schedule runs ", s.spec_.microbatches);
      x = inputs[static_cast<size_t>(mb)];
    } else {
      at::Tensor local_in;
      std::optional<Placements> pl;
      if (local.contains(a.stage - 1)) {  // a hand-off on this rank
        const at::Tensor& prev = state.at({a.stage - 1, mb}).output;
        local_in = local_of(prev.detach());
        if (is_dtensor(prev)) pl = placements(prev);
      } else {
        local_in = take(a.stage, 0, mb, a);
        pl = input_meta.at(a.stage).placements;
      }
      m.input_leaf = local_in.detach().requires_grad_(true);
      if (pl) {
        DTENSOR_CHECK(st.boundary_mesh(), "dtensor: pipeline stage ", a.stage, " receives a DTensor activation ",
                      "but has no boundary_mesh to rebuild it on");
        x = DTensor::from_local(m.input_leaf, *st.boundary_mesh(), *pl);
      } else {
        x = m.input_leaf;
      }
    }
    const auto t = Clock::now();
    m.output = st.forward()(x);
    if (st.is_last()) {
      DTENSOR_CHECK(a.microbatch < static_cast<int>(targets.size()), "dtensor: pipeline's last stage has ",
                    targets.size(), " microbatch targets; the schedule runs ", s.spec_.microbatches);
      at::Tensor loss = s.loss_fn_(m.output, targets[static_cast<size_t>(mb)]);
      losses[static_cast<size_t>(mb)] = loss.detach();
      m.loss = loss / static_cast<double>(s.spec_.microbatches);
    }
    stats.compute_ms += ms_since(t);
  }

  // The tensor to differentiate and its incoming gradient: the scaled loss, or the output with the gradient the next
  // stage sent (or handed over on this rank).
  std::pair<at::Tensor, at::Tensor> root(PipelineStage& st, const Action& a, Microbatch& m) {
    if (st.is_last()) return {m.loss, at::Tensor()};
    if (!m.grad_output.defined()) {
      at::Tensor g;
      if (local.contains(a.stage + 1)) {
        Microbatch& next = state.at({a.stage + 1, a.microbatch});
        g = next.grad_input;
        DTENSOR_CHECK(g.defined(), "dtensor: pipeline stage ", a.stage + 1, " handed no gradient back");
        next.grad_input = at::Tensor();
      } else {
        g = take(a.stage, 1, a.microbatch, a);
      }
      if (is_dtensor(m.output)) g = DTensor::from_local(g, device_mesh(m.output), placements(m.output));
      m.grad_output = g;
    }
    return {m.output, m.grad_output};
  }

  void backward(PipelineStage& st, const Action& a, Microbatch& m) {
    auto [out, grad] = root(st, a, m);
    const auto t = Clock::now();
    std::vector<at::Tensor> grads;
    if (grad.defined()) grads.push_back(grad);
    if (a.type != ActionType::BACKWARD_INPUT && st.before_backward()) {
      st.before_backward()(a.microbatch, a.microbatch + 1 == s.spec_.microbatches);
    }
    if (a.type == ActionType::FULL_BACKWARD) {
      torch::autograd::backward({out}, grads);
      if (m.input_leaf.defined()) m.grad_input = m.input_leaf.grad();
      release(m);
    } else if (a.type == ActionType::BACKWARD_INPUT) {
      if (m.input_leaf.defined()) {
        m.grad_input = torch::autograd::grad({out}, {m.input_leaf}, grads, /*retain_graph=*/true)[0];
      }
    } else {  // BACKWARD_WEIGHT
      if (!st.parameters().empty()) {
        torch::autograd::backward({out}, grads, /*retain_graph=*/false, /*create_graph=*/false, st.parameters());
      }
      release(m);
    }
    stats.compute_ms += ms_since(t);
  }

  // The microbatch's activations and graph freed; its input's gradient stays until sent (or handed over).
  static void release(Microbatch& m) {
    at::Tensor keep = m.grad_input;
    m = Microbatch{};
    m.grad_input = keep;
  }
};

PipelineSchedule::PipelineSchedule(std::vector<PipelineStage*> stages, ScheduleSpec spec, LossFn loss_fn)
    : stages_(std::move(stages)), spec_(spec), loss_fn_(std::move(loss_fn)) {
  DTENSOR_CHECK(!stages_.empty(), "dtensor: PipelineSchedule without a stage");
  spec_.check();
  ProcessGroup* g = stages_.front()->group();
  const int group_size = g ? g->size() : 1;
  DTENSOR_CHECK(group_size == spec_.pp, "dtensor: PipelineSchedule ", to_string(spec_.kind), " for pp ", spec_.pp,
                " on a pp group of ", group_size, " ranks");
  pp_rank_ = g ? g->rank() : 0;
  const std::vector<int> want = spec_.stages_of(pp_rank_);
  std::vector<int> have;
  for (auto* st : stages_) {
    DTENSOR_CHECK(st->num_stages() == spec_.num_stages(), "dtensor: PipelineSchedule of ", spec_.num_stages(),
                  " stages given stage ", st->stage_index(), " of ", st->num_stages());
    have.push_back(st->stage_index());
  }
  DTENSOR_CHECK(have == want, "dtensor: pp rank ", pp_rank_, " of ", to_string(spec_.kind), " holds stages ",
                at::IntArrayRef(std::vector<int64_t>(want.begin(), want.end())), ", not those given: ",
                at::IntArrayRef(std::vector<int64_t>(have.begin(), have.end())));
  program_ = rank_programs(spec_)[static_cast<size_t>(pp_rank_)];
}

std::vector<at::Tensor> PipelineSchedule::step(const std::vector<at::Tensor>& inputs,
                                               const std::vector<at::Tensor>& targets) {
  const auto start = Clock::now();
  Runner r{*this, inputs, targets, {}, {}, {}, {}, {}, {}, {}};
  for (auto* st : stages_) r.local[st->stage_index()] = st;
  const bool last_here = r.local.contains(spec_.num_stages() - 1);
  if (last_here) r.losses.resize(static_cast<size_t>(spec_.microbatches));
  for (const Action& a : program_) r.run(a);
  for (auto& p : r.sends) r.wait(p);
  r.stats.ms = ms_since(start);
  stats_ = r.stats;
  return last_here ? r.losses : std::vector<at::Tensor>{};
}

std::vector<at::Tensor> PipelineSchedule::step_batch(const at::Tensor& input, const at::Tensor& target) {
  const int m = spec_.microbatches;
  auto split = [m](const at::Tensor& t, const char* what) {
    if (!t.defined()) return std::vector<at::Tensor>{};
    DTENSOR_CHECK(t.dim() >= 1 && t.size(0) % m == 0, "dtensor: pipeline step: the ", what, "'s batch of ",
                  t.dim() ? t.size(0) : 0, " does not split into ", m, " microbatches");
    return t.chunk(m, 0);
  };
  const std::vector<at::Tensor> inputs = split(input, "input");
  return step(inputs, split(target, "target"));
}

}  // namespace dtensor::pp
