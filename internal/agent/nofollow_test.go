package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// TestRemoveNoFollow: a removal with nofollow never reaches through a
// symbolic link: not one in the path's directories (refused), not one at
// the path (the link goes, not its target), not one inside a removed tree
// (unlinked, not entered).
func TestRemoveNoFollow(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	mk := func(p string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk(filepath.Join(victim, "keep"))
	mk(filepath.Join(victim, "sub", "keep"))
	link := func(p string) {
		t.Helper()
		if err := os.Symlink(victim, p); err != nil {
			t.Fatal(err)
		}
	}
	link(filepath.Join(dir, "d"))
	mk(filepath.Join(dir, "tree", "a", "f"))
	link(filepath.Join(dir, "tree", "a", "l"))
	link(filepath.Join(dir, "tree", "l"))

	err := removeNoFollow(filepath.Join(dir, "d", "keep"), true)
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("remove under a link: %v, want it refused", err)
	}
	if err := removeNoFollow(filepath.Join(dir, "d", "sub"), true); err == nil {
		t.Error("remove of a tree under a link: no error")
	}
	if err := removeNoFollow(filepath.Join(dir, "d"), true); err != nil {
		t.Fatalf("remove a link: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "d")); !os.IsNotExist(err) {
		t.Errorf("the link is still there: %v", err)
	}
	if err := removeNoFollow(filepath.Join(dir, "tree"), true); err != nil {
		t.Fatalf("remove a tree holding links: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "tree")); !os.IsNotExist(err) {
		t.Errorf("the tree is still there: %v", err)
	}
	for _, p := range []string{"keep", "sub/keep"} {
		if _, err := os.Stat(filepath.Join(victim, p)); err != nil {
			t.Errorf("the link's target lost %s: %v", p, err)
		}
	}
	if err := removeNoFollow(filepath.Join(dir, "missing"), false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("remove of a missing path: %v, want not found", err)
	}
	mk(filepath.Join(dir, "full", "f"))
	if err := removeNoFollow(filepath.Join(dir, "full"), false); err == nil {
		t.Error("non-recursive remove of a directory with a file: no error")
	}

	// A FIFO where a directory should be: refused at once, not an open
	// waiting for a writer for good (with the restore holding the
	// sandbox's lifecycle lock).
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 3)
	go func() { done <- removeNoFollow(filepath.Join(fifo, "x"), true) }()
	go func() {
		done <- writeNoFollow(filepath.Join(fifo, "x"), strings.NewReader("x"), account{}, 0o644, false)
	}()
	go func() { _, err := openDirNoFollow(fifo, false, account{}); done <- err }()
	for range 3 {
		select {
		case err := <-done:
			if err == nil {
				t.Error("an operation through a FIFO succeeded")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("an operation through a FIFO hangs")
		}
	}
}

// TestUnixMode: a numeric mode keeps its setuid, setgid and sticky bits
// through a write (os.FileMode(0o4755) is 0755 to Chmod).
func TestUnixMode(t *testing.T) {
	dir := t.TempDir()
	for _, m := range []uint32{0o4755, 0o2750, 0o1777, 0o644} {
		p := filepath.Join(dir, fmt.Sprintf("f%o", m))
		if err := writeNoFollow(p, strings.NewReader("x"), account{uid: uint32(os.Getuid()), gid: uint32(os.Getgid())}, unixMode(m), false); err != nil {
			t.Fatal(err)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		if got := st.Mode & 0o7777; got != m {
			t.Errorf("mode %o written as %o", m, got)
		}
	}
}
