package agent

import (
	"bytes"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
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

// TestCopySparse: whole blocks of zeros become holes (the file takes less
// disk than its size), everything reads back the same, and a file ending in
// a hole keeps its size.
func TestCopySparse(t *testing.T) {
	data := make([]byte, 0, 6*sparseBlock+100)
	data = append(data, make([]byte, 2*sparseBlock)...)     // hole
	data = append(data, bytes.Repeat([]byte("x"), 1000)...) // data in a block
	data = append(data, make([]byte, sparseBlock-1000)...)  // same block: written
	data = append(data, make([]byte, 3*sparseBlock+100)...) // holes, then a short zero tail (written)
	for _, tail := range []int{0, 100} {
		d := data[:len(data)-100+tail]
		f, err := os.CreateTemp(t.TempDir(), "sparse")
		if err != nil {
			t.Fatal(err)
		}
		n, err := copySparse(f, iotest.OneByteReader(bytes.NewReader(d)))
		if err != nil || n != int64(len(d)) {
			t.Fatalf("copySparse = %d, %v; want %d", n, err, len(d))
		}
		f.Close()
		got, _ := os.ReadFile(f.Name())
		if !bytes.Equal(got, d) {
			t.Fatalf("read back %d bytes, not the %d written", len(got), len(d))
		}
		var st syscall.Stat_t
		syscall.Stat(f.Name(), &st)
		if st.Blocks*512 >= int64(len(d))/2 {
			t.Errorf("tail %d: %d bytes on disk for a %d-byte file of mostly zeros", tail, st.Blocks*512, len(d))
		}
	}
}

// TestCopySparseKeepsReadErrors: a source that ends early with an error
// (a body cut short of its length reads as io.ErrUnexpectedEOF) fails the
// copy; only io.EOF ends it.
func TestCopySparseKeepsReadErrors(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "short")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src := io.MultiReader(strings.NewReader("0123456789"), iotest.ErrReader(io.ErrUnexpectedEOF))
	if _, err := copySparse(f, src); err != io.ErrUnexpectedEOF {
		t.Errorf("copySparse of a short body = %v, want io.ErrUnexpectedEOF", err)
	}
}
