package snapshot

import (
	"fmt"
	"testing"
	"time"
)

func TestOpenSpeedTmp(t *testing.T) {
	s := newStore(t)
	m := &Manifest{Info: Info{ID: "big", Version: 1, Kind: KindFiles}}
	for i := range 50000 {
		m.Entries = append(m.Entries, FileEntry{Path: fmt.Sprintf("usr/share/doc/pkg%d/file%d", i/10, i), Type: TypeFile, Mode: 0o644, ModTime: time.Now(), Size: 1234,
			Chunks: []ChunkRef{{Digest: "ab2c3d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccddeeff0011", Size: 1234}}})
	}
	sortEntries(m.Entries)
	if err := s.commitManifest(m); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := s.Open("big"); err != nil {
		t.Fatal(err)
	}
	t.Logf("Open 50k entries: %v", time.Since(start))
	start = time.Now()
	s.List()
	t.Logf("List: %v", time.Since(start))
	start = time.Now()
	Merge(m, m)
	t.Logf("Merge: %v", time.Since(start))
}
