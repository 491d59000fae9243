package distckpt_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
	"distckpt.dev/go/internal/mototest"
)

// checkEveryValue reads back every entry of the standard fixture saved with seed and step: each tensor whole and a
// region across pieces (checkFixture), the bytes entry, and the user metadata.
func checkEveryValue(t *testing.T, r *distckpt.Reader, seed float32, step int) {
	t.Helper()
	checkFixture(t, r, seed)
	got, err := r.Read(fixtures.BytesEntry)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("rng state for seed %v", seed); string(got) != want {
		t.Fatalf("%s: %q, want %q", fixtures.BytesEntry, got, want)
	}
	user, err := r.UserMetadata()
	if err != nil {
		t.Fatal(err)
	}
	if user["step"] != fmt.Sprint(step) || user["framework"] != "fixtures" {
		t.Fatalf("user metadata %v", user)
	}
	entries, err := r.Entries()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(fixtures.Standard)+1 {
		t.Fatalf("%d entries, want %d", len(entries), len(fixtures.Standard)+1)
	}
}

func TestSaveToAnS3URLAndReadEveryValueBack(t *testing.T) {
	srv := mototest.Start(t)
	srv.CreateBucket(t, "ckpts")
	url := "s3://ckpts/run/step-100"
	// No storage: the library resolves the URL (S3 from the AWS_* environment mototest set).
	fixtures.Write(t, url, fixtures.Options{Step: 100, Seed: 3})
	r, err := distckpt.Open(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Path() != url {
		t.Fatalf("Path() = %q", r.Path())
	}
	checkEveryValue(t, r, 3, 100)

	info, err := (*distckpt.StorageHandle)(nil).Stat(url, time.Hour)
	if err != nil || info.Kind != distckpt.PathCheckpoint || info.Files < 2 || info.LeftoverFiles != 0 {
		t.Fatalf("Stat(%s): %+v, %v", url, info, err)
	}
	names, err := distckpt.ListDir("s3://ckpts/run")
	if err != nil || strings.Join(names, ",") != "step-100" {
		t.Fatalf("ListDir(s3://ckpts/run) = %v, %v", names, err)
	}
	names, err = distckpt.ListDir(url + "/")
	if err != nil || len(names) < 2 || names[len(names)-1] != "metadata.dckpt" {
		t.Fatalf("ListDir(%s/) = %v, %v", url, names, err)
	}
	if names, err := distckpt.ListDir("s3://ckpts/nothing-here"); err != nil || len(names) != 0 {
		t.Fatalf("an empty prefix lists %v, %v", names, err)
	}

	// Saving there again without Overwrite is refused; nothing changes.
	_, err = distckpt.Save(url, fixtures.State(t, fixtures.Options{Step: 1}), nil)
	if !errors.Is(err, distckpt.ErrExists) || !strings.Contains(err.Error(), url) {
		t.Fatalf("a second save: %v", err)
	}
	// The exporter reads the checkpoint at the URL and writes into a local directory.
	out := t.TempDir()
	if err := distckpt.ExportSafetensors(url, out, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "model.safetensors.index.json")); err != nil {
		t.Fatal(err)
	}
}

func TestS3StorageWithOptionsStreamsMultipartFiles(t *testing.T) {
	srv := mototest.Start(t)
	srv.CreateBucket(t, "big")
	h, err := distckpt.NewS3Storage(&distckpt.S3Options{
		Endpoint: srv.Endpoint, Region: "us-east-1", AccessKeyID: "testing", SecretAccessKey: "testing",
		Addressing: distckpt.S3AddressingPath, MaxInFlight: 4, MaxAttempts: 2, RequestTimeout: 20 * time.Second,
		PartSize: 5 << 20, ReadBlockSize: 1 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// 13 MiB in one tensor: a data file of three parts.
	data := make([]byte, 13<<20)
	rand.New(rand.NewSource(7)).Read(data)
	st := distckpt.NewState()
	if err := st.AddTensorData("w", distckpt.U8, []uint64{uint64(len(data))}, data); err != nil {
		t.Fatal(err)
	}
	url := "s3://big/w"
	if _, err := distckpt.Save(url, st, &distckpt.SaveOptions{Storage: h}); err != nil {
		t.Fatal(err)
	}
	// Read back through the handle, and through the URL alone.
	for _, opts := range []*distckpt.ReadOptions{{Storage: h}, nil} {
		r, err := distckpt.Open(url, opts)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.Read("w")
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read back %d bytes (%v), equal: %v", len(got), err, bytes.Equal(got, data))
		}
		part, err := r.ReadRegion("w", []uint64{(5 << 20) - 10}, []uint64{20})
		if err != nil || !bytes.Equal(part, data[(5<<20)-10:(5<<20)+10]) {
			t.Fatalf("a region across two parts: %v", err)
		}
		if _, err := r.Verify(nil); err != nil {
			t.Fatal(err)
		}
		r.Close()
	}
	names, err := h.List("s3://big")
	if err != nil || strings.Join(names, ",") != "w" {
		t.Fatalf("List(s3://big) = %v, %v", names, err)
	}
	if err := h.RemoveCheckpoint(url); err != nil {
		t.Fatal(err)
	}
	if names, err := h.List(url); err != nil || len(names) != 0 {
		t.Fatalf("after RemoveCheckpoint: %v, %v", names, err)
	}
	if _, err := distckpt.Open(url, &distckpt.ReadOptions{Storage: h}); !errors.Is(err, distckpt.ErrNotFound) {
		t.Fatalf("open after RemoveCheckpoint: %v", err)
	}
}

func TestOpenStorageURL(t *testing.T) {
	srv := mototest.Start(t)
	srv.CreateBucket(t, "ckpts")
	h, err := distckpt.OpenStorageURL("s3://ckpts")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := distckpt.Save("s3://ckpts/a", fixtures.State(t, fixtures.Options{Step: 2, Seed: 2}),
		&distckpt.SaveOptions{Storage: h, ChecksumBlockSize: fixtures.BlockSize}); err != nil {
		t.Fatal(err)
	}
	r, err := distckpt.Open("s3://ckpts/a", &distckpt.ReadOptions{Storage: h})
	if err != nil {
		t.Fatal(err)
	}
	checkEveryValue(t, r, 2, 2)
	r.Close()

	// A plain path opens the POSIX file system.
	dir := t.TempDir()
	p, err := distckpt.OpenStorageURL(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	fixtures.Write(t, filepath.Join(dir, "step-1"), fixtures.Options{Step: 1})
	if names, err := p.List(dir); err != nil || strings.Join(names, ",") != "step-1" {
		t.Fatalf("List(%s) = %v, %v", dir, names, err)
	}
}

func TestAURLOfAnotherSchemeIsUnsupportedAndNamesIt(t *testing.T) {
	url := "gs://bucket/run/step-1"
	_, err := distckpt.OpenStorageURL(url)
	checkUnsupportedScheme(t, "OpenStorageURL", err)
	_, err = distckpt.Open(url, nil)
	checkUnsupportedScheme(t, "Open", err)
	_, err = distckpt.Save(url, fixtures.State(t, fixtures.Options{Step: 1}), nil)
	checkUnsupportedScheme(t, "Save", err)
	_, err = distckpt.ListDir(url)
	checkUnsupportedScheme(t, "ListDir", err)
	_, err = (*distckpt.StorageHandle)(nil).Stat(url, 0)
	checkUnsupportedScheme(t, "Stat", err)
}

func checkUnsupportedScheme(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, distckpt.ErrUnsupported) || !strings.Contains(err.Error(), "gs") {
		t.Fatalf("%s of a gs:// URL: %v (want an unsupported error naming the scheme)", what, err)
	}
}

func TestNewS3StorageRefusesNegativeOptions(t *testing.T) {
	for _, o := range []distckpt.S3Options{{MaxInFlight: -1}, {MaxAttempts: -1}, {RequestTimeout: -time.Second}} {
		if _, err := distckpt.NewS3Storage(&o); !errors.Is(err, distckpt.ErrInvalid) {
			t.Fatalf("%+v: %v", o, err)
		}
	}
}

func TestIsURL(t *testing.T) {
	for path, want := range map[string]bool{
		"s3://b/p": true, "gs://b": true, "s3+x.y-z://b": true, "/ckpt/step-1": false, "step-1": false,
		"://x": false, "./a://b": false, "1s3://b": false, "C:/x": false,
	} {
		if got := distckpt.IsURL(path); got != want {
			t.Errorf("IsURL(%q) = %v, want %v", path, got, want)
		}
	}
}
