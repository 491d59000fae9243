package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// humanBytes prints a byte count in binary units: "512 B", "68.0 KiB", "1.5 GiB".
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// parseSize accepts a byte count with an optional unit: 1000, 500MB (10^6), 5GB (10^9), 512MiB (2^20).
func parseSize(s string) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := uint64(1)
	for _, u := range []struct {
		suffix string
		mult   uint64
	}{
		{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
		{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12}, {"k", 1e3}, {"m", 1e6}, {"g", 1e9}, {"t", 1e12}, {"b", 1},
	} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || v*float64(mult) > float64(^uint64(0)>>1) {
		return 0, fmt.Errorf("invalid size %q (examples: 1000, 500MB, 5GB, 512MiB)", s)
	}
	return uint64(v * float64(mult)), nil
}

// shapeString prints a shape as "[64, 32]" ("[]" for a scalar).
func shapeString(shape []uint64) string {
	parts := make([]string, len(shape))
	for i, d := range shape {
		parts[i] = strconv.FormatUint(d, 10)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// boxString prints a box as half-open ranges per dimension: "[0:16, 32:64]".
func boxString(offsets, lengths []uint64) string {
	parts := make([]string, len(offsets))
	for i := range offsets {
		parts[i] = fmt.Sprintf("%d:%d", offsets[i], offsets[i]+lengths[i])
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

// jsonTime is a time in RFC 3339 UTC for JSON output (null when unknown).
func jsonTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339)
	return &s
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
