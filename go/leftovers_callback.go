package distckpt

// The callback libdistckpt calls for each leftover ScanLeftovers is told about (dckpt_leftover_fn, set up in
// leftovers.go). The strings are the library's, valid during the call only: they are copied.

/*
#include <stdint.h>
#include <distckpt/distckpt.h>
*/
import "C"

import (
	"runtime/cgo"
	"time"
)

//export distckptGoLeftover
func distckptGoLeftover(info *C.dckpt_leftover_info, h C.uintptr_t) C.int {
	scan := cgo.Handle(h).Value().(*leftoverScan)
	l := Leftover{
		Path:       C.GoString(info.path),
		Name:       C.GoString(info.name),
		FinalName:  C.GoString(info.final_name),
		Kind:       LeftoverKind(info.kind),
		Bytes:      uint64(info.bytes),
		Idle:       time.Duration(float64(info.idle_seconds) * float64(time.Second)),
		Writer:     WriterState(info.writer),
		WriterPID:  int64(info.writer_pid),
		WriterHost: C.GoString(info.writer_host),
		Garbage:    info.garbage != 0,
		Reason:     C.GoString(info.reason),
	}
	if l.WriterPID <= 0 {
		l.WriterPID = -1
	}
	if t, err := time.Parse("2006-01-02T15:04:05Z", C.GoString(info.writer_started_utc)); err == nil {
		l.WriterStarted = t
	}
	scan.found = append(scan.found, l)
	return 0
}
