package snapshot

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// newStore opens a store in a fresh temp dir, closed at the end of the test.
func newStore(t testing.TB, opts ...Option) *Store {
	t.Helper()
	s, err := New(filepath.Join(t.TempDir(), "store"), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// randBytes returns n deterministic pseudo-random (incompressible) bytes.
func randBytes(seed uint64, n int) []byte {
	var key [32]byte
	key[0], key[1] = byte(seed), byte(seed>>8)
	b := make([]byte, n)
	rand.NewChaCha8(key).Read(b)
	return b
}

// item is one tar entry for mkTar; data is the body of a regular file.
type item struct {
	hdr  tar.Header
	data []byte
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func file(name string, data []byte) item {
	return item{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: t0, Uid: 1000, Gid: 1000}, data: data}
}

func dir(name string) item {
	return item{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755, ModTime: t0}}
}

func symlink(name, target string) item {
	return item{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: t0}}
}

func mkTar(t testing.TB, items ...item) []byte {
	t.Helper()
	var buf bytes.Buffer
	n := 0
	for _, it := range items {
		n += len(it.data) + 1024
	}
	buf.Grow(n + 1024)
	tw := tar.NewWriter(&buf)
	for _, it := range items {
		h := it.hdr
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(it.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// streamTar is mkTar without the buffer: the stream is written by a
// goroutine as it is read.
func streamTar(items ...item) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		for _, it := range items {
			h := it.hdr
			if err := tw.WriteHeader(&h); err != nil {
				pw.CloseWithError(err)
				return
			}
			if _, err := tw.Write(it.data); err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		pw.CloseWithError(tw.Close())
	}()
	return pr
}

// tarEntry is a parsed tar entry with a hash of its body.
type tarEntry struct {
	hdr  tar.Header
	sum  [32]byte
	size int64
}

func readTar(t testing.TB, r io.Reader) map[string]tarEntry {
	t.Helper()
	out := map[string]tarEntry{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		hs := sha256.New()
		n, err := io.Copy(hs, tr)
		if err != nil {
			t.Fatal(err)
		}
		e := tarEntry{hdr: *h, size: n}
		copy(e.sum[:], hs.Sum(nil))
		out[h.Name] = e
	}
}

func readAll(t testing.TB, r io.ReadCloser) []byte {
	t.Helper()
	defer r.Close()
	var b bytes.Buffer
	if _, err := io.Copy(&b, r); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func writeFile(t testing.TB, p string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
}

func mustPutTar(t testing.TB, s *Store, id string, data []byte, meta Meta) *Manifest {
	t.Helper()
	m, err := s.PutTar(t.Context(), id, bytes.NewReader(data), meta)
	if err != nil {
		t.Fatalf("PutTar %s: %v", id, err)
	}
	return m
}

func paths(es []FileEntry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Path)
	}
	return out
}
