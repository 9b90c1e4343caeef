package snapshot

import (
	"fmt"
	"io"
	"path/filepath"
	"testing"
)

// BenchmarkStore measures ingest of new data, ingest of unchanged data
// (all chunks deduplicated; in the shared scope and in a team's) and
// streaming a file back, on 64 MiB of incompressible data.
func BenchmarkStore(b *testing.B) {
	data := randBytes(3, 64<<20)
	src := mkTar(b, file("f", data))
	dir := b.TempDir()
	var s *Store
	var m *Manifest
	b.Run("put-new", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for i := 0; b.Loop(); i++ {
			if s != nil {
				s.Close()
			}
			var err error
			if s, err = New(filepath.Join(dir, fmt.Sprint(i))); err != nil {
				b.Fatal(err)
			}
			m = mustPutTar(b, s, "x", src, Meta{})
		}
	})
	defer s.Close()
	b.Run("put-dedup", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for i := 0; b.Loop(); i++ {
			mustPutTar(b, s, fmt.Sprint("d", i), src, Meta{})
		}
	})
	// The same in a team's scope: chunk addresses are HMAC-SHA256s.
	mustPutTar(b, s, "scoped", src, Meta{Scope: "team/bench"})
	b.Run("put-dedup-scoped", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for i := 0; b.Loop(); i++ {
			mustPutTar(b, s, fmt.Sprint("s", i), src, Meta{Scope: "team/bench"})
		}
	})
	b.Run("read", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			r, _, err := s.ReadFile(b.Context(), m, "f")
			if err != nil {
				b.Fatal(err)
			}
			if n, err := io.Copy(io.Discard, r); err != nil || n != int64(len(data)) {
				b.Fatal(n, err)
			}
		}
	})
}
