#include "cpu_bind.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

namespace tprun {
namespace {

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

long topology_id(int cpu, const char* name) {
  std::ifstream in("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/" + name);
  long id = -1;
  return (in >> id) ? id : -1;
}

// The allowed CPUs grouped by (socket, core), in that order: each group one physical core's hardware threads.
std::vector<std::vector<int>> cores_of(const std::vector<int>& cpus) {
  std::map<std::tuple<long, long, int>, std::vector<int>> cores;
  for (int c : cpus) {
    const long package = topology_id(c, "physical_package_id"), core = topology_id(c, "core_id");
    // Without topology (a container hiding /sys), each CPU is a core of its own.
    cores[core < 0 ? std::make_tuple(-1L, -1L, c) : std::make_tuple(package, core, -1)].push_back(c);
  }
  std::vector<std::vector<int>> out;
  for (auto& [key, threads] : cores) out.push_back(std::move(threads));
  return out;
}

bool parse_int(const std::string& s, int& v) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size() && v >= 0 && v < CPU_SETSIZE;
}

// "0-3,8" -> {0, 1, 2, 3, 8}; false on anything else.
bool parse_cpu_list(const std::string& text, std::vector<int>& cpus) {
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const size_t dash = item.find('-');
    int lo = 0, hi = 0;
    bool ok = false;
    if (dash == std::string::npos) {
      ok = parse_int(item, lo);
      hi = lo;
    } else {
      ok = parse_int(item.substr(0, dash), lo) && parse_int(item.substr(dash + 1), hi) && lo <= hi;
    }
    if (!ok) return false;
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    start = comma + 1;
  }
  return !cpus.empty();
}

}  // namespace

std::vector<std::vector<int>> rank_cpus(const std::string& spec, long nproc, std::string* error) {
  const std::vector<std::vector<int>> unbound(static_cast<size_t>(nproc));
  if (spec == "none") return unbound;
  const std::vector<int> allowed = allowed_cpus();
  if (spec == "auto") {
    const std::vector<std::vector<int>> cores = cores_of(allowed);
    const long n = static_cast<long>(cores.size());
    if (nproc < 2 || n < nproc) return unbound;
    // Rank r gets cores [r * n / nproc, (r + 1) * n / nproc): whole cores, the remainder spread over the ranks.
    std::vector<std::vector<int>> out(static_cast<size_t>(nproc));
    for (long r = 0; r < nproc; ++r) {
      for (long c = r * n / nproc; c < (r + 1) * n / nproc; ++c) {
        out[static_cast<size_t>(r)].insert(out[static_cast<size_t>(r)].end(), cores[c].begin(), cores[c].end());
      }
    }
    return out;
  }
  std::vector<std::vector<int>> out;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t bar = std::min(spec.find('|', start), spec.size());
    const std::string list = spec.substr(start, bar - start);
    std::vector<int> cpus;
    if (!parse_cpu_list(list, cpus)) {
      *error = "--cpu-bind: '" + list + "' is not a CPU list (e.g. 0-3,8); give auto, none or one list per local rank "
               "separated by '|' (0-3|4-7)";
      return {};
    }
    for (int c : cpus) {
      if (!std::binary_search(allowed.begin(), allowed.end(), c)) {
        *error = "--cpu-bind: CPU " + std::to_string(c) + " is not one tprun may run on (" + cpu_list_string(allowed) + ")";
        return {};
      }
    }
    std::sort(cpus.begin(), cpus.end());
    cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
    out.push_back(std::move(cpus));
    start = bar + 1;
  }
  if (static_cast<long>(out.size()) != nproc) {
    *error = "--cpu-bind gives " + std::to_string(out.size()) + " CPU lists for --nproc-per-node " + std::to_string(nproc) +
             ": one per local rank, separated by '|'";
    return {};
  }
  return out;
}

std::string cpu_list_string(const std::vector<int>& cpus) {
  std::set<int> sorted(cpus.begin(), cpus.end());
  std::string s;
  for (auto it = sorted.begin(); it != sorted.end();) {
    int lo = *it, hi = lo;
    while (++it != sorted.end() && *it == hi + 1) ++hi;
    if (!s.empty()) s += ',';
    s += hi == lo ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi);
  }
  return s;
}

bool bind_to_cpus(const std::vector<int>& cpus) {
  if (cpus.empty()) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  return sched_setaffinity(0, sizeof set, &set) == 0;
}

}  // namespace tprun
