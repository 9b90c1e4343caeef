// Package snapshot owns differential, content-addressed snapshot storage:
// a chunk store, the manifests that describe snapshots, their layering,
// reading and restoring them, garbage collection and retention.
//
// It is a pure library with no knowledge of sandboxes. The sandbox service
// feeds it two kinds of snapshot:
//
//   - files: a sandbox's writable overlay layer as a tar stream (PutTar),
//     with deletions as overlay whiteouts; Merge/Resolve lay it over a base
//     (the template's own manifest, made once with PutDir) to give the full
//     filesystem view.
//   - checkpoint: a directory of runtime image files (PutDir), restored with
//     MaterializeDir.
//
// # Storage layout
//
//	<root>/LOCK                   flock held by the one process that owns the store
//	<root>/KEY                    master key of the dedup scopes (address.go), 0600
//	<root>/chunks/<2 hex>/<addr>  zstd-compressed chunk; the name is its address:
//	                              the SHA-256 of the uncompressed bytes in the
//	                              shared scope, an HMAC-SHA256 keyed per scope
//	                              in any other
//	<root>/manifests/<id>.json    one committed snapshot
//
// Files are cut into chunks with content-defined chunking (FastCDC-style gear
// hashing, min 256 KiB, average ~1 MiB, max 4 MiB), so unchanged data, even
// after an insertion earlier in a file, maps to chunks already stored, but
// only to chunks of the same dedup scope (Meta.Scope): one tenant's Put never
// learns what another tenant stored.
//
// # Crash safety
//
// Every file is written to a dot-prefixed "*.tmp" file in its final
// directory, fsynced and renamed into place (a manifest is hard-linked
// instead, so an existing snapshot is never replaced). A Put fsyncs the
// chunk directories it added to once, before it commits its manifest, and
// then the manifest directory. A snapshot exists only once its manifest is
// in place; chunks written by an interrupted Put are garbage that GC
// removes, and temp files are never read as snapshots.
//
// Every manifest lists all of its chunks: snapshots share chunks but never
// depend on one another, so deleting any of them is always safe.
//
// # Concurrency
//
// One process owns a store directory: New takes an exclusive flock on
// <root>/LOCK and fails with errdefs.ErrUnavailable if another holder has
// it. Within the process a Store is safe for concurrent use: Puts, reads and
// Delete share a store-wide RW lock, GC takes it exclusively, so a sweep
// never sees a half-written snapshot.
package snapshot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/errdefs"
)

const (
	chunksDir    = "chunks"
	manifestsDir = "manifests"
	lockName     = "LOCK"
	tmpSuffix    = ".tmp"

	// DefaultStaleTempAge is how old a leftover temp file must be before GC
	// removes it.
	DefaultStaleTempAge = time.Hour
)

// Store is a snapshot store rooted at one directory. Create it with New and
// release it with Close.
type Store struct {
	root string
	lock *os.File // holds the flock on <root>/LOCK

	// mu orders GC (exclusive) against everything that writes or reads
	// chunks (shared).
	mu sync.RWMutex

	enc *zstd.Encoder
	dec *zstd.Decoder

	cache manifestCache

	// scopes derives the per-scope chunk address keys (address.go).
	scopes scopeKeys

	now          func() time.Time
	staleTempAge time.Duration
	workers      int

	// beforeCommit, when set (tests only), runs just before a manifest is
	// committed; an error aborts the Put as a crash would.
	beforeCommit func(id string) error

	// unsynced counts, per chunk directory, the chunks renamed into it
	// whose Put has not made the directory durable yet (or never will:
	// it failed). A Put that deduplicates against a chunk in such a
	// directory syncs it too before its manifest is committed: the chunk
	// it names could otherwise be lost to a crash that keeps the manifest.
	unsyncedMu sync.Mutex
	unsynced   map[string]int
}

// renamed notes a chunk renamed into directory dir (not yet synced).
func (s *Store) renamed(dir string) {
	s.unsyncedMu.Lock()
	if s.unsynced == nil {
		s.unsynced = map[string]int{}
	}
	s.unsynced[dir]++
	s.unsyncedMu.Unlock()
}

// synced notes that n chunks renamed into dir were made durable.
func (s *Store) synced(dir string, n int) {
	s.unsyncedMu.Lock()
	if s.unsynced[dir] -= n; s.unsynced[dir] <= 0 {
		delete(s.unsynced, dir)
	}
	s.unsyncedMu.Unlock()
}

// isUnsynced reports whether directory dir may hold chunks not yet durable.
func (s *Store) isUnsynced(dir string) bool {
	s.unsyncedMu.Lock()
	defer s.unsyncedMu.Unlock()
	return s.unsynced[dir] > 0
}

// Option configures a Store.
type Option func(*Store)

// WithClock sets the clock used for CreatedAt defaults and stale temp file
// ages (default time.Now).
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// WithStaleTempAge sets how old a temp file must be before GC removes it
// (default DefaultStaleTempAge).
func WithStaleTempAge(d time.Duration) Option { return func(s *Store) { s.staleTempAge = d } }

// WithWorkers sets how many goroutines compress and write new chunks during
// a Put (default GOMAXPROCS).
func WithWorkers(n int) Option {
	return func(s *Store) {
		if n > 0 {
			s.workers = n
		}
	}
}

// New opens the store rooted at root, creating its layout if needed, and
// takes the store's process lock. It fails with errdefs.ErrUnavailable if
// another process (or another open Store) holds the lock.
func New(root string, opts ...Option) (*Store, error) {
	if root == "" {
		return nil, errdefs.InvalidArgument("snapshot store: empty root")
	}
	s := &Store{
		root:         root,
		now:          time.Now,
		staleTempAge: DefaultStaleTempAge,
		workers:      runtime.GOMAXPROCS(0),
	}
	for _, o := range opts {
		o(s)
	}
	for _, d := range []string{root, filepath.Join(root, chunksDir), filepath.Join(root, manifestsDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("snapshot store: %w", err)
		}
	}
	f, err := os.OpenFile(filepath.Join(root, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("snapshot store %s is in use by another process: %w", root, errdefs.ErrUnavailable)
		}
		return nil, fmt.Errorf("snapshot store: lock %s: %w", root, err)
	}
	s.lock = f
	if s.scopes.master, err = loadKey(root); err != nil {
		f.Close()
		return nil, fmt.Errorf("snapshot store: master key: %w", err)
	}
	// EncodeAll/DecodeAll are safe for concurrent use; the encoder's own
	// goroutines are not needed because Put compresses chunks in parallel.
	s.enc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1), zstd.WithLowerEncoderMem(true))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("snapshot store: zstd: %w", err)
	}
	s.dec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(2*maxChunk))
	if err != nil {
		s.enc.Close()
		f.Close()
		return nil, fmt.Errorf("snapshot store: zstd: %w", err)
	}
	return s, nil
}

// Close releases the store's process lock. The Store must not be used after.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lock == nil {
		return nil
	}
	s.enc.Close()
	s.dec.Close()
	err := s.lock.Close() // closing the descriptor drops the flock
	s.lock = nil
	return err
}

// Root returns the store's root directory.
func (s *Store) Root() string { return s.root }

var idRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$`)

// validID reports whether id can name a manifest file: no path separators,
// no leading dot (temp files start with one) and no ".tmp" suffix.
func validID(id string) error {
	if !idRE.MatchString(id) || len(id) > 4 && id[len(id)-4:] == tmpSuffix {
		return errdefs.InvalidArgument("invalid snapshot id %q", id)
	}
	return nil
}

func (s *Store) manifestPath(id string) string {
	return filepath.Join(s.root, manifestsDir, id+".json")
}

// writeTemp writes data to a fresh temp file in dir and fsyncs it; the
// caller renames or links it into place. Nothing is left behind on error.
func writeTemp(dir, name string, data []byte) (string, error) {
	f, err := os.CreateTemp(dir, "."+name+".*"+tmpSuffix)
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// isTemp reports whether a directory entry name is a temp file.
func isTemp(name string) bool {
	return len(name) > 0 && name[0] == '.' && filepath.Ext(name) == tmpSuffix
}
