// The corruption suite (issue 10): damage a copy of a real multi-file checkpoint at random, in every way a disk, a
// copy tool or a careless user can, then check it completely in a separate process (corruption_worker.cc). Every
// trial must end in one of two ways: a clear error that names the damaged file (and the entry, when the damage lies
// inside a chunk of data), or a load whose every value is exactly the original (damage in padding, or none). Wrong
// data, a crash or a hang fails the suite. Damage kinds: bit flips anywhere in any file (every byte is a candidate,
// not only fields the validator knows), truncation, extension, a zeroed page, a deleted file, two data files
// swapped, a data file or the metadata replaced by another checkpoint's, a file replaced by a directory or by a
// symbolic link to an intact copy, and pairs of these.
//
// CI runs 160 trials (about 20 s). The long run:
//   DCKPT_CORRUPTION_TRIALS=1000 bazel test //tests/corruption:corruption_test --test_output=all
// DCKPT_CORRUPTION_SEED picks another sequence; the table of outcomes is printed either way, and a failing trial
// prints its seed, damage and the worker's output.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/base/testing/read_file.h"
#include "core/base/testing/temp_dir.h"
#include "core/engine/reader.h"
#include "tools/launcher/launcher.h"

namespace distckpt {
namespace {

using launcher::Launch;
using launcher::LaunchSpec;
using launcher::RankResult;
using testing_util::MakeTempDir;
using testing_util::ReadFileToString;
using launcher::EnvOr;

std::string Worker() { return launcher::Runfile("tests/corruption/corruption_worker"); }

// Replaces what is at `path` with a new regular file (never writes through a link a damage planted there: a link
// to the pristine copy would damage every later trial's source). Does nothing where a directory is.
void WriteFile(const std::string& path, const std::string& bytes) {
  ::unlink(path.c_str());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::vector<RankResult> RunWorker(int world, const std::vector<std::string>& args) {
  LaunchSpec spec;
  spec.program = Worker();
  spec.world_size = world;
  spec.args = args;
  spec.log_dir = MakeTempDir("logs-");
  spec.timeout = std::chrono::milliseconds(60000);
  return Launch(spec);
}

// Where the data of each entry lies: data file name -> [(offset, end, entry)].
using ChunkMap = std::map<std::string, std::vector<std::tuple<uint64_t, uint64_t, std::string>>>;

struct Damage {
  std::string kind;
  std::string what;                 // for the report: file, position, bits
  std::vector<std::string> files;   // the files it involves; an error must name one of them
  std::string entry;                // the damage changed bytes inside a chunk of this entry: the error names it
};

class CorruptionSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    base_ = MakeTempDir("corruption-");
    for (int variant : {0, 1}) {
      const std::string path = base_ + (variant == 0 ? "/pristine" : "/other");
      for (const RankResult& r : RunWorker(3, {"--mode", "save", "--path", path, "--variant", std::to_string(variant)})) {
        ASSERT_EQ(r.exit_code, 0) << r.log;
      }
    }
    auto reader = Reader::Open(base_ + "/pristine", nullptr, ReadOptions{});
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    const MetadataView& m = (*reader)->metadata();
    for (size_t f = 0; f < m.num_files(); ++f) files_.emplace_back(m.file_name(f));
    ASSERT_EQ(files_.size(), 3u) << "three ranks, three data files";
    for (size_t i = 0; i < m.num_entries(); ++i) {
      const EntryView e = m.entry(i);
      for (size_t c = 0; c < e.num_chunks; ++c) {
        const ChunkLocation loc = e.chunk(c);
        chunks_[std::string(m.file_name(loc.file))].emplace_back(loc.offset, loc.offset + loc.length,
                                                                   std::string(e.name));
      }
    }
    files_.push_back("metadata.dckpt");
    for (const std::string& f : files_) pristine_bytes_.push_back(ReadFileToString(base_ + "/pristine/" + f));
  }

  // The trials' source is what it was when the suite began (a damage never reached it).
  static std::string PristineChanged() {
    for (size_t i = 0; i < files_.size(); ++i) {
      if (ReadFileToString(base_ + "/pristine/" + files_[i]) != pristine_bytes_[i]) return files_[i];
    }
    return "";
  }

  static std::string EntryAt(const std::string& file, uint64_t offset) {
    auto it = chunks_.find(file);
    if (it == chunks_.end()) return "";
    for (const auto& [lo, hi, name] : it->second) {
      if (offset >= lo && offset < hi) return name;
    }
    return "";  // padding between chunks
  }

  static bool NonEmptyRegularFile(const std::string& path) {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
  }

  // A fresh copy of the pristine checkpoint.
  static std::string Copy(int trial) {
    const std::string dir = base_ + "/trial-" + std::to_string(trial);
    ::mkdir(dir.c_str(), 0755);
    for (const std::string& f : files_) WriteFile(dir + "/" + f, ReadFileToString(base_ + "/pristine/" + f));
    return dir;
  }

  // Applies one random damage to the copy at `dir` and describes it.
  static Damage Apply(const std::string& dir, std::mt19937_64& rng) {
    static const char* const kKinds[] = {"bitflip",  "multiflip", "truncate", "extend",    "zero-page",
                                         "delete",   "swap-data", "foreign-data", "foreign-metadata",
                                         "directory", "symlink"};
    Damage d;
    // Bit flips, the common case, get half of the trials; the rest share the others.
    d.kind = rng() % 2 == 0 ? (rng() % 3 == 0 ? "multiflip" : "bitflip") : kKinds[2 + rng() % 9];
    // A file that is still a non-empty regular file (a first damage may have removed or emptied one).
    std::string file = files_[rng() % files_.size()];
    for (int tries = 0; tries < 16 && !NonEmptyRegularFile(dir + "/" + file); ++tries) {
      file = files_[rng() % files_.size()];
    }
    if (!NonEmptyRegularFile(dir + "/" + file) && d.kind != "foreign-data" && d.kind != "foreign-metadata") {
      d.kind = "foreign-metadata";
    }
    const std::string path = dir + "/" + file;
    const std::string data_file = files_[rng() % 3];
    d.files = {file};
    if (d.kind == "bitflip" || d.kind == "multiflip" || d.kind == "zero-page") {
      std::string bytes = ReadFileToString(path);
      const std::string before = bytes;
      std::vector<uint64_t> changed;
      if (d.kind == "zero-page") {
        const uint64_t page = (rng() % ((bytes.size() + 4095) / 4096)) * 4096;
        const uint64_t end = std::min<uint64_t>(bytes.size(), page + 4096);
        std::fill(bytes.begin() + page, bytes.begin() + end, '\0');
        d.what = file + " page at " + std::to_string(page);
        for (uint64_t i = page; i < end; ++i) {
          if (before[i] != bytes[i]) changed.push_back(i);
        }
      } else {
        const int flips = d.kind == "bitflip" ? 1 : 2 + static_cast<int>(rng() % 7);
        // Multiple flips cluster in one region half the time (a torn sector), else anywhere.
        const uint64_t center = rng() % bytes.size();
        d.what = file;
        for (int k = 0; k < flips; ++k) {
          const uint64_t pos = rng() % 2 ? rng() % bytes.size()
                                         : std::min<uint64_t>(bytes.size() - 1, center + rng() % 64);
          const int bit = static_cast<int>(rng() % 8);
          bytes[pos] = static_cast<char>(bytes[pos] ^ (1 << bit));
          d.what += " byte " + std::to_string(pos) + " bit " + std::to_string(bit);
        }
        for (uint64_t i = 0; i < bytes.size(); ++i) {
          if (before[i] != bytes[i]) changed.push_back(i);
        }
      }
      WriteFile(path, bytes);
      // Damage inside a chunk must be reported naming that chunk's entry. (With several changed bytes in different
      // entries the error names whichever is found first: any of them.)
      std::vector<std::string> entries;
      for (uint64_t i : changed) {
        const std::string e = EntryAt(file, i);
        if (!e.empty() && std::find(entries.begin(), entries.end(), e) == entries.end()) entries.push_back(e);
      }
      if (entries.size() == 1) d.entry = entries[0];
      if (changed.empty()) d.what += " (no byte changed)";
    } else if (d.kind == "truncate") {
      const std::string bytes = ReadFileToString(path);
      const uint64_t len = rng() % 4 == 0 ? 0 : rng() % bytes.size();
      WriteFile(path, bytes.substr(0, len));
      d.what = file + " to " + std::to_string(len) + " of " + std::to_string(bytes.size()) + " bytes";
    } else if (d.kind == "extend") {
      std::string bytes = ReadFileToString(path);
      const uint64_t extra = 1 + rng() % 8192;
      for (uint64_t i = 0; i < extra; ++i) bytes.push_back(static_cast<char>(rng()));
      WriteFile(path, bytes);
      d.what = file + " by " + std::to_string(extra) + " bytes";
    } else if (d.kind == "delete") {
      ::unlink(path.c_str());
      d.what = file;
    } else if (d.kind == "swap-data") {
      const std::string a = files_[rng() % 3];
      std::string b = files_[rng() % 3];
      while (b == a) b = files_[rng() % 3];
      const std::string tmp = dir + "/swap.tmp";
      ::rename((dir + "/" + a).c_str(), tmp.c_str());
      ::rename((dir + "/" + b).c_str(), (dir + "/" + a).c_str());
      ::rename(tmp.c_str(), (dir + "/" + b).c_str());
      d.files = {a, b};
      d.what = a + " <-> " + b;
    } else if (d.kind == "foreign-data") {
      WriteFile(dir + "/" + data_file, ReadFileToString(base_ + "/other/" + data_file));
      d.files = {data_file};
      d.what = data_file + " from another checkpoint of the same layout";
    } else if (d.kind == "foreign-metadata") {
      WriteFile(dir + "/metadata.dckpt", ReadFileToString(base_ + "/other/metadata.dckpt"));
      // Every file is consistent on its own: the mismatch shows in whichever data file is read first.
      d.files = files_;
      d.what = "metadata.dckpt from another checkpoint of the same layout";
    } else if (d.kind == "directory") {
      ::unlink(path.c_str());
      ::mkdir(path.c_str(), 0755);
      d.what = file + " replaced by a directory";
    } else {  // symlink: to an intact copy outside the checkpoint, so following it would "work"
      ::unlink(path.c_str());
      if (::symlink((base_ + "/pristine/" + file).c_str(), path.c_str()) != 0) std::abort();
      d.what = file + " replaced by a link to an intact copy outside";
    }
    return d;
  }

  static std::string base_;
  static std::vector<std::string> files_;  // the three data files, then metadata.dckpt
  static std::vector<std::string> pristine_bytes_;  // their bytes in the pristine checkpoint
  static ChunkMap chunks_;
};

std::string CorruptionSuite::base_;
std::vector<std::string> CorruptionSuite::files_;
std::vector<std::string> CorruptionSuite::pristine_bytes_;
ChunkMap CorruptionSuite::chunks_;

bool Names(const std::string& log, const Damage& d) {
  for (const std::string& f : d.files) {
    if (log.find(f) != std::string::npos) return true;
  }
  return false;
}

TEST_F(CorruptionSuite, EveryDamageIsAnErrorNamingTheFileOrAnExactLoad) {
  const uint64_t trials = EnvOr("DCKPT_CORRUPTION_TRIALS", 160);
  const uint64_t seed = EnvOr("DCKPT_CORRUPTION_SEED", 20261124);
  std::printf("corruption suite: %llu trials, seed %llu\n", static_cast<unsigned long long>(trials),
              static_cast<unsigned long long>(seed));
  std::map<std::string, std::map<std::string, int>> table;  // kind -> outcome -> count
  int failures = 0;
  for (uint64_t t = 0; t < trials; ++t) {
    std::mt19937_64 rng(seed * 1000003 + t);
    const std::string dir = Copy(static_cast<int>(t));
    Damage d = Apply(dir, rng);
    if (rng() % 5 == 0) {  // a second damage on top
      Damage more = Apply(dir, rng);
      d.kind += "+" + more.kind;
      d.what += "; " + more.what;
      d.files.insert(d.files.end(), more.files.begin(), more.files.end());
      d.entry.clear();
    }
    const std::string source_changed = PristineChanged();
    ASSERT_EQ(source_changed, "") << "trial " << t << " (" << d.kind << ": " << d.what
                                  << ") changed the pristine copy's " << source_changed << ": a bug in the suite";
    // One trial in eight loads collectively on two ranks (broadcast metadata, shared verification).
    const int world = t % 8 == 7 ? 2 : 1;
    const std::vector<RankResult> results = RunWorker(world, {"--mode", "check", "--path", dir});
    std::string outcome;
    for (const RankResult& r : results) {
      std::string o;
      if (r.timed_out) o = "HANG";
      else if (r.signal != 0) o = "CRASH (signal " + std::to_string(r.signal) + ")";
      else if (r.exit_code == 0) o = "exact";
      else if (r.exit_code == 2) o = "WRONG DATA";
      else if (r.exit_code != 3) o = "UNEXPECTED EXIT " + std::to_string(r.exit_code);
      else if (!Names(r.log, d)) o = "ERROR NOT NAMING THE FILE";
      else if (!d.entry.empty() && r.log.find("'" + d.entry + "'") == std::string::npos) {
        o = "ERROR NOT NAMING THE ENTRY " + d.entry;
      } else {
        o = "error";
      }
      // Bytes changed inside a chunk can never load exactly: every byte is read and verified.
      if (o == "exact" && !d.entry.empty()) o = "DAMAGED CHUNK LOADED WITHOUT ERROR";
      // A link to an intact copy loads "exactly" only if the reader followed it out of the checkpoint.
      if (o == "exact" && d.kind.find("symlink") != std::string::npos) o = "READ THROUGH A SYMBOLIC LINK";
      if (outcome.empty() || o != "exact") outcome = o;
    }
    if (world == 2 && results.size() == 2 && (results[0].exit_code == 0) != (results[1].exit_code == 0)) {
      outcome = "RANKS DISAGREE";
    }
    table[d.kind.substr(0, d.kind.find('+')) + (d.kind.find('+') != std::string::npos ? "+more" : "")][outcome]++;
    if (outcome != "exact" && outcome != "error") {
      ++failures;
      ADD_FAILURE() << "trial " << t << " (seed " << seed << "): " << d.kind << ": " << d.what << " -> " << outcome
                    << "\n" << results[0].log;
    }
  }
  std::printf("%-22s %8s %8s %8s\n", "damage", "error", "exact", "failed");
  int errors = 0, exact = 0;
  for (const auto& [kind, outcomes] : table) {
    int e = 0, x = 0, f = 0;
    for (const auto& [o, n] : outcomes) (o == "error" ? e : o == "exact" ? x : f) += n;
    errors += e;
    exact += x;
    std::printf("%-22s %8d %8d %8d\n", kind.c_str(), e, x, f);
  }
  std::printf("%-22s %8d %8d %8d\n", "total", errors, exact, failures);
  EXPECT_EQ(failures, 0);
  EXPECT_GT(errors, static_cast<int>(trials) / 2) << "most damage must be detected; check the suite itself";
}

}  // namespace
}  // namespace distckpt
