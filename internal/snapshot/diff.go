package snapshot

import (
	"maps"
	"slices"
)

// ChangeKind says how a path differs between two snapshots.
type ChangeKind string

const (
	Added    ChangeKind = "added"
	Removed  ChangeKind = "removed"
	Modified ChangeKind = "modified"
)

// Change is one path that differs between two snapshots.
type Change struct {
	Path string     `json:"path"`
	Kind ChangeKind `json:"kind"`
	// Type is the entry's type in b (in a for Removed).
	Type    EntryType `json:"type"`
	OldSize int64     `json:"old_size"`
	NewSize int64     `json:"new_size"`
}

// Diff lists the paths that differ from a to b, in path order. An entry is
// Modified when its type, content (chunk digests), mode, ownership, link
// target, device numbers or xattrs change; a change of mtime alone is not
// reported. Every path of an added or removed subtree is listed. Either
// manifest may be nil (empty). Entries are compared as stored: diff full
// views (Resolve) to compare filesystems, uppers to compare layers.
func Diff(a, b *Manifest) []Change {
	var ea, eb []FileEntry
	if a != nil {
		ea = a.Entries
	}
	if b != nil {
		eb = b.Entries
	}
	var out []Change
	i, j := 0, 0
	for i < len(ea) || j < len(eb) {
		var c int
		switch {
		case i == len(ea):
			c = 1
		case j == len(eb):
			c = -1
		default:
			c = comparePath(ea[i].Path, eb[j].Path)
		}
		switch {
		case c < 0:
			out = append(out, Change{Path: ea[i].Path, Kind: Removed, Type: ea[i].Type, OldSize: ea[i].Size})
			i++
		case c > 0:
			out = append(out, Change{Path: eb[j].Path, Kind: Added, Type: eb[j].Type, NewSize: eb[j].Size})
			j++
		default:
			if !sameEntry(ea[i], eb[j]) {
				out = append(out, Change{Path: eb[j].Path, Kind: Modified, Type: eb[j].Type, OldSize: ea[i].Size, NewSize: eb[j].Size})
			}
			i++
			j++
		}
	}
	return out
}

// sameEntry compares everything but the path and mtime.
func sameEntry(x, y FileEntry) bool {
	return x.Type == y.Type && x.Mode == y.Mode && x.UID == y.UID && x.GID == y.GID &&
		x.Size == y.Size && x.Link == y.Link && x.Devmajor == y.Devmajor && x.Devminor == y.Devminor &&
		maps.Equal(x.Xattrs, y.Xattrs) && slices.Equal(x.Chunks, y.Chunks)
}
