// Package mototest starts a moto S3 server (the repository's Python venv, <repo>/.venv, with moto[server]) for the
// tests that use s3:// URLs (the library's S3 storage, reached through the C ABI). Without it, the tests skip, saying
// what to install. Buckets, and objects distckpt did not write, are made with plain unsigned HTTP PUTs, which moto
// accepts: the tests have no S3 client of their own.
package mototest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Server is a moto S3 server running for a test.
type Server struct {
	Endpoint string // "http://127.0.0.1:PORT"
}

// python is the venv's interpreter, found above the working directory.
func python() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, ".venv", "bin", "python")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no .venv/bin/python above the working directory (python/run_tests.sh creates it)")
		}
		dir = parent
	}
}

// Start runs a moto S3 server on a free port of 127.0.0.1 until the test ends and sets, for the test, the AWS_*
// variables the library reads for an s3:// URL (credentials, region, endpoint). It skips the test when the venv or
// moto is missing.
func Start(t testing.TB) *Server {
	t.Helper()
	py, err := python()
	if err != nil {
		t.Skipf("moto S3 server unavailable: %v", err)
	}
	if out, err := exec.Command(py, "-c", "import moto.server").CombinedOutput(); err != nil {
		t.Skipf("moto S3 server unavailable: %s cannot import moto.server (install it with "+
			"`.venv/bin/pip install 'moto[server]'`): %v %s", py, err, lastLine(out))
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(py, "-m", "moto.server", "-H", "127.0.0.1", "-p", fmt.Sprint(port))
	log, err := os.CreateTemp(t.TempDir(), "moto-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting moto: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		log.Close()
	})
	endpoint := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(endpoint + "/moto-api/")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case <-done:
			text, _ := os.ReadFile(log.Name())
			t.Fatalf("moto exited before it served: %s", text)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("moto did not answer on %s within 30 s", endpoint)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "",
		"AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "", "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": "",
	} {
		setenv(t, k, v)
	}
	return &Server{Endpoint: endpoint}
}

// CreateBucket makes a bucket.
func (s *Server) CreateBucket(t testing.TB, bucket string) {
	t.Helper()
	s.put(t, s.Endpoint+"/"+bucket, nil)
}

// Put writes an object at an "s3://bucket/key" URL, as something other than distckpt would.
func (s *Server) Put(t testing.TB, url string, data []byte) {
	t.Helper()
	rest := strings.TrimPrefix(url, "s3://")
	if rest == url || !strings.Contains(rest, "/") {
		t.Fatalf("mototest.Put: %q is not an s3://bucket/key URL", url)
	}
	s.put(t, s.Endpoint+"/"+rest, data)
}

func (s *Server) put(t testing.TB, target string, data []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, target, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("PUT %s: %v", target, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("PUT %s: %s %s", target, resp.Status, body)
	}
}

func setenv(t testing.TB, k, v string) {
	old, had := os.LookupEnv(k)
	os.Setenv(k, v)
	t.Cleanup(func() {
		if had {
			os.Setenv(k, old)
		} else {
			os.Unsetenv(k)
		}
	})
}

func lastLine(b []byte) string {
	s := string(b)
	for len(s) > 0 && s[len(s)-1] == '\n' {
		s = s[:len(s)-1]
	}
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			return s[i+1:]
		}
	}
	return s
}
