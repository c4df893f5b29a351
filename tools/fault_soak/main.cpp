// fault_soak: kills (SIGKILL) or freezes (SIGSTOP) one rank of a small job at a random moment of its life,
// many times, and checks that the other ranks always end on their own, with a clear error, within the
// timeout plus a little — never hang. See docs/design/fault_tolerance.md.
//
//   fault_soak [--trials N] [--jobs J] [--timeout S] [--slack S] [--seed N] [--worlds 2,4]
//              [--launch hand,tprun] [--backends shm,gloo] [--signals kill,stop] [--aim PHASE,...|all]
//              [--worker PATH] [--tprun PATH] [--verbose]
//
// Exit status: 0 no hang, crash or unclear error; 1 otherwise; 2 bad flags.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "../common/cli.h"
#include "report.h"
#include "trial.h"

namespace {

using namespace fault_soak;

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ",") + i;
  return out;
}

std::vector<std::string> checked_list(const std::string& flag, const std::string& text,
                                      const std::vector<std::string>& allowed) {
  auto items = split(text);
  if (items.empty()) throw tools_cli::UsageError("--" + flag + " needs at least one value");
  for (const auto& i : items) {
    if (std::find(allowed.begin(), allowed.end(), i) == allowed.end()) {
      std::string all;
      for (const auto& a : allowed) all += (all.empty() ? "" : ", ") + a;
      throw tools_cli::UsageError("--" + flag + ": '" + i + "' is not one of " + all);
    }
  }
  return items;
}

struct Options {
  int64_t trials = 24, jobs = 2;
  double timeout_s = 3, slack_s = 5;
  uint64_t seed = 0;
  std::vector<std::string> worlds{"2", "4"}, launch{"hand", "tprun"}, backends{"shm", "gloo"}, signals{"kill", "stop"};
  std::vector<std::string> aims;
  bool verbose = false;
  Settings settings;
};

// How long after its phase begins the signal comes: within the phase (soak_worker's phases last about
// start 100 ms, collectives 250+ ms, shutdown a few ms), or anywhere in a ~3 s job for "random".
double draw_delay(const std::string& aim, std::mt19937_64& rng) {
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  if (aim == "random") return uniform(0.05, 3.0);
  if (aim == "start") return uniform(0, 0.08);
  if (aim == "rendezvous") return uniform(0, 0.1);
  if (aim == "group") return uniform(0, 0.05);
  if (aim == "shutdown") return uniform(0, 0.01);
  return uniform(0, 0.25);
}

TrialSpec draw_trial(int index, const Options& o) {
  std::mt19937_64 rng(o.seed * 1000003 + static_cast<uint64_t>(index));
  auto pick = [&](const std::vector<std::string>& v) { return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)]; };
  TrialSpec s;
  s.index = index;
  s.world = std::stoi(pick(o.worlds));
  s.under_tprun = pick(o.launch) == "tprun";
  s.backend = pick(o.backends);
  s.signal = pick(o.signals) == "kill" ? SIGKILL : SIGSTOP;
  s.aim = pick(o.aims);
  s.victim = std::uniform_int_distribution<int>(0, s.world - 1)(rng);
  s.delay_s = draw_delay(s.aim, rng);
  return s;
}

Options parse(int argc, char** argv) {
  Options o;
  std::string here = argv[0];
  here = here.find('/') == std::string::npos ? "." : here.substr(0, here.rfind('/'));
  o.settings.worker = here + "/soak_worker";
  o.settings.tprun = here + "/tprun";
  std::vector<std::string> aim_choices = phases();
  aim_choices.push_back("random");
  o.aims = aim_choices;
  bool seeded = false;
  CLI::App app("fault_soak: kills or freezes one rank of a job at a random moment, trial after trial, and fails on "
               "any hang, crash or unclear error");
  tools_cli::configure(app, "fault_soak");
  app.add_option("--trials", o.trials, "trials to run")->check(tools_cli::positive());
  app.add_option("--jobs", o.jobs, "trials at once")->check(tools_cli::positive());
  app.add_option("--timeout", o.timeout_s, "DTENSOR_TIMEOUT_SEC of each job")->check(tools_cli::positive());
  app.add_option("--slack", o.slack_s, "a survivor alive at timeout + slack after the later of the fault and its latest phase marker is a hang")->check(tools_cli::positive());
  app.add_option_function<uint64_t>("--seed", [&](const uint64_t& v) { o.seed = v, seeded = true; },
                                    "random seed (default: from the clock; printed)");
  auto list = [&](const char* name, std::vector<std::string>& field, std::vector<std::string> allowed, const char* help) {
    app.add_option_function<std::string>(name, [&field, name, allowed](const std::string& v) {
      field = checked_list(std::string(name).substr(2), v, allowed);
    }, help)->default_str(join(field));
  };
  list("--worlds", o.worlds, {"2", "4"}, "world sizes to draw from");
  list("--launch", o.launch, {"hand", "tprun"}, "hand (the soak starts each rank) and/or tprun");
  list("--backends", o.backends, {"shm", "gloo"}, "shm and/or gloo, as DTENSOR_BACKEND");
  list("--signals", o.signals, {"kill", "stop"}, "kill (SIGKILL) and/or stop (SIGSTOP)");
  app.add_option_function<std::string>("--aim", [&](const std::string& v) {
    if (v != "all") o.aims = checked_list("aim", v, aim_choices);
  }, "phases to aim at, 'random' for any moment, or all")->default_str("all");
  app.add_option("--worker", o.settings.worker, "soak_worker (default: beside fault_soak)")->default_str("");
  app.add_option("--tprun", o.settings.tprun, "tprun (default: beside fault_soak)")->default_str("");
  app.add_flag("--verbose", o.verbose, "print every trial, not only the ones that went wrong");
  if (tools_cli::parse(app, std::vector<std::string>(argv + 1, argv + argc))) {
    std::cout << app.help();
    std::exit(0);
  }
  for (const auto& path : {o.settings.worker, o.settings.tprun}) {
    if (access(path.c_str(), X_OK) != 0) throw tools_cli::UsageError(path + " is not an executable (see --worker, --tprun)");
  }
  if (!seeded) o.seed = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) % 1000000;
  o.settings.timeout_s = o.timeout_s;
  o.settings.slack_s = o.slack_s;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const tools_cli::UsageError& e) {
    std::cerr << "fault_soak: error: " << e.what() << "\n";
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  std::cout << "fault_soak: " << o.trials << " trials, " << o.jobs << " at once, timeout " << o.timeout_s
            << " s, slack " << o.slack_s << " s, seed " << o.seed << std::endl;
  Report report;
  std::mutex mutex;
  std::atomic<int64_t> next{0};
  int64_t done = 0;
  const auto started = std::chrono::steady_clock::now();
  auto work = [&] {
    for (int64_t i; (i = next++) < o.trials;) {
      TrialResult r = run_trial(draw_trial(static_cast<int>(i), o), o.settings);
      std::lock_guard<std::mutex> lock(mutex);
      report.add(r);
      ++done;
      bool bad = !r.setup_error.empty();
      for (const auto& s : r.survivors) bad |= !r.injected && s.ending != Ending::OK;  // failed with no fault
      for (const auto& s : r.survivors) bad |= s.ending == Ending::HANG || s.ending == Ending::UNCLEAR_ERROR || s.ending == Ending::CRASH;
      if (bad || o.verbose) std::cout << describe(r) << std::endl;
      if (done % 10 == 0 || done == o.trials) {
        double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        std::cout << "progress " << done << "/" << o.trials << " trials, " << report.total().count(Ending::HANG)
                  << " hangs, " << static_cast<int>(elapsed) << " s" << std::endl;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t j = 0; j < o.jobs; ++j) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  report.print(std::cout, o.timeout_s, o.slack_s);
  return report.failed() ? 1 : 0;
}
