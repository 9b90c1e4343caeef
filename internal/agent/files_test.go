package agent

import (
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"
)

// TestAsTarget: errors about a write's temporary file name the file asked
// for instead.
func TestAsTarget(t *testing.T) {
	const target = "/home/user/report.csv"
	for _, err := range []error{
		&fs.PathError{Op: "write", Path: "/home/user/.space-write-123", Err: syscall.ENOSPC},
		&os.LinkError{Op: "rename", Old: "/home/user/.space-write-123", New: target, Err: syscall.EXDEV},
		&fs.PathError{Op: "open", Path: "/home/user/.space-write-*", Err: syscall.EACCES},
		syscall.EROFS,
	} {
		got := osError(asTarget(err, target)).Error()
		if strings.Contains(got, tempPrefix) || !strings.Contains(got, target) {
			t.Errorf("%v → %q", err, got)
		}
	}
	other := &fs.PathError{Op: "mkdir", Path: "/home/user/dir", Err: syscall.EACCES}
	if got := asTarget(other, target); got != error(other) {
		t.Errorf("an error about another path was changed: %v", got)
	}
}
