package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aymanbagabas/go-udiff"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/snapshot"
	"github.com/spacesandbox/space/internal/store"
)

// FileVersion is one version of a path in a sandbox's timeline: the first
// snapshot that holds it (or the template, when the path is in it).
type FileVersion struct {
	// Snapshot is the snapshot it first appears in ("" with Template: the
	// template's version, before any snapshot).
	Snapshot  string    `json:"snapshot"`
	Template  bool      `json:"template,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// CommandID and Command name the command the snapshot was taken after
	// (snapshot_on_exec), which made this version; none for other
	// snapshots.
	CommandID int64  `json:"command_id,omitempty"`
	Command   string `json:"command,omitempty"`
	// Deleted: the path is gone in this snapshot (the other fields but
	// the snapshot's are empty).
	Deleted bool   `json:"deleted,omitempty"`
	Type    string `json:"type,omitempty"`
	Size    int64  `json:"size"`
	Mode    uint32 `json:"mode,omitempty"`
	// SHA256 of a regular file's content ("" for other types, and for a
	// file over maxHashBytes).
	SHA256 string `json:"sha256,omitempty"`
	Link   string `json:"target,omitempty"` // a symlink's target
}

// maxHashBytes bounds the file a history hashes: each version is read
// whole for it.
const maxHashBytes = 256 << 20

// layers finds paths in snapshots of one sandbox, each as its writable
// layer over its template (LookupLayered: no full merge per snapshot),
// opening each template's view once.
type layers struct {
	s     *Service
	bases map[string]*snapshot.Manifest
}

func (s *Service) newLayers() *layers { return &layers{s: s, bases: map[string]*snapshot.Manifest{}} }

func (ls *layers) base(ctx context.Context, name, digest string) (*snapshot.Manifest, error) {
	if m := ls.bases[digest]; m != nil {
		return m, nil
	}
	m, err := ls.s.templateView(ctx, name, digest)
	if err != nil {
		return nil, err
	}
	ls.bases[digest] = m
	return m, nil
}

// lookup finds rel in snapshot sn. Errors: errdefs.ErrNotSupported for a
// snapshot without a file-level view (a VM checkpoint).
func (ls *layers) lookup(ctx context.Context, sn store.Snapshot, rel string) (snapshot.FileEntry, bool, error) {
	filesID := sn.ID
	if sn.Kind == KindCheckpoint {
		filesID = sn.ID + filesSuffix
	}
	upper, err := ls.s.snaps.Store.Open(filesID)
	if errors.Is(err, errdefs.ErrNotFound) && sn.Kind == KindCheckpoint {
		return snapshot.FileEntry{}, false, errdefs.NotSupported("snapshot %s was taken by a driver without a file-level view (a VM checkpoint)", sn.ID)
	}
	if err != nil {
		return snapshot.FileEntry{}, false, err
	}
	base, err := ls.base(ctx, sn.Template, sn.TemplateDigest)
	if err != nil {
		return snapshot.FileEntry{}, false, err
	}
	e, ok := snapshot.LookupLayered(rel, base, upper)
	return e, ok, nil
}

// FileHistory lists the versions of path p across a sandbox's timeline
// (its ready snapshots, oldest first): one entry where the path's content
// (type, bytes, link target) differs from the version before, starting
// from the template's. Snapshots without a file-level view are skipped.
// The sandbox's record may be gone while its snapshots live on. Errors:
// errdefs.ErrNotFound (no such sandbox of the caller's),
// errdefs.ErrInvalidArgument (path), errdefs.ErrNotSupported (snapshots
// off).
func (s *Service) FileHistory(ctx context.Context, c Caller, id, p string) ([]FileVersion, error) {
	if s.snaps == nil {
		return nil, errdefs.NotSupported("snapshots are not enabled on this server")
	}
	p, err := cleanPath(p)
	if err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, errdefs.InvalidArgument("path: the history of a file or directory, not of the root")
	}
	rel := strings.TrimPrefix(p, "/")
	all, err := s.Snapshots(ctx, c, id)
	if err != nil {
		return nil, err
	}
	ls := s.newLayers()
	hashes := map[string]string{} // by chunk list: versions that come back are read once
	out := []FileVersion{}
	var prev *snapshot.FileEntry // nil: absent
	started := false
	for _, sn := range all {
		if sn.Status != store.SnapshotReady {
			continue
		}
		if !started {
			started = true
			// The template's version, if the path is in it.
			if base, err := ls.base(ctx, sn.Template, sn.TemplateDigest); err == nil {
				if e, ok := snapshot.LookupLayered(rel, base); ok {
					v, err := s.version(ctx, e, hashes)
					if err != nil {
						return nil, err
					}
					v.Template = true
					out = append(out, v)
					prev = &e
				}
			}
		}
		v, e, changed, err := s.versionIn(ctx, ls, sn, rel, prev, hashes)
		if err != nil {
			return nil, err
		}
		if changed {
			v.Snapshot, v.CreatedAt, v.CommandID, v.Command = sn.ID, sn.CreatedAt, sn.CommandSeq, sn.Cause
			out = append(out, v)
			prev = e
		}
	}
	return out, nil
}

// versionIn looks rel up in snapshot sn, pinned meanwhile (retention may
// drop it between the listing and the read), and describes it if it
// differs from prev (nil: absent). A snapshot without a file-level view,
// or dropped already, changes nothing.
func (s *Service) versionIn(ctx context.Context, ls *layers, sn store.Snapshot, rel string, prev *snapshot.FileEntry, hashes map[string]string) (FileVersion, *snapshot.FileEntry, bool, error) {
	defer s.pinSnapshot(sn.ID)()
	e, ok, err := ls.lookup(ctx, sn, rel)
	if errors.Is(err, errdefs.ErrNotSupported) || errors.Is(err, errdefs.ErrNotFound) {
		return FileVersion{}, prev, false, nil
	}
	if err != nil {
		return FileVersion{}, prev, false, err
	}
	switch {
	case !ok && prev == nil:
		return FileVersion{}, nil, false, nil
	case !ok:
		return FileVersion{Deleted: true}, nil, true, nil
	case prev != nil && snapshot.SameContent(*prev, e):
		return FileVersion{}, prev, false, nil
	}
	v, err := s.version(ctx, e, hashes)
	return v, &e, err == nil, err
}

// version describes entry e, hashing a regular file's content.
func (s *Service) version(ctx context.Context, e snapshot.FileEntry, hashes map[string]string) (FileVersion, error) {
	v := FileVersion{Type: string(e.Type), Size: e.Size, Mode: e.Mode, Link: e.Link}
	if e.Type == snapshot.TypeHardlink {
		v.Type, v.Link = string(snapshot.TypeFile), ""
	}
	if e.Type != snapshot.TypeFile && e.Type != snapshot.TypeHardlink || e.Size > maxHashBytes {
		return v, nil
	}
	key := chunkKey(e)
	if h, ok := hashes[key]; ok {
		v.SHA256 = h
		return v, nil
	}
	rc := s.snaps.Store.ReadEntry(ctx, e)
	defer rc.Close()
	h := sha256.New()
	if _, err := io.Copy(h, rc); err != nil {
		return v, fmt.Errorf("read %s: %w", e.Path, err)
	}
	v.SHA256 = hex.EncodeToString(h.Sum(nil))
	hashes[key] = v.SHA256
	return v, nil
}

func chunkKey(e snapshot.FileEntry) string {
	var b strings.Builder
	for _, c := range e.Chunks {
		fmt.Fprintf(&b, "%v;", c)
	}
	return b.String()
}

// FileDiff is a unified diff of one file between two snapshots.
type FileDiff struct {
	From string `json:"from"`
	To   string `json:"to"`
	Path string `json:"path"`
	// FromExists and ToExists: whether the path is in each snapshot (a
	// file added or removed is diffed against nothing).
	FromExists bool  `json:"from_exists"`
	ToExists   bool  `json:"to_exists"`
	FromSize   int64 `json:"from_size"`
	ToSize     int64 `json:"to_size"`
	// Binary: either side is not text (a NUL byte, or not UTF-8); TooLarge:
	// either side is over MaxDiffBytes. Neither has a Diff then.
	Binary   bool `json:"binary,omitempty"`
	TooLarge bool `json:"too_large,omitempty"`
	// Same: the content is the same (Diff is empty).
	Same bool   `json:"same"`
	Diff string `json:"diff"`
}

// MaxDiffBytes bounds each side of a file diff: a line diff's time grows
// with the product of the sides' changed lines.
const MaxDiffBytes = 1 << 20

// DiffFile diffs path p between snapshots from and to of the caller's. A
// symlink's content is its target. Errors: errdefs.ErrNotFound (a snapshot,
// or the path in both), errdefs.ErrInvalidArgument (path; a directory).
func (s *Service) DiffFile(ctx context.Context, c Caller, from, to, p string) (FileDiff, error) {
	if s.snaps == nil {
		return FileDiff{}, errdefs.NotSupported("snapshots are not enabled on this server")
	}
	p, err := cleanPath(p)
	if err != nil {
		return FileDiff{}, err
	}
	rel := strings.TrimPrefix(p, "/")
	d := FileDiff{From: from, To: to, Path: p}
	ls := s.newLayers()
	var text [2]string
	for i, sid := range []string{from, to} {
		t, e, ok, err := s.fileText(ctx, c, ls, sid, rel)
		if err != nil {
			return FileDiff{}, err
		}
		if !ok {
			continue
		}
		if e.IsDir() {
			return FileDiff{}, errdefs.InvalidArgument("%s is a directory in snapshot %s", p, sid)
		}
		if i == 0 {
			d.FromExists, d.FromSize = true, e.Size
		} else {
			d.ToExists, d.ToSize = true, e.Size
		}
		switch {
		case t == nil:
			d.TooLarge = true
		case bytes.IndexByte(t, 0) >= 0 || !utf8.Valid(t):
			d.Binary = true
		}
		text[i] = string(t)
	}
	if !d.FromExists && !d.ToExists {
		return FileDiff{}, errdefs.NotFound("%s is in neither snapshot", p)
	}
	if d.Binary || d.TooLarge {
		return d, nil
	}
	d.Same = d.FromExists == d.ToExists && text[0] == text[1]
	if !d.Same {
		a, b := "a"+p, "b"+p
		if !d.FromExists {
			a = "/dev/null"
		}
		if !d.ToExists {
			b = "/dev/null"
		}
		d.Diff = udiff.Unified(a, b, text[0], text[1])
	}
	return d, nil
}

// fileText reads rel from snapshot sid for a diff: its content (a
// symlink's target), nil when over MaxDiffBytes; ok false when it is not
// in the snapshot.
func (s *Service) fileText(ctx context.Context, c Caller, ls *layers, sid, rel string) ([]byte, snapshot.FileEntry, bool, error) {
	defer s.pinSnapshot(sid)()
	sn, err := s.readySnapshot(ctx, c, sid)
	if err != nil {
		return nil, snapshot.FileEntry{}, false, err
	}
	e, ok, err := ls.lookup(ctx, sn, rel)
	if err != nil || !ok {
		return nil, e, false, err
	}
	switch {
	case e.Type == snapshot.TypeSymlink:
		return []byte(e.Link), e, true, nil
	case e.IsDir():
		return nil, e, true, nil
	case e.Type != snapshot.TypeFile && e.Type != snapshot.TypeHardlink:
		return []byte{0}, e, true, nil // a device or fifo: not text
	case e.Size > MaxDiffBytes:
		return nil, e, true, nil
	}
	rc := s.snaps.Store.ReadEntry(ctx, e)
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MaxDiffBytes+1))
	if err != nil {
		return nil, e, false, fmt.Errorf("read %s: %w", rel, err)
	}
	return b, e, true, nil
}

// RestoreBefore restores paths (every path when empty) of a running
// sandbox as they were before command cmdID (Command.ID) started: from the
// newest ready snapshot with a file-level view taken before that start
// (with snapshot_on_exec, the one after the command before it, or the
// baseline before the first). A path that did not exist then is removed,
// as RestoreFiles does. Errors: errdefs.ErrNotFound (no such sandbox or
// command), errdefs.ErrConflict (no snapshot before that command: the
// files then are not known), and RestoreFiles's.
func (s *Service) RestoreBefore(ctx context.Context, c Caller, id string, cmdID int64, paths []string) (RestoreResult, error) {
	if s.snaps == nil {
		return RestoreResult{}, errdefs.NotSupported("snapshots are not enabled on this server")
	}
	if cmdID < 1 {
		return RestoreResult{}, errdefs.InvalidArgument("before_command: a command id (see the sandbox's commands)")
	}
	sb, err := s.get(ctx, c, id)
	if err != nil {
		return RestoreResult{}, err
	}
	s.procs.flush()
	p, err := s.store.GetProcess(ctx, sb.ID, cmdID)
	if err != nil {
		return RestoreResult{}, err
	}
	snaps, err := s.store.ListSnapshots(ctx, sb.ID, store.SnapshotReady)
	if err != nil {
		return RestoreResult{}, err
	}
	for i := len(snaps) - 1; i >= 0; i-- {
		sn := snaps[i]
		if sn.CreatedAt.Before(p.StartedAt) && sn.TemplateDigest == sb.TemplateDigest && s.hasFileView(sn) {
			return s.RestoreFiles(ctx, c, id, sn.ID, paths)
		}
	}
	return RestoreResult{}, errdefs.Conflict("no snapshot of sandbox %s was taken before command %d started, so its files then are not known (a sandbox created with snapshot_on_exec has one before its first command and after each)", id, cmdID)
}

// hasFileView reports whether a snapshot has a writable-layer manifest.
func (s *Service) hasFileView(sn store.Snapshot) bool {
	if sn.Kind != KindCheckpoint {
		return true
	}
	_, err := s.snaps.Store.Open(sn.ID + filesSuffix)
	return err == nil
}
