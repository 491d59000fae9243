// StatusIs, the one status matcher the tests share.
#include "core/base/testing/status_matchers.h"

namespace distckpt {

::testing::AssertionResult StatusIs(const Status& status, StatusCode code, const std::vector<std::string>& mentions) {
  if (status.code() != code) {
    return ::testing::AssertionFailure() << "expected code '" << StatusCodeName(code) << "', got " << status.ToString();
  }
  for (const std::string& m : mentions) {
    if (status.message().find(m) == std::string::npos) {
      return ::testing::AssertionFailure() << "message does not mention '" << m << "': " << status.ToString();
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace distckpt
