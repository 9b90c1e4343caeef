package snapshot

import (
	"context"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/spacesandbox/space/internal/errdefs"
)

// maxSymlinks bounds symlink resolution in ReadFile, as the kernel does.
const maxSymlinks = 40

// ReadFile streams the content of the file at p in m, following symlinks
// in the last path element within the snapshot (an absolute target is
// taken relative to the snapshot root), and returns the entry of the file
// it read. Chunks are verified as they are read; a mismatch is a read
// error wrapping ErrCorrupt. A snapshot deleted and garbage-collected while
// its file is being read fails the same way.
//
// Errors: errdefs.ErrNotFound if p does not exist (or is whiteout),
// errdefs.ErrInvalidArgument if it is not a regular file or a symlink to
// one, or its symlinks loop.
func (s *Store) ReadFile(ctx context.Context, m *Manifest, p string) (io.ReadCloser, FileEntry, error) {
	cur, err := cleanPath(p)
	if err != nil {
		return nil, FileEntry{}, err
	}
	for hops := 0; ; hops++ {
		i, ok := m.find(cur)
		if !ok || m.Entries[i].Type == TypeWhiteout {
			return nil, FileEntry{}, errdefs.NotFound("%s: no such file in snapshot %s", p, m.ID)
		}
		e := m.Entries[i]
		switch e.Type {
		case TypeFile, TypeHardlink:
			return &chunkReader{ctx: ctx, s: s, chunks: e.Chunks}, e, nil
		case TypeSymlink:
			if hops == maxSymlinks {
				return nil, FileEntry{}, errdefs.InvalidArgument("%s: too many levels of symbolic links", p)
			}
			target := e.Link
			if !strings.HasPrefix(target, "/") {
				target = path.Join(path.Dir("/"+cur), target)
			}
			// Like a chroot: ".." at the root stays at the root.
			cur = strings.TrimPrefix(path.Clean("/"+target), "/")
		case TypeDir, TypeOpaque:
			return nil, FileEntry{}, errdefs.InvalidArgument("%s is a directory", p)
		default:
			return nil, FileEntry{}, errdefs.InvalidArgument("%s is not a regular file", p)
		}
	}
}

// ListDir returns the entries directly inside directory p of m ("" or "/"
// for the root), in name order. It is empty if p has no entries beneath
// it. A directory that has entries beneath it but none of its own (a tar
// may omit parents) is listed as a plain 0755 root-owned directory.
// Whiteouts are listed as they are (upper layers only have them).
func ListDir(m *Manifest, p string) []FileEntry {
	dir, err := cleanPath(p)
	if err != nil {
		return nil
	}
	prefix := dir + "/"
	if dir == "" {
		prefix = ""
	}
	i, j := m.subtree(dir)
	var out []FileEntry
	for _, e := range m.Entries[i:j] {
		if e.Path == dir {
			continue
		}
		rest := e.Path[len(prefix):]
		name, _, deeper := strings.Cut(rest, "/")
		if !deeper {
			out = append(out, e)
			continue
		}
		if n := len(out); n > 0 && out[n-1].Path == prefix+name {
			continue // its directory is listed already
		}
		out = append(out, FileEntry{Path: prefix + name, Type: TypeDir, Mode: 0o755})
	}
	return out
}

// chunkReader streams a file's chunks, verifying each.
type chunkReader struct {
	ctx    context.Context
	s      *Store
	chunks []ChunkRef
	cur    []byte // unread part of the current chunk
	buf    []byte // reused for each chunk
}

func (r *chunkReader) load() error {
	if err := r.ctx.Err(); err != nil {
		return err
	}
	c := r.chunks[0]
	if int64(cap(r.buf)) < c.Size {
		r.buf = make([]byte, 0, max(c.Size, avgChunk))
	}
	data, err := r.s.chunk(c, r.buf)
	if err != nil {
		return err
	}
	r.chunks, r.cur, r.buf = r.chunks[1:], data, data[:0]
	return nil
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if len(r.chunks) == 0 {
			return 0, io.EOF
		}
		if err := r.load(); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// WriteTo lets io.Copy take whole chunks without an extra buffer.
func (r *chunkReader) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		if len(r.cur) > 0 {
			n, err := w.Write(r.cur)
			total += int64(n)
			r.cur = r.cur[n:]
			if err != nil {
				return total, err
			}
		}
		if len(r.chunks) == 0 {
			return total, nil
		}
		if err := r.load(); err != nil {
			return total, err
		}
	}
}

func (r *chunkReader) Close() error {
	r.chunks, r.cur, r.buf = nil, nil, nil
	return nil
}

// chunk reads and verifies one chunk under the shared lock, so GC cannot
// remove it halfway.
func (s *Store) chunk(c ChunkRef, buf []byte) ([]byte, error) {
	s.mu.RLock()
	data, err := s.readChunk(c, buf)
	s.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != c.Size {
		return nil, fmt.Errorf("chunk %s: %d bytes, manifest says %d: %w", c.Digest, len(data), c.Size, ErrCorrupt)
	}
	return data, nil
}
