package sandbox

import (
	"context"
	"errors"
	"os"

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
}

// Quota returns the quota that applies to team: its own, else the
// server's default (Config.TeamQuota).
func (s *Service) Quota(ctx context.Context, team string) (store.Quota, bool, error) {
	q, err := s.store.GetQuota(ctx, team)
	switch {
	case err == nil:
		return q, true, nil
	case errors.Is(err, errdefs.ErrNotFound):
		return s.cfg.TeamQuota, false, nil
	default:
		return q, false, err
	}
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
	return QuotaView{Team: team, Quota: q, Own: own, Usage: u}, nil
}

// admit checks, before a create does any work, that team may take n more
// sandboxes of memoryMB each (its quota; the store decides again when the
// record is written) and that the host has memory to spare. It returns the
// quota to write the records under.
func (s *Service) admit(ctx context.Context, team string, n, memoryMB int) (store.Quota, error) {
	q, _, err := s.Quota(ctx, team)
	if err != nil {
		return q, err
	}
	if err := s.store.CheckQuota(ctx, team, n, memoryMB, q); err != nil {
		s.metrics.CreatesRefused.WithLabelValues("team").Inc()
		return q, err
	}
	if err := s.hostHasRoom(); err != nil {
		s.metrics.CreatesRefused.WithLabelValues("host").Inc()
		return q, err
	}
	return q, nil
}

// hostHasRoom refuses new sandboxes while the host's available memory is
// below the reserve (Config.ReserveMemoryMB): past it the kernel's OOM
// killer would pick among the running sandboxes and the server.
func (s *Service) hostHasRoom() error {
	reserve := s.cfg.ReserveMemoryMB
	if reserve <= 0 {
		return nil
	}
	avail, ok := hostAvailableMB()
	if !ok || avail >= int64(reserve) {
		return nil
	}
	return errdefs.Unavailable("the host has %d MiB of memory available, below its reserve of %d MiB: no new sandboxes until some stop", avail, reserve)
}

// hostAvailableMB reads the host's MemAvailable (false when it cannot).
func hostAvailableMB() (int64, bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	v, ok := agentproto.ParseMeminfo(string(b))["MemAvailable"]
	return v >> 20, ok
}

// DefaultReserveMB is the host memory reserve when none is configured:
// 5 % of the host's memory, between 256 MiB and 2 GiB.
func DefaultReserveMB() int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 512
	}
	total := agentproto.ParseMeminfo(string(b))["MemTotal"] >> 20
	return int(min(max(total/20, 256), 2048))
}
