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
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Overlay whiteout conventions accepted by PutTar.
const (
	whiteoutPrefix = ".wh."         // AUFS/OCI: ".wh.<name>" deletes <name>
	opaqueMarker   = ".wh..wh..opq" // AUFS/OCI: this directory is opaque
	paxXattr       = "SCHILY.xattr."
)

// Overlayfs xattrs, under the trusted. (root) or user. (userxattr) prefix.
var (
	opaqueXattrs   = []string{"trusted.overlay.opaque", "user.overlay.opaque"}
	whiteoutXattrs = []string{"trusted.overlay.whiteout", "user.overlay.whiteout"}
)

// PutTar ingests a tar stream as snapshot id and returns its manifest.
//
// The stream is an overlay upper layer such as `runsc tar rootfs-upper`
// writes. Deletions are accepted in both conventions: ".wh.<name>" entries
// (any type) and character devices 0:0 become TypeWhiteout; a
// ".wh..wh..opq" entry or an overlay opaque xattr makes its directory
// TypeOpaque; a regular file with an overlay whiteout xattr is a whiteout
// too. A root ("./") entry is dropped. Where a path appears twice the later
// entry wins, as when extracting.
//
// Errors: errdefs.ErrInvalidArgument for a bad id or a malformed stream (a
// path leaving the root included), errdefs.ErrConflict if id exists.
func (s *Store) PutTar(ctx context.Context, id string, r io.Reader, meta Meta) (*Manifest, error) {
	return s.put(ctx, id, meta, KindFiles, func(p *putter) ([]FileEntry, error) {
		return p.readTar(r)
	})
}

// PutDir ingests the directory tree at dir as snapshot id (dir itself is
// the root and gets no entry). Regular files, directories, symlinks,
// hardlinks (by inode), FIFOs and devices are recorded; sockets are
// skipped. Xattrs are not read.
//
// Errors: errdefs.ErrInvalidArgument for a bad id or a dir that is not a
// directory, errdefs.ErrNotFound if dir does not exist,
// errdefs.ErrConflict if id exists.
func (s *Store) PutDir(ctx context.Context, id, dir string, meta Meta) (*Manifest, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, errdefs.NotFound("directory %s not found", dir)
		}
		return nil, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if !fi.IsDir() {
		return nil, errdefs.InvalidArgument("%s is not a directory", dir)
	}
	return s.put(ctx, id, meta, KindCheckpoint, func(p *putter) ([]FileEntry, error) {
		return p.readDir(dir)
	})
}

// put runs one ingest: fill produces the entries while the putter stores
// chunks, then the manifest is committed.
func (s *Store) put(ctx context.Context, id string, meta Meta, defKind Kind, fill func(*putter) ([]FileEntry, error)) (*Manifest, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	kind := meta.Kind
	if kind == "" {
		kind = defKind
	}
	if kind != KindFiles && kind != KindCheckpoint {
		return nil, errdefs.InvalidArgument("unknown snapshot kind %q", kind)
	}
	if err := validScope(meta.Scope); err != nil {
		return nil, err
	}
	if meta.Parent != "" {
		if err := validID(meta.Parent); err != nil {
			return nil, err
		}
	}
	created := meta.CreatedAt
	if created.IsZero() {
		created = s.now()
	}

	// Shared lock for the whole ingest: GC must not sweep chunks this Put
	// found already stored (and so did not write) before its manifest
	// references them.
	s.mu.RLock()
	defer s.mu.RUnlock()
	if _, err := os.Lstat(s.manifestPath(id)); err == nil {
		return nil, fmt.Errorf("snapshot %s already exists: %w", id, errdefs.ErrConflict)
	}

	p := s.newPutter(ctx, meta.Scope)
	entries, err := fill(p)
	if ferr := p.finish(); err == nil {
		err = ferr
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", id, err)
	}
	sortEntries(entries)
	m := &Manifest{
		Info: Info{
			Version:   FormatVersion,
			ID:        id,
			Kind:      kind,
			Name:      meta.Name,
			Parent:    meta.Parent,
			Labels:    meta.Labels,
			CreatedAt: created.UTC(),
			BytesNew:  p.bytesNew.Load(),
		},
		Entries: entries,
	}
	m.BytesTotal = bytesTotal(entries)
	if err := s.commitManifest(m); err != nil {
		return nil, err
	}
	return m, nil
}

func bytesTotal(es []FileEntry) int64 {
	var n int64
	for _, e := range es {
		if e.Type == TypeFile {
			n += e.Size
		}
	}
	return n
}

// putter is one ingest session: it chunks file contents, dedups against
// the store and compresses and writes new chunks on a pool of workers.
type putter struct {
	s     *Store
	ctx   context.Context
	ck    *chunker
	scope string     // dedup scope of every chunk this Put stores
	key   []byte     // scope's key (nil: shared)
	addr  *addresser // the producer's

	seen map[string]bool // digests handled in this session (producer only)
	jobs chan chunkJob
	wg   sync.WaitGroup

	bytesNew atomic.Int64
	mu       sync.Mutex
	err      error               // first worker error
	dirty    map[string]struct{} // chunk dirs to sync: that gained entries, or hold unsynced ones it uses
	renames  map[string]int      // chunks this Put renamed, per dir (Store.unsynced)
}

type chunkJob struct {
	digest string
	data   *[]byte // from bufPool
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, maxChunk+maxChunk/8); return &b }}

func (s *Store) newPutter(ctx context.Context, scope string) *putter {
	key := s.scopes.key(scope)
	p := &putter{
		s:       s,
		ctx:     ctx,
		ck:      newChunker(nil),
		scope:   scope,
		key:     key,
		addr:    newAddresser(key),
		seen:    map[string]bool{},
		jobs:    make(chan chunkJob, s.workers),
		dirty:   map[string]struct{}{},
		renames: map[string]int{},
	}
	for range s.workers {
		p.wg.Add(1)
		go p.worker()
	}
	return p
}

func (p *putter) worker() {
	defer p.wg.Done()
	for j := range p.jobs {
		if p.failed() == nil {
			out := bufPool.Get().(*[]byte)
			comp := p.s.enc.EncodeAll(*j.data, (*out)[:0])
			if err := p.s.writeChunk(j.digest, comp); err != nil {
				p.fail(fmt.Errorf("store chunk: %w", err))
			} else {
				p.bytesNew.Add(int64(len(comp)))
				p.s.renamed(j.digest[:2])
				p.mu.Lock()
				p.dirty[j.digest[:2]] = struct{}{}
				p.renames[j.digest[:2]]++
				p.mu.Unlock()
			}
			*out = comp[:0]
			bufPool.Put(out)
		}
		bufPool.Put(j.data)
	}
}

func (p *putter) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
}

func (p *putter) failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// finish waits for the workers and makes the new chunks' directory entries
// durable, so that a manifest committed after it never names a chunk a
// crash could lose.
func (p *putter) finish() error {
	close(p.jobs)
	p.wg.Wait()
	if err := p.failed(); err != nil {
		return err
	}
	if len(p.dirty) == 0 {
		return nil
	}
	for d := range p.dirty {
		if err := syncDir(filepath.Join(p.s.root, chunksDir, d)); err != nil {
			return fmt.Errorf("store chunk: %w", err)
		}
	}
	if err := syncDir(filepath.Join(p.s.root, chunksDir)); err != nil { // new <2 hex> dirs
		return err
	}
	for d, n := range p.renames {
		p.s.synced(d, n)
	}
	return nil
}

// hashWindow is how many of a file's chunks may be hashed on other
// goroutines while the next ones are cut.
const hashWindow = 4

// hashing is one chunk being hashed off the producer: a copy of its data
// and, once done is closed, its digest.
type hashing struct {
	idx    int
	data   *[]byte // from bufPool
	digest string
	done   chan struct{}
}

// content chunks r and returns its chunk list and length.
//
// Cutting and hashing each cost about as much as the other, so they run
// side by side: every chunk but a file's last is copied and hashed on its
// own goroutine (at most hashWindow at a time) while the next is cut, and
// is stored or found in order afterwards. The last chunk, for most files
// the only one, is hashed in place without a copy.
func (p *putter) content(r io.Reader) (refs []ChunkRef, size int64, err error) {
	p.ck.reset(r)
	var window []*hashing
	defer func() { // on an early return: wait for the hashers, then reuse their buffers
		for _, h := range window {
			<-h.done
			bufPool.Put(h.data)
		}
	}()
	settle := func() error {
		h := window[0]
		window = window[1:]
		<-h.done
		refs[h.idx].Digest = h.digest
		return p.keep(h.digest, *h.data, h.data)
	}
	for {
		if err := p.ctx.Err(); err != nil {
			return nil, 0, err
		}
		if err := p.failed(); err != nil {
			return nil, 0, err
		}
		data, err := p.ck.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, 0, err
		}
		refs = append(refs, ChunkRef{Size: int64(len(data)), Scope: p.scope})
		size += int64(len(data))
		if p.ck.drained() {
			d := p.addr.of(data)
			refs[len(refs)-1].Digest = d
			if err := p.keep(d, data, nil); err != nil {
				return nil, 0, err
			}
			continue
		}
		buf := bufPool.Get().(*[]byte)
		*buf = append((*buf)[:0], data...)
		h := &hashing{idx: len(refs) - 1, data: buf, done: make(chan struct{})}
		go func() {
			h.digest = newAddresser(p.key).of(*h.data)
			close(h.done)
		}()
		window = append(window, h)
		if len(window) == hashWindow {
			if err := settle(); err != nil {
				return nil, 0, err
			}
		}
	}
	for len(window) > 0 {
		if err := settle(); err != nil {
			return nil, 0, err
		}
	}
	return refs, size, nil
}

// keep stores chunk d unless this session or the store already has it.
// buf, if not nil, holds data and comes from bufPool: keep takes it over.
func (p *putter) keep(d string, data []byte, buf *[]byte) error {
	if p.seen[d] || p.s.hasChunk(d) {
		if !p.seen[d] && p.s.isUnsynced(d[:2]) {
			// Another Put's chunk whose directory is not durable yet.
			p.mu.Lock()
			p.dirty[d[:2]] = struct{}{}
			p.mu.Unlock()
		}
		p.seen[d] = true
		if buf != nil {
			bufPool.Put(buf)
		}
		return nil // dedup: already stored
	}
	p.seen[d] = true
	if buf == nil {
		buf = bufPool.Get().(*[]byte)
		*buf = append((*buf)[:0], data...)
	}
	select {
	case p.jobs <- chunkJob{digest: d, data: buf}:
		return nil
	case <-p.ctx.Done():
		bufPool.Put(buf)
		return p.ctx.Err()
	}
}

// readTar turns a tar stream into entries, storing file contents.
func (p *putter) readTar(r io.Reader) ([]FileEntry, error) {
	tr := tar.NewReader(r)
	var entries []FileEntry
	index := map[string]int{}
	opaque := map[string]*tar.Header{}
	add := func(e FileEntry) {
		if i, ok := index[e.Path]; ok {
			entries[i] = e
			return
		}
		index[e.Path] = len(entries)
		entries = append(entries, e)
	}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, tarError(err)
		}
		p0, err := cleanPath(hdr.Name)
		if err != nil {
			return nil, err
		}
		if p0 == "" || hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		dir, base := path.Split(p0)
		dir = strings.TrimSuffix(dir, "/")
		e := FileEntry{
			Path:    p0,
			Mode:    uint32(hdr.Mode) & 0o7777,
			UID:     hdr.Uid,
			GID:     hdr.Gid,
			ModTime: hdr.ModTime.UTC(),
		}
		xattrs, isOpaque, isWhiteout := splitXattrs(hdr.PAXRecords)
		e.Xattrs = xattrs

		switch {
		case base == opaqueMarker:
			if dir == "" {
				continue // the root has no entry to make opaque
			}
			if _, ok := opaque[dir]; !ok {
				opaque[dir] = hdr
			}
			continue
		case strings.HasPrefix(base, whiteoutPrefix):
			name := base[len(whiteoutPrefix):]
			if name == "" || name == "." || name == ".." {
				return nil, errdefs.InvalidArgument("bad whiteout %q", hdr.Name)
			}
			e.Path = path.Join(dir, name)
			e.Type, e.Mode, e.Xattrs = TypeWhiteout, 0, nil
			add(e)
			continue
		}

		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeGNUSparse: // the reader already maps TypeRegA
			if isWhiteout && hdr.Size == 0 {
				e.Type, e.Mode, e.Xattrs = TypeWhiteout, 0, nil
				break
			}
			e.Type = TypeFile
			chunks, n, err := p.content(tr)
			if err != nil {
				return nil, tarError(err)
			}
			e.Chunks, e.Size = chunks, n
		case tar.TypeDir:
			e.Type = TypeDir
			if isOpaque {
				opaque[p0] = hdr
			}
		case tar.TypeSymlink:
			e.Type, e.Link = TypeSymlink, hdr.Linkname
		case tar.TypeLink:
			target, err := cleanPath(hdr.Linkname)
			if err != nil || target == "" {
				return nil, errdefs.InvalidArgument("bad hardlink %q -> %q", hdr.Name, hdr.Linkname)
			}
			e.Type, e.Link = TypeHardlink, target
			if i, ok := index[target]; ok && entries[i].Type == TypeWhiteout {
				// Every overlay whiteout is the same 0:0 device inode,
				// so tar writers (runsc's among them) emit all but the
				// first as hard links to it: a deletion all the same.
				e.Type, e.Link, e.Mode, e.Xattrs = TypeWhiteout, "", 0, nil
				break
			}
			if i, ok := index[target]; ok && (entries[i].Type == TypeFile || entries[i].Type == TypeHardlink) {
				e.Size, e.Chunks = entries[i].Size, entries[i].Chunks
				if entries[i].Type == TypeHardlink {
					e.Link = entries[i].Link // point at the file itself
				}
			}
		case tar.TypeChar:
			if hdr.Devmajor == 0 && hdr.Devminor == 0 {
				e.Type, e.Mode, e.Xattrs = TypeWhiteout, 0, nil // overlayfs whiteout
				break
			}
			e.Type, e.Devmajor, e.Devminor = TypeChar, hdr.Devmajor, hdr.Devminor
		case tar.TypeBlock:
			e.Type, e.Devmajor, e.Devminor = TypeBlock, hdr.Devmajor, hdr.Devminor
		case tar.TypeFifo:
			e.Type = TypeFifo
		default:
			continue // nothing a filesystem snapshot can hold
		}
		add(e)
	}
	for dir, hdr := range opaque {
		if i, ok := index[dir]; ok && entries[i].IsDir() {
			entries[i].Type = TypeOpaque
			continue
		}
		// The marker came without (or after a non-directory at) its
		// directory: an opaque directory with the marker's ownership.
		add(FileEntry{Path: dir, Type: TypeOpaque, Mode: 0o755, UID: hdr.Uid, GID: hdr.Gid, ModTime: hdr.ModTime.UTC()})
	}
	return entries, nil
}

// splitXattrs pulls the xattrs out of PAX records, removing the overlay
// ones, which become entry types instead.
func splitXattrs(recs map[string]string) (xattrs map[string]string, opaque, whiteout bool) {
	for k, v := range recs {
		name, ok := strings.CutPrefix(k, paxXattr)
		if !ok {
			continue
		}
		switch {
		case contains(opaqueXattrs, name):
			opaque = opaque || v == "y"
		case contains(whiteoutXattrs, name):
			whiteout = true
		case strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay."):
			// overlay bookkeeping (origin, redirect, ...): meaningless elsewhere
		default:
			if xattrs == nil {
				xattrs = map[string]string{}
			}
			xattrs[name] = v
		}
	}
	return xattrs, opaque, whiteout
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func tarError(err error) error {
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, tar.ErrFieldTooLong) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("read tar: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("read tar: %w", err)
}

// readDir walks root and turns it into entries, storing file contents.
func (p *putter) readDir(root string) ([]FileEntry, error) {
	type inode struct{ dev, ino uint64 }
	links := map[inode]int{} // first path of a multiply-linked file -> entry index
	var entries []FileEntry
	err := filepath.WalkDir(root, func(fp string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := p.ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(root, fp)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat data", fp)
		}
		e := FileEntry{
			Path:    filepath.ToSlash(rel),
			Mode:    unixMode(fi.Mode()),
			UID:     int(st.Uid),
			GID:     int(st.Gid),
			ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC(),
		}
		switch fi.Mode().Type() {
		case 0:
			key := inode{uint64(st.Dev), st.Ino}
			if st.Nlink > 1 {
				if i, ok := links[key]; ok {
					e.Type, e.Link = TypeHardlink, entries[i].Path
					e.Size, e.Chunks = entries[i].Size, entries[i].Chunks
					break
				}
				links[key] = len(entries)
			}
			f, err := os.Open(fp)
			if err != nil {
				return err
			}
			chunks, n, err := p.content(f)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", fp, err)
			}
			e.Type, e.Chunks, e.Size = TypeFile, chunks, n
		case fs.ModeDir:
			e.Type = TypeDir
		case fs.ModeSymlink:
			target, err := os.Readlink(fp)
			if err != nil {
				return err
			}
			e.Type, e.Link = TypeSymlink, target
		case fs.ModeNamedPipe:
			e.Type = TypeFifo
		case fs.ModeDevice | fs.ModeCharDevice:
			e.Type, e.Devmajor, e.Devminor = TypeChar, int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		case fs.ModeDevice:
			e.Type, e.Devmajor, e.Devminor = TypeBlock, int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		default:
			return nil // sockets and the like
		}
		entries = append(entries, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return entries, nil
}

// unixMode converts fs.FileMode permission and special bits to 07777 form.
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// fileMode is the inverse of unixMode for the permission and special bits.
func fileMode(u uint32) fs.FileMode {
	m := fs.FileMode(u & 0o777)
	if u&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if u&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if u&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}
