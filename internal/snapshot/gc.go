package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// CorruptError reports the chunks of a snapshot that failed verification.
// It matches ErrCorrupt and errdefs.ErrInternal with errors.Is.
type CorruptError struct {
	ID  string
	Bad []BadChunk
}

// BadChunk is one chunk that is missing or does not match its digest.
type BadChunk struct {
	Digest string
	Paths  []string // the entries that use it
	Err    error
}

func (e *CorruptError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "snapshot %s: %d corrupt chunk(s)", e.ID, len(e.Bad))
	for i, c := range e.Bad {
		if i == 3 {
			fmt.Fprintf(&b, "; ...")
			break
		}
		fmt.Fprintf(&b, "; %v (used by %s)", c.Err, strings.Join(c.Paths, ", "))
	}
	return b.String()
}

func (e *CorruptError) Unwrap() []error { return []error{ErrCorrupt, errdefs.ErrInternal} }

// Verify re-reads and re-hashes every chunk that snapshot id references.
// It returns nil if all are intact, a *CorruptError listing the bad ones
// otherwise, errdefs.ErrNotFound if id does not exist.
func (s *Store) Verify(ctx context.Context, id string) error {
	m, err := s.Open(id)
	if err != nil {
		return err
	}
	users := map[string][]string{}
	var order []ChunkRef
	for _, e := range m.Entries {
		for _, c := range e.Chunks {
			if _, ok := users[c.Digest]; !ok {
				order = append(order, c)
			}
			if u := users[c.Digest]; len(u) == 0 || u[len(u)-1] != e.Path {
				users[c.Digest] = append(u, e.Path)
			}
		}
	}
	cerr := &CorruptError{ID: id}
	buf := make([]byte, 0, maxChunk)
	for _, c := range order {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := s.chunk(c, buf); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				return fmt.Errorf("verify %s: %w", id, err)
			}
			cerr.Bad = append(cerr.Bad, BadChunk{Digest: c.Digest, Paths: users[c.Digest], Err: err})
		}
	}
	if len(cerr.Bad) > 0 {
		return cerr
	}
	return nil
}

// GCStats reports what a GC pass did.
type GCStats struct {
	Manifests     int   // snapshots whose chunks were kept
	ChunksKept    int   //
	ChunksRemoved int   //
	BytesFreed    int64 // compressed bytes of removed chunks
	TempsRemoved  int   // stale temp files from interrupted writes
}

// GC deletes every chunk no committed manifest references and temp files
// older than the stale-temp age (WithStaleTempAge). It holds the store's
// lock exclusively, so it waits for running Puts and they wait for it. If
// any manifest cannot be read GC removes nothing and returns the error:
// better to keep garbage than to lose a snapshot's data.
func (s *Store) GC(ctx context.Context) (GCStats, error) {
	if err := s.lockForGC(ctx); err != nil {
		return GCStats{}, err
	}
	defer s.mu.Unlock()
	var st GCStats

	// Mark.
	ids, err := s.manifestIDs()
	if err != nil {
		return st, err
	}
	live := map[string]bool{}
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		m := s.cache.get(id)
		if m == nil {
			var err error
			if m, err = s.load(id); err != nil { // not cached: a sweep would evict the hot ones
				return st, fmt.Errorf("gc: %w", err)
			}
		}
		for _, e := range m.Entries {
			for _, c := range e.Chunks {
				live[c.Digest] = true
			}
		}
	}
	st.Manifests = len(ids)

	// Sweep.
	cutoff := s.now().Add(-s.staleTempAge)
	sweepTemp := func(dir string, de fs.DirEntry) {
		if fi, err := de.Info(); err == nil && fi.ModTime().Before(cutoff) {
			if os.Remove(filepath.Join(dir, de.Name())) == nil {
				st.TempsRemoved++
			}
		}
	}
	chunkRoot := filepath.Join(s.root, chunksDir)
	subs, err := os.ReadDir(chunkRoot)
	if err != nil {
		return st, fmt.Errorf("gc: %w", err)
	}
	for _, sub := range subs {
		if !sub.IsDir() || len(sub.Name()) != 2 {
			continue
		}
		if err := ctx.Err(); err != nil {
			return st, err
		}
		dir := filepath.Join(chunkRoot, sub.Name())
		des, err := os.ReadDir(dir)
		if err != nil {
			return st, fmt.Errorf("gc: %w", err)
		}
		for _, de := range des {
			name := de.Name()
			switch {
			case isTemp(name):
				sweepTemp(dir, de)
			case !validDigest(name) || name[:2] != sub.Name():
				// not ours: leave it
			case live[name]:
				st.ChunksKept++
			default:
				fi, err := de.Info()
				if err != nil {
					continue
				}
				if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return st, fmt.Errorf("gc: %w", err)
				}
				st.ChunksRemoved++
				st.BytesFreed += fi.Size()
			}
		}
	}
	mdir := filepath.Join(s.root, manifestsDir)
	des, err := os.ReadDir(mdir)
	if err != nil {
		return st, fmt.Errorf("gc: %w", err)
	}
	for _, de := range des {
		if isTemp(de.Name()) {
			sweepTemp(mdir, de)
		}
	}
	return st, nil
}

// gcPatience is how long GC asks for the store's lock without queueing for
// it (lockForGC).
var gcPatience = time.Minute

// lockForGC takes the store's lock for GC without stalling everyone else
// while it waits: a writer queued on a sync.RWMutex holds back every new
// reader, so one slow export (a Put holds the read lock for its whole
// stream) blocked every chunk read, delete and Put of the server behind a
// waiting GC. It polls with TryLock for gcPatience, then queues.
func (s *Store) lockForGC(ctx context.Context) error {
	deadline := time.Now().Add(gcPatience)
	for !s.mu.TryLock() {
		if time.Now().After(deadline) {
			s.mu.Lock()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
