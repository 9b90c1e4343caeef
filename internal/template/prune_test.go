package template

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeBuild puts a complete build of digest in b's cache, built at.
func fakeBuild(t *testing.T, b *Builder, digest string, at time.Time) {
	t.Helper()
	dir := filepath.Join(b.dir, digest)
	if err := os.MkdirAll(filepath.Join(dir, rootfsDir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(Template{Name: "x", Digest: digest, Kind: KindDir, BuiltAt: at})
	if err := os.WriteFile(filepath.Join(dir, metadataFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Prune removes the builds nobody keeps or touched lately, leaves the
// ones kept, touched within the idle time, or being built (their lock
// held), and finishes an interrupted prune.
func TestPrune(t *testing.T) {
	b, err := NewBuilder(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	old := now.Add(-30 * 24 * time.Hour)
	d := func(c string) string { return strings.Repeat(c, 64) }
	kept, touched, stale, building, fresh := d("a"), d("b"), d("c"), d("d"), d("e")
	for _, x := range []string{kept, touched, stale, building} {
		fakeBuild(t, b, x, old)
	}
	fakeBuild(t, b, fresh, now.Add(-time.Hour)) // built lately, never touched
	if err := b.Touch(touched); err != nil {
		t.Fatal(err)
	}
	if err := b.Touch(stale); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(filepath.Join(b.dir, stale+stampSuffix), old, old) // touched long ago
	unlock, err := lockFile(context.Background(), filepath.Join(b.dir, building+".lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if err := os.MkdirAll(filepath.Join(b.dir, pruneTmpPrefix+d("f"), "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	removed, err := b.Prune(func(x string) bool { return x == kept }, 8*24*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{stale}) {
		t.Fatalf("removed %v, want only the stale build", removed)
	}
	for _, x := range []string{kept, touched, building, fresh} {
		if _, err := b.Lookup(x); err != nil {
			t.Errorf("%s… gone: %v", x[:4], err)
		}
	}
	if _, err := os.Stat(filepath.Join(b.dir, stale)); !os.IsNotExist(err) {
		t.Errorf("the stale build is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(b.dir, stale+stampSuffix)); !os.IsNotExist(err) {
		t.Errorf("the stale build's stamp is still there: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(b.dir, pruneTmpPrefix+"*")); len(left) > 0 {
		t.Errorf("leftovers of an interrupted prune: %v", left)
	}
}
