// Package mototest starts a moto S3 server (the repository's Python venv, <repo>/.venv, with moto[server]) for the
// tests of the S3 storage and of the CLI on s3:// URLs. Without it, the tests skip, saying what to install.
package mototest

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

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

// Start runs a moto S3 server on a free port of 127.0.0.1 until the test ends, sets the AWS_* variables the s3
// package reads (credentials, region, endpoint) for the test, and returns the endpoint URL. It skips the test when
// the venv or moto is missing.
func Start(t testing.TB) string {
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
	return endpoint
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
