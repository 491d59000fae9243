#include "core/storage/s3/curl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

namespace distckpt {
namespace s3 {

std::string CurlLibraryName() {
  const char* env = std::getenv("DCKPT_CURL_LIBRARY");
  return env != nullptr && *env != '\0' ? env : "libcurl.so.4";
}

namespace {

Result<const CurlLibrary*> Load() {
  const std::string name = CurlLibraryName();
  const std::string need =
      "S3 storage needs libcurl 7.75 or later (Debian: apt-get install libcurl4; or point "
      "DCKPT_CURL_LIBRARY at a libcurl.so)";
  // RTLD_LOCAL: curl's symbols stay out of the global namespace (the host may load its own copy).
  void* lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = ::dlerror();
    return Unsupported("cannot load " + name + " (" + (err ? err : "dlopen failed") + "): " + need);
  }
  auto* c = new CurlLibrary();  // never freed: libcurl stays loaded for the life of the process
  Status missing;
  auto sym = [&](auto* field, const char* symbol) {
    void* p = ::dlsym(lib, symbol);
    if (p == nullptr && missing.ok()) missing = Unsupported(name + " has no symbol " + symbol + ": " + need);
    *field = reinterpret_cast<std::remove_pointer_t<decltype(field)>>(p);
  };
  sym(&c->curl_global_init, "curl_global_init");
  sym(&c->curl_easy_init, "curl_easy_init");
  sym(&c->curl_easy_cleanup, "curl_easy_cleanup");
  sym(&c->curl_easy_reset, "curl_easy_reset");
  sym(&c->curl_easy_setopt, "curl_easy_setopt");
  sym(&c->curl_easy_perform, "curl_easy_perform");
  sym(&c->curl_easy_getinfo, "curl_easy_getinfo");
  sym(&c->curl_easy_strerror, "curl_easy_strerror");
  sym(&c->curl_slist_append, "curl_slist_append");
  sym(&c->curl_slist_free_all, "curl_slist_free_all");
  sym(&c->curl_version, "curl_version");
  if (!missing.ok()) {
    delete c;
    ::dlclose(lib);
    return missing;
  }
  // Not thread-safe in old libcurls: done once here, under LoadCurl's once.
  const CURLcode rc = c->curl_global_init(kGlobalDefault);
  if (rc != kCurlOk) {
    return Unsupported(name + ": curl_global_init failed: " + c->curl_easy_strerror(rc));
  }
  return static_cast<const CurlLibrary*>(c);
}

}  // namespace

Result<const CurlLibrary*> LoadCurl() {
  static std::once_flag once;
  static Result<const CurlLibrary*>* loaded = nullptr;
  std::call_once(once, [] { loaded = new Result<const CurlLibrary*>(Load()); });
  return *loaded;
}

}  // namespace s3
}  // namespace distckpt
