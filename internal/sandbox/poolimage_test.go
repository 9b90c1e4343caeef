package sandbox

import (
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/store"
)

// TestPoolImageCheck: an image is used only when it is complete and of the
// pool's shape, template digest and agent binary; anything else makes the
// pool rebuild it (checkPoolImage fails).
func TestPoolImageCheck(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(dir, "space-agent")
	os.WriteFile(agent, []byte("agent v1"), 0o755)
	svc := New(Config{DataDir: dir, AgentPath: agent}, nil, nil, slog.New(slog.DiscardHandler), nil)
	k := shape{digest: "sha256:0123456789abcdef0123", driver: "qemu", cpu: 1, memoryMB: 256}
	p := &pool{s: svc, shape: k, tpl: store.Template{Name: "base", Digest: k.digest}, img: svc.newPoolImage(k)}
	if want := filepath.Join(dir, "pool-images", "qemu-0123456789abcdef-1c-256m-1"); p.img.dir != want {
		t.Errorf("image dir %s, want %s", p.img.dir, want)
	}
	// A later pool of the same shape (one replaced retires in the
	// background) has an image of its own.
	if next := svc.newPoolImage(k); next.dir == p.img.dir {
		t.Errorf("two pools of one shape share the image dir %s", next.dir)
	}
	if err := svc.checkPoolImage(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no image: %v", err)
	}
	// A complete image, as buildPoolImage leaves it.
	os.MkdirAll(p.img.dir, 0o700)
	os.WriteFile(filepath.Join(p.img.dir, "memory"), []byte("0123456789"), 0o600)
	meta, err := svc.poolImageMeta(p)
	if err != nil {
		t.Fatal(err)
	}
	meta.Files = map[string]int64{"memory": 10}
	write := func(m poolImageMeta) {
		b, _ := json.Marshal(m)
		os.WriteFile(filepath.Join(p.img.dir, poolImageMetaFile), b, 0o600)
	}
	write(meta)
	if err := svc.checkPoolImage(p); err != nil {
		t.Fatalf("complete image: %v", err)
	}
	for _, tc := range []struct {
		name        string
		spoil, undo func()
		want        string
	}{
		{"truncated file", func() { os.Truncate(filepath.Join(p.img.dir, "memory"), 4) }, func() { os.WriteFile(filepath.Join(p.img.dir, "memory"), []byte("0123456789"), 0o600) }, "missing or changed"},
		{"new template digest", func() { p.tpl.Digest, p.shape.digest = "sha256:ffff", "sha256:ffff" }, func() { p.tpl.Digest, p.shape.digest = k.digest, k.digest }, "another shape or template"},
		{"other memory size", func() { p.shape.memoryMB = 512 }, func() { p.shape.memoryMB = 256 }, "another shape or template"},
		{"new agent binary", func() { os.Chtimes(agent, time.Now(), time.Now().Add(time.Hour)) }, func() { os.Chtimes(agent, time.Now(), meta.Agent.ModTime) }, "agent binary changed"},
		{"corrupt image.json", func() { os.WriteFile(filepath.Join(p.img.dir, poolImageMetaFile), []byte("{"), 0o600) }, func() { write(meta) }, "image.json"},
	} {
		tc.spoil()
		if err := svc.checkPoolImage(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
		tc.undo()
		if err := svc.checkPoolImage(p); err != nil {
			t.Errorf("after undoing %s: %v", tc.name, err)
		}
	}
}
