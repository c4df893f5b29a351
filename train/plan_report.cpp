#include "train/plan_report.h"

#include <algorithm>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace train {
namespace {

using dtensor::CommRecord;
using dtensor::StepPhase;

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

const char* short_name(const std::string& collective) {
  if (collective == "all_reduce") return "AR";
  if (collective == "all_gather") return "AG";
  if (collective == "reduce_scatter") return "RS";
  if (collective == "all_to_all") return "A2A";
  if (collective == "broadcast") return "BC";
  if (collective == "fused_all_gather_matmul") return "AG+mm";  // async TP
  if (collective == "fused_matmul_reduce_scatter") return "mm+RS";
  return collective.c_str();
}

// "model.layers.12.mlp" -> "model.layers.12"; anything else stays as it is ("" -> "(no module)").
std::string row_of(const std::string& module) {
  const std::string prefix = "model.layers.";
  if (module.rfind(prefix, 0) == 0) return module.substr(0, module.find('.', prefix.size()));
  return module.empty() ? "(no module)" : module;
}

struct Row {
  std::string label;
  std::vector<CommRecord> forward, backward, optimizer;
};

// "2 AG 1.00 MiB, 2 RS 4.00 MiB" (count, collective, bytes of this rank's input per call)
std::string describe(const std::vector<CommRecord>& records) {
  std::map<std::string, std::pair<int64_t, int64_t>> by;  // collective@dim -> (count, bytes)
  std::vector<std::string> order;
  for (const auto& r : records) {
    const std::string key = std::string(short_name(r.collective)) + (r.mesh_dim == "tp" || r.mesh_dim == "0" ? "" : "@" + r.mesh_dim);
    if (!by.count(key)) order.push_back(key);
    by[key].first += r.count;
    by[key].second += r.bytes;
  }
  std::string out;
  for (const auto& key : order) {
    const auto& [count, bytes] = by[key];
    out += (out.empty() ? "" : ", ") + std::to_string(count) + " " + key + " " + human_bytes(double(bytes) / count);
  }
  return out.empty() ? "-" : out;
}

std::vector<Row> rows_of(const dtensor::RankReport& rank) {
  std::vector<Row> rows;
  std::map<std::string, size_t> index;
  for (const auto& r : rank.comms) {
    const std::string label = row_of(r.module);
    auto it = index.find(label);
    if (it == index.end()) {
      it = index.emplace(label, rows.size()).first;
      rows.push_back({label, {}, {}, {}});
    }
    Row& row = rows[it->second];
    (r.phase == StepPhase::FORWARD ? row.forward : r.phase == StepPhase::BACKWARD ? row.backward : row.optimizer).push_back(r);
  }
  return rows;
}

double rows_seconds(const Row& row, const CostModel& cost) {
  double s = 0;
  for (const auto* list : {&row.forward, &row.backward, &row.optimizer}) {
    for (const auto& r : *list) s += record_seconds(r, cost);
  }
  return s;
}

nlohmann::json rank_json(const dtensor::RankReport& r, const CostModel& cost) {
  nlohmann::json comms = nlohmann::json::array();
  for (const auto& c : r.comms) {
    comms.push_back({{"phase", dtensor::step_phase_name(c.phase)}, {"module", c.module}, {"collective", c.collective},
                     {"mesh_dim", c.mesh_dim}, {"group_size", c.group_size}, {"count", c.count}, {"bytes", c.bytes}});
  }
  const StepEstimate e = estimate_step(r, cost);
  return {{"rank", r.rank}, {"coordinate", r.coordinate}, {"param_bytes", r.param_bytes}, {"num_params", r.num_params},
          {"grad_bytes", r.grad_bytes}, {"optimizer_state_bytes", r.optimizer_state_bytes},
          {"activation_bytes", r.activation_bytes}, {"peak_bytes", r.peak_bytes}, {"matmul_flops", r.matmul_flops},
          {"allocated_bytes", r.allocated_bytes}, {"dtensor_ops", r.dtensor_ops},
          {"estimate", {{"compute_s", e.compute_s}, {"other_s", e.other_s}, {"dispatch_s", e.dispatch_s},
                        {"comm_s", e.comm_s}, {"step_s", e.step_s},
                        {"fused_comm_s", e.fused_comm_s}, {"fused_overhead_s", e.fused_overhead_s},
                        {"step_overlapped_s", e.step_overlapped_s}}},
          {"comms", comms}};
}

}  // namespace

void print_tables(std::ostream& os, const PlanOptions& o, const dtensor::DryRunReport& report, const CostModel& cost) {
  const dtensor::RankReport& r0 = report.ranks.front();
  char line[512];
  os << "# llama_plan: " << o.model.to_string() << "\n# seq_len=" << o.seq_len << " batch=" << o.batch << " mesh=";
  for (size_t d = 0; d < report.mesh_shape.size(); ++d) {
    os << (d ? " x " : "") << report.mesh_dim_names[d] << " " << report.mesh_shape[d];
  }
  os << " sequence_parallel=" << o.sequence_parallel << " loss_parallel=" << o.loss_parallel
     << " async_tp=" << o.async_tp << "\n";
  os << "\n# collectives per step, rank " << r0.rank << " (count, type, bytes of this rank's input per call; layers with "
     << "the same traffic merged)\n";
  std::snprintf(line, sizeof line, "%-24s %-44s %-44s %10s\n", "module", "forward", "backward", "est ms");
  os << line;
  const auto rows = rows_of(r0);
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    const std::string f = describe(rows[i].forward), b = describe(rows[i].backward);
    const bool layer = rows[i].label.rfind("model.layers.", 0) == 0;
    while (layer && j < rows.size() && rows[j].label.rfind("model.layers.", 0) == 0 &&
           describe(rows[j].forward) == f && describe(rows[j].backward) == b) {
      ++j;
    }
    std::string label = rows[i].label;
    if (j - i > 1) label += "-" + rows[j - 1].label.substr(std::string("model.layers.").size()) + " (each)";
    std::snprintf(line, sizeof line, "%-24s %-44s %-44s %10.3f\n", label.c_str(), f.c_str(), b.c_str(),
                  rows_seconds(rows[i], cost) * 1e3);
    os << line;
    if (!rows[i].optimizer.empty()) os << "    optimizer: " << describe(rows[i].optimizer) << "\n";
    i = j;
  }
  os << "\n# totals per step, rank " << r0.rank << "\n";
  for (auto phase : {StepPhase::FORWARD, StepPhase::BACKWARD, StepPhase::OPTIMIZER}) {
    const auto counts = r0.counts(phase), bytes = r0.bytes(phase);
    for (const auto& [name, n] : counts) {
      std::snprintf(line, sizeof line, "%-10s %-16s %8lld calls %14s\n", dtensor::step_phase_name(phase), name.c_str(),
                    static_cast<long long>(n), human_bytes(static_cast<double>(bytes.at(name))).c_str());
      os << line;
    }
  }
  os << "\n# memory per rank (measured on the meta run)\n";
  for (const auto& r : report.ranks) {
    os << "rank " << r.rank << ": parameters " << human_bytes(r.param_bytes) << " (" << r.num_params << " elements), gradients "
       << human_bytes(r.grad_bytes) << ", optimizer state " << human_bytes(r.optimizer_state_bytes)
       << ", activations kept for backward " << human_bytes(r.activation_bytes) << ", peak " << human_bytes(r.peak_bytes)
       << "\n";
  }
  os << "ranks simulated:";
  for (const auto& r : report.ranks) os << " " << r.rank;
  os << "; ranks whose numbers differ from rank " << r0.rank << ":";
  if (report.differing_ranks.empty()) os << " none";
  for (int r : report.differing_ranks) os << " " << r;
  os << "\n";
  const StepEstimate e = estimate_step(r0, cost);
  std::snprintf(line, sizeof line,
                "\n# estimate (no overlap): compute %.1f ms (%.3g matmul GFLOP at %.1f GFLOP/s), the rest %.1f ms "
                "(%.3g MB allocated, at %.1f GB/s), DTensor dispatch %.1f ms (%lld ops at %.1f us), communication "
                "%.1f ms (%s), async TP hand-offs %.1f ms, step %.1f ms\n",
                e.compute_s * 1e3, r0.matmul_flops / 1e9, cost.matmul_gflops, e.other_s * 1e3,
                static_cast<double>(r0.allocated_bytes) / 1e6, cost.memory_gbps, e.dispatch_s * 1e3,
                static_cast<long long>(r0.dtensor_ops), cost.dtensor_op_us, e.comm_s * 1e3,
                cost.comm_source.c_str(), e.fused_overhead_s * 1e3, e.step_s * 1e3);
  os << line;
  if (!cost.machine_source.empty()) os << "# machine: " << cost.machine_source << "\n";
  if (e.fused_comm_s > 0) {
    std::snprintf(line, sizeof line,
                  "# async TP at best (its fused collectives, %.1f ms, hidden behind the matmuls): step %.1f ms\n",
                  e.fused_comm_s * 1e3, e.step_overlapped_s * 1e3);
    os << line;
  }
  os << summary_line(o, report, cost) << "\n";
}

std::string summary_line(const PlanOptions& o, const dtensor::DryRunReport& report, const CostModel& cost) {
  const dtensor::RankReport& r0 = report.ranks.front();
  int64_t fwd_calls = 0, bwd_calls = 0, comm_bytes = 0;
  for (const auto& c : r0.comms) {
    if (c.phase == StepPhase::FORWARD) fwd_calls += c.count;
    if (c.phase == StepPhase::BACKWARD) bwd_calls += c.count;
    comm_bytes += c.bytes;
  }
  const StepEstimate e = estimate_step(r0, cost);
  std::ostringstream os;
  os << "summary tp=" << o.tp << " dp=" << o.dp << " layers=" << o.model.num_hidden_layers
     << " param_bytes_per_rank=" << r0.param_bytes << " activation_bytes=" << r0.activation_bytes
     << " peak_bytes=" << r0.peak_bytes << " fwd_collectives=" << fwd_calls << " bwd_collectives=" << bwd_calls
     << " comm_bytes=" << comm_bytes << " est_step_ms=" << e.step_s * 1e3 << " async_tp=" << o.async_tp
     << " est_step_overlapped_ms=" << e.step_overlapped_s * 1e3
     << " differing_ranks=" << report.differing_ranks.size() << " dry_run_s=" << report.seconds;
  return os.str();
}

void print_pipeline(std::ostream& os, const PlanOptions& o, const PipelinePlan& plan, const CostModel& cost) {
  char line[512];
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const auto& st = plan.stages[s];
    std::snprintf(line, sizeof line, "\n## pipeline stage %zu of %zu: layers [%lld, %lld)%s%s, one microbatch of %lld rows\n", s,
                  plan.stages.size(), static_cast<long long>(st.layers.first), static_cast<long long>(st.layers.last),
                  st.layers.embeddings ? " + embeddings" : "", st.layers.head ? " + norm, lm_head, loss" : "",
                  static_cast<long long>(o.batch / o.dp / plan.microbatches));
    os << line;
    print_tables(os, o, st.report, cost);
  }
  std::snprintf(line, sizeof line, "\n## pipeline: pp %lld, %s, %d microbatches: bubble %.3f of the step (simulated from the "
                "schedule's action lists, F = I = W)\n", static_cast<long long>(o.pp), o.pp_schedule.c_str(),
                plan.microbatches, plan.bubble_fraction);
  os << line;
  os << "stage  layers      params/rank  in flight  peak/rank (one mb)  peak/rank (schedule)\n";
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const auto& st = plan.stages[s];
    const auto& r0 = st.report.ranks.front();
    std::snprintf(line, sizeof line, "%5zu  [%3lld,%3lld)  %11.1f  %9d  %15.1f MB  %17.1f MB\n", s,
                  static_cast<long long>(st.layers.first), static_cast<long long>(st.layers.last), r0.param_bytes / 1e6,
                  st.in_flight, r0.peak_bytes / 1e6, st.peak_bytes_with_schedule / 1e6);
    os << line;
  }
  std::snprintf(line, sizeof line, "point-to-point per step and boundary: %.3f MB each way (%d activations, %d gradients)\n",
                plan.p2p_bytes_per_step / 2e6, plan.microbatches, plan.microbatches);
  os << line;
  std::snprintf(line, sizeof line, "summary pp=%lld schedule=%s microbatches=%d bubble=%.4f p2p_bytes_per_step=%lld max_peak_bytes=%lld\n",
                static_cast<long long>(o.pp), o.pp_schedule.c_str(), plan.microbatches, plan.bubble_fraction,
                static_cast<long long>(plan.p2p_bytes_per_step),
                static_cast<long long>(std::max_element(plan.stages.begin(), plan.stages.end(), [](const auto& a, const auto& b) {
                                         return a.peak_bytes_with_schedule < b.peak_bytes_with_schedule;
                                       })->peak_bytes_with_schedule));
  os << line;
}

nlohmann::json to_json(const PlanOptions& o, const dtensor::DryRunReport& report, const CostModel& cost) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : report.ranks) ranks.push_back(rank_json(r, cost));
  const auto& m = o.model;
  return {{"model",
           {{"vocab_size", m.vocab_size}, {"hidden_size", m.hidden_size}, {"num_hidden_layers", m.num_hidden_layers},
            {"num_attention_heads", m.num_attention_heads}, {"num_key_value_heads", m.num_key_value_heads},
            {"intermediate_size", m.intermediate_size}}},
          {"seq_len", o.seq_len}, {"batch", o.batch}, {"sequence_parallel", o.sequence_parallel},
          {"loss_parallel", o.loss_parallel}, {"async_tp", o.async_tp}, {"mesh_shape", report.mesh_shape}, {"mesh_dim_names", report.mesh_dim_names},
          {"ranks", ranks}, {"differing_ranks", report.differing_ranks},
          {"cost_model", {{"matmul_gflops", cost.matmul_gflops}, {"memory_gbps", cost.memory_gbps},
                          {"dtensor_op_us", cost.dtensor_op_us},
                          {"comm_source", cost.comm_source}, {"comm_world", cost.comm_world},
                          {"machine_source", cost.machine_source}}},
          {"dry_run_seconds", report.seconds}};
}

}  // namespace train
