package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/template"
)

// The template cache keeps every build a record needs (a template, a
// sandbox not stopped, a snapshot) and the built-in recipes', and removes
// the rest once nobody touched them for templateIdle, with their VM root
// images; root images whose build is gone go too.
func TestPruneTemplatesKeepsWhatRecordsNeed(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cache := filepath.Join(dir, "cache")
	b, err := template.NewBuilder(filepath.Join(cache, "templates"))
	if err != nil {
		t.Fatal(err)
	}
	vmCache := filepath.Join(cache, "vm")
	old := time.Now().Add(-30 * 24 * time.Hour)
	d := func(c string) string { return strings.Repeat(c, 64) }
	tpl, running, stopped, snap, unused, imageOnly := d("a"), d("b"), d("c"), d("d"), d("e"), d("f")
	base, _ := template.Builtin("base")
	for _, x := range []string{tpl, running, stopped, snap, unused, base.Digest()} {
		p := filepath.Join(b.Dir(), x)
		os.MkdirAll(filepath.Join(p, "rootfs", "bin"), 0o755)
		data, _ := json.Marshal(template.Template{Name: "x", Digest: x, Kind: template.KindDir, BuiltAt: old})
		if err := os.WriteFile(filepath.Join(p, "template.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(filepath.Join(vmCache, "root"), 0o755)
	for _, x := range []string{running, unused, imageOnly} {
		img := filepath.Join(vmCache, "root", x+".r1.ext4")
		os.WriteFile(img, []byte("image"), 0o644)
		os.Chtimes(img, old, old)
	}
	if err := st.PutTemplate(ctx, store.Template{Name: "base", Digest: tpl, Status: store.TemplateReady}); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for id, s := range map[string]struct{ digest, state string }{"sb-run": {running, "running"}, "sb-stop": {stopped, "stopped"}} {
		if err := st.CreateSandbox(ctx, store.Sandbox{ID: id, Team: "t", Template: "base", TemplateDigest: s.digest, Driver: "gvisor", State: s.state, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CreateSnapshot(ctx, store.Snapshot{ID: "sn-1", SandboxID: "sb-stop", Team: "t", Kind: "files", Template: "base", TemplateDigest: snap, Status: "ready", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := pruneTemplatesOnce(ctx, st, b, vmCache, time.Now(), log); err != nil {
		t.Fatal(err)
	}
	for _, x := range []string{tpl, running, snap, base.Digest()} {
		if _, err := b.Lookup(x); err != nil {
			t.Errorf("build %s… a record needs was removed: %v", x[:4], err)
		}
	}
	for _, x := range []string{stopped, unused} {
		if _, err := b.Lookup(x); err == nil {
			t.Errorf("build %s… nobody needs is still there", x[:4])
		}
	}
	if _, err := os.Stat(filepath.Join(vmCache, "root", running+".r1.ext4")); err != nil {
		t.Errorf("the running sandbox's root image was removed: %v", err)
	}
	for _, x := range []string{unused, imageOnly} {
		if _, err := os.Stat(filepath.Join(vmCache, "root", x+".r1.ext4")); !os.IsNotExist(err) {
			t.Errorf("root image %s… nobody needs is still there: %v", x[:4], err)
		}
	}
	// The builds this server needs were touched: another server sharing
	// the cache, which needs none of them, keeps them for templateIdle.
	st2, err := store.Open(ctx, filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if err := pruneTemplatesOnce(ctx, st2, b, vmCache, time.Now(), log); err != nil {
		t.Fatal(err)
	}
	for _, x := range []string{tpl, running, snap} {
		if _, err := b.Lookup(x); err != nil {
			t.Errorf("another server removed build %s… this one touched: %v", x[:4], err)
		}
	}
}
