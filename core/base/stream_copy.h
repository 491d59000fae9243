// A memcpy for large copies whose destination is not read again soon (the async-save staging buffer, which the
// disk then reads by DMA): non-temporal stores skip the read-for-ownership of every destination line and do not
// evict the caller's working set. glibc switches to such stores only above its own threshold (288 MiB on the bench
// machine), far above the slices the staging copy is cut into.
#ifndef DISTCKPT_CORE_BASE_STREAM_COPY_H_
#define DISTCKPT_CORE_BASE_STREAM_COPY_H_

#include <cstddef>

namespace distckpt {

/// Copies `n` bytes like memcpy (the ranges must not overlap). The bytes are visible to other threads once this
/// returns (it ends with a store fence). Falls back to memcpy for small copies and on other architectures.
void StreamCopy(void* dst, const void* src, size_t n);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_BASE_STREAM_COPY_H_
