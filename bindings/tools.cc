// distckpt._distckpt.export_safetensors: the offline tools of the C ABI.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "bindings/binding_util.h"
#include "bindings/calls.h"
#include "bindings/register.h"
#include "bindings/storage.h"

namespace distckpt_python {
namespace {

void ExportSafetensors(const std::string& ckpt_path, const std::string& out_dir, uint64_t max_shard_bytes,
                       std::optional<std::string> prefix, bool verify, py::object progress,
                       std::shared_ptr<Storage> storage, std::shared_ptr<Storage> out_storage) {
  auto prog = MakeProgress(progress);
  dckpt_export_options o;
  Check(dckpt_export_options_init(&o, DCKPT_EXPORT_OPTIONS_VERSION));
  StorageCall in_call(std::move(storage)), out_call(std::move(out_storage));
  o.storage = in_call.get();
  o.out_storage = out_call.get();
  o.max_shard_bytes = max_shard_bytes;
  o.prefix = prefix ? prefix->c_str() : nullptr;
  o.verify = verify ? 1 : 0;
  if (prog) {
    o.progress = &ProgressTrampoline;
    o.progress_user_data = prog.get();
  }
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_export_safetensors(ckpt_path.c_str(), out_dir.c_str(), &o);
  }
  if (rc == DCKPT_OK) return;
  std::string message = dckpt_error_last();
  py::object cause = prog ? prog->errors.Take() : py::none();
  in_call.Annotate(message, cause);
  if (out_call.storage() != in_call.storage()) out_call.Annotate(message, cause);
  throw NativeError(rc, std::move(message), std::move(cause));
}

}  // namespace

void RegisterTools(py::module_& m) {
  m.def("export_safetensors", &ExportSafetensors, py::arg("ckpt_path"), py::arg("out_dir"), py::arg("max_shard_bytes"),
        py::arg("prefix"), py::arg("verify"), py::arg("progress"), py::arg("storage").none(true) = nullptr,
        py::arg("out_storage").none(true) = nullptr);
}

}  // namespace distckpt_python
