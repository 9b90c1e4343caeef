package snapshot

import "github.com/spacesandbox/space/internal/errdefs"

// Merge lays upper over base and returns the resulting full view, as an
// overlay mount would show it:
//
//   - an upper entry replaces the base entry at its path; an upper
//     directory over a base directory keeps the base's contents;
//   - a whiteout removes the base path and everything beneath it;
//   - an opaque directory hides everything beneath it in base and becomes
//     a plain directory;
//   - an upper non-directory over a base directory hides the base's
//     contents.
//
// base must be a full view (no whiteouts), such as a PutDir manifest or a
// Merge result; the result is one too. Its Info is upper's with BytesTotal
// recomputed and BytesNew zero. Neither input is modified.
func Merge(base, upper *Manifest) *Manifest {
	var b, u []FileEntry
	if base != nil {
		b = base.Entries
	}
	out := &Manifest{}
	if upper != nil {
		u = upper.Entries
		out.Info = upper.Info
	}
	entries := make([]FileEntry, 0, len(b)+len(u))

	// Both lists are sorted with comparePath, so everything beneath a path
	// comes right after it: one hidden prefix at a time is enough.
	hide, hiding := "", false
	setHide := func(p string) {
		if !hiding || !isUnder(p, hide) {
			hide, hiding = p, true
		}
	}
	hidden := func(p string) bool { return hiding && isUnder(p, hide) }

	i, j := 0, 0
	for i < len(b) || j < len(u) {
		var c int
		switch {
		case i == len(b):
			c = 1
		case j == len(u):
			c = -1
		default:
			c = comparePath(b[i].Path, u[j].Path)
		}
		if c < 0 {
			if !hidden(b[i].Path) {
				entries = append(entries, b[i])
			}
			i++
			continue
		}
		if c == 0 {
			i++ // the upper entry replaces (or removes) the base one
		}
		e := u[j]
		j++
		switch e.Type {
		case TypeWhiteout:
			setHide(e.Path)
			continue
		case TypeOpaque:
			setHide(e.Path)
			e.Type = TypeDir
		case TypeDir:
			// merged directory: base contents stay visible
		default:
			setHide(e.Path)
		}
		entries = append(entries, e)
	}
	out.Entries = entries
	out.BytesTotal = bytesTotal(entries)
	out.BytesNew = 0
	return out
}

// Resolve opens the snapshots ids, bottom layer first, and merges them
// into one full view: Resolve(templateID, upperID) is the filesystem a
// sandbox saw when upperID was taken. Errors: errdefs.ErrNotFound if any
// id is missing; errdefs.ErrInvalidArgument if ids is empty.
func (s *Store) Resolve(ids ...string) (*Manifest, error) {
	if len(ids) == 0 {
		return nil, errdefs.InvalidArgument("Resolve needs at least one snapshot id")
	}
	view := &Manifest{}
	for _, id := range ids {
		m, err := s.Open(id)
		if err != nil {
			return nil, err
		}
		view = Merge(view, m)
	}
	return view, nil
}
