package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// progressMode is the --progress flag's value: where and how a long command reports its progress on stderr.
type progressMode string

const (
	progressAuto  progressMode = "auto" // bar on a terminal, nothing otherwise
	progressDrawn progressMode = "bar"  // the bar, even when stderr is not a terminal
	progressLog   progressMode = "log"  // plain lines (every 10% or 5 s), for CI logs and files
	progressNone  progressMode = "none"
)

// progressFlags adds --progress and its other spellings --no-progress and --quiet (= --progress=none; --quiet is
// python -m distckpt's) to a command's flags; the returned function gives the mode after parsing, or an error for an
// unknown one. A leading -q (c.quiet) means none as well.
func (c *ctx) progressFlags(fs *flag.FlagSet) func() (progressMode, error) {
	mode := fs.String("progress", string(progressAuto), "progress on stderr: `auto|bar|log|none` (auto: a bar on a "+
		"terminal, nothing otherwise; log: a plain line every 10% or 5s, for CI logs)")
	none := fs.Bool("no-progress", false, "same as --progress=none")
	quiet := fs.Bool("quiet", false, "same as --progress=none")
	return func() (progressMode, error) {
		m := progressMode(*mode)
		switch m {
		case progressAuto, progressDrawn, progressLog, progressNone:
		default:
			return "", fmt.Errorf("--progress must be auto, bar, log or none, not %q", *mode)
		}
		if *none || *quiet || c.quiet {
			m = progressNone
		}
		return m, nil
	}
}

// progressReporter draws or logs a command's progress; a nil one does nothing.
type progressReporter interface {
	update(done, total uint64) error
	finish()
}

// newProgress returns the reporter for a mode, writing to w (the command's stderr), or nil.
func newProgress(mode progressMode, w io.Writer, label string) progressReporter {
	switch mode {
	case progressAuto:
		if b := newProgressBar(w, label); b != nil {
			return b
		}
	case progressDrawn:
		return &progressBar{w: w, label: label, start: time.Now()}
	case progressLog:
		return &progressLogger{w: w, label: label, start: time.Now(), every: 5 * time.Second, step: 10}
	}
	return nil
}

// reportTo returns the callback that feeds r (nil for no reporter, so that the library skips the calls).
func reportTo(r progressReporter) func(done, total uint64) error {
	if r == nil {
		return nil
	}
	return r.update
}

// progressLogger prints "label: 40% (16.0 MiB / 40.0 MiB, 80.1 MiB/s)" lines: the first report, then whenever
// another `step` percent is done or `every` has passed with progress, and the end.
type progressLogger struct {
	w        io.Writer
	label    string
	every    time.Duration
	step     uint64 // percent
	mu       sync.Mutex
	start    time.Time
	lastTime time.Time
	lastPct  uint64
	lastDone uint64
	lines    int
	ended    bool
}

func (l *progressLogger) update(done, total uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	pct := uint64(100)
	if total > 0 {
		pct = uint64(float64(done) * 100 / float64(total))
	}
	now := time.Now()
	end := done >= total
	switch {
	case l.ended:
		return nil
	case l.lines == 0, end, pct >= l.lastPct+l.step, now.Sub(l.lastTime) >= l.every && done > l.lastDone:
	default:
		return nil
	}
	rate := ""
	if s := now.Sub(l.start).Seconds(); s > 0 && done > 0 {
		rate = ", " + humanBytes(uint64(float64(done)/s)) + "/s"
	}
	fmt.Fprintf(l.w, "%s: %d%% (%s / %s%s)\n", l.label, pct, humanBytes(done), humanBytes(total), rate)
	l.lines++
	l.lastTime, l.lastPct, l.lastDone, l.ended = now, pct, done, end
	return nil
}

func (l *progressLogger) finish() {}

// isTerminal reports whether w is a terminal (only an *os.File can be).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	var t syscall.Termios
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCGETS, uintptr(unsafe.Pointer(&t)))
	return errno == 0
}

// progressBar draws "label [=====>    ]  45%  12.3 MiB / 27.0 MiB  80.1 MiB/s" on one terminal line, at most ten
// times a second.
type progressBar struct {
	w     io.Writer
	label string
	mu    sync.Mutex
	start time.Time
	drawn time.Time
}

// newProgressBar returns nil unless w is a terminal.
func newProgressBar(w io.Writer, label string) *progressBar {
	if !isTerminal(w) {
		return nil
	}
	return &progressBar{w: w, label: label, start: time.Now()}
}

func (b *progressBar) update(done, total uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if now.Sub(b.drawn) < 100*time.Millisecond && done < total {
		return nil
	}
	b.drawn = now
	fmt.Fprint(b.w, "\r\x1b[K"+renderBar(b.label, done, total, now.Sub(b.start)))
	return nil
}

// finish clears the bar's line.
func (b *progressBar) finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	fmt.Fprint(b.w, "\r\x1b[K")
}

func renderBar(label string, done, total uint64, elapsed time.Duration) string {
	const width = 30
	frac := 1.0
	if total > 0 {
		frac = float64(done) / float64(total)
	}
	if frac > 1 {
		frac = 1
	}
	fill := int(frac * width)
	bar := strings.Repeat("=", fill)
	if fill < width {
		bar += ">" + strings.Repeat(" ", width-fill-1)
	}
	rate := ""
	if s := elapsed.Seconds(); s > 0 {
		rate = "  " + humanBytes(uint64(float64(done)/s)) + "/s"
	}
	return fmt.Sprintf("%s [%s] %3.0f%%  %s / %s%s", label, bar, frac*100, humanBytes(done), humanBytes(total), rate)
}
