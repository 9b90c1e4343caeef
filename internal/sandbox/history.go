package sandbox

import (
	"context"
	"time"

	"github.com/spacesandbox/space/internal/snapshot"
	"github.com/spacesandbox/space/internal/store"
)

// History keeps the rolling snapshot history until ctx ends: an automatic
// files snapshot of every running sandbox whose files changed since its
// last snapshot, at most every Interval; retention thinning of every
// sandbox's timeline; and garbage collection of chunks no snapshot uses.
func (s *Service) History(ctx context.Context, tick time.Duration) {
	if s.snaps == nil {
		return
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	lastRetention := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.snaps.Interval > 0 {
			s.AutoSnapshotOnce(ctx)
		}
		if s.now().Sub(lastRetention) >= 10*time.Minute {
			s.RetainOnce(ctx)
			lastRetention = s.now()
		}
	}
}

// CleanupSnapshots runs at start, from Recover, before the server answers
// requests: snapshots a killed server left half-made are marked failed and
// their partial content dropped. Earlier snapshots are untouched (their
// manifests were committed before).
func (s *Service) CleanupSnapshots(ctx context.Context) {
	snaps, err := s.store.ListSnapshots(ctx, "", store.SnapshotCreating)
	if err != nil {
		s.log.Error("snapshot cleanup", "err", err)
		return
	}
	for _, sn := range snaps {
		_ = s.snaps.Store.Delete(sn.ID)
		_ = s.snaps.Store.Delete(sn.ID + filesSuffix)
		_ = s.store.FinishSnapshot(ctx, sn.ID, store.SnapshotFailed, "interrupted by a server restart", 0, 0)
		s.log.Warn("snapshot interrupted by a restart; marked failed", "snapshot", sn.ID, "sandbox", sn.SandboxID)
	}
}

// AutoSnapshotOnce takes the automatic files snapshots that are due, a
// page of running sandboxes at a time: one page only (1,000) left the
// newer sandboxes of a busier host without a history.
func (s *Service) AutoSnapshotOnce(ctx context.Context) {
	for cursor := ""; ; {
		sbs, next, err := s.store.ListSandboxes(ctx, store.SandboxFilter{States: []string{StateRunning}, Limit: store.MaxListLimit, After: cursor})
		if err != nil {
			return
		}
		s.autoSnapshot(ctx, sbs)
		if cursor = next; cursor == "" || ctx.Err() != nil {
			return
		}
	}
}

// autoSnapshot takes the automatic snapshots due among sbs.
func (s *Service) autoSnapshot(ctx context.Context, sbs []store.Sandbox) {
	for _, sb := range sbs {
		if ctx.Err() != nil {
			return
		}
		snaps, err := s.store.ListSnapshots(ctx, sb.ID, store.SnapshotReady)
		if err != nil {
			continue
		}
		last := sb.CreatedAt
		var prev *store.Snapshot
		if len(snaps) > 0 {
			prev = &snaps[len(snaps)-1]
			last = prev.CreatedAt
		}
		interval := s.snaps.Interval
		if sb.SnapshotIntervalS < 0 {
			continue
		}
		if sb.SnapshotIntervalS > 0 {
			interval = time.Duration(sb.SnapshotIntervalS) * time.Second
		}
		if s.now().Sub(last) < interval {
			continue
		}
		s.mu.Lock()
		l := s.live[sb.ID]
		s.mu.Unlock()
		if l == nil || !l.opMu.TryLock() {
			continue // busy with a lifecycle operation: next round
		}
		if s.now().Sub(l.autoTried) < interval {
			// An export of the whole writable layer every tick of an
			// idle sandbox would cost what the interval saves.
			l.opMu.Unlock()
			continue
		}
		sn, err := s.takeSnapshot(ctx, sb, KindFiles, "", true)
		if err != nil {
			l.autoTried = s.now()
			l.opMu.Unlock()
			continue
		}
		// Unchanged since the previous snapshot: nothing worth a point in
		// the timeline.
		if prev != nil && s.sameLayer(*prev, sn) {
			_ = s.dropSnapshot(ctx, sn)
			l.autoTried = s.now()
		}
		l.opMu.Unlock()
	}
}

// sameLayer reports whether two snapshots hold the same writable layer.
func (s *Service) sameLayer(a, b store.Snapshot) bool {
	id := func(sn store.Snapshot) string {
		if sn.Kind == KindCheckpoint {
			return sn.ID + filesSuffix
		}
		return sn.ID
	}
	ma, err := s.snaps.Store.Open(id(a))
	if err != nil {
		return false
	}
	mb, err := s.snaps.Store.Open(id(b))
	if err != nil {
		return false
	}
	return len(snapshot.Diff(ma, mb)) == 0
}

// RetainOnce applies the retention policy to every timeline and collects
// garbage.
func (s *Service) RetainOnce(ctx context.Context) {
	all, err := s.store.ListSnapshots(ctx, "", "")
	if err != nil {
		return
	}
	bySandbox := map[string][]store.Snapshot{}
	for _, sn := range all {
		if sn.Status == store.SnapshotFailed && s.now().Sub(sn.CreatedAt) > time.Hour {
			_ = s.store.DeleteSnapshot(ctx, sn.ID)
			continue
		}
		if sn.Status == store.SnapshotReady {
			bySandbox[sn.SandboxID] = append(bySandbox[sn.SandboxID], sn)
		}
	}
	dropped := 0
	for _, snaps := range bySandbox {
		infos := make([]snapshot.SnapInfo, len(snaps))
		byID := map[string]store.Snapshot{}
		for i, sn := range snaps {
			infos[i] = snapshot.SnapInfo{ID: sn.ID, CreatedAt: sn.CreatedAt, Kind: snapshot.Kind(sn.Kind), Named: sn.Name != ""}
			byID[sn.ID] = sn
		}
		policy := s.snaps.Retention
		// The sandbox's retention_days, or once its record is gone (a day
		// after it stopped) what its newest snapshot recorded of it.
		days := snaps[len(snaps)-1].RetentionDays
		if sb, err := s.store.GetSandbox(ctx, snaps[0].SandboxID); err == nil {
			days = sb.RetentionDays
		}
		if days > 0 {
			// A sandbox may keep less history than the server, never more.
			if d := time.Duration(days) * 24 * time.Hour; policy.Daily == 0 || d < policy.Daily {
				policy.Daily, policy.NamedMaxAge = d, d
				if policy.Hourly > d {
					policy.Hourly = d
				}
			}
		}
		_, drop := snapshot.Thin(infos, s.now().UTC(), policy)
		for _, id := range drop {
			if err := s.dropSnapshot(ctx, byID[id]); err == nil {
				dropped++
			}
		}
	}
	st, err := s.snaps.Store.GC(ctx)
	if err != nil {
		s.log.Error("snapshot GC", "err", err)
		return
	}
	s.log.Info("snapshot retention", "dropped", dropped, "gc", st)
}
