// Test assertions on Status and Result<T>: the DCKPT_*_OK macros and StatusIs (code plus the words a message must
// mention).
#ifndef DISTCKPT_CORE_BASE_TESTING_STATUS_MATCHERS_H_
#define DISTCKPT_CORE_BASE_TESTING_STATUS_MATCHERS_H_

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "core/base/status.h"

namespace distckpt {

/// Success if `status` has `code` and its message contains every string in `mentions` (paths, usually).
::testing::AssertionResult StatusIs(const Status& status, StatusCode code,
                                    const std::vector<std::string>& mentions = {});

}  // namespace distckpt

/// Test assertions on Status and Result<T>.
#define DCKPT_EXPECT_OK(expr)                                          \
  do {                                                                 \
    const ::distckpt::Status dckpt_expect_ok_ = (expr);                \
    EXPECT_TRUE(dckpt_expect_ok_.ok()) << dckpt_expect_ok_.ToString(); \
  } while (0)
#define DCKPT_ASSERT_OK(expr)                                          \
  do {                                                                 \
    const ::distckpt::Status dckpt_assert_ok_ = (expr);                \
    ASSERT_TRUE(dckpt_assert_ok_.ok()) << dckpt_assert_ok_.ToString(); \
  } while (0)
#define DCKPT_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                     \
  ASSERT_TRUE(tmp.ok()) << tmp.status().ToString();      \
  lhs = std::move(tmp).value()
/// `DCKPT_ASSERT_OK_AND_ASSIGN(auto file, storage->OpenFile(p));`
#define DCKPT_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  DCKPT_ASSERT_OK_AND_ASSIGN_IMPL_(DCKPT_CONCAT_(dckpt_test_result_, __LINE__), lhs, expr)

#endif  // DISTCKPT_CORE_BASE_TESTING_STATUS_MATCHERS_H_
