// The library version. capi/include/distckpt/distckpt.h repeats these numbers as macros; capi checks they agree.
#ifndef DISTCKPT_CORE_BASE_VERSION_H_
#define DISTCKPT_CORE_BASE_VERSION_H_

namespace distckpt {

constexpr int kVersionMajor = 0;
constexpr int kVersionMinor = 1;
constexpr int kVersionPatch = 0;
constexpr char kVersionString[] = "0.1.0";
/// Written into every checkpoint's metadata as the writer.
constexpr char kWriterName[] = "distckpt 0.1.0";

}  // namespace distckpt

#endif  // DISTCKPT_CORE_BASE_VERSION_H_
