package sandbox

import (
	"context"
	"encoding/hex"
	"errors"
	"sync"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// snapUsage caches, per team, the distinct chunks its ready snapshots
// reference. A check adds the manifests of the snapshots that are new
// since the last one and starts the team over when one of those it
// counted is gone (deleted, or thinned out of the history).
type snapUsage struct {
	mu    sync.Mutex
	teams map[string]*teamChunks
	// taking serialises the snapshots of each team with a snapshot quota
	// (teamSnapshotLock).
	taking map[string]*sync.Mutex
}

// teamSnapshotLock returns the lock a team with a snapshot quota holds
// while it takes a snapshot, from its room check to its record: the check
// counts ready snapshots only, so twenty taken at once all passed it at
// 1000 of 1024 MiB; one at a time, only the one that crosses the quota is
// taken whole, as documented. Teams without a snapshot quota take theirs
// concurrently (nil).
func (s *Service) teamSnapshotLock(ctx context.Context, team string) *sync.Mutex {
	if s.snaps == nil {
		return nil
	}
	if q, _, err := s.Quota(ctx, team); err != nil || q.MaxSnapshotMB <= 0 {
		return nil
	}
	u := &s.snapUse
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.taking == nil {
		u.taking = map[string]*sync.Mutex{}
	}
	m := u.taking[team]
	if m == nil {
		m = &sync.Mutex{}
		u.taking[team] = m
	}
	return m
}

type teamChunks struct {
	ids    map[string]bool     // snapshots counted
	chunks map[[32]byte]uint32 // digest → size
	bytes  int64
}

// snapshotBytes returns the data team's ready snapshots hold: each distinct
// chunk once, at its size before compression (chunks it shares with other
// teams count for each of them: it is what keeping this team's snapshots
// alone would cost).
func (s *Service) snapshotBytes(ctx context.Context, team string) (int64, error) {
	if s.snaps == nil {
		return 0, nil
	}
	snaps, err := s.store.TeamSnapshots(ctx, team, store.SnapshotReady)
	if err != nil {
		return 0, err
	}
	cur := make(map[string]bool, len(snaps))
	for _, sn := range snaps {
		cur[sn.ID] = true
	}
	u := &s.snapUse
	u.mu.Lock()
	defer u.mu.Unlock()
	tc := u.teams[team]
	if tc != nil {
		for id := range tc.ids {
			if !cur[id] {
				tc = nil
				break
			}
		}
	}
	if tc == nil {
		tc = &teamChunks{ids: map[string]bool{}, chunks: map[[32]byte]uint32{}}
		if u.teams == nil {
			u.teams = map[string]*teamChunks{}
		}
		u.teams[team] = tc
	}
	for _, sn := range snaps {
		if tc.ids[sn.ID] {
			continue
		}
		ids := []string{sn.ID}
		if sn.Kind == KindCheckpoint {
			ids = append(ids, sn.ID+filesSuffix)
		}
		for _, id := range ids {
			m, err := s.snaps.Store.Open(id)
			if errors.Is(err, errdefs.ErrNotFound) {
				continue // a checkpoint without a files layer (a VM's)
			}
			if err != nil {
				return 0, err
			}
			for _, e := range m.Entries {
				for _, c := range e.Chunks {
					var d [32]byte
					if n, err := hex.Decode(d[:], []byte(c.Digest)); err != nil || n != len(d) {
						continue // Open verified the manifest; never here
					}
					if _, ok := tc.chunks[d]; !ok {
						tc.chunks[d] = uint32(c.Size)
						tc.bytes += c.Size
					}
				}
			}
		}
		tc.ids[sn.ID] = true
	}
	return tc.bytes, nil
}

// snapshotRoom refuses a snapshot while the server's disk is below its
// reserve (507) or team's snapshots already hold its quota (429). The
// check is made before a snapshot starts, so the one that crosses the
// quota is taken whole.
func (s *Service) snapshotRoom(ctx context.Context, team string) error {
	if err := s.diskHasRoom(); err != nil {
		s.metrics.SnapshotsRefused.WithLabelValues("disk").Inc()
		return err
	}
	q, _, err := s.Quota(ctx, team)
	if err != nil || q.MaxSnapshotMB <= 0 {
		return err
	}
	n, err := s.snapshotBytes(ctx, team)
	if err != nil {
		return err
	}
	if n >= int64(q.MaxSnapshotMB)<<20 {
		s.metrics.SnapshotsRefused.WithLabelValues("team").Inc()
		return errdefs.Newf(errdefs.ErrQuotaExceeded, "team %s's snapshots hold %d MiB of its %d MiB: delete snapshots (or let the history thin out) before taking more", team, n>>20, q.MaxSnapshotMB)
	}
	return nil
}
