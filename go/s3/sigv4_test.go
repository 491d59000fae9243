package s3

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// The "GET Object" example of the S3 documentation on Signature Version 4 (header-based authentication).
func TestSignMatchesTheDocumentedExample(t *testing.T) {
	req, err := http.NewRequest("GET", "https://examplebucket.s3.amazonaws.com/test.txt", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Range", "bytes=0-9")
	cred := credentials{accessKeyID: "AKIAIOSFODNN7EXAMPLE", secretAccessKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}
	sign(req, emptyPayloadSHA, cred, "us-east-1", time.Date(2013, 5, 24, 0, 0, 0, 0, time.UTC))
	want := "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, " +
		"SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, " +
		"Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
	if got := req.Header.Get("Authorization"); got != want {
		t.Fatalf("Authorization:\n got %s\nwant %s", got, want)
	}
}

func TestURIEncode(t *testing.T) {
	for in, want := range map[string]string{
		"a/b c+d~e": "a/b%20c%2Bd~e", "x=1&y": "x%3D1%26y", "é": "%C3%A9",
	} {
		if got := uriEncode(in, true); got != want {
			t.Errorf("uriEncode(%q) = %q, want %q", in, got, want)
		}
	}
	if got := uriEncode("a/b", false); got != "a%2Fb" {
		t.Errorf("uriEncode without keepSlash: %q", got)
	}
	if got := canonicalQuery(map[string]string{"prefix": "a/b", "list-type": "2", "delimiter": "/"}); !strings.HasPrefix(got, "delimiter=%2F&list-type=2&prefix=a%2Fb") {
		t.Errorf("canonicalQuery: %q", got)
	}
}
