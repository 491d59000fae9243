// S3 storage: an ObjectClient speaking the S3 REST API through libcurl (loaded at run time), turned into a Storage by
// ObjectStorage, so checkpoints on S3 are committed metadata-last (FORMAT.md section 6.2). Paths are "s3://bucket/key"
// URLs.
//
// Requests: HEAD for sizes, ranged GETs for reads, ListObjectsV2 (delimiter '/') for listings, DELETE for removal, a
// PUT for a file of one part, multipart uploads (CreateMultipartUpload, UploadPart, Complete, Abort) for larger ones,
// and the commit as one PUT with If-None-Match: * (a plain PUT when replacing). A network failure, HTTP 500, 502, 503,
// 504, 408 or 429, or a throttling/timeout error code is retried, max_attempts tries in all, waiting a random time
// up to min(cap, base * 2^retry) between them; a read that failed midway resumes where it stopped. A retried
// conditional PUT answered 412 is a success if the object now holds exactly the bytes sent (the first try landed); a
// retried CompleteMultipartUpload answered NoSuchUpload likewise if the object has the size of the parts sent.
#ifndef DISTCKPT_CORE_STORAGE_S3_S3_STORAGE_H_
#define DISTCKPT_CORE_STORAGE_S3_S3_STORAGE_H_

#include <memory>

#include "core/base/status.h"
#include "core/storage/object/object_storage.h"
#include "core/storage/s3/s3_config.h"
#include "core/storage/storage.h"

namespace distckpt {
namespace s3 {

/// The ObjectClient for `config` (resolved: ResolveS3Config). Loads libcurl: kUnsupported naming it when it cannot.
Result<std::shared_ptr<ObjectClient>> NewS3Client(const S3Config& config);

}  // namespace s3

/// S3 storage for `config`, completed from the environment (s3::ResolveS3Config).
Result<std::unique_ptr<Storage>> NewS3Storage(const s3::S3Config& config);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_STORAGE_S3_S3_STORAGE_H_
