#include "core/plan/plan_codec.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace distckpt {
namespace {

Box B(std::vector<uint64_t> off, std::vector<uint64_t> len) { return Box::Make(off, len).value(); }

LocalPlan SamplePlan() {
  LocalPlan p;
  p.rank = 1023;
  p.tensors.push_back(LocalTensorDecl{
      "model.layers.0.weight", DType::kBF16, {4096, 11008}, {B({1024, 0}, {1024, 11008}), B({0, 0}, {0, 11008})}});
  p.tensors.push_back(LocalTensorDecl{"step", DType::kI64, {}, {Box()}});
  p.tensors.push_back(LocalTensorDecl{"huge", DType::kU8, {UINT64_MAX}, {B({UINT64_MAX - 1}, {1})}});
  p.tensors.push_back(LocalTensorDecl{"nothing_here", DType::kF32, {8, 0}, {}});
  p.bytes.push_back(LocalBytesDecl{"rng_state", 5056});
  p.bytes.push_back(LocalBytesDecl{std::string("bin\0ary", 7), 0});
  return p;
}

void ExpectSame(const LocalPlan& a, const LocalPlan& b) {
  EXPECT_EQ(a.rank, b.rank);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_EQ(a.tensors[i].dtype, b.tensors[i].dtype);
    EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape);
    EXPECT_EQ(a.tensors[i].boxes, b.tensors[i].boxes);
    ASSERT_EQ(a.tensors[i].fingerprints.size(), b.tensors[i].fingerprints.size());
    for (size_t k = 0; k < a.tensors[i].fingerprints.size(); ++k) {
      EXPECT_EQ(a.tensors[i].fingerprints[k].known, b.tensors[i].fingerprints[k].known);
      EXPECT_EQ(a.tensors[i].fingerprints[k].hash, b.tensors[i].fingerprints[k].hash);
    }
  }
  ASSERT_EQ(a.bytes.size(), b.bytes.size());
  for (size_t i = 0; i < a.bytes.size(); ++i) {
    EXPECT_EQ(a.bytes[i].name, b.bytes[i].name);
    EXPECT_EQ(a.bytes[i].size, b.bytes[i].size);
    EXPECT_EQ(a.bytes[i].fingerprint.known, b.bytes[i].fingerprint.known);
    EXPECT_EQ(a.bytes[i].fingerprint.hash, b.bytes[i].fingerprint.hash);
  }
}

TEST(PlanCodecTest, LocalPlanRoundTrips) {
  const LocalPlan plan = SamplePlan();
  auto encoded = EncodeLocalPlan(plan);
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  auto decoded = DecodeLocalPlan(*encoded);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ExpectSame(plan, *decoded);

  auto empty = DecodeLocalPlan(EncodeLocalPlan(LocalPlan{}).value());
  ASSERT_TRUE(empty.ok());
  ExpectSame(LocalPlan{}, *empty);

  // An incremental save's fingerprints (one per box, or none for a tensor; one per bytes entry).
  LocalPlan hashed = SamplePlan();
  hashed.tensors[0].fingerprints = {ChunkFingerprint{true, 7, ChunkHash{1, 2}}, ChunkFingerprint{}};
  hashed.bytes[0].fingerprint = ChunkFingerprint{true, 9, ChunkHash{~0ull, 3}};
  const std::string with = EncodeLocalPlan(hashed).value();
  auto back = DecodeLocalPlan(with);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSame(hashed, *back);
  for (size_t cut = 0; cut < with.size(); ++cut) EXPECT_FALSE(DecodeLocalPlan(with.substr(0, cut)).ok()) << cut;
  hashed.tensors[1].fingerprints.resize(3);  // not one per box
  EXPECT_EQ(EncodeLocalPlan(hashed).status().code(), StatusCode::kInvalidArgument);
}

TEST(PlanCodecTest, LocalPlanIsCompact) {
  // A typical sharded declaration is a few dozen bytes: name + dtype + shape + one box, as varints.
  LocalPlan p;
  p.tensors.push_back(
      LocalTensorDecl{"layers.17.mlp.up_proj.weight", DType::kBF16, {14336, 4096}, {B({896 * 3, 0}, {896, 4096})}});
  auto encoded = EncodeLocalPlan(p);
  ASSERT_TRUE(encoded.ok());
  EXPECT_LT(encoded->size(), 60u);
}

TEST(PlanCodecTest, EncodeRejectsWhatNoMessageCanCarry) {
  LocalPlan p;
  p.tensors.push_back(LocalTensorDecl{"deep", DType::kF32, std::vector<uint64_t>(kMaxDims + 1, 1), {}});
  auto encoded = EncodeLocalPlan(p);
  ASSERT_FALSE(encoded.ok());
  EXPECT_NE(encoded.status().message().find("'deep'"), std::string::npos);
}

TEST(PlanCodecTest, TruncatedLocalPlansFailCleanly) {
  const std::string full = EncodeLocalPlan(SamplePlan()).value();
  for (size_t n = 0; n < full.size(); ++n) {
    auto decoded = DecodeLocalPlan(std::string_view(full).substr(0, n));
    EXPECT_FALSE(decoded.ok()) << "prefix of " << n << " bytes decoded";
  }
  EXPECT_FALSE(DecodeLocalPlan(full + "x").ok()) << "trailing byte accepted";
}

TEST(PlanCodecTest, GarbageNeverCrashes) {
  const std::string full = EncodeLocalPlan(SamplePlan()).value();
  std::mt19937_64 rng(42);
  int decoded_ok = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s = full;
    // Flip a few bytes, or feed pure noise after a valid header.
    if (i % 4 == 0) {
      s.resize(4 + rng() % 64);
      for (size_t k = 4; k < s.size(); ++k) s[k] = static_cast<char>(rng());
    } else {
      for (int k = 0; k < 1 + i % 3; ++k) s[rng() % s.size()] ^= static_cast<char>(1 + rng() % 255);
    }
    auto decoded = DecodeLocalPlan(s);
    decoded_ok += decoded.ok();
  }
  // Some mutations still decode (a changed dimension is a valid message); most do not.
  EXPECT_LT(decoded_ok, 20000);
}

TEST(PlanCodecTest, HostileCountsDoNotAllocate) {
  // Header, rank 0, then a tensor count of 2^63: must be rejected before reserving anything.
  std::string s("DLP\x02\x00", 5);
  for (int k = 0; k < 9; ++k) s.push_back(static_cast<char>(0xff));
  s.push_back(0x7f);
  auto decoded = DecodeLocalPlan(s);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), StatusCode::kCorrupt);

  // A box count far larger than the bytes left.
  std::string t("DLP\x02\x00\x01\x01n\x0c\x00\xff\xff\xff\xff\x0f", 15);
  EXPECT_FALSE(DecodeLocalPlan(t).ok());

  EXPECT_EQ(DecodeLocalPlan("XXXX").status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(DecodeLocalPlan(std::string("DLP\x03\x00\x00\x00", 7)).status().code(), StatusCode::kVersion);
}

TEST(PlanCodecTest, RankAssignmentRoundTripsAndRejectsTruncation) {
  RankAssignment a;
  a.rank = 7;
  a.tasks.push_back(WriteTask{3, 1, 0, 2, 0, 4096});
  a.tasks.push_back(WriteTask{5, 1023, 2, 2, 1ull << 40, 0});
  a.tensor_entry = {3, 5, 9};
  a.bytes_entry = {0};
  const std::string full = EncodeRankAssignment(a).value();
  auto decoded = DecodeRankAssignment(full);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->rank, 7u);
  ASSERT_EQ(decoded->tasks.size(), 2u);
  EXPECT_EQ(decoded->tasks[1].chunk, 1023u);
  EXPECT_EQ(decoded->tasks[1].offset, 1ull << 40);
  EXPECT_EQ(decoded->tasks[0].length, 4096u);
  EXPECT_EQ(decoded->tensor_entry, a.tensor_entry);
  EXPECT_EQ(decoded->bytes_entry, a.bytes_entry);
  for (size_t n = 0; n < full.size(); ++n) EXPECT_FALSE(DecodeRankAssignment(full.substr(0, n)).ok());
  // A local plan is not a rank assignment.
  EXPECT_FALSE(DecodeRankAssignment(EncodeLocalPlan(SamplePlan()).value()).ok());
}

}  // namespace
}  // namespace distckpt
