package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

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
// times a second. A nil *progressBar draws nothing, so callers need not check whether the output is a terminal.
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
	if b == nil {
		return nil
	}
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
	if b == nil {
		return
	}
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
