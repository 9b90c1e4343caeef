package snapshot

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// SnapInfo is what retention looks at.
type SnapInfo struct {
	ID        string
	CreatedAt time.Time
	Kind      Kind
	Named     bool // named by a user: kept until NamedMaxAge
}

// Policy is a retention policy. Ages are measured back from now and their
// bounds are inclusive; a zero field takes its DefaultPolicy value.
type Policy struct {
	// KeepAll keeps every unnamed snapshot at most this old (default 1h).
	KeepAll time.Duration
	// Hourly keeps, beyond KeepAll and up to this age, the newest snapshot
	// of each clock hour (UTC) and kind (default 24h).
	Hourly time.Duration
	// Daily keeps, beyond Hourly and up to this age, the newest snapshot of
	// each UTC day and kind (default 7 days). Older unnamed snapshots are
	// dropped.
	Daily time.Duration
	// NamedMaxAge keeps named snapshots up to this age (default 7 days).
	NamedMaxAge time.Duration
}

// DefaultPolicy returns the default retention policy.
func DefaultPolicy() Policy {
	return Policy{KeepAll: time.Hour, Hourly: 24 * time.Hour, Daily: 7 * 24 * time.Hour, NamedMaxAge: 7 * 24 * time.Hour}
}

func (p Policy) withDefaults() Policy {
	d := DefaultPolicy()
	p.KeepAll = cmp.Or(p.KeepAll, d.KeepAll)
	p.Hourly = cmp.Or(p.Hourly, d.Hourly)
	p.Daily = cmp.Or(p.Daily, d.Daily)
	p.NamedMaxAge = cmp.Or(p.NamedMaxAge, d.NamedMaxAge)
	return p
}

// Thin applies policy to snaps at time now and splits their IDs into the
// ones to keep and the ones to drop, each newest first. It is a pure
// function: the same input always gives the same answer. Buckets are
// aligned to the UTC clock, not to now, so the snapshot chosen for an
// hour or a day stays chosen as time passes; within a bucket the newest
// wins (ties broken by the larger ID). Snapshots dated in the future count
// as new.
func Thin(snaps []SnapInfo, now time.Time, policy Policy) (keep, drop []string) {
	p := policy.withDefaults()
	sorted := slices.Clone(snaps)
	slices.SortFunc(sorted, func(a, b SnapInfo) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	type bucket struct {
		kind  Kind
		width time.Duration
		start int64
	}
	taken := map[bucket]bool{}
	take := func(s SnapInfo, width time.Duration) bool {
		b := bucket{s.Kind, width, s.CreatedAt.Truncate(width).UnixNano()}
		if taken[b] {
			return false
		}
		taken[b] = true
		return true
	}
	for _, s := range sorted {
		age := now.Sub(s.CreatedAt)
		var ok bool
		switch {
		case s.Named:
			ok = age <= p.NamedMaxAge
		case age <= p.KeepAll:
			ok = true
		case age <= p.Hourly:
			ok = take(s, time.Hour)
		case age <= p.Daily:
			ok = take(s, 24*time.Hour)
		}
		if ok {
			keep = append(keep, s.ID)
		} else {
			drop = append(drop, s.ID)
		}
	}
	return keep, drop
}
