package snapshot

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

func TestCutPoint(t *testing.T) {
	data := randBytes(11, 20<<20)
	var sizes []int
	for rest := data; len(rest) > 0; {
		n := cutPoint(rest)
		if n < minChunk && n != len(rest) || n > maxChunk {
			t.Fatalf("chunk of %d bytes", n)
		}
		sizes = append(sizes, n)
		rest = rest[n:]
	}
	avg := len(data) / len(sizes)
	t.Logf("20 MiB -> %d chunks, average %d KiB", len(sizes), avg>>10)
	if avg < 512<<10 || avg > 2<<20 {
		t.Errorf("average chunk %d bytes, want ~1 MiB", avg)
	}
	if cutPoint(data[:1000]) != 1000 || cutPoint(nil) != 0 {
		t.Error("small input not one chunk")
	}
	// The chunker over a stream cuts where cutPoint does on the whole.
	ck := newChunker(nil)
	ck.reset(bytes.NewReader(data))
	var got []int
	for {
		c, err := ck.next()
		if err != nil {
			break
		}
		got = append(got, len(c))
	}
	if !slices.Equal(got, sizes) {
		t.Errorf("streamed cuts %v, want %v", got, sizes)
	}
	// Zeros (no content to cut on) give max-size chunks.
	if n := cutPoint(make([]byte, 10<<20)); n != maxChunk {
		t.Errorf("zeros cut at %d", n)
	}
}

// TestDedupUnchangedTree: a second snapshot of the same 200 MB tree writes
// (almost) nothing; a tree that shares most files shares their chunks.
func TestDedupUnchangedTree(t *testing.T) {
	s := newStore(t)
	var items []item
	for i := range 25 {
		items = append(items, file("data/f"+string(rune('a'+i)), randBytes(uint64(100+i), 8<<20)))
	}
	for i := range 200 {
		items = append(items, file("small/s"+string(rune('a'+i%26))+string(rune('a'+i/26)), randBytes(uint64(1000+i), 2000)))
	}
	put := func(id string, items []item) *Manifest {
		m, err := s.PutTar(t.Context(), id, streamTar(items...), Meta{})
		if err != nil {
			t.Fatalf("PutTar %s: %v", id, err)
		}
		return m
	}

	start := time.Now()
	m1 := put("one", items)
	el1 := time.Since(start)
	start = time.Now()
	m2 := put("two", items)
	el2 := time.Since(start)
	mb := float64(m1.BytesTotal) / 1e6
	t.Logf("200 MB tree: first put %v (%.0f MB/s, %d new bytes), unchanged put %v (%.0f MB/s, %d new bytes = %.4f%%)",
		el1, mb/el1.Seconds(), m1.BytesNew, el2, mb/el2.Seconds(), m2.BytesNew,
		100*float64(m2.BytesNew)/float64(m1.BytesNew))
	if m1.BytesNew < m1.BytesTotal {
		t.Errorf("first put wrote %d bytes of %d incompressible", m1.BytesNew, m1.BytesTotal)
	}
	if m2.BytesNew*100 > m1.BytesTotal {
		t.Errorf("unchanged tree wrote %d new bytes (> 1%%)", m2.BytesNew)
	}
	if d := Diff(m1, m2); len(d) != 0 {
		t.Errorf("Diff of identical trees: %+v", d)
	}

	// A tree sharing most files: 3 of 25 big files replaced, one added.
	items2 := slices.Clone(items)
	for _, i := range []int{3, 10, 20} {
		items2[i] = file(items[i].hdr.Name, randBytes(uint64(5000+i), 8<<20))
	}
	items2 = append(items2, file("data/new", randBytes(9999, 4<<20)))
	m3 := put("three", items2)
	changed := int64(3*8<<20 + 4<<20)
	t.Logf("tree sharing 22 of 25 big files: %d new bytes for %d changed (ratio %.3f)", m3.BytesNew, changed, float64(m3.BytesNew)/float64(changed))
	if m3.BytesNew < changed || m3.BytesNew > changed+changed/20 {
		t.Errorf("shared tree wrote %d new bytes, want ~%d", m3.BytesNew, changed)
	}
	shared := 0
	live := map[string]bool{}
	for _, e := range m1.Entries {
		for _, c := range e.Chunks {
			live[c.Digest] = true
		}
	}
	for _, e := range m3.Entries {
		for _, c := range e.Chunks {
			if live[c.Digest] {
				shared++
			}
		}
	}
	if shared == 0 {
		t.Error("no shared chunks")
	}
}

// TestDedupInsert: 10 bytes inserted in the middle of a 50 MB file change
// only the chunks around the insertion.
func TestDedupInsert(t *testing.T) {
	s := newStore(t)
	data := randBytes(42, 50<<20)
	m1 := mustPutTar(t, s, "before", mkTar(t, file("big", data)), Meta{})
	mid := len(data) / 2
	edited := slices.Concat(data[:mid], []byte("0123456789"), data[mid:])
	m2 := mustPutTar(t, s, "after", mkTar(t, file("big", edited)), Meta{})

	old := map[string]bool{}
	for _, c := range m1.Entries[0].Chunks {
		old[c.Digest] = true
	}
	newChunks := 0
	for _, c := range m2.Entries[0].Chunks {
		if !old[c.Digest] {
			newChunks++
		}
	}
	t.Logf("10-byte insert in 50 MiB (%d chunks): %d new chunks, %d new bytes (%.2f%%)",
		len(m1.Entries[0].Chunks), newChunks, m2.BytesNew, 100*float64(m2.BytesNew)/float64(len(data)))
	if newChunks < 1 || newChunks > 3 {
		t.Errorf("%d new chunks, want 1-3", newChunks)
	}
	r, _, err := s.ReadFile(t.Context(), m2, "big")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, r), edited) {
		t.Error("edited file does not read back")
	}
	if d := Diff(m1, m2); len(d) != 1 || d[0].Kind != Modified || d[0].OldSize != int64(len(data)) || d[0].NewSize != int64(len(edited)) {
		t.Errorf("Diff = %+v", d)
	}
}

// TestDedupWithinFile: a file whose chunks repeat while they are still
// being hashed side by side stores each once and keeps them in order.
func TestDedupWithinFile(t *testing.T) {
	s := newStore(t)
	block := randBytes(7, maxChunk) // cut inside; the cuts fall in step again in each copy
	data := slices.Concat(block, block, randBytes(8, 3<<20), block, block, block, []byte("tail"))
	m := mustPutTar(t, s, "rep", mkTar(t, file("f", data)), Meta{})
	cs := m.Entries[0].Chunks
	var sum int64
	uniq := map[string]int64{}
	for _, c := range cs {
		if c.Digest == "" {
			t.Fatalf("chunk without digest: %+v", cs)
		}
		sum += c.Size
		uniq[c.Digest] = c.Size
	}
	if sum != int64(len(data)) {
		t.Errorf("chunks add up to %d, want %d", sum, len(data))
	}
	if len(uniq) > len(cs)/2 {
		t.Errorf("%d chunks, %d distinct: the repeats were not found", len(cs), len(uniq))
	}
	r, _, err := s.ReadFile(t.Context(), m, "f")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, r), data) {
		t.Fatal("file does not read back")
	}
	// Stored compressed, but random data barely shrinks: each distinct
	// chunk once, not each occurrence.
	var distinct int64
	for _, n := range uniq {
		distinct += n
	}
	if m.BytesNew > distinct+distinct/50 || m.BytesNew < distinct-distinct/50 {
		t.Errorf("bytes_new %d, distinct chunks %d bytes (%d chunks, %d distinct)", m.BytesNew, distinct, len(cs), len(uniq))
	}
}

// cancelAfter cancels its context once n bytes were read through it.
type cancelAfter struct {
	r      io.Reader
	n      int
	cancel context.CancelFunc
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	if c.n -= k; c.n <= 0 {
		c.cancel()
	}
	return k, err
}

// TestPutCanceledMidFile: a cancel while a big file's chunks are being
// hashed returns the error, leaves nothing and races nothing.
func TestPutCanceledMidFile(t *testing.T) {
	s := newStore(t)
	for _, at := range []int{1 << 20, 9 << 20, 21 << 20} {
		ctx, cancel := context.WithCancel(t.Context())
		r := &cancelAfter{r: bytes.NewReader(mkTar(t, file("f", randBytes(9, 32<<20)))), n: at, cancel: cancel}
		if _, err := s.PutTar(ctx, "c", r, Meta{}); !errors.Is(err, context.Canceled) {
			t.Errorf("cancel after %d bytes: %v", at, err)
		}
		if _, err := s.Open("c"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("canceled Put left a snapshot: %v", err)
		}
		cancel()
	}
	// The store still works, and the same content goes in whole.
	data := randBytes(9, 32<<20)
	m := mustPutTar(t, s, "ok", mkTar(t, file("f", data)), Meta{})
	r, _, err := s.ReadFile(t.Context(), m, "f")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, r), data) {
		t.Fatal("file does not read back")
	}
}
