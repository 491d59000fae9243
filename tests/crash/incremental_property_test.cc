// Incremental checkpoints against everything that removes or replaces a checkpoint (issue 41, part 2): random
// sequences of saves (whole or incremental, with a random committed base), overwrites, removals and prunes, each run
// in a process of its own and, half the time, killed (SIGKILL) at a random storage step. After every step:
//   - the path of a killed or refused operation holds exactly what it held before, or (a save) exactly the new
//     checkpoint, or (a removal) nothing;
//   - every checkpoint that exists loads exactly the values it was saved with, following its references: no kept
//     checkpoint ever has a dangling or replaced reference;
//   - a removal or overwrite of a checkpoint that another refers to is refused, naming it.
// DCKPT_INCREMENTAL_SEQUENCES (default 200) and DCKPT_INCREMENTAL_SEED choose how many and which. Run by
// tests/crash/run.sh (what scripts/test.sh does).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "core/engine/base_checkpoint.h"
#include "core/engine/reader.h"
#include "tests/faults/test_state.h"
#include "tools/launcher/launcher.h"

namespace distckpt {
namespace {

using launcher::Launch;
using launcher::LaunchSpec;
using launcher::RankResult;
using testing_util::CheckCheckpoint;
using testing_util::MakeTempDir;

constexpr uint64_t kMiB = 1;
const char* const kNames[] = {"c0", "c1", "c2", "c3", "c4"};

// What ran: the worker's exit code (-1: killed) and its output.
struct Outcome {
  int code = 0;
  std::string log;
};

Outcome RunWorker(const std::vector<std::string>& args, const std::string& faults) {
  LaunchSpec spec;
  spec.program = launcher::Runfile("tests/faults/fault_worker");
  spec.world_size = 1;
  spec.args = args;
  spec.args.insert(spec.args.end(), {"--mb", std::to_string(kMiB), "--sync", "0", "--timeout-ms", "20000"});
  if (!faults.empty()) spec.args.insert(spec.args.end(), {"--faults", faults, "--fault-rank", "0"});
  spec.log_dir = MakeTempDir("logs-");
  spec.timeout = std::chrono::seconds(60);
  const std::vector<RankResult> results = Launch(spec);
  Outcome o;
  if (results.empty()) return Outcome{-2, "no result"};
  o.code = results[0].signal != 0 ? -1 : results[0].exit_code;
  o.log = results[0].log;
  return o;
}

// The committed checkpoints of one sequence: name -> variant, and the order they were (last) saved in.
struct Model {
  std::map<std::string, uint64_t> variant;
  std::vector<std::string> order;

  void Saved(const std::string& name, uint64_t v) {
    variant[name] = v;
    order.erase(std::remove(order.begin(), order.end(), name), order.end());
    order.push_back(name);
  }
  void Removed(const std::string& name) {
    variant.erase(name);
    order.erase(std::remove(order.begin(), order.end(), name), order.end());
  }
};

bool Exists(const std::string& path) { return ::access((path + "/metadata.dckpt").c_str(), F_OK) == 0; }

class IncrementalProperty : public ::testing::Test {
 protected:
  // Every committed checkpoint of `model` loads exactly; nothing else in `dir` is a checkpoint. "" or what failed.
  std::string CheckAll(const std::string& dir, const Model& model) {
    std::string out;
    for (const auto& [name, v] : model.variant) {
      const std::string bad = CheckCheckpoint(dir + "/" + name, v, kMiB);
      if (!bad.empty()) out += name + " (variant " + std::to_string(v) + "): " + bad + "\n";
    }
    for (const char* name : kNames) {
      if (!model.variant.count(name) && Exists(dir + "/" + name)) out += std::string(name) + " exists but should not\n";
    }
    return out;
  }
};

TEST_F(IncrementalProperty, NoSequenceOfSavesRemovalsPrunesAndKillsBreaksAKeptCheckpoint) {
  const int sequences = static_cast<int>(launcher::EnvOr("DCKPT_INCREMENTAL_SEQUENCES", 200));
  const uint64_t seed = launcher::EnvOr("DCKPT_INCREMENTAL_SEED", 20261129);
  std::mt19937_64 rng(seed);
  std::map<std::string, int> counts;  // what happened, for the summary line
  uint64_t next_variant = 1;
  for (int seq = 0; seq < sequences; ++seq) {
    const std::string dir = MakeTempDir("incr-prop-");
    Model model;
    std::string history;
    for (int op = 0; op < 6; ++op) {
      const std::string name = kNames[rng() % 5];
      const std::string path = dir + "/" + name;
      const bool kill = rng() % 2 == 0;
      const std::string faults = kill ? "any:*:nth=" + std::to_string(1 + rng() % 40) + ":kill" : "";
      const int what = model.variant.empty() ? 0 : static_cast<int>(rng() % 10);
      std::string step;
      if (what < 6) {
        // A save, whole or incremental (a committed base other than itself), new or over an existing one. Frozen
        // weights ("model.emb") change only every thousand variants: most incremental saves refer to them.
        const uint64_t v = (rng() % 3 == 0 ? 1000 : 0) + next_variant++;
        std::string base;
        std::vector<std::string> others;
        for (const auto& [n, _] : model.variant) {
          if (n != name) others.push_back(n);
        }
        if (!others.empty() && rng() % 4 != 0) base = others[rng() % others.size()];
        const bool overwrite = model.variant.count(name) != 0;
        Outcome o = RunWorker({"--mode", "save", "--path", path, "--variant", std::to_string(v), "--overwrite",
                               overwrite ? "1" : "0", "--base", base},
                              faults);
        step = "save " + name + " v" + std::to_string(v) + (base.empty() ? "" : " base " + base) +
               (kill ? " " + faults : "") + " -> " + std::to_string(o.code);
        const std::string now = Exists(path) ? (CheckCheckpoint(path, v, kMiB).empty() ? "new" : "other") : "none";
        if (now == "new") {
          if (o.code != 0 && o.code != -1) ADD_FAILURE() << "a save that failed committed: " << o.log;
          model.Saved(name, v);
          ++counts[base.empty() ? "whole saves committed" : "incremental saves committed"];
        } else if (o.code == 0) {
          ADD_FAILURE() << "seq " << seq << ": " << step << ": the save succeeded but " << name << " is " << now;
        } else if (o.log.find("would break") != std::string::npos) {
          ++counts["overwrites refused (dependents)"];
        } else {
          ++counts[kill ? "saves killed before committing" : "saves failed"];
        }
      } else if (what < 8) {
        // Removing one checkpoint.
        Outcome o = RunWorker({"--mode", "remove", "--path", path}, faults);
        step = "remove " + name + (kill ? " " + faults : "") + " -> " + std::to_string(o.code);
        const bool had = model.variant.count(name) != 0;
        const bool dependents = had && !Dependents(DefaultStorage(), path).value().empty();
        if (!Exists(path)) {
          if (had && dependents) ADD_FAILURE() << "seq " << seq << ": " << step << ": removed a checkpoint others use";
          if (had) ++counts["removals done"];
          model.Removed(name);
        } else if (o.log.find("would break") != std::string::npos) {
          ++counts["removals refused (dependents)"];
        } else if (o.code == 0) {
          ADD_FAILURE() << "seq " << seq << ": " << step << ": removal succeeded but the checkpoint is there";
        }
      } else {
        // A prune keeping the newest two: the others removed oldest first, each refused while a kept one refers to it.
        step = "prune (keep 2)";
        std::vector<std::string> doomed(model.order.begin(),
                                        model.order.end() - std::min<size_t>(2, model.order.size()));
        for (const std::string& n : doomed) {
          Outcome o = RunWorker({"--mode", "remove", "--path", dir + "/" + n}, kill ? faults : "");
          step += " " + n + "->" + std::to_string(o.code);
          if (!Exists(dir + "/" + n)) {
            model.Removed(n);
            ++counts["pruned"];
          } else if (o.log.find("would break") != std::string::npos) {
            ++counts["prune kept a base"];
          }
        }
      }
      history += "  " + step + "\n";
      const std::string broken = CheckAll(dir, model);
      if (!broken.empty()) {
        ADD_FAILURE() << "seed " << seed << " sequence " << seq << ", after:\n" << history << broken;
        break;
      }
    }
  }
  std::printf("incremental property: %d sequences of 6 steps, seed %llu\n", sequences,
              static_cast<unsigned long long>(seed));
  for (const auto& [what, n] : counts) std::printf("  %6d  %s\n", n, what.c_str());
}

}  // namespace
}  // namespace distckpt
