package snapshot

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Chunk sizes of the content-defined chunker. Changing any of them (or the
// gear table) changes where files are cut and so defeats dedup against
// chunks already stored: treat them as part of the on-disk format.
const (
	minChunk = 256 << 10
	avgChunk = 1 << 20
	maxChunk = 4 << 20

	// FastCDC's normalized chunking: a stricter mask before the average
	// size and a looser one after it pull chunk sizes towards avgChunk.
	// log2(avgChunk) = 20; ±2 bits. The hash shifts left, so its high bits
	// depend on the most bytes: the masks test those.
	maskStrict = ((uint64(1) << 22) - 1) << (64 - 22)
	maskLoose  = ((uint64(1) << 18) - 1) << (64 - 18)
)

// ErrCorrupt marks data that failed verification: a chunk whose content
// does not match its digest, or one that is missing although a manifest
// references it. It is an internal error (errdefs.Classify gives 500).
var ErrCorrupt = errors.New("snapshot data corrupt")

// gear is the gear-hash table: 256 pseudo-random words from splitmix64 with
// a fixed seed, so it is identical in every build.
var gear = func() (t [256]uint64) {
	x := uint64(0x5350414345434443) // "SPACECDC"
	for i := range t {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		t[i] = z ^ (z >> 31)
	}
	return t
}()

// cutPoint returns the length of the first chunk of data. data must hold
// at least maxChunk bytes unless it is the end of the stream.
func cutPoint(data []byte) int {
	n := len(data)
	if n <= minChunk {
		return n
	}
	if n > maxChunk {
		n = maxChunk
	}
	normal := min(avgChunk, n)
	var h uint64
	i := minChunk // FastCDC: no cut can fall before minChunk, so skip hashing it
	for ; i < normal; i++ {
		h = h<<1 + gear[data[i]]
		if h&maskStrict == 0 {
			return i + 1
		}
	}
	for ; i < n; i++ {
		h = h<<1 + gear[data[i]]
		if h&maskLoose == 0 {
			return i + 1
		}
	}
	return n
}

// chunker cuts a stream into content-defined chunks.
type chunker struct {
	r          io.Reader
	buf        []byte // 2*maxChunk; live data is buf[start:end]
	start, end int
	eof        bool
}

func newChunker(buf []byte) *chunker {
	if cap(buf) < 2*maxChunk {
		buf = make([]byte, 2*maxChunk)
	}
	return &chunker{buf: buf[:2*maxChunk]}
}

func (c *chunker) reset(r io.Reader) {
	c.r, c.start, c.end, c.eof = r, 0, 0, false
}

// next returns the next chunk, valid until the following call, or io.EOF.
func (c *chunker) next() ([]byte, error) {
	if c.end-c.start < maxChunk && !c.eof {
		n := copy(c.buf, c.buf[c.start:c.end])
		c.start, c.end = 0, n
		m, err := io.ReadFull(c.r, c.buf[c.end:])
		c.end += m
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			c.eof = true
		case err != nil:
			return nil, err
		}
	}
	if c.start == c.end {
		return nil, io.EOF
	}
	n := cutPoint(c.buf[c.start:c.end])
	chunk := c.buf[c.start : c.start+n]
	c.start += n
	return chunk, nil
}

// drained reports whether the chunk next returned last was the stream's
// final one (false when that is not known yet).
func (c *chunker) drained() bool {
	return c.eof && c.start == c.end
}

func validDigest(d string) bool {
	if len(d) != 64 {
		return false
	}
	for i := 0; i < len(d); i++ {
		c := d[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func (s *Store) chunkPath(digest string) string {
	return filepath.Join(s.root, chunksDir, digest[:2], digest)
}

func (s *Store) hasChunk(digest string) bool {
	fi, err := os.Stat(s.chunkPath(digest))
	return err == nil && fi.Mode().IsRegular()
}

// writeChunk stores compressed bytes under digest (temp file, fsync,
// rename). The caller fsyncs the chunk directory before it commits a
// manifest that references the chunk.
func (s *Store) writeChunk(digest string, compressed []byte) error {
	dir := filepath.Join(s.root, chunksDir, digest[:2])
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := writeTemp(dir, digest, compressed)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, digest)); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// readChunk returns the uncompressed content of chunk c, decoded into
// buf's storage when it is large enough, after checking it against its
// address in its scope. Failures that mean the store lost or mangled data
// wrap ErrCorrupt.
func (s *Store) readChunk(c ChunkRef, buf []byte) ([]byte, error) {
	digest := c.Digest
	if !validDigest(digest) {
		return nil, fmt.Errorf("chunk %q: bad digest: %w", digest, ErrCorrupt)
	}
	comp, err := os.ReadFile(s.chunkPath(digest))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("chunk %s: missing: %w", digest, ErrCorrupt)
		}
		return nil, fmt.Errorf("chunk %s: %w", digest, err)
	}
	data, err := s.dec.DecodeAll(comp, buf[:0])
	if err != nil {
		return nil, fmt.Errorf("chunk %s: decompress: %v: %w", digest, err, ErrCorrupt)
	}
	if s.address(c.Scope, data) != digest {
		return nil, fmt.Errorf("chunk %s: content does not match digest: %w", digest, ErrCorrupt)
	}
	return data, nil
}
