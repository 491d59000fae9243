package s3

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"sort"
	"strings"
	"time"
)

// AWS Signature Version 4 (the "Authorization" header form), written from the public specification: a canonical
// request (method, URI, query, signed headers, payload hash) is hashed into a string to sign, which is signed with a
// key derived from the secret through the date, region and service.

const (
	sigAlgorithm    = "AWS4-HMAC-SHA256"
	emptyPayloadSHA = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" // sha256("")
	amzDateFormat   = "20060102T150405Z"
)

// credentials sign requests.
type credentials struct {
	accessKeyID, secretAccessKey, sessionToken string
}

// uriEncode percent-encodes s as SigV4 wants: everything but the unreserved characters (A-Z a-z 0-9 - _ . ~), and
// '/' too unless keepSlash. Hex digits are upper case.
func uriEncode(s string, keepSlash bool) string {
	const hexdig = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_', c == '.', c == '~':
			b.WriteByte(c)
		case c == '/' && keepSlash:
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hexdig[c>>4])
			b.WriteByte(hexdig[c&15])
		}
	}
	return b.String()
}

// canonicalQuery is the query with keys sorted (then values), each encoded; it is also what is sent.
func canonicalQuery(q map[string]string) string {
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, uriEncode(k, false)+"="+uriEncode(q[k], false))
	}
	return strings.Join(parts, "&")
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// sign adds x-amz-date, x-amz-content-sha256, x-amz-security-token (with a session token) and Authorization to req.
// payloadHash is the hex SHA-256 of the body. req.URL.EscapedPath() and req.URL.RawQuery must already be in canonical
// form (uriEncode, canonicalQuery). Every header set on req before the call is signed, with Host.
func sign(req *http.Request, payloadHash string, cred credentials, region string, now time.Time) {
	amzDate := now.UTC().Format(amzDateFormat)
	day := amzDate[:8]
	req.Header.Set("X-Amz-Date", amzDate)
	req.Header.Set("X-Amz-Content-Sha256", payloadHash)
	if cred.sessionToken != "" {
		req.Header.Set("X-Amz-Security-Token", cred.sessionToken)
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	headers := map[string]string{"host": host}
	for name, values := range req.Header {
		headers[strings.ToLower(name)] = strings.Join(trimAll(values), ",")
	}
	names := make([]string, 0, len(headers))
	for n := range headers {
		names = append(names, n)
	}
	sort.Strings(names)
	var canonHeaders strings.Builder
	for _, n := range names {
		canonHeaders.WriteString(n + ":" + headers[n] + "\n")
	}
	signed := strings.Join(names, ";")
	path := req.URL.EscapedPath()
	if path == "" {
		path = "/"
	}
	canonical := strings.Join([]string{req.Method, path, req.URL.RawQuery, canonHeaders.String(), signed, payloadHash},
		"\n")
	scope := day + "/" + region + "/s3/aws4_request"
	toSign := sigAlgorithm + "\n" + amzDate + "\n" + scope + "\n" + sha256Hex([]byte(canonical))
	key := hmacSHA256([]byte("AWS4"+cred.secretAccessKey), day)
	key = hmacSHA256(key, region)
	key = hmacSHA256(key, "s3")
	key = hmacSHA256(key, "aws4_request")
	signature := hex.EncodeToString(hmacSHA256(key, toSign))
	req.Header.Set("Authorization", sigAlgorithm+" Credential="+cred.accessKeyID+"/"+scope+", SignedHeaders="+signed+
		", Signature="+signature)
}

// trimAll trims each value and folds inner runs of spaces, as the canonical header form wants.
func trimAll(values []string) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = strings.Join(strings.Fields(v), " ")
	}
	return out
}
