package snapshot

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/errdefs"
)

// TestScopedDedup: a Put dedups only within its scope. Team B storing a
// file identical to one of team A's pays exactly what team A paid (what a
// never-seen file costs), not 0; within one team the second copy is free;
// shared-scope data (a template) is addressed by plain SHA-256 and a team's
// upper merges over it and reads back whole. Scoped snapshots survive a
// reopen (the master key is kept, 0600); another store's key gives other
// addresses.
func TestScopedDedup(t *testing.T) {
	root := filepath.Join(t.TempDir(), "store")
	s, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	secret := randBytes(1, 300<<10) // two chunks: one hashed aside, one in place
	secret = append(secret, randBytes(2, 2<<20)...)
	tarOf := func(data []byte) []byte { return mkTar(t, dir("home"), file("home/pin.txt", data)) }

	a := mustPutTar(t, s, "a1", tarOf(secret), Meta{Scope: "team/a"})
	b := mustPutTar(t, s, "b1", tarOf(secret), Meta{Scope: "team/b"})
	if a.BytesNew == 0 || b.BytesNew != a.BytesNew {
		t.Errorf("team b storing team a's file: bytes_new %d, team a paid %d (want equal: no cross-team dedup)", b.BytesNew, a.BytesNew)
	}
	if b2 := mustPutTar(t, s, "b2", tarOf(secret), Meta{Scope: "team/b"}); b2.BytesNew != 0 {
		t.Errorf("team b storing its own file again: bytes_new %d, want 0", b2.BytesNew)
	}
	ea, _ := a.Lookup("home/pin.txt")
	eb, _ := b.Lookup("home/pin.txt")
	if len(ea.Chunks) < 2 || len(ea.Chunks) != len(eb.Chunks) {
		t.Fatalf("chunks: %d and %d", len(ea.Chunks), len(eb.Chunks))
	}
	for i := range ea.Chunks {
		ca, cb := ea.Chunks[i], eb.Chunks[i]
		if ca.Digest == cb.Digest || ca.Scope != "team/a" || cb.Scope != "team/b" {
			t.Errorf("chunk %d: %+v and %+v", i, ca, cb)
		}
	}
	var off int64
	for _, c := range ea.Chunks {
		sum := sha256.Sum256(secret[off : off+c.Size])
		if c.Digest == hex.EncodeToString(sum[:]) {
			t.Errorf("a scoped chunk is addressed by its plain SHA-256")
		}
		off += c.Size
	}

	// The shared scope: plain SHA-256, and a team's layer over it.
	base := mustPutTar(t, s, "tpl", mkTar(t, dir("etc"), file("etc/os", []byte("debian"))), Meta{})
	eo, _ := base.Lookup("etc/os")
	if sum := sha256.Sum256([]byte("debian")); eo.Chunks[0].Digest != hex.EncodeToString(sum[:]) || eo.Chunks[0].Scope != SharedScope {
		t.Errorf("shared chunk %+v", eo.Chunks[0])
	}
	view := Merge(base, a)
	for p, want := range map[string][]byte{"etc/os": []byte("debian"), "home/pin.txt": secret} {
		rc, _, err := s.ReadFile(t.Context(), view, p)
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, rc); !bytes.Equal(got, want) {
			t.Errorf("%s through the merged view: %d bytes", p, len(got))
		}
	}
	if err := s.Verify(t.Context(), "a1"); err != nil {
		t.Errorf("verify a scoped snapshot: %v", err)
	}

	// The key persists; a reopened store reads scoped chunks.
	s.Close()
	if fi, err := os.Stat(filepath.Join(root, keyName)); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != keySize {
		t.Errorf("master key file: %v %v", fi, err)
	}
	s, err = New(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Verify(t.Context(), "b1"); err != nil {
		t.Errorf("verify after reopen: %v", err)
	}
	if m := mustPutTar(t, s, "a2", tarOf(secret), Meta{Scope: "team/a"}); m.BytesNew != 0 {
		t.Errorf("after reopen, team a's own file again: bytes_new %d", m.BytesNew)
	}

	// Another store (another key): other addresses for the same scope.
	other := newStore(t)
	oa := mustPutTar(t, other, "a1", tarOf(secret), Meta{Scope: "team/a"})
	if e, _ := oa.Lookup("home/pin.txt"); e.Chunks[0].Digest == ea.Chunks[0].Digest {
		t.Error("two stores' keys give the same scoped address")
	}

	// A chunk read under the wrong scope fails verification.
	wrong := ea.Chunks[0]
	wrong.Scope = "team/b"
	if _, err := s.chunk(wrong, nil); !errors.Is(err, ErrCorrupt) {
		t.Errorf("chunk read under another scope: %v", err)
	}
	if _, err := s.PutTar(t.Context(), "bad", bytes.NewReader(tarOf([]byte("x"))), Meta{Scope: "a\nb"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a scope with a control character: %v", err)
	}
	if _, err := s.PutTar(t.Context(), "bad", bytes.NewReader(tarOf([]byte("x"))), Meta{Scope: strings.Repeat("x", maxScopeLen+1)}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a long scope: %v", err)
	}
}

// TestVersion1ManifestReadsShared: a manifest written before scopes (version
// 1, no scope on its chunks) reads as shared-scope data.
func TestVersion1ManifestReadsShared(t *testing.T) {
	s := newStore(t)
	data := randBytes(3, 100<<10)
	mustPutTar(t, s, "old", mkTar(t, file("f", data)), Meta{})
	p := s.manifestPath("old")
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(`"scope"`)) {
		t.Fatalf("a shared manifest names a scope: %s", raw)
	}
	raw = bytes.Replace(raw, []byte(`"version":2`), []byte(`"version":1`), 1)
	if err := os.WriteFile(p, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	s.cache.drop("old")
	m, err := s.Open("old")
	if err != nil || m.Version != 1 {
		t.Fatalf("open version 1: %v %+v", err, m)
	}
	rc, _, err := s.ReadFile(t.Context(), m, "f")
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, rc); !bytes.Equal(got, data) {
		t.Errorf("version-1 file read back %d bytes", len(got))
	}
}
