// Issue 38: Hugging Face hub cache directories read in place (core/foreign/hub_cache.h, Directory::
// OpenAsHubCacheSnapshot). The layout is the one huggingface_hub writes: `models--org--name/blobs/<hash>`,
// `refs/main` holding the revision, `snapshots/<revision>/<file>` a relative link `../../blobs/<hash>`. The snapshot,
// one of its files and the repository itself open; every other link is refused, naming the file and why.
// python/tests/test_hub_cache.py builds the same layout next to huggingface_hub's own scan_cache_dir.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <numeric>
#include <string>
#include <vector>

#include "core/base/testing/read_file.h"
#include "core/base/testing/status_matchers.h"
#include "core/base/testing/temp_dir.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"
#include "core/foreign/hub_cache.h"
#include "core/foreign/testing/safetensors_file.h"

namespace distckpt {
namespace {

using testing_util::ReadFileToString;
using testing_util::SafetensorsFile;
using testing_util::WriteStringToFile;

constexpr char kRevision[] = "0123456789abcdef0123456789abcdef01234567";
constexpr char kWeightsBlob[] = "4d2a4f0e3c1b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d";
constexpr char kConfigBlob[] = "d1f0a7c3b2e4f6a8c0e2d4b6a8f0c2e4d6b8a0f2";

void MakeDir(const std::string& path) { ASSERT_EQ(::mkdir(path.c_str(), 0755), 0) << path; }
void Link(const std::string& target, const std::string& at) {
  ASSERT_EQ(::symlink(target.c_str(), at.c_str()), 0) << at << " -> " << target;
}

class HubCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing_util::MakeTempDir("hf-hub-");
    hub_ = root_ + "/hub";
    repo_ = hub_ + "/models--org--tiny";
    snapshot_ = repo_ + "/snapshots/" + kRevision;
    w_.resize(2 * 3);
    std::iota(w_.begin(), w_.end(), 1.5f);
    MakeDir(hub_);
    MakeDir(repo_);
    for (const char* d : {"/blobs", "/refs", "/snapshots"}) MakeDir(repo_ + d);
    MakeDir(snapshot_);
    WriteStringToFile(repo_ + "/refs/main", kRevision);  // no newline, as huggingface_hub writes it
    WriteStringToFile(repo_ + "/blobs/" + kWeightsBlob,
                      SafetensorsFile(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})",
                                      std::string(reinterpret_cast<const char*>(w_.data()), 24)));
    WriteStringToFile(repo_ + "/blobs/" + kConfigBlob, "{}");
    Link(std::string("../../blobs/") + kWeightsBlob, snapshot_ + "/model.safetensors");
    Link(std::string("../../blobs/") + kConfigBlob, snapshot_ + "/config.json");
  }

  // Opens `path` and reads all of "w".
  void ExpectReadsW(const std::string& path) {
    DCKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(path, nullptr, ReadOptions()));
    EXPECT_EQ(reader->metadata().source(), "safetensors");
    Box box;
    box.ndim = 2;
    box.length[0] = 2, box.length[1] = 3;
    std::vector<float> got(6);
    DCKPT_ASSERT_OK(reader->ReadRegion("w", box, got.data(), 24));
    EXPECT_EQ(got, w_);
    DCKPT_ASSERT_OK(reader->MapAll({}, nullptr));
  }

  // Replaces the snapshot's model.safetensors by a link to `target`.
  void RelinkWeights(const std::string& target) {
    ASSERT_EQ(::unlink((snapshot_ + "/model.safetensors").c_str()), 0);
    Link(target, snapshot_ + "/model.safetensors");
  }

  std::string root_, hub_, repo_, snapshot_;
  std::vector<float> w_;
};

TEST_F(HubCacheTest, TheSnapshotOpensThroughItsLinks) { ExpectReadsW(snapshot_); }

TEST_F(HubCacheTest, OneFileOfTheSnapshotOpens) { ExpectReadsW(snapshot_ + "/model.safetensors"); }

TEST_F(HubCacheTest, TheRepositoryOpensAtRefsMain) {
  ExpectReadsW(repo_);
  ExpectReadsW(repo_ + "/");
  // Hand-written refs end in a newline: one is allowed.
  WriteStringToFile(repo_ + "/refs/main", std::string(kRevision) + "\n");
  ExpectReadsW(repo_);
}

TEST_F(HubCacheTest, ADirectoryBelowTheRevisionOpens) {
  MakeDir(snapshot_ + "/unet");
  Link(std::string("../../../blobs/") + kWeightsBlob, snapshot_ + "/unet/diffusion.safetensors");
  ExpectReadsW(snapshot_ + "/unet");
  // The depth is the link's own: "../../blobs" from one level down is not the repository's blobs.
  MakeDir(snapshot_ + "/vae");
  Link(std::string("../../blobs/") + kWeightsBlob, snapshot_ + "/vae/model.safetensors");
  EXPECT_TRUE(StatusIs(Reader::Open(snapshot_ + "/vae", nullptr, ReadOptions()).status(), StatusCode::kCorrupt,
                       {snapshot_ + "/vae/model.safetensors", "../../../blobs/<blob>"}));
}

TEST_F(HubCacheTest, ALinkOutOfTheRepositoryIsRefused) {
  WriteStringToFile(root_ + "/outside.safetensors", ReadFileToString(repo_ + "/blobs/" + kWeightsBlob));
  RelinkWeights("../../../../outside.safetensors");
  auto opened = Reader::Open(snapshot_, nullptr, ReadOptions());
  EXPECT_TRUE(StatusIs(opened.status(), StatusCode::kCorrupt,
                       {snapshot_ + "/model.safetensors", "is a symbolic link to '../../../../outside.safetensors'",
                        "does not lead to a file in its hub cache repository's blobs directory", repo_ + "/blobs"}))
      << opened.status().ToString();
  // ".." games that end in blobs/ are no better.
  RelinkWeights(std::string("../../blobs/../../models--org--tiny/blobs/") + kWeightsBlob);
  EXPECT_TRUE(StatusIs(Reader::Open(snapshot_, nullptr, ReadOptions()).status(), StatusCode::kCorrupt,
                       {"does not lead to a file in its hub cache repository's blobs directory"}));
  RelinkWeights(repo_ + "/blobs/" + kWeightsBlob);  // absolute, even to the right file
  EXPECT_TRUE(StatusIs(Reader::Open(snapshot_, nullptr, ReadOptions()).status(), StatusCode::kCorrupt,
                       {"does not lead to a file in its hub cache repository's blobs directory"}));
}

TEST_F(HubCacheTest, ALinkToEtcPasswdIsRefused) {
  RelinkWeights("/etc/passwd");
  EXPECT_TRUE(StatusIs(Reader::Open(snapshot_ + "/model.safetensors", nullptr, ReadOptions()).status(),
                       StatusCode::kCorrupt, {"'/etc/passwd'", "does not lead to a file"}));
}

TEST_F(HubCacheTest, ALinkToADirectoryIsRefused) {
  MakeDir(repo_ + "/blobs/adir");
  RelinkWeights("../../blobs/adir");
  EXPECT_TRUE(
      StatusIs(Reader::Open(snapshot_, nullptr, ReadOptions()).status(), StatusCode::kCorrupt,
               {snapshot_ + "/model.safetensors", repo_ + "/blobs/adir' is a directory", "not a regular file"}));
}

TEST_F(HubCacheTest, ChainsOfLinksAreRefused) {
  // A blob that is itself a link (to a real blob beside it).
  Link(kWeightsBlob, repo_ + "/blobs/alias");
  RelinkWeights("../../blobs/alias");
  EXPECT_TRUE(StatusIs(Reader::Open(snapshot_, nullptr, ReadOptions()).status(), StatusCode::kCorrupt,
                       {repo_ + "/blobs/alias' is a symbolic link", "never a chain of links"}));
  // A link to another link of the snapshot.
  Link(std::string("../../blobs/") + kWeightsBlob, snapshot_ + "/real.bin");
  RelinkWeights("real.bin");
  EXPECT_TRUE(StatusIs(Reader::Open(snapshot_, nullptr, ReadOptions()).status(), StatusCode::kCorrupt,
                       {"is a symbolic link to 'real.bin'", "does not lead to a file"}));
  // A blob that is a link out of the repository.
  ASSERT_EQ(::unlink((repo_ + "/blobs/alias").c_str()), 0);
  Link("/etc/passwd", repo_ + "/blobs/alias");
  RelinkWeights("../../blobs/alias");
  EXPECT_TRUE(StatusIs(Reader::Open(snapshot_, nullptr, ReadOptions()).status(), StatusCode::kCorrupt,
                       {"is a symbolic link", "never a chain of links"}));
}

TEST_F(HubCacheTest, ADanglingLinkIsNotFound) {
  RelinkWeights("../../blobs/0000");
  EXPECT_TRUE(StatusIs(Reader::Open(snapshot_, nullptr, ReadOptions()).status(), StatusCode::kNotFound,
                       {snapshot_ + "/model.safetensors", repo_ + "/blobs/0000"}));
}

TEST_F(HubCacheTest, AHostileRefIsRefused) {
  for (const std::string& ref : {std::string("../x"), std::string(".."), std::string("a/b"), std::string(""),
                                 std::string("rev\nrev"), std::string(300, 'a')}) {
    WriteStringToFile(repo_ + "/refs/main", ref);
    auto opened = Reader::Open(repo_, nullptr, ReadOptions());
    EXPECT_TRUE(StatusIs(opened.status(), StatusCode::kCorrupt, {repo_, repo_ + "/refs/main"}))
        << opened.status().ToString();
  }
  WriteStringToFile(repo_ + "/refs/main", "../x");
  EXPECT_TRUE(StatusIs(Reader::Open(repo_, nullptr, ReadOptions()).status(), StatusCode::kCorrupt,
                       {"holds \"../x\", which is not a revision name"}));
  // refs/main itself a link: never followed.
  ASSERT_EQ(::unlink((repo_ + "/refs/main").c_str()), 0);
  WriteStringToFile(root_ + "/ref", kRevision);
  Link(root_ + "/ref", repo_ + "/refs/main");
  EXPECT_TRUE(StatusIs(Reader::Open(repo_, nullptr, ReadOptions()).status(), StatusCode::kCorrupt,
                       {repo_ + "/refs/main' is a symbolic link"}));
}

TEST_F(HubCacheTest, ARepositoryWithoutRefsMainNamesItsRevisions) {
  ASSERT_EQ(::unlink((repo_ + "/refs/main").c_str()), 0);
  EXPECT_TRUE(StatusIs(Reader::Open(repo_, nullptr, ReadOptions()).status(), StatusCode::kNotFound,
                       {repo_, "has no refs/main", std::string("'") + kRevision + "'"}));
  WriteStringToFile(repo_ + "/refs/main", "fedcba");
  EXPECT_TRUE(StatusIs(Reader::Open(repo_, nullptr, ReadOptions()).status(), StatusCode::kNotFound,
                       {"names revision 'fedcba'", repo_ + "/snapshots/fedcba' does not exist"}));
}

TEST_F(HubCacheTest, ADistckptCheckpointsOwnFilesAreNeverFollowed) {
  // A distckpt checkpoint inside a snapshot, its files moved into blobs/ and linked as huggingface_hub would.
  const std::string ckpt = snapshot_ + "/dckpt";
  State state;
  std::vector<float> v = w_;
  DCKPT_ASSERT_OK(state.AddTensor("w", DType::kF32, {2, 3}));
  DCKPT_ASSERT_OK(state.AddPiece("w", {0, 0}, {2, 3}, v.data()));
  DCKPT_ASSERT_OK(Save(ckpt, state, nullptr, SaveOptions()).status());
  for (const char* name : {"metadata.dckpt", "data-00000.bin"}) {
    const std::string blob = repo_ + "/blobs/" + name;
    ASSERT_EQ(::rename((ckpt + "/" + name).c_str(), blob.c_str()), 0);
    Link(std::string("../../../blobs/") + name, ckpt + "/" + name);
  }
  EXPECT_TRUE(StatusIs(Reader::Open(ckpt, nullptr, ReadOptions()).status(), StatusCode::kCorrupt,
                       {ckpt + "/metadata.dckpt' is a symbolic link"}));
}

TEST(HubCacheRevision, PlainNamesOnly) {
  EXPECT_TRUE(IsHubCacheRevision(kRevision));
  EXPECT_TRUE(IsHubCacheRevision("v1.0"));
  for (const char* bad : {"", ".", "..", "../x", "a/b", "a\\b", "a b", "a\tb"}) EXPECT_FALSE(IsHubCacheRevision(bad));
}

}  // namespace
}  // namespace distckpt
