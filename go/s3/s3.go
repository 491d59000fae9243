// Package s3 is a distckpt.Storage for S3 and S3-compatible object stores (MinIO, Ceph RGW, moto, ...), written on
// the standard library only: requests are signed with AWS Signature Version 4, objects are written with PUT (or a
// multipart upload the library streams part by part), read with ranged GETs, sized with HEAD, listed with
// ListObjectsV2 (delimiter "/"), and removed with DELETE. A checkpoint's metadata is committed with one PUT, made
// conditional ("If-None-Match: *") when it must not replace anything.
//
// Paths are "s3://bucket/key" (or "bucket/key"); a checkpoint saved at "s3://bucket/run/step-100" is the objects
// "run/step-100/metadata.dckpt", "run/step-100/data-00000.<nonce>.bin", ... of the bucket.
//
// Conditional writes: a server that ignores "If-None-Match: *" on PUT (older S3-compatible servers; AWS S3 honours
// it since August 2024) lets a save without overwrite replace a checkpoint another writer committed at the same path
// at the same moment. The library checks that nothing is there before it commits, so only that race is lost.
//
// The Client is a distckpt.MultipartStorage: the library assembles every file of more than one part (Config.PartSize)
// itself and streams it as a multipart upload, part by part while the file is written, so a data file is never held
// whole in memory. Smaller files (the metadata, small data files) are buffered until they are closed and sent with
// one PUT.
package s3

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	distckpt "distckpt.dev/go"
)

// Config says where the object store is and who signs.
type Config struct {
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string // temporary credentials only
	Region          string // "" : us-east-1
	// Endpoint is the store's URL ("http://127.0.0.1:9000"); requests then use path-style addressing
	// (ENDPOINT/bucket/key). "": AWS, virtual-hosted style (https://bucket.s3.REGION.amazonaws.com/key).
	Endpoint string
	// PartSize is the part size of multipart uploads (S3 requires parts of at least 5 MiB but the last): the library
	// streams every file larger than one part through BeginUpload. MultipartThreshold applies to objects written
	// through a StorageFile (Create) directly: those larger are uploaded in parts on Close. 0: 16 MiB and 64 MiB.
	MultipartThreshold int64
	PartSize           int64
	HTTPClient         *http.Client // nil: http.DefaultClient
}

// ConfigFromEnv reads the variables the AWS CLI reads: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
// AWS_REGION (else AWS_DEFAULT_REGION) and AWS_ENDPOINT_URL (AWS_ENDPOINT_URL_S3 first, when set).
func ConfigFromEnv() Config {
	c := Config{
		AccessKeyID:     os.Getenv("AWS_ACCESS_KEY_ID"),
		SecretAccessKey: os.Getenv("AWS_SECRET_ACCESS_KEY"),
		SessionToken:    os.Getenv("AWS_SESSION_TOKEN"),
		Region:          os.Getenv("AWS_REGION"),
		Endpoint:        os.Getenv("AWS_ENDPOINT_URL_S3"),
	}
	if c.Region == "" {
		c.Region = os.Getenv("AWS_DEFAULT_REGION")
	}
	if c.Endpoint == "" {
		c.Endpoint = os.Getenv("AWS_ENDPOINT_URL")
	}
	return c
}

// Client talks to one S3 endpoint. It implements distckpt.Storage and distckpt.Committer; safe for concurrent use.
type Client struct {
	cfg      Config
	cred     credentials
	endpoint *url.URL // nil: AWS
	http     *http.Client
	now      func() time.Time
}

var (
	_ distckpt.Storage   = (*Client)(nil)
	_ distckpt.Committer = (*Client)(nil)
)

// New makes a client. Credentials are required (anonymous access is not supported).
func New(cfg Config) (*Client, error) {
	if cfg.AccessKeyID == "" || cfg.SecretAccessKey == "" {
		return nil, errors.New("s3: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	if cfg.MultipartThreshold <= 0 {
		cfg.MultipartThreshold = 64 << 20
	}
	if cfg.PartSize <= 0 {
		cfg.PartSize = 16 << 20
	}
	c := &Client{cfg: cfg, cred: credentials{cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken},
		http: cfg.HTTPClient, now: time.Now}
	if c.http == nil {
		c.http = http.DefaultClient
	}
	if cfg.Endpoint != "" {
		u, err := url.Parse(strings.TrimSuffix(cfg.Endpoint, "/"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("s3: endpoint %q is not an http(s) URL", cfg.Endpoint)
		}
		c.endpoint = u
	}
	return c, nil
}

// NewFromEnv is New(ConfigFromEnv()).
func NewFromEnv() (*Client, error) { return New(ConfigFromEnv()) }

// IsURL reports whether s is an "s3://" URL.
func IsURL(s string) bool { return strings.HasPrefix(s, "s3://") }

// Split returns the bucket and key of "s3://bucket/key" or "bucket/key" (the key may be empty). "s3:/bucket/key" is
// accepted too: the library joins a checkpoint's path with its file names lexically, which folds "//" into "/".
func Split(path string) (bucket, key string, err error) {
	rest := path
	if strings.HasPrefix(rest, "s3://") {
		rest = rest[len("s3://"):]
	} else if strings.HasPrefix(rest, "s3:/") {
		rest = rest[len("s3:/"):]
	}
	bucket, key, _ = strings.Cut(rest, "/")
	if bucket == "" {
		return "", "", fmt.Errorf("s3: %q names no bucket (want s3://bucket/prefix)", path)
	}
	return bucket, key, nil
}

// Error is a failed request: the HTTP status and S3's error code and message.
type Error struct {
	Op      string // "GET", "PUT", ...
	Path    string // s3://bucket/key
	Status  int
	Code    string // S3's error code ("NoSuchKey", "AccessDenied", ...)
	Message string
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("s3: %s %s: HTTP %d", e.Op, e.Path, e.Status)
	if e.Code != "" {
		msg += " " + e.Code
	}
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// Is matches fs.ErrNotExist for 404 and fs.ErrExist for 412 (a conditional write found something there), and
// fs.ErrPermission for 403.
func (e *Error) Is(target error) bool {
	switch target {
	case fs.ErrNotExist:
		return e.Status == http.StatusNotFound
	case fs.ErrExist:
		return e.Status == http.StatusPreconditionFailed
	case fs.ErrPermission:
		return e.Status == http.StatusForbidden
	}
	return false
}

// request is one S3 call.
type request struct {
	method, bucket, key string
	query               map[string]string
	header              http.Header
	body                []byte
	retry               bool // idempotent: retried on a transport error or a 5xx
}

func (c *Client) url(bucket, key string, query map[string]string) string {
	path := "/" + uriEncode(key, true)
	var u string
	if c.endpoint != nil {
		u = c.endpoint.Scheme + "://" + c.endpoint.Host + strings.TrimSuffix(c.endpoint.Path, "/") + "/" +
			uriEncode(bucket, false) + path
	} else {
		u = "https://" + bucket + ".s3." + c.cfg.Region + ".amazonaws.com" + path
	}
	if len(query) > 0 {
		u += "?" + canonicalQuery(query)
	}
	return u
}

// do sends r and returns a response with a 2xx status (the caller closes its body), or an *Error.
func (c *Client) do(r request) (*http.Response, error) {
	where := "s3://" + r.bucket + "/" + r.key
	attempts := 1
	if r.retry {
		attempts = 4
	}
	var lastErr error
	for i := 0; i < attempts; i++ {
		if i > 0 {
			time.Sleep(time.Duration(100<<uint(i-1)) * time.Millisecond)
		}
		req, err := http.NewRequest(r.method, c.url(r.bucket, r.key, r.query), bytes.NewReader(r.body))
		if err != nil {
			return nil, fmt.Errorf("s3: %s %s: %w", r.method, where, err)
		}
		if r.body == nil {
			req.Body, req.GetBody, req.ContentLength = http.NoBody, nil, 0
		}
		for k, v := range r.header {
			req.Header[k] = v
		}
		hash := emptyPayloadSHA
		if len(r.body) > 0 {
			hash = sha256Hex(r.body)
		}
		sign(req, hash, c.cred, c.cfg.Region, c.now())
		resp, err := c.http.Do(req)
		if err != nil {
			lastErr = fmt.Errorf("s3: %s %s: %w", r.method, where, err)
			continue
		}
		if resp.StatusCode/100 == 2 {
			return resp, nil
		}
		lastErr = responseError(r.method, where, resp)
		if resp.StatusCode/100 != 5 {
			break
		}
	}
	return nil, lastErr
}

// responseError reads S3's XML error document (if any) and closes the body.
func responseError(op, where string, resp *http.Response) *Error {
	defer resp.Body.Close()
	e := &Error{Op: op, Path: where, Status: resp.StatusCode}
	var doc struct {
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if xml.Unmarshal(body, &doc) == nil {
		e.Code, e.Message = doc.Code, doc.Message
	}
	if e.Code == "" && e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// CreateBucket creates a bucket (for tests and set-up; an existing bucket of yours is no error).
func (c *Client) CreateBucket(bucket string) error {
	var body []byte
	if c.cfg.Region != "us-east-1" {
		body = []byte(`<CreateBucketConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><LocationConstraint>` +
			c.cfg.Region + `</LocationConstraint></CreateBucketConfiguration>`)
	}
	resp, err := c.do(request{method: "PUT", bucket: bucket, body: body, retry: true})
	var e *Error
	if errors.As(err, &e) && e.Code == "BucketAlreadyOwnedByYou" {
		return nil
	}
	if err != nil {
		return err
	}
	drain(resp)
	return nil
}

// Size is the object's size (HEAD); fs.ErrNotExist when there is none.
func (c *Client) Size(path string) (uint64, error) {
	bucket, key, err := Split(path)
	if err != nil {
		return 0, err
	}
	resp, err := c.do(request{method: "HEAD", bucket: bucket, key: key, retry: true})
	if err != nil {
		return 0, err
	}
	drain(resp)
	if resp.ContentLength < 0 {
		return 0, fmt.Errorf("s3: HEAD %s: no Content-Length", path)
	}
	return uint64(resp.ContentLength), nil
}

// ReadAt reads len(p) bytes at off with a ranged GET; fewer (and io.EOF) only at the end of the object.
func (c *Client) ReadAt(path string, p []byte, off uint64) (int, error) {
	bucket, key, err := Split(path)
	if err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	h := http.Header{}
	h.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+uint64(len(p))-1))
	resp, err := c.do(request{method: "GET", bucket: bucket, key: key, header: h, retry: true})
	var e *Error
	if errors.As(err, &e) && e.Status == http.StatusRequestedRangeNotSatisfiable {
		return 0, io.EOF // off is at or past the end
	}
	if err != nil {
		return 0, err
	}
	defer drain(resp)
	body := io.Reader(resp.Body)
	if resp.StatusCode == http.StatusOK && off > 0 { // the server sent the whole object
		if _, err := io.CopyN(io.Discard, body, int64(off)); err != nil {
			return 0, io.EOF
		}
	}
	n, err := io.ReadFull(body, p)
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		return n, io.EOF
	}
	if err != nil {
		return n, fmt.Errorf("s3: GET %s: %w", path, err)
	}
	return n, nil
}

// List names what is directly below dir (ListObjectsV2 with delimiter "/", every page).
func (c *Client) List(dir string) ([]string, error) {
	bucket, prefix, err := Split(dir)
	if err != nil {
		return nil, err
	}
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	var names []string
	seen := map[string]bool{}
	token := ""
	for {
		q := map[string]string{"list-type": "2", "delimiter": "/", "prefix": prefix}
		if token != "" {
			q["continuation-token"] = token
		}
		resp, err := c.do(request{method: "GET", bucket: bucket, query: q, retry: true})
		if err != nil {
			return nil, err
		}
		var page struct {
			Contents              []struct{ Key string }
			CommonPrefixes        []struct{ Prefix string }
			IsTruncated           bool
			NextContinuationToken string
		}
		err = xml.NewDecoder(resp.Body).Decode(&page)
		drain(resp)
		if err != nil {
			return nil, fmt.Errorf("s3: listing %s: %w", dir, err)
		}
		add := func(full string) {
			name := strings.TrimSuffix(strings.TrimPrefix(full, prefix), "/")
			if name != "" && !strings.Contains(name, "/") && !seen[name] {
				seen[name] = true
				names = append(names, name)
			}
		}
		for _, o := range page.Contents {
			add(o.Key)
		}
		for _, p := range page.CommonPrefixes {
			add(p.Prefix)
		}
		if !page.IsTruncated || page.NextContinuationToken == "" {
			return names, nil
		}
		token = page.NextContinuationToken
	}
}

// Remove deletes the object; nil when there is none.
func (c *Client) Remove(path string) error {
	bucket, key, err := Split(path)
	if err != nil {
		return err
	}
	resp, err := c.do(request{method: "DELETE", bucket: bucket, key: key, retry: true})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	drain(resp)
	return nil
}

// Commit writes data with one PUT, conditional on nothing being there unless replace: fs.ErrExist (HTTP 412) when
// something is. A server that ignores If-None-Match replaces what is there (see the package comment).
func (c *Client) Commit(path string, data []byte, replace bool) error {
	bucket, key, err := Split(path)
	if err != nil {
		return err
	}
	h := http.Header{}
	if !replace {
		h.Set("If-None-Match", "*")
	}
	if data == nil {
		data = []byte{}
	}
	// A conditional PUT is not retried: a first attempt that succeeded unseen would make the retry fail with 412.
	resp, err := c.do(request{method: "PUT", bucket: bucket, key: key, header: h, body: data, retry: replace})
	if err != nil {
		return err
	}
	drain(resp)
	return nil
}

// Create buffers the object in memory; Close uploads it (nothing is visible before).
func (c *Client) Create(path string, sizeHint uint64) (distckpt.StorageFile, error) {
	if _, _, err := Split(path); err != nil {
		return nil, err
	}
	const maxHint = 1 << 30 // a hint, not a promise: do not reserve more than this up front
	if sizeHint > maxHint {
		sizeHint = maxHint
	}
	return &object{c: c, path: path, buf: make([]byte, 0, sizeHint)}, nil
}

// object is a file being written: its bytes, until Close uploads them.
type object struct {
	c    *Client
	path string
	mu   sync.Mutex
	buf  []byte
}

func (o *object) WriteAt(p []byte, off uint64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	end := off + uint64(len(p))
	if end > uint64(len(o.buf)) {
		if end > uint64(cap(o.buf)) {
			grown := make([]byte, end, end+end/4)
			copy(grown, o.buf)
			o.buf = grown
		} else {
			o.buf = o.buf[:end]
		}
	}
	copy(o.buf[off:], p)
	return nil
}

func (o *object) Sync() error { return nil } // nothing is durable before Close's upload, which is

func (o *object) Close(size uint64, discard bool) error {
	o.mu.Lock()
	data := o.buf
	o.buf = nil
	o.mu.Unlock()
	if discard {
		return nil
	}
	if uint64(len(data)) < size {
		grown := make([]byte, size)
		copy(grown, data)
		data = grown
	}
	data = data[:size]
	if int64(len(data)) > o.c.cfg.MultipartThreshold {
		return o.c.putMultipart(o.path, data)
	}
	return o.c.Commit(o.path, data, true)
}

// MinPartSize is the part size of the files the library streams through BeginUpload (Config.PartSize).
func (c *Client) MinPartSize() uint64 { return uint64(c.cfg.PartSize) }

// BeginUpload starts a multipart upload whose parts the library sends while it writes the file (distckpt's
// MultipartStorage): a data file is streamed, never held whole in memory.
func (c *Client) BeginUpload(path string, sizeHint uint64) (distckpt.Upload, error) {
	bucket, key, err := Split(path)
	if err != nil {
		return nil, err
	}
	id, err := c.startMultipart(bucket, key, path)
	if err != nil {
		return nil, err
	}
	return &upload{c: c, path: path, bucket: bucket, key: key, id: id, etags: map[int]string{}}, nil
}

// upload is a multipart upload the library is sending.
type upload struct {
	c                     *Client
	path, bucket, key, id string
	mu                    sync.Mutex
	etags                 map[int]string
}

func (u *upload) UploadPart(number int, p []byte) error {
	// The library's buffer is valid only during the call, and the HTTP transport may still hold a request body
	// after the response came back: send a copy.
	etag, err := u.c.putPart(u.bucket, u.key, u.id, number, append([]byte(nil), p...))
	if err != nil {
		return err
	}
	u.mu.Lock()
	u.etags[number] = etag
	u.mu.Unlock()
	return nil
}

func (u *upload) Complete() error {
	u.mu.Lock()
	etags := make([]string, len(u.etags))
	for n, tag := range u.etags {
		if n < 1 || n > len(etags) {
			u.mu.Unlock()
			u.c.abortMultipart(u.bucket, u.key, u.id)
			return fmt.Errorf("s3: completing the upload of %s: parts are not numbered 1..%d", u.path, len(etags))
		}
		etags[n-1] = tag
	}
	u.mu.Unlock()
	if err := u.c.completeMultipart(u.bucket, u.key, u.id, u.path, etags); err != nil {
		u.c.abortMultipart(u.bucket, u.key, u.id) // nothing more is called on a failed upload: leave no parts
		return err
	}
	return nil
}

func (u *upload) Abort() error {
	u.c.abortMultipart(u.bucket, u.key, u.id)
	return nil
}

// putMultipart uploads data in parts of PartSize, four at a time, and aborts the upload when a part fails (a file
// written through the StorageFile interface directly; the library streams its files through BeginUpload instead).
func (c *Client) putMultipart(path string, data []byte) error {
	bucket, key, err := Split(path)
	if err != nil {
		return err
	}
	id, err := c.startMultipart(bucket, key, path)
	if err != nil {
		return err
	}
	parts := int((int64(len(data)) + c.cfg.PartSize - 1) / c.cfg.PartSize)
	etags := make([]string, parts)
	errs := make([]error, parts)
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i := 0; i < parts; i++ {
		lo := int64(i) * c.cfg.PartSize
		hi := lo + c.cfg.PartSize
		if hi > int64(len(data)) {
			hi = int64(len(data))
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(i int, part []byte) {
			defer func() { <-sem; wg.Done() }()
			etags[i], errs[i] = c.putPart(bucket, key, id, i+1, part)
		}(i, data[lo:hi])
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			c.abortMultipart(bucket, key, id)
			return err
		}
	}
	if err := c.completeMultipart(bucket, key, id, path, etags); err != nil {
		c.abortMultipart(bucket, key, id)
		return err
	}
	return nil
}

// startMultipart starts a multipart upload and returns its id.
func (c *Client) startMultipart(bucket, key, path string) (string, error) {
	resp, err := c.do(request{method: "POST", bucket: bucket, key: key, query: map[string]string{"uploads": ""}})
	if err != nil {
		return "", err
	}
	var started struct{ UploadId string }
	err = xml.NewDecoder(resp.Body).Decode(&started)
	drain(resp)
	if err != nil || started.UploadId == "" {
		return "", fmt.Errorf("s3: starting a multipart upload of %s: no upload id (%v)", path, err)
	}
	return started.UploadId, nil
}

// putPart sends part number (from 1) of upload id and returns its ETag.
func (c *Client) putPart(bucket, key, id string, number int, part []byte) (string, error) {
	q := map[string]string{"partNumber": strconv.Itoa(number), "uploadId": id}
	resp, err := c.do(request{method: "PUT", bucket: bucket, key: key, query: q, body: part, retry: true})
	if err != nil {
		return "", err
	}
	etag := resp.Header.Get("ETag")
	drain(resp)
	return etag, nil
}

// abortMultipart drops an upload and its parts (best effort: the store expires unfinished uploads anyway).
func (c *Client) abortMultipart(bucket, key, id string) {
	if resp, err := c.do(request{method: "DELETE", bucket: bucket, key: key,
		query: map[string]string{"uploadId": id}, retry: true}); err == nil {
		drain(resp)
	}
}

// completeMultipart publishes the object made of the parts with these ETags (part i+1 has etags[i]).
func (c *Client) completeMultipart(bucket, key, id, path string, etags []string) error {
	var doc strings.Builder
	doc.WriteString("<CompleteMultipartUpload>")
	for i, tag := range etags {
		fmt.Fprintf(&doc, "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>", i+1, xmlEscape(tag))
	}
	doc.WriteString("</CompleteMultipartUpload>")
	resp, err := c.do(request{method: "POST", bucket: bucket, key: key, query: map[string]string{"uploadId": id},
		body: []byte(doc.String()), retry: true})
	if err != nil {
		return err
	}
	// S3 may report a failure of the completion inside a 200 response.
	body, _ := io.ReadAll(resp.Body)
	drain(resp)
	var failed struct {
		XMLName xml.Name
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	}
	if xml.Unmarshal(body, &failed) == nil && failed.XMLName.Local == "Error" {
		return &Error{Op: "POST", Path: path, Status: http.StatusOK, Code: failed.Code, Message: failed.Message}
	}
	return nil
}

func xmlEscape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
