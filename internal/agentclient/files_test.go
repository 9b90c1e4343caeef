package agentclient_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/spacesandbox/space/internal/agent"
	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

func readAll(t *testing.T, h *harness, path string) []byte {
	t.Helper()
	rc, size, err := h.c.ReadFile(t.Context(), path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	if size != int64(len(b)) {
		t.Fatalf("size %d, read %d", size, len(b))
	}
	return b
}

func TestFiles(t *testing.T) {
	h := newHarness(t, agent.Options{})
	ctx := t.Context()

	t.Run("one-byte", func(t *testing.T) {
		info, err := h.c.WriteFile(ctx, "one", strings.NewReader("x"), 0, "")
		if err != nil {
			t.Fatal(err)
		}
		if info.Path != filepath.Join(h.home, "one") || info.Size != 1 || info.Type != "file" || info.Mode != 0o644 {
			t.Fatalf("info %+v", info)
		}
		if got := readAll(t, h, filepath.Join(h.home, "one")); string(got) != "x" {
			t.Fatalf("got %q", got)
		}
	})
	t.Run("large", func(t *testing.T) {
		data := make([]byte, 20<<20)
		rand.Read(data)
		// A plain io.Reader (no length) is streamed chunked.
		info, err := h.c.WriteFile(ctx, "/"+filepath.Join(h.home, "big", "data.bin")[1:], io.MultiReader(bytes.NewReader(data)), 0o600, "")
		if err != nil {
			t.Fatal(err)
		}
		if info.Size != int64(len(data)) || info.Mode != 0o600 {
			t.Fatalf("info %+v", info)
		}
		if got := readAll(t, h, info.Path); !bytes.Equal(got, data) {
			t.Fatal("20 MB round trip differs")
		}
	})
	t.Run("nested-unicode", func(t *testing.T) {
		p := filepath.Join(h.home, "a", "b", "c", "ünïcødé 文件.txt")
		info, err := h.c.WriteFile(ctx, p, strings.NewReader("héllo"), 0, "")
		if err != nil {
			t.Fatal(err)
		}
		if info.Name != "ünïcødé 文件.txt" {
			t.Fatalf("name %q", info.Name)
		}
		if got := readAll(t, h, p); string(got) != "héllo" {
			t.Fatalf("got %q", got)
		}
		st, err := h.c.Stat(ctx, filepath.Join(h.home, "a", "b"))
		if err != nil || st.Type != "dir" {
			t.Fatalf("stat %+v %v", st, err)
		}
	})
	t.Run("list-depth", func(t *testing.T) {
		root := filepath.Join(h.home, "tree")
		for _, p := range []string{"f1", "d1/f2", "d1/d2/f3", "d1/d2/d3/f4"} {
			if _, err := h.c.WriteFile(ctx, filepath.Join(root, p), strings.NewReader(p), 0, ""); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(filepath.Join(root, "d1"), filepath.Join(root, "link")); err != nil {
			t.Fatal(err)
		}
		paths := func(depth int) []string {
			list, err := h.c.List(ctx, root, depth)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, fi := range list {
				out = append(out, strings.TrimPrefix(fi.Path, root+"/")+":"+fi.Type)
			}
			slices.Sort(out)
			return out
		}
		if got, want := paths(1), []string{"d1:dir", "f1:file", "link:symlink"}; !slices.Equal(got, want) {
			t.Fatalf("depth 1: %v", got)
		}
		if got, want := paths(2), []string{"d1/d2:dir", "d1/f2:file", "d1:dir", "f1:file", "link:symlink"}; !slices.Equal(got, want) {
			t.Fatalf("depth 2: %v", got)
		}
		if got := paths(10); len(got) != 8 {
			t.Fatalf("depth 10: %v", got)
		}
		if _, err := h.c.List(ctx, filepath.Join(root, "f1"), 1); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("list a file: %v", err)
		}
	})
	t.Run("mkdir-move-remove", func(t *testing.T) {
		d, err := h.c.Mkdir(ctx, "m/n/o", "")
		if err != nil || d.Type != "dir" {
			t.Fatalf("mkdir %+v %v", d, err)
		}
		if _, err := h.c.Mkdir(ctx, "m/n/o", ""); err != nil {
			t.Fatalf("mkdir again: %v", err)
		}
		if _, err := h.c.WriteFile(ctx, "m/file", strings.NewReader("1"), 0, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := h.c.Mkdir(ctx, "m/file", ""); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("mkdir over a file: %v", err)
		}
		mv, err := h.c.Move(ctx, "m/file", "moved/deep/file2", "")
		if err != nil || mv.Path != filepath.Join(h.home, "moved/deep/file2") {
			t.Fatalf("move %+v %v", mv, err)
		}
		if _, err := h.c.Stat(ctx, "m/file"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("stat moved-away: %v", err)
		}
		if err := h.c.Remove(ctx, "m", false); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("remove non-empty dir: %v", err)
		}
		if err := h.c.Remove(ctx, "m", true); err != nil {
			t.Fatal(err)
		}
		if err := h.c.Remove(ctx, "moved/deep/file2", false); err != nil {
			t.Fatal(err)
		}
		if err := h.c.Remove(ctx, "m", true); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("remove missing: %v", err)
		}
	})
	t.Run("errors", func(t *testing.T) {
		if _, _, err := h.c.ReadFile(ctx, "/no/such/file"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("read missing: %v", err)
		}
		if _, _, err := h.c.ReadFile(ctx, h.home); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("read dir: %v", err)
		}
		if _, err := h.c.Stat(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("stat missing: %v", err)
		}
		for _, p := range []string{"../etc/passwd", "/tmp/../etc/passwd", "a/..", "a\x00b", ""} {
			if _, err := h.c.Stat(ctx, p); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("stat %q: %v", p, err)
			}
			if _, err := h.c.WriteFile(ctx, p, strings.NewReader("x"), 0, ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("write %q: %v", p, err)
			}
		}
		if _, err := h.c.WriteFile(ctx, "x", strings.NewReader("x"), 0, "no-such-user-xyz"); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("unknown user: %v", err)
		}
	})
}

func TestWatch(t *testing.T) {
	h := newHarness(t, agent.Options{})
	dir := filepath.Join(h.home, "w")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ws, err := h.c.Watch(t.Context(), dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	events := make(chan agentproto.WatchEvent, 100)
	go func() {
		defer close(events)
		for {
			ev, err := ws.Next()
			if err != nil {
				return
			}
			events <- ev
		}
	}()
	expect := func(typ, path string) {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("stream ended waiting for %s %s", typ, path)
				}
				if ev.Type == typ && ev.Path == path {
					return
				}
			case <-timeout:
				t.Fatalf("no %s event for %s", typ, path)
			}
		}
	}
	f := filepath.Join(dir, "a.txt")
	if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	expect("create", f)
	expect("write", f)
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	// A file written right after its directory is reported, even when it
	// lands before the agent has the new directory's watch in place.
	g := filepath.Join(sub, "b.txt")
	if err := os.WriteFile(g, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	expect("create", sub)
	expect("create", g)
	// So is everything in a tree moved in whole (it existed before any
	// watch could see it being made).
	tree := filepath.Join(h.home, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "deep", "y.txt"), []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	moved := filepath.Join(dir, "tree")
	if err := os.Rename(tree, moved); err != nil {
		t.Fatal(err)
	}
	expect("create", moved)
	expect("create", filepath.Join(moved, "deep"))
	expect("create", filepath.Join(moved, "deep", "y.txt"))
	y := filepath.Join(moved, "deep", "y.txt")
	if err := os.WriteFile(y, []byte("yy"), 0o644); err != nil {
		t.Fatal(err)
	}
	expect("write", y) // and it is watched from then on
	if err := os.Rename(f, filepath.Join(dir, "c.txt")); err != nil {
		t.Fatal(err)
	}
	expect("rename", f)
	expect("create", filepath.Join(dir, "c.txt"))
	if err := os.Remove(filepath.Join(dir, "c.txt")); err != nil {
		t.Fatal(err)
	}
	expect("remove", filepath.Join(dir, "c.txt"))
	ws.Close()
	if _, err := h.c.Watch(t.Context(), filepath.Join(h.home, "missing"), false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("watch missing: %v", err)
	}
}

// Watches are bounded: a tree of more directories than one watch may hold
// is 413, and past the open watches a sandbox may have it is 503 until one
// ends (3,000 recursive watches of / kept an agent busy for 15 minutes).
func TestWatchLimits(t *testing.T) {
	h := newHarness(t, agent.Options{})
	big := filepath.Join(h.home, "big")
	for i := range 8200 {
		if err := os.MkdirAll(filepath.Join(big, fmt.Sprint(i/100), fmt.Sprint(i%100)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.c.Watch(t.Context(), big, true); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("a recursive watch of 8,283 directories: %v, want too large", err)
	}
	small := filepath.Join(h.home, "small")
	os.Mkdir(small, 0o755)
	var open []*agentclient.WatchStream
	defer func() {
		for _, ws := range open {
			ws.Close()
		}
	}()
	for i := range 64 {
		ws, err := h.c.Watch(t.Context(), small, false)
		if err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
		open = append(open, ws)
	}
	if _, err := h.c.Watch(t.Context(), small, false); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("watch 65: %v, want unavailable", err)
	}
	open[0].Close()
	open = open[1:]
	// The ended watch is released when the agent sees its stream close.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ws, err := h.c.Watch(t.Context(), small, false)
		if err == nil {
			open = append(open, ws)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a watch after one ended: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Reading something that is not a regular file is refused at once: a FIFO
// used to hold the request (and an agent thread) until a writer came.
func TestReadNotRegular(t *testing.T) {
	h := newHarness(t, agent.Options{})
	fifo := filepath.Join(h.home, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, p := range []string{fifo, "/dev/zero"} {
		rc, _, err := h.c.ReadFile(ctx, p)
		if err == nil {
			rc.Close()
		}
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("read %s: %v, want invalid_argument", p, err)
		}
	}
}

// TestWatchOwnWrites: a watch reports the agent's own atomic writes as what
// they do to the target, as envd's in-place writes are reported: a new
// file is a create and a write, a write over a file is a write of it (it
// was a create of it after the temporary file's create, write, chmod and
// rename, and never a write: watchers waiting for one waited for good).
// Nothing of the temporary file is reported.
func TestWatchOwnWrites(t *testing.T) {
	h := newHarness(t, agent.Options{})
	ctx := t.Context()
	dir := filepath.Join(h.home, "ow")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ws, err := h.c.Watch(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	// until returns the events up to the create of marker (made after the
	// writes, so everything they caused came before it).
	marks := 0
	until := func() []string {
		t.Helper()
		marks++
		marker := filepath.Join(dir, fmt.Sprintf("marker-%d", marks))
		if err := os.WriteFile(marker, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			ev, err := ws.Next()
			if err != nil {
				t.Fatalf("watch ended after %v: %v", got, err)
			}
			if ev.Path == marker {
				return got
			}
			got = append(got, ev.Type+" "+strings.TrimPrefix(ev.Path, dir+"/"))
		}
	}
	a := filepath.Join(dir, "a.txt")
	if _, err := h.c.WriteFile(ctx, a, strings.NewReader("1"), 0, ""); err != nil {
		t.Fatal(err)
	}
	if got := until(); !slices.Equal(got, []string{"create a.txt", "write a.txt"}) {
		t.Errorf("a new file written: %q, want create and write of a.txt", got)
	}
	if _, err := h.c.WriteFile(ctx, a, strings.NewReader("22"), 0, ""); err != nil {
		t.Fatal(err)
	}
	if got := until(); !slices.Equal(got, []string{"write a.txt"}) {
		t.Errorf("a write over a.txt: %q, want one write of a.txt", got)
	}
	// A write that fails (its body breaks off) leaves nothing to report.
	if _, err := h.c.WriteFile(ctx, a, io.MultiReader(strings.NewReader("partial"), iotest.ErrReader(errors.New("cut"))), 0, ""); err == nil {
		t.Fatal("a write whose body failed succeeded")
	}
	if got := until(); len(got) != 0 {
		t.Errorf("a failed write: %q, want no events", got)
	}
	// A rename of the caller's own is reported as before.
	if err := os.Rename(a, filepath.Join(dir, "b.txt")); err != nil {
		t.Fatal(err)
	}
	if got := until(); !slices.Equal(got, []string{"rename a.txt", "create b.txt"}) {
		t.Errorf("a rename: %q", got)
	}
}
