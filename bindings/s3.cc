// distckpt._distckpt.Storage.s3: S3 storage made by the core (dckpt_storage_new_s3) from options given in Python;
// every option left None or 0 is what the AWS CLI reads from the environment, or the core's default
// (distckpt.h, "S3 and URLs"). The HTTP client, signing, retries and the commit protocol are the core's.
#include <optional>
#include <string>

#include "bindings/register.h"
#include "bindings/storage.h"

namespace distckpt_python {
namespace {

using OptionalString = std::optional<std::string>;

std::shared_ptr<Storage> NewS3(const OptionalString& endpoint, const OptionalString& region,
                               const OptionalString& access_key_id, const OptionalString& secret_access_key,
                               const OptionalString& session_token, const std::string& addressing,
                               unsigned max_in_flight, unsigned max_attempts, double request_timeout_seconds,
                               uint64_t part_size, uint64_t read_block_size) {
  dckpt_s3_options o;
  Check(dckpt_s3_options_init(&o, DCKPT_S3_OPTIONS_VERSION));
  auto str = [](const OptionalString& s) { return s ? s->c_str() : nullptr; };
  o.endpoint = str(endpoint);
  o.region = str(region);
  o.access_key_id = str(access_key_id);
  o.secret_access_key = str(secret_access_key);
  o.session_token = str(session_token);
  if (addressing == "auto") {
    o.addressing = DCKPT_S3_ADDRESSING_AUTO;
  } else if (addressing == "path") {
    o.addressing = DCKPT_S3_ADDRESSING_PATH;
  } else if (addressing == "virtual") {
    o.addressing = DCKPT_S3_ADDRESSING_VIRTUAL;
  } else {
    throw NativeError(DCKPT_EINVAL, "S3 addressing must be 'auto', 'path' or 'virtual', not '" + addressing + "'");
  }
  o.max_in_flight = max_in_flight;
  o.max_attempts = max_attempts;
  o.request_timeout_seconds = request_timeout_seconds;
  o.part_size = part_size;
  o.read_block_size = read_block_size;
  // The strings are borrowed for the call only: the core copies what it keeps.
  return Storage::Native("s3", [&](dckpt_storage** out) { return dckpt_storage_new_s3(out, &o); });
}

}  // namespace

void RegisterS3(py::module_& m) {
  auto storage = py::reinterpret_borrow<py::class_<Storage, std::shared_ptr<Storage>>>(m.attr("Storage"));
  storage.def_static("s3", &NewS3, py::arg("endpoint").none(true), py::arg("region").none(true),
                     py::arg("access_key_id").none(true), py::arg("secret_access_key").none(true),
                     py::arg("session_token").none(true), py::arg("addressing"), py::arg("max_in_flight"),
                     py::arg("max_attempts"), py::arg("request_timeout_seconds"), py::arg("part_size"),
                     py::arg("read_block_size"),
                     "S3 storage (dckpt_storage_new_s3): None and 0 take the AWS_* environment or the default.");
}

}  // namespace distckpt_python
