package snapshot

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/spacesandbox/space/internal/errdefs"
)

// chunkSet returns the digests m references.
func chunkSet(m *Manifest) map[string]bool {
	out := map[string]bool{}
	for _, e := range m.Entries {
		for _, c := range e.Chunks {
			out[c.Digest] = true
		}
	}
	return out
}

// storedChunks returns the digests present in the store.
func storedChunks(t *testing.T, s *Store) map[string]bool {
	out := map[string]bool{}
	subs, _ := os.ReadDir(filepath.Join(s.root, chunksDir))
	for _, sub := range subs {
		des, _ := os.ReadDir(filepath.Join(s.root, chunksDir, sub.Name()))
		for _, de := range des {
			if validDigest(de.Name()) {
				out[de.Name()] = true
			}
		}
	}
	return out
}

func TestVerifyDetectsCorruption(t *testing.T) {
	s := newStore(t)
	data := randBytes(5, 3<<20)
	m := mustPutTar(t, s, "v", mkTar(t, file("a", data), file("b", []byte("small"))), Meta{})
	if err := s.Verify(t.Context(), "v"); err != nil {
		t.Fatalf("Verify clean snapshot: %v", err)
	}
	if err := s.Verify(t.Context(), "missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Verify missing: %v", err)
	}

	// Flip one byte of the chunk's content, re-compressed so only the
	// digest check can notice.
	c := m.Entries[0].Chunks[0]
	p := s.chunkPath(c.Digest)
	raw := slicesClone(data[:c.Size])
	raw[len(raw)/2] ^= 0x01
	enc, _ := zstd.NewWriter(nil)
	if err := os.WriteFile(p, enc.EncodeAll(raw, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	err := s.Verify(t.Context(), "v")
	var ce *CorruptError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || !errors.Is(err, errdefs.ErrInternal) {
		t.Fatalf("Verify after flip: %v", err)
	}
	if len(ce.Bad) != 1 || ce.Bad[0].Digest != c.Digest || ce.Bad[0].Paths[0] != "a" {
		t.Errorf("bad chunks = %+v", ce.Bad)
	}
	// Reading the file fails too, rather than returning wrong bytes.
	r, _, err := s.ReadFile(t.Context(), m, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readAllErr(r); !errors.Is(err, ErrCorrupt) {
		t.Errorf("read of corrupt file: %v", err)
	}

	// A flipped byte in the compressed file, and a missing chunk.
	comp, _ := os.ReadFile(p)
	comp[len(comp)/2] ^= 0x80
	os.WriteFile(p, comp, 0o600)
	if err := s.Verify(t.Context(), "v"); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Verify after compressed flip: %v", err)
	}
	os.Remove(p)
	if err := s.Verify(t.Context(), "v"); !errors.As(err, &ce) || len(ce.Bad) != 1 {
		t.Errorf("Verify after removal: %v", err)
	}
}

func slicesClone(b []byte) []byte { return append([]byte(nil), b...) }

func readAllErr(r interface{ Read([]byte) (int, error) }) ([]byte, error) {
	var buf bytes.Buffer
	_, err := buf.ReadFrom(r)
	return buf.Bytes(), err
}

func TestGC(t *testing.T) {
	s := newStore(t)
	shared := randBytes(1, 2<<20)
	a := mustPutTar(t, s, "a", mkTar(t, file("shared", shared), file("only-a", randBytes(2, 1<<20))), Meta{})
	b := mustPutTar(t, s, "b", mkTar(t, file("shared", shared), file("only-b", randBytes(3, 1<<20))), Meta{})
	ca, cb := chunkSet(a), chunkSet(b)

	st, err := s.GC(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.ChunksRemoved != 0 || st.Manifests != 2 || st.ChunksKept != len(storedChunks(t, s)) {
		t.Errorf("GC with everything referenced: %+v", st)
	}

	if err := s.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second Delete: %v", err)
	}
	st, err = s.GC(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	onlyA := 0
	for d := range ca {
		if !cb[d] {
			onlyA++
		}
	}
	if st.ChunksRemoved != onlyA || st.ChunksKept != len(cb) || st.BytesFreed <= 1<<20 {
		t.Errorf("GC after Delete(a): %+v; want %d removed, %d kept", st, onlyA, len(cb))
	}
	stored := storedChunks(t, s)
	if len(stored) != len(cb) {
		t.Errorf("stored %d chunks, want exactly b's %d", len(stored), len(cb))
	}
	for d := range cb {
		if !stored[d] {
			t.Errorf("GC removed referenced chunk %s", d)
		}
	}
	if err := s.Verify(t.Context(), "b"); err != nil {
		t.Errorf("Verify b after GC: %v", err)
	}

	// A manifest GC cannot read stops it before it removes anything.
	s.Delete("b")
	os.WriteFile(s.manifestPath("broken"), []byte("{not json"), 0o600)
	if _, err := s.GC(t.Context()); err == nil {
		t.Error("GC with an unreadable manifest succeeded")
	}
	if len(storedChunks(t, s)) != len(cb) {
		t.Error("GC removed chunks despite an unreadable manifest")
	}
}

// TestCrashLeavesNoSnapshot simulates a crash between writing chunks and
// committing the manifest, plus temp files left mid-write.
func TestCrashLeavesNoSnapshot(t *testing.T) {
	now := time.Now()
	s := newStore(t, WithClock(func() time.Time { return now }))
	good := mustPutTar(t, s, "good", mkTar(t, file("f", randBytes(1, 1<<20))), Meta{})

	crash := errors.New("crash")
	s.beforeCommit = func(string) error { return crash }
	if _, err := s.PutTar(t.Context(), "partial", bytes.NewReader(mkTar(t, file("g", randBytes(2, 3<<20)))), Meta{}); !errors.Is(err, crash) {
		t.Fatalf("PutTar with crash: %v", err)
	}
	s.beforeCommit = nil
	// Temp files as a crash mid-write leaves them: a complete manifest
	// that was never renamed, and a chunk.
	fullManifest, _ := os.ReadFile(s.manifestPath("good"))
	tmpManifest := filepath.Join(s.root, manifestsDir, ".partial2.json.123.tmp")
	os.WriteFile(tmpManifest, bytes.ReplaceAll(fullManifest, []byte(`"good"`), []byte(`"partial2"`)), 0o600)
	tmpChunk := filepath.Join(s.root, chunksDir, "ab", ".abcd.456.tmp")
	os.MkdirAll(filepath.Dir(tmpChunk), 0o700)
	os.WriteFile(tmpChunk, []byte("half a chunk"), 0o600)

	for _, id := range []string{"partial", "partial2"} {
		if _, err := s.Open(id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Open %s: %v", id, err)
		}
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].ID != "good" {
		t.Errorf("List = %+v, %v", list, err)
	}
	if err := s.Verify(t.Context(), "good"); err != nil {
		t.Errorf("Verify good: %v", err)
	}

	// Fresh temp files survive GC (a writer may own them); the partial
	// snapshot's chunks do not.
	st, err := s.GC(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.ChunksRemoved == 0 || st.TempsRemoved != 0 || st.ChunksKept != len(chunkSet(good)) {
		t.Errorf("GC = %+v", st)
	}
	now = now.Add(2 * time.Hour)
	if st, err = s.GC(t.Context()); err != nil || st.TempsRemoved != 2 {
		t.Errorf("GC 2h later = %+v, %v", st, err)
	}
	for _, p := range []string{tmpManifest, tmpChunk} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s not removed", p)
		}
	}
	if err := s.Verify(t.Context(), "good"); err != nil {
		t.Errorf("Verify good after GC: %v", err)
	}
	// The id is free to be used now.
	mustPutTar(t, s, "partial", mkTar(t, file("g", []byte("x"))), Meta{})
}

func TestStoreLock(t *testing.T) {
	root := filepath.Join(t.TempDir(), "s")
	s, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(root); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("second New: %v", err)
	}
	s.Close()
	s2, err := New(root)
	if err != nil {
		t.Fatalf("New after Close: %v", err)
	}
	s2.Close()
}

// TestGCConcurrentWithPut: snapshots taken while GC runs keep their chunks.
func TestGCConcurrentWithPut(t *testing.T) {
	s := newStore(t)
	shared := randBytes(9, 2<<20)
	mustPutTar(t, s, "seed", mkTar(t, file("f", shared)), Meta{})
	s.Delete("seed") // its chunks are garbage now, but Puts below reuse them
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			src := mkTar(t, file("f", shared), file("g", randBytes(uint64(20+i), 300<<10)))
			if _, err := s.PutTar(t.Context(), "p"+string(rune('0'+i)), bytes.NewReader(src), Meta{}); err != nil {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			if _, err := s.GC(t.Context()); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i := range 4 {
		if err := s.Verify(t.Context(), "p"+string(rune('0'+i))); err != nil {
			t.Errorf("Verify: %v", err)
		}
	}
}

func TestListAndOpen(t *testing.T) {
	now := time.Date(2025, 5, 1, 0, 0, 0, 0, time.UTC)
	s := newStore(t, WithClock(func() time.Time { return now }))
	mustPutTar(t, s, "b", mkTar(t), Meta{Name: "mine", Labels: map[string]string{"k": "v"}})
	mustPutTar(t, s, "a", mkTar(t), Meta{CreatedAt: now.Add(-time.Hour), Parent: "b"})
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != "a" || list[1].ID != "b" || list[1].Name != "mine" || list[1].Labels["k"] != "v" ||
		!list[1].CreatedAt.Equal(now) || list[0].Parent != "b" || list[0].Version != FormatVersion {
		t.Errorf("List = %+v", list)
	}
	if si := list[1].SnapInfo(); !si.Named || si.Kind != KindFiles {
		t.Errorf("SnapInfo = %+v", si)
	}

	// Open caches; Delete forgets.
	m1, _ := s.Open("a")
	m2, _ := s.Open("a")
	if m1 != m2 {
		t.Error("Open did not reuse the cached manifest")
	}
	s.Delete("a")
	if _, err := s.Open("a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Open after Delete: %v", err)
	}
	os.WriteFile(s.manifestPath("junk"), []byte("{"), 0o600)
	if _, err := s.Open("junk"); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Open junk: %v", err)
	}
}

func TestPutCanceled(t *testing.T) {
	s := newStore(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.PutTar(ctx, "c", bytes.NewReader(mkTar(t, file("f", randBytes(1, 1<<20)))), Meta{}); !errors.Is(err, context.Canceled) {
		t.Errorf("PutTar with canceled context: %v", err)
	}
	if _, err := s.Open("c"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("canceled Put left a snapshot: %v", err)
	}
}

// TestGCWaitingDoesNotStallReads: while a slow Put holds the store's read
// lock (a CPU-limited sandbox's export), a GC waiting for it must not hold
// back reads: queued on the RWMutex it did, and every chunk read, delete
// and Put of the server waited for that one export to end.
func TestGCWaitingDoesNotStallReads(t *testing.T) {
	s := newStore(t)
	m := mustPutTar(t, s, "a", mkTar(t, file("f", randBytes(3, 256<<10))), Meta{})
	s.mu.RLock() // the slow Put
	gcDone := make(chan error, 1)
	go func() {
		_, err := s.GC(t.Context())
		gcDone <- err
	}()
	time.Sleep(200 * time.Millisecond) // GC is waiting for the lock by now
	read := make(chan []byte, 1)
	go func() {
		rc, _, err := s.ReadFile(t.Context(), m, "f")
		if err != nil {
			t.Error(err)
			read <- nil
			return
		}
		read <- readAll(t, rc)
	}()
	select {
	case got := <-read:
		if len(got) != 256<<10 {
			t.Errorf("read %d bytes", len(got))
		}
	case <-time.After(30 * time.Second):
		t.Error("a read waited behind a GC waiting for a Put")
	}
	s.mu.RUnlock()
	if err := <-gcDone; err != nil {
		t.Fatal(err)
	}
}

// TestDedupSyncsUnsyncedDirs: a Put that reuses a chunk another Put renamed
// into place but has not made durable (it is still running, or it failed
// before its directory sync) syncs that chunk's directory before its own
// manifest is committed; a Put's own chunks stop counting as unsynced once
// it synced them.
func TestDedupSyncsUnsyncedDirs(t *testing.T) {
	s := newStore(t)
	data := randBytes(11, 100<<10)
	d := s.address(SharedScope, data)
	if err := s.writeChunk(d, s.enc.EncodeAll(data, nil)); err != nil { // renamed, never synced
		t.Fatal(err)
	}
	s.renamed(d[:2])
	p := s.newPutter(t.Context(), SharedScope)
	if err := p.keep(d, data, nil); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	_, dirty := p.dirty[d[:2]]
	p.mu.Unlock()
	if !dirty {
		t.Error("a chunk deduplicated against an unsynced one: its directory is not synced by this Put")
	}
	if err := p.finish(); err != nil {
		t.Fatal(err)
	}
	if !s.isUnsynced(d[:2]) {
		t.Error("another Put's unsynced chunk was counted synced by this one")
	}

	// A Put's own chunks: unsynced while it runs, synced after it.
	own := randBytes(12, 100<<10)
	m := mustPutTar(t, s, "own", mkTar(t, file("f", own)), Meta{})
	for c := range chunkSet(m) {
		if c[:2] != d[:2] && s.isUnsynced(c[:2]) {
			t.Errorf("chunk dir %s still unsynced after its Put", c[:2])
		}
	}
}
