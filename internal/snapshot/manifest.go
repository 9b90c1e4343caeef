package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/spacesandbox/space/internal/errdefs"
)

// FormatVersion is the manifest format written by this package. Version 2
// added ChunkRef.Scope; a version-1 manifest has none, so all its chunks
// read as SharedScope (plain SHA-256 addresses), which is what they are.
const FormatVersion = 2

// Kind says what a snapshot holds.
type Kind string

const (
	// KindFiles is a filesystem: a full tree (PutDir of a template rootfs)
	// or an overlay upper layer (PutTar) to Merge over one.
	KindFiles Kind = "files"
	// KindCheckpoint is a directory of runtime checkpoint image files.
	KindCheckpoint Kind = "checkpoint"
)

// EntryType is the type of a manifest entry.
type EntryType string

const (
	TypeFile     EntryType = "file"
	TypeDir      EntryType = "dir"
	TypeSymlink  EntryType = "symlink"
	TypeHardlink EntryType = "hardlink" // Link names the other path; Size and Chunks are copied from it
	// TypeWhiteout marks a path deleted in this layer (overlay upper only).
	TypeWhiteout EntryType = "whiteout"
	// TypeOpaque is a directory that hides everything beneath it in lower
	// layers (overlay upper only); otherwise it is a TypeDir.
	TypeOpaque EntryType = "opaque"
	TypeFifo   EntryType = "fifo"
	TypeChar   EntryType = "char"
	TypeBlock  EntryType = "block"
)

// ChunkRef is one chunk of a file's content, in order.
type ChunkRef struct {
	// Digest is the chunk's address: the hex SHA-256 of the uncompressed
	// bytes in SharedScope, their HMAC-SHA256 under the scope's key in
	// any other (address.go).
	Digest string `json:"digest"`
	Size   int64  `json:"size"` // uncompressed
	// Scope is the dedup scope the chunk was stored in.
	Scope string `json:"scope,omitempty"`
}

// FileEntry is one path in a snapshot.
type FileEntry struct {
	// Path is slash-separated and relative to the snapshot root, without a
	// leading "/" or "./" and never containing "..". The root itself has no
	// entry.
	Path    string    `json:"path"`
	Type    EntryType `json:"type"`
	Mode    uint32    `json:"mode"` // permission bits plus setuid/setgid/sticky (07777)
	UID     int       `json:"uid"`
	GID     int       `json:"gid"`
	ModTime time.Time `json:"mtime"`
	Size    int64     `json:"size,omitempty"`
	// Link is the target of a symlink, or the path a hardlink points to.
	Link     string            `json:"link,omitempty"`
	Devmajor int64             `json:"devmajor,omitempty"`
	Devminor int64             `json:"devminor,omitempty"`
	Xattrs   map[string]string `json:"xattrs,omitempty"`
	Chunks   []ChunkRef        `json:"chunks,omitempty"`
}

// IsDir reports whether the entry is a directory (opaque ones included).
func (e FileEntry) IsDir() bool { return e.Type == TypeDir || e.Type == TypeOpaque }

// Info is a snapshot's metadata: the manifest without its entries.
type Info struct {
	Version   int               `json:"version"`
	ID        string            `json:"id"`
	Kind      Kind              `json:"kind"`
	Name      string            `json:"name,omitempty"`
	Parent    string            `json:"parent,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	// BytesTotal is the sum of the sizes of the regular files (hardlinks
	// not counted twice).
	BytesTotal int64 `json:"bytes_total"`
	// BytesNew is the compressed bytes this snapshot added to the store:
	// chunks that were not stored before. Zero for views made by Merge.
	BytesNew int64 `json:"bytes_new"`
}

// SnapInfo returns what retention (Thin) needs to know about i.
func (i Info) SnapInfo() SnapInfo {
	return SnapInfo{ID: i.ID, CreatedAt: i.CreatedAt, Kind: i.Kind, Named: i.Name != ""}
}

// Manifest describes one snapshot. Entries are sorted by path with
// comparePath, so a directory comes right before everything beneath it.
// A Manifest is a value: nothing here mutates one after it is returned.
type Manifest struct {
	Info
	Entries []FileEntry `json:"entries"` // last, so List can stop reading before it
}

// Meta is what the caller says about a snapshot being created.
type Meta struct {
	// Kind defaults to KindFiles for PutTar and KindCheckpoint for PutDir.
	Kind   Kind
	Parent string
	// Name marks a named (user-kept) snapshot; see Thin.
	Name      string
	Labels    map[string]string
	CreatedAt time.Time // default: the store's clock
	// Scope is the dedup scope of the chunks this Put stores: it dedups
	// only against chunks of the same scope (a tenant's: BytesNew then
	// says nothing about what other tenants stored). SharedScope, the
	// default, is for data every tenant may share, such as templates.
	Scope string
}

// comparePath orders paths so that a directory sorts immediately before
// its descendants: "/" sorts below every other byte.
func comparePath(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		ca, cb := a[i], b[i]
		if ca == cb {
			continue
		}
		if ca == '/' {
			return -1
		}
		if cb == '/' {
			return 1
		}
		if ca < cb {
			return -1
		}
		return 1
	}
	return len(a) - len(b)
}

// isUnder reports whether p is strictly beneath dir ("" is the root).
func isUnder(p, dir string) bool {
	if dir == "" {
		return p != ""
	}
	return len(p) > len(dir) && p[len(dir)] == '/' && p[:len(dir)] == dir
}

// cleanPath normalizes a path from a tar header, a directory walk or a
// caller: slash-separated, relative, no "." or ".." elements. The root is
// "". A path that climbs above the root is rejected.
func cleanPath(p string) (string, error) {
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return "", errdefs.InvalidArgument("path %q leaves the snapshot root", p)
		}
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errdefs.InvalidArgument("path %q contains NUL", p)
	}
	c := path.Clean("/" + p)
	return strings.TrimPrefix(c, "/"), nil
}

// find returns the index of the entry at p in m's sorted entries.
func (m *Manifest) find(p string) (int, bool) {
	return slices.BinarySearchFunc(m.Entries, p, func(e FileEntry, p string) int { return comparePath(e.Path, p) })
}

// Lookup returns the entry at p (any form accepted by cleanPath).
func (m *Manifest) Lookup(p string) (FileEntry, bool) {
	c, err := cleanPath(p)
	if err != nil {
		return FileEntry{}, false
	}
	i, ok := m.find(c)
	if !ok {
		return FileEntry{}, false
	}
	return m.Entries[i], true
}

// subtree returns the index range [i, j) of the entries at or beneath p.
func (m *Manifest) subtree(p string) (int, int) {
	if p == "" {
		return 0, len(m.Entries)
	}
	i, _ := m.find(p)
	j := i
	for j < len(m.Entries) && (m.Entries[j].Path == p || isUnder(m.Entries[j].Path, p)) {
		j++
	}
	return i, j
}

func sortEntries(es []FileEntry) {
	slices.SortStableFunc(es, func(a, b FileEntry) int { return comparePath(a.Path, b.Path) })
}

// commitManifest writes m as <id>.json atomically. A hard link (not a
// rename) moves it into place so that an existing snapshot with the same
// id is never replaced: that is errdefs.ErrConflict.
func (s *Store) commitManifest(m *Manifest) error {
	data, err := json.Marshal(wireOf(m))
	if err != nil {
		return fmt.Errorf("snapshot %s: encode manifest: %w", m.ID, err)
	}
	dir := filepath.Join(s.root, manifestsDir)
	tmp, err := writeTemp(dir, m.ID+".json", data)
	if err != nil {
		return fmt.Errorf("snapshot %s: write manifest: %w", m.ID, err)
	}
	defer os.Remove(tmp)
	if s.beforeCommit != nil {
		if err := s.beforeCommit(m.ID); err != nil {
			return err
		}
	}
	if err := os.Link(tmp, s.manifestPath(m.ID)); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("snapshot %s already exists: %w", m.ID, errdefs.ErrConflict)
		}
		return fmt.Errorf("snapshot %s: commit manifest: %w", m.ID, err)
	}
	os.Remove(tmp)
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("snapshot %s: commit manifest: %w", m.ID, err)
	}
	return nil
}

// Open returns the manifest of snapshot id, or errdefs.ErrNotFound.
// Recently opened manifests are cached (a template's can hold tens of
// thousands of entries): the result is shared and must be treated as
// read-only.
func (s *Store) Open(id string) (*Manifest, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	if m := s.cache.get(id); m != nil {
		return m, nil
	}
	m, err := s.load(id)
	if err != nil {
		return nil, err
	}
	s.cache.put(id, m)
	return m, nil
}

// load reads and decodes a manifest file.
func (s *Store) load(id string) (*Manifest, error) {
	data, err := os.ReadFile(s.manifestPath(id))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, errdefs.NotFound("snapshot %s not found", id)
		}
		return nil, fmt.Errorf("snapshot %s: %w", id, err)
	}
	var w manifestWire
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, fmt.Errorf("snapshot %s: bad manifest: %v: %w", id, err, ErrCorrupt)
	}
	m, err := w.manifest()
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: bad manifest: %v: %w", id, err, ErrCorrupt)
	}
	if m.ID != id {
		return nil, fmt.Errorf("snapshot %s: manifest names %q: %w", id, m.ID, ErrCorrupt)
	}
	return m, nil
}

// List returns every committed snapshot's Info, oldest first (ties by ID).
// Only the header of each manifest is decoded.
func (s *Store) List() ([]Info, error) {
	ids, err := s.manifestIDs()
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(ids))
	for _, id := range ids {
		info, err := s.readInfo(id)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b Info) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// manifestIDs lists the ids of committed manifests; temp files and
// anything else that is not "<valid id>.json" are ignored.
func (s *Store) manifestIDs() ([]string, error) {
	des, err := os.ReadDir(filepath.Join(s.root, manifestsDir))
	if err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	var ids []string
	for _, de := range des {
		name := de.Name()
		id, ok := strings.CutSuffix(name, ".json")
		if !ok || !de.Type().IsRegular() || validID(id) != nil {
			continue
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// readInfo decodes a manifest up to its entries.
func (s *Store) readInfo(id string) (Info, error) {
	f, err := os.Open(s.manifestPath(id))
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	fields := map[string]json.RawMessage{}
	bad := func(err error) (Info, error) {
		return Info{}, fmt.Errorf("snapshot %s: bad manifest: %v: %w", id, err, ErrCorrupt)
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return bad(fmt.Errorf("not an object"))
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return bad(err)
		}
		key, _ := tok.(string)
		if key == "entries" {
			break
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return bad(err)
		}
		fields[key] = raw
	}
	hdr, _ := json.Marshal(fields)
	var info Info
	if err := json.Unmarshal(hdr, &info); err != nil {
		return bad(err)
	}
	if info.ID != id {
		return bad(fmt.Errorf("manifest names %q", info.ID))
	}
	return info, nil
}

// Delete removes snapshot id. Its chunks stay until GC finds them
// unreferenced. A missing snapshot is errdefs.ErrNotFound.
func (s *Store) Delete(id string) error {
	if err := validID(id); err != nil {
		return err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	s.cache.drop(id)
	if err := os.Remove(s.manifestPath(id)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return errdefs.NotFound("snapshot %s not found", id)
		}
		return fmt.Errorf("snapshot %s: delete: %w", id, err)
	}
	if err := syncDir(filepath.Join(s.root, manifestsDir)); err != nil {
		return fmt.Errorf("snapshot %s: delete: %w", id, err)
	}
	return nil
}

// manifestCache keeps the last few decoded manifests. Committed manifests
// never change (ids are never reused while one exists), and this process
// alone writes the store, so an entry is valid until Delete drops it.
type manifestCache struct {
	mu    sync.Mutex
	order []string // least recently used first
	byID  map[string]*Manifest
}

const manifestCacheSize = 16

func (c *manifestCache) get(id string) *Manifest {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.byID[id]
	if m != nil {
		c.touchLocked(id)
	}
	return m
}

func (c *manifestCache) put(id string, m *Manifest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byID == nil {
		c.byID = map[string]*Manifest{}
	}
	if _, ok := c.byID[id]; !ok && len(c.order) == manifestCacheSize {
		delete(c.byID, c.order[0])
		c.order = c.order[1:]
	}
	c.byID[id] = m
	c.touchLocked(id)
}

func (c *manifestCache) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.byID, id)
	c.order = slices.DeleteFunc(c.order, func(x string) bool { return x == id })
}

func (c *manifestCache) touchLocked(id string) {
	c.order = slices.DeleteFunc(c.order, func(x string) bool { return x == id })
	c.order = append(c.order, id)
}

// manifestWire is a manifest as stored. JSON strings carry only UTF-8, so
// a path or link target that is not (a file named "\xff" is legal) would
// be written with U+FFFD in its place, and a restore would make a file of
// another name and remove the real one: RawNames keeps the exact bytes of
// those, by entry index. Entries stays last (List stops before it).
type manifestWire struct {
	Info
	RawNames map[int]rawName `json:"raw_names,omitempty"`
	Entries  []FileEntry     `json:"entries"`
}

// rawName holds the exact bytes of an entry's path and link (base64 in
// JSON), each only when it is not valid UTF-8.
type rawName struct {
	Path []byte `json:"path,omitempty"`
	Link []byte `json:"link,omitempty"`
}

func wireOf(m *Manifest) manifestWire {
	w := manifestWire{Info: m.Info, Entries: m.Entries}
	for i, e := range m.Entries {
		pathOK, linkOK := utf8.ValidString(e.Path), utf8.ValidString(e.Link)
		if pathOK && linkOK {
			continue
		}
		var rn rawName
		if !pathOK {
			rn.Path = []byte(e.Path)
		}
		if !linkOK {
			rn.Link = []byte(e.Link)
		}
		if w.RawNames == nil {
			w.RawNames = map[int]rawName{}
		}
		w.RawNames[i] = rn
	}
	return w
}

func (w *manifestWire) manifest() (*Manifest, error) {
	for i, rn := range w.RawNames {
		if i < 0 || i >= len(w.Entries) {
			return nil, fmt.Errorf("raw name of entry %d of %d", i, len(w.Entries))
		}
		if rn.Path != nil {
			w.Entries[i].Path = string(rn.Path)
		}
		if rn.Link != nil {
			w.Entries[i].Link = string(rn.Link)
		}
	}
	return &Manifest{Info: w.Info, Entries: w.Entries}, nil
}
