package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"1000": 1000, "5GB": 5e9, "5gb": 5e9, "512MiB": 512 << 20, "1.5KB": 1500, "2 KiB": 2048, "7B": 7, "3M": 3e6,
	} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "lots", "-1", "5XB"} {
		if _, err := parseSize(bad); err == nil {
			t.Errorf("parseSize(%q) accepted", bad)
		}
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 30: "5.0 GiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestRenderBar(t *testing.T) {
	got := renderBar("verifying", 512<<10, 1<<20, time.Second)
	if !strings.HasPrefix(got, "verifying [===============>              ]  50%  512.0 KiB / 1.0 MiB  512.0 KiB/s") {
		t.Fatalf("bar: %q", got)
	}
	if b := newProgressBar(&strings.Builder{}, "x"); b != nil {
		t.Fatal("a progress bar on something that is not a terminal")
	}
}
