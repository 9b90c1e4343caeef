package sandbox

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// QuotaView is a team's quota and what it holds against it.
type QuotaView struct {
	Team  string
	Quota store.Quota
	Own   bool // set for the team (else the server's default)
	Usage store.Usage
	// SnapshotBytes is the data the team's snapshots hold (each distinct
	// chunk once, before compression): what MaxSnapshotMB limits.
	SnapshotBytes int64
}

// quotas caches each team's own quota (or its absence): every create asks,
// and the store changes only through SetQuota and DeleteQuota, which drop
// the entry.
type quotaCache struct {
	mu sync.Mutex
	m  map[string]*store.Quota // nil value: the team has none of its own
	// gen counts each team's changes (forgetQuota): a value read from the
	// store is cached only if no change came between the read and the
	// caching, or a quota tightened meanwhile was lost until the next
	// change.
	gen map[string]uint64
}

// Quota returns the quota that applies to team: its own, else the
// server's default (Config.TeamQuota).
func (s *Service) Quota(ctx context.Context, team string) (store.Quota, bool, error) {
	s.quotas.mu.Lock()
	q, ok := s.quotas.m[team]
	gen := s.quotas.gen[team]
	s.quotas.mu.Unlock()
	if !ok {
		own, err := s.store.GetQuota(ctx, team)
		switch {
		case err == nil:
			q = &own
		case errors.Is(err, errdefs.ErrNotFound):
		default:
			return store.Quota{}, false, err
		}
		s.quotas.mu.Lock()
		if s.quotas.m == nil {
			s.quotas.m = map[string]*store.Quota{}
		}
		if s.quotas.gen[team] == gen {
			s.quotas.m[team] = q
		}
		s.quotas.mu.Unlock()
	}
	if q == nil {
		return s.cfg.TeamQuota, false, nil
	}
	return *q, true, nil
}

// SetQuota gives team a quota of its own (admin).
func (s *Service) SetQuota(ctx context.Context, c Caller, team string, q store.Quota) error {
	if !c.Admin {
		return errdefs.Newf(errdefs.ErrPermissionDenied, "this call needs an admin key")
	}
	defer s.forgetQuota(team)
	return s.store.PutQuota(ctx, team, q)
}

// DeleteQuota returns team to the server's default (admin).
func (s *Service) DeleteQuota(ctx context.Context, c Caller, team string) error {
	if !c.Admin {
		return errdefs.Newf(errdefs.ErrPermissionDenied, "this call needs an admin key")
	}
	defer s.forgetQuota(team)
	return s.store.DeleteQuota(ctx, team)
}

func (s *Service) forgetQuota(team string) {
	s.quotas.mu.Lock()
	delete(s.quotas.m, team)
	if s.quotas.gen == nil {
		s.quotas.gen = map[string]uint64{}
	}
	s.quotas.gen[team]++
	s.quotas.mu.Unlock()
}

// QuotaOf returns team's quota and usage. A team sees only its own; an
// admin any.
func (s *Service) QuotaOf(ctx context.Context, c Caller, team string) (QuotaView, error) {
	if !c.Admin && team != c.Team {
		return QuotaView{}, errdefs.Newf(errdefs.ErrPermissionDenied, "a team key sees only its own team's quota")
	}
	q, own, err := s.Quota(ctx, team)
	if err != nil {
		return QuotaView{}, err
	}
	u, err := s.store.TeamUsage(ctx, team)
	if err != nil {
		return QuotaView{}, err
	}
	sb, err := s.snapshotBytes(ctx, team)
	if err != nil {
		return QuotaView{}, err
	}
	return QuotaView{Team: team, Quota: q, Own: own, Usage: u, SnapshotBytes: sb}, nil
}

// admit checks, before a create does any work, that team may take n more
// sandboxes of size sz each (its quota; the store decides again when the
// record is written) and that the host has memory to spare. It returns the
// quota to write the records under.
func (s *Service) admit(ctx context.Context, team string, n int, sz store.Size) (store.Quota, error) {
	q, _, err := s.Quota(ctx, team)
	if err != nil {
		return q, err
	}
	if err := s.store.CheckQuota(ctx, team, n, sz, q); err != nil {
		s.metrics.CreatesRefused.WithLabelValues("team").Inc()
		return q, err
	}
	if err := s.hostHasRoom(); err != nil {
		reason := "host"
		if errors.Is(err, errdefs.ErrNoStorage) {
			reason = "disk"
		}
		s.metrics.CreatesRefused.WithLabelValues(reason).Inc()
		return q, err
	}
	return q, nil
}

// hostHasRoom refuses new sandboxes while the host's available memory is
// below the reserve (Config.ReserveMemoryMB): past it the kernel's OOM
// killer would pick among the running sandboxes and the server. The same
// goes for free disk (diskHasRoom).
func (s *Service) hostHasRoom() error {
	if reserve := s.cfg.ReserveMemoryMB; reserve > 0 {
		if avail, ok := s.hostMem.get(); ok && avail < int64(reserve) {
			return errdefs.Unavailable("the host has %d MiB of memory available, below its reserve of %d MiB: no new sandboxes until some stop", avail, reserve)
		}
	}
	return s.diskHasRoom()
}

// diskHasRoom refuses work that fills the data directory's filesystem
// (new sandboxes' writable layers, snapshots) while its free space is below
// the reserve (Config.ReserveDiskMB): past it the database, the chunk store
// and every sandbox's writes would fail alike.
func (s *Service) diskHasRoom() error {
	reserve := s.cfg.ReserveDiskMB
	if reserve <= 0 {
		return nil
	}
	avail, ok := s.hostDisk.get()
	if !ok || avail >= int64(reserve) {
		return nil
	}
	return errdefs.Newf(errdefs.ErrNoStorage, "the server's disk has %d MiB free, below its reserve of %d MiB: no new sandboxes or snapshots until space is freed", avail, reserve)
}

// dirAvailableMB is the free space under dir (false when statfs fails).
func dirAvailableMB(dir string) (int64, bool) {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return 0, false
	}
	return int64(st.Bavail) * st.Bsize >> 20, true
}

// DefaultReserveDiskMB is the disk reserve when none is configured: 5 % of
// dir's filesystem, between 512 MiB and 10 GiB.
func DefaultReserveDiskMB(dir string) int {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 1024
	}
	return int(min(max(int64(st.Blocks)*st.Bsize>>20/20, 512), 10240))
}

// gauge caches a reading (the host's MemAvailable, a disk's free space)
// for ttl: a burst of creates reads it once, and neither moves much in that
// time.
type gauge struct {
	ttl  time.Duration
	read func() (int64, bool)

	mu  sync.Mutex
	at  time.Time
	val int64
	ok  bool
}

func (g *gauge) get() (int64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now := time.Now(); now.Sub(g.at) >= g.ttl {
		g.val, g.ok = g.read()
		g.at = now
	}
	return g.val, g.ok
}

// hostAvailableMB reads the host's MemAvailable (false when it cannot).
func hostAvailableMB() (int64, bool) {
	v, ok := hostMeminfo()["MemAvailable"]
	return v >> 20, ok
}

// hostMeminfo is the host's /proc/meminfo in bytes per field (empty when
// it cannot be read).
func hostMeminfo() map[string]int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil
	}
	return agentproto.ParseMeminfo(string(b))
}

// DefaultReserveMB is the host memory reserve when none is configured:
// 5 % of the host's memory, between 256 MiB and 2 GiB.
func DefaultReserveMB() int {
	total, ok := hostMeminfo()["MemTotal"]
	if !ok {
		return 512
	}
	return int(min(max(total>>20/20, 256), 2048))
}
