package snapshot

import (
	"context"
	"io"
	"slices"
	"strings"
)

// LookupLayered finds path p in the view that layers (bottom first) make
// when merged, without merging them: the same answer as
// Merge(...Merge(layers[0], layers[1])..., layers[n-1]).Lookup(p), at the
// cost of one lookup per ancestor of p in each layer above the bottom
// instead of a pass over every entry (a file's history looks one path up in
// every snapshot of a timeline). As in Merge:
//
//   - an entry of a higher layer at p wins: a whiteout there means p does
//     not exist, an opaque directory is a plain directory;
//   - a lower layer's p is hidden when a higher layer has, at an ancestor
//     of p, a whiteout, an opaque directory or a non-directory.
//
// The bottom layer must be a full view (no whiteouts), such as a template's
// PutDir manifest. Nil layers are empty.
func LookupLayered(p string, layers ...*Manifest) (FileEntry, bool) {
	c, err := cleanPath(p)
	if err != nil || c == "" {
		return FileEntry{}, false
	}
	for i := len(layers) - 1; i >= 0; i-- {
		m := layers[i]
		if m == nil {
			continue
		}
		if j, ok := m.find(c); ok {
			e := m.Entries[j]
			switch e.Type {
			case TypeWhiteout:
				return FileEntry{}, false
			case TypeOpaque:
				e.Type = TypeDir
			}
			return e, true
		}
		if i == 0 {
			break
		}
		// Not in this layer: the layers below show p unless an ancestor
		// here hides their contents.
		for a := parentOf(c); a != ""; a = parentOf(a) {
			if j, ok := m.find(a); ok && m.Entries[j].Type != TypeDir {
				return FileEntry{}, false
			}
		}
	}
	return FileEntry{}, false
}

// parentOf is the parent of a clean relative path ("" for a top-level one).
func parentOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return ""
}

// ReadEntry streams the content of a regular file (or hardlink) entry, as
// LookupLayered found it.
func (s *Store) ReadEntry(ctx context.Context, e FileEntry) io.ReadCloser {
	return &chunkReader{ctx: ctx, s: s, chunks: e.Chunks}
}

// SameContent reports whether two entries hold the same content: the same
// type, the same chunks (content-addressed) and the same link target.
// Mode, ownership and times are not content.
func SameContent(a, b FileEntry) bool {
	return a.Type == b.Type && a.Size == b.Size && a.Link == b.Link && slices.Equal(a.Chunks, b.Chunks)
}
