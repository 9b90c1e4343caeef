package snapshot

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/errdefs"
)

// WriteTar writes the entries of m at or beneath paths (nil: all of them)
// to w as a tar stream, in path order, verifying content as it goes.
// Ancestor directories of a chosen path are not added. Whiteouts are
// written as ".wh.<name>" files and an opaque directory as the directory
// plus a ".wh..wh..opq" file, so an upper layer round-trips. Of a set of
// hardlinked names in the stream the first in path order carries the
// content and the others link to it.
//
// Errors: errdefs.ErrNotFound if a path matches no entry (checked before
// anything is written); errdefs.ErrInvalidArgument for a bad path; any
// error from w, or ErrCorrupt, after a partial stream.
func (s *Store) WriteTar(ctx context.Context, m *Manifest, w io.Writer, paths []string) error {
	chosen, err := m.selection(paths)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	// The first path written of each set of hardlinked names (keyed by the
	// path of the file they share) carries the content; later ones link to
	// it, whichever of them was the link in m.
	written := map[string]string{}
	for i, e := range m.Entries {
		if chosen != nil && !chosen[i] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.writeTarEntry(ctx, tw, e, written); err != nil {
			return fmt.Errorf("write tar: %s: %w", e.Path, err)
		}
	}
	return tw.Close()
}

// selection marks the entries at or beneath paths; nil means all.
func (m *Manifest) selection(paths []string) ([]bool, error) {
	if paths == nil {
		return nil, nil
	}
	chosen := make([]bool, len(m.Entries))
	for _, p := range paths {
		c, err := cleanPath(p)
		if err != nil {
			return nil, err
		}
		i, j := m.subtree(c)
		if i == j {
			return nil, errdefs.NotFound("%s: not in snapshot %s", p, m.ID)
		}
		for k := i; k < j; k++ {
			chosen[k] = true
		}
	}
	return chosen, nil
}

func (s *Store) writeTarEntry(ctx context.Context, tw *tar.Writer, e FileEntry, written map[string]string) error {
	hdr := &tar.Header{
		Name:    e.Path,
		Mode:    int64(e.Mode),
		Uid:     e.UID,
		Gid:     e.GID,
		ModTime: e.ModTime,
	}
	if len(e.Xattrs) > 0 {
		hdr.PAXRecords = map[string]string{}
		for k, v := range e.Xattrs {
			hdr.PAXRecords[paxXattr+k] = v
		}
	}
	content := false
	switch e.Type {
	case TypeFile, TypeHardlink:
		key := e.Path
		if e.Type == TypeHardlink {
			key = e.Link
		}
		if first, ok := written[key]; ok {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
		} else {
			hdr.Typeflag, hdr.Size, content = tar.TypeReg, e.Size, true
			written[key] = e.Path
		}
	case TypeDir, TypeOpaque:
		hdr.Typeflag, hdr.Name = tar.TypeDir, e.Path+"/"
	case TypeSymlink:
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.Link
	case TypeFifo:
		hdr.Typeflag = tar.TypeFifo
	case TypeChar:
		hdr.Typeflag, hdr.Devmajor, hdr.Devminor = tar.TypeChar, e.Devmajor, e.Devminor
	case TypeBlock:
		hdr.Typeflag, hdr.Devmajor, hdr.Devminor = tar.TypeBlock, e.Devmajor, e.Devminor
	case TypeWhiteout:
		dir, base := path.Split(e.Path)
		hdr.Typeflag, hdr.Name, hdr.Mode, hdr.PAXRecords = tar.TypeReg, dir+whiteoutPrefix+base, 0, nil
	default:
		return fmt.Errorf("unknown entry type %q", e.Type)
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if content {
		r := &chunkReader{ctx: ctx, s: s, chunks: e.Chunks}
		if _, err := r.WriteTo(tw); err != nil {
			return err
		}
	}
	if e.Type == TypeOpaque {
		return tw.WriteHeader(&tar.Header{
			Typeflag: tar.TypeReg, Name: e.Path + "/" + opaqueMarker,
			Uid: e.UID, Gid: e.GID, ModTime: e.ModTime,
		})
	}
	return nil
}

// MaterializeDir recreates the tree of m in dir, which must be empty or
// not yet exist: contents, modes, mtimes and, when running as root,
// ownership. It is meant for checkpoint images and full views. Everything
// is created through an os.Root, so a snapshot's symlinks cannot make it
// write outside dir. Whiteouts are skipped, opaque directories become
// plain ones, devices are skipped when the process may not create them,
// and symlinks keep the time of their creation. On error what was created
// is removed.
//
// Errors: errdefs.ErrConflict if dir is not empty; ErrCorrupt for bad
// chunks.
func (s *Store) MaterializeDir(ctx context.Context, m *Manifest, dir string) (err error) {
	created := false
	if err := os.Mkdir(dir, 0o700); err == nil {
		created = true
	} else if !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("materialize %s: %w", m.ID, err)
	} else if des, err := os.ReadDir(dir); err != nil {
		return fmt.Errorf("materialize %s: %w", m.ID, err)
	} else if len(des) > 0 {
		return errdefs.Conflict("materialize %s: %s is not empty", m.ID, dir)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("materialize %s: %w", m.ID, err)
	}
	defer root.Close()
	defer func() {
		if err == nil {
			return
		}
		if created {
			os.RemoveAll(dir)
			return
		}
		if des, rerr := os.ReadDir(dir); rerr == nil {
			for _, de := range des {
				os.RemoveAll(dir + "/" + de.Name())
			}
		}
	}()

	asRoot := os.Geteuid() == 0
	// As in WriteTar, the first name created of a set of hardlinked names
	// gets the content and the others are linked to it.
	linked := map[string]string{}
	present := map[string]bool{"": true} // directories that exist
	var dirs []FileEntry
	for _, e := range m.Entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		// A tar may omit parent directories: make them plainly.
		if parent := parentDir(e.Path); !present[parent] {
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return fmt.Errorf("materialize %s: %s: %w", m.ID, e.Path, err)
			}
			for p := parent; p != "" && !present[p]; p = parentDir(p) {
				present[p] = true
			}
		}
		made, err := s.materialize(ctx, root, e, linked)
		if err != nil {
			return fmt.Errorf("materialize %s: %s: %w", m.ID, e.Path, err)
		}
		if !made {
			continue
		}
		if asRoot {
			if err := root.Lchown(e.Path, e.UID, e.GID); err != nil {
				return fmt.Errorf("materialize %s: %s: %w", m.ID, e.Path, err)
			}
		}
		switch e.Type {
		case TypeDir, TypeOpaque:
			present[e.Path] = true
			dirs = append(dirs, e) // mode and mtime once their contents exist
		case TypeFile, TypeHardlink, TypeFifo, TypeChar, TypeBlock:
			if err := root.Chmod(e.Path, fileMode(e.Mode)); err != nil {
				return fmt.Errorf("materialize %s: %s: %w", m.ID, e.Path, err)
			}
			if err := root.Chtimes(e.Path, e.ModTime, e.ModTime); err != nil {
				return fmt.Errorf("materialize %s: %s: %w", m.ID, e.Path, err)
			}
		}
	}
	for _, e := range slices.Backward(dirs) {
		if err := root.Chmod(e.Path, fileMode(e.Mode)); err != nil {
			return fmt.Errorf("materialize %s: %s: %w", m.ID, e.Path, err)
		}
		if err := root.Chtimes(e.Path, e.ModTime, e.ModTime); err != nil {
			return fmt.Errorf("materialize %s: %s: %w", m.ID, e.Path, err)
		}
	}
	return nil
}

// materialize creates one entry under root; made is false if it was
// skipped.
func (s *Store) materialize(ctx context.Context, root *os.Root, e FileEntry, linked map[string]string) (made bool, err error) {
	switch e.Type {
	case TypeDir, TypeOpaque:
		return true, root.Mkdir(e.Path, 0o700)
	case TypeSymlink:
		return true, root.Symlink(e.Link, e.Path)
	case TypeFile, TypeHardlink:
		key := e.Path
		if e.Type == TypeHardlink {
			key = e.Link
		}
		if first, ok := linked[key]; ok {
			if err := root.Link(first, e.Path); err == nil {
				return true, nil
			}
			// else copy the content
		} else {
			linked[key] = e.Path
		}
		f, err := root.OpenFile(e.Path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return false, err
		}
		_, err = (&chunkReader{ctx: ctx, s: s, chunks: e.Chunks}).WriteTo(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return true, err
	case TypeFifo, TypeChar, TypeBlock:
		dir, base := path.Split(e.Path)
		if dir == "" {
			dir = "."
		}
		d, err := root.Open(dir)
		if err != nil {
			return false, err
		}
		defer d.Close()
		mode := uint32(0o600)
		switch e.Type {
		case TypeFifo:
			mode |= unix.S_IFIFO
		case TypeChar:
			mode |= unix.S_IFCHR
		case TypeBlock:
			mode |= unix.S_IFBLK
		}
		err = unix.Mknodat(int(d.Fd()), base, mode, int(unix.Mkdev(uint32(e.Devmajor), uint32(e.Devminor))))
		if e.Type != TypeFifo && errors.Is(err, unix.EPERM) {
			return false, nil
		}
		return err == nil, err
	default:
		return false, nil // whiteouts
	}
}

// parentDir returns the directory of a manifest path ("" for the root).
func parentDir(p string) string {
	d := path.Dir(p)
	if d == "." {
		return ""
	}
	return d
}
