package distckpt

// S3 storage made with explicit options (dckpt_storage_new_s3). The library's own backend: HTTP and signing through
// libcurl, loaded at run time; Go adds no transport of its own. An "s3://bucket/prefix" URL given to Open, Save,
// ExportSafetensors or a nil *StorageHandle's methods reaches the same backend configured from the AWS_* environment.

/*
#include <stdlib.h>
#include <distckpt/distckpt.h>

// Weak, so that this package still links against a libdistckpt built before S3 existed (same ABI version: functions
// are only ever added); NewS3Storage then reports ErrUnsupported.
#pragma weak dckpt_s3_options_init
#pragma weak dckpt_storage_new_s3

static int distckpt_go_has_s3(void) { return dckpt_s3_options_init != NULL && dckpt_storage_new_s3 != NULL; }
*/
import "C"

import (
	"time"
	"unsafe"
)

// S3Addressing says how a bucket is named in a request's URL (dckpt_s3_addressing).
type S3Addressing int

// Addressing styles, as in distckpt.h.
const (
	// S3AddressingAuto: path style with a custom endpoint, virtual-hosted on AWS (path style for a bucket name with
	// dots).
	S3AddressingAuto S3Addressing = C.DCKPT_S3_ADDRESSING_AUTO
	// S3AddressingPath: <endpoint>/<bucket>/<key>.
	S3AddressingPath S3Addressing = C.DCKPT_S3_ADDRESSING_PATH
	// S3AddressingVirtual: <scheme>://<bucket>.<endpoint host>/<key>.
	S3AddressingVirtual S3Addressing = C.DCKPT_S3_ADDRESSING_VIRTUAL
)

// S3Options says where and how to reach S3 (dckpt_s3_options). Every empty or zero field takes what the AWS CLI reads
// from the environment, or else the library's default.
type S3Options struct {
	Endpoint        string // "http://127.0.0.1:9000"; "": AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS's for the region
	Region          string // "": AWS_REGION, AWS_DEFAULT_REGION, else us-east-1
	AccessKeyID     string // "": AWS_ACCESS_KEY_ID (with neither, requests go unsigned)
	SecretAccessKey string // "": AWS_SECRET_ACCESS_KEY
	SessionToken    string // "": AWS_SESSION_TOKEN
	Addressing      S3Addressing
	MaxInFlight     int           // requests running at once; 0: 16
	MaxAttempts     int           // tries per request, the first included (1: no retry); 0: 6
	RequestTimeout  time.Duration // a request that moves no byte for this long fails (and is retried); 0: 30 s
	PartSize        uint64        // multipart upload part size; 0: 8 MiB; at least 5 MiB
	ReadBlockSize   uint64        // reads shorter than half of this share one GET of the aligned block; 0: 4 MiB; 1: none
}

// NewS3Storage makes a handle for S3 (nil options: all from the environment). Paths on it are "s3://bucket/key" URLs.
// Without libcurl on the machine it fails with ErrUnsupported naming the library.
func NewS3Storage(opts *S3Options) (*StorageHandle, error) {
	if C.distckpt_go_has_s3() == 0 {
		return nil, errorf(CodeUnsupported, "the loaded libdistckpt %s has no S3 storage (dckpt_storage_new_s3); "+
			"upgrade it", LibraryVersion())
	}
	if opts == nil {
		return builtinStorage("s3", func(out **C.dckpt_storage) C.int { return C.dckpt_storage_new_s3(out, nil) })
	}
	if opts.MaxInFlight < 0 || opts.MaxAttempts < 0 || opts.RequestTimeout < 0 {
		return nil, errorf(CodeInvalid, "NewS3Storage: MaxInFlight, MaxAttempts and RequestTimeout must not be "+
			"negative")
	}
	var co C.dckpt_s3_options
	if err := ccall(func() C.int { return C.dckpt_s3_options_init(&co, C.DCKPT_S3_OPTIONS_VERSION) }); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		dst **C.char
		s   string
	}{
		{&co.endpoint, opts.Endpoint}, {&co.region, opts.Region}, {&co.access_key_id, opts.AccessKeyID},
		{&co.secret_access_key, opts.SecretAccessKey}, {&co.session_token, opts.SessionToken},
	} {
		if f.s != "" {
			*f.dst = C.CString(f.s)
			defer C.free(unsafe.Pointer(*f.dst))
		}
	}
	co.addressing = C.int(opts.Addressing)
	co.max_in_flight = C.unsigned(opts.MaxInFlight)
	co.max_attempts = C.unsigned(opts.MaxAttempts)
	co.request_timeout_seconds = C.double(opts.RequestTimeout.Seconds())
	co.part_size = C.uint64_t(opts.PartSize)
	co.read_block_size = C.uint64_t(opts.ReadBlockSize)
	return builtinStorage("s3", func(out **C.dckpt_storage) C.int { return C.dckpt_storage_new_s3(out, &co) })
}
