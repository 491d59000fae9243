package main

import (
	"sort"
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

func TestNaturalOrder(t *testing.T) {
	names := []string{"step-1000", "step-99", "step-100", "a", "step-100.dckpt-staging-00ff", "step-0100x"}
	sort.Slice(names, func(i, j int) bool { return naturalLess(names[i], names[j]) })
	if got := strings.Join(names, " "); got != "a step-99 step-100 step-100.dckpt-staging-00ff step-0100x step-1000" {
		t.Fatalf("order: %s", got)
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

func TestSplitSuffixedName(t *testing.T) {
	for name, want := range map[string]string{
		"step-1.dckpt-staging-0123456789abcdef": "step-1", "a.b.dckpt-staging-ff": "a.b",
		".dckpt-staging-00": "", "x.dckpt-staging-": "", "x.dckpt-staging-ABCD": "", "x.dckpt-staging-12g4": "",
	} {
		got, ok := splitSuffixedName(name, stagingInfix)
		if got != want || ok != (want != "") {
			t.Errorf("%q: %q %v, want %q", name, got, ok, want)
		}
	}
}
