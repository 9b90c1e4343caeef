package agent

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

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
}
