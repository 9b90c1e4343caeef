package snapshot

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestThin(t *testing.T) {
	// now is 10:30 UTC; hour buckets start on the hour, day buckets at 00:00 UTC.
	now := time.Date(2025, 6, 10, 10, 30, 0, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	h := time.Hour
	day := 24 * h
	snap := func(id string, at time.Time) SnapInfo { return SnapInfo{ID: id, CreatedAt: at, Kind: KindFiles} }
	named := func(id string, at time.Time) SnapInfo {
		s := snap(id, at)
		s.Named = true
		return s
	}

	tests := []struct {
		name   string
		snaps  []SnapInfo
		policy Policy
		keep   []string // newest first
	}{
		{
			name:  "everything in the last hour, boundary included",
			snaps: []SnapInfo{snap("a", ago(0)), snap("b", ago(time.Minute)), snap("c", ago(59*time.Minute)), snap("d", ago(h))},
			keep:  []string{"a", "b", "c", "d"},
		},
		{
			name: "one per clock hour for the last day, newest wins",
			snaps: []SnapInfo{
				snap("h1a", ago(h+time.Second)),      // 09:29:59, bucket 09:00
				snap("h1b", ago(h+20*time.Minute)),   // 09:10, bucket 09:00
				snap("h2a", ago(h+31*time.Minute)),   // 08:59, bucket 08:00
				snap("h2b", ago(2*h+29*time.Minute)), // 08:01, bucket 08:00
				snap("h2c", ago(2*h+30*time.Minute)), // 08:00:00 exactly, bucket 08:00
				snap("h3", ago(2*h+31*time.Minute)),  // 07:59, bucket 07:00
			},
			keep: []string{"h1a", "h2a", "h3"},
		},
		{
			name: "hourly boundary at 24h inclusive, then one per UTC day",
			snaps: []SnapInfo{
				snap("edge", ago(day)),              // 09 Jun 10:30: hourly tier
				snap("edge2", ago(day+time.Minute)), // 09 Jun 10:29: daily tier, newest of 09 Jun in it
				snap("d1", ago(day+2*h)),            // 09 Jun 08:30: same day, dropped
				snap("d2a", ago(day+11*h)),          // 08 Jun 23:30
				snap("d2b", ago(day+20*h)),          // 08 Jun 14:30
				snap("d3", ago(3*day)),              // 07 Jun 10:30
			},
			keep: []string{"edge", "edge2", "d2a", "d3"},
		},
		{
			name: "drop older than 7 days, boundary inclusive",
			snaps: []SnapInfo{
				snap("seven", ago(7*day)),
				snap("older", ago(7*day+time.Second)),
				snap("ancient", ago(100*day)),
			},
			keep: []string{"seven"},
		},
		{
			name: "named kept until MaxAge regardless of buckets",
			snaps: []SnapInfo{
				named("n1", ago(2*h)), named("n2", ago(2*h+time.Minute)), // same hour: both kept
				snap("u", ago(2*h+2*time.Minute)), // the bucket is still the unnamed one's
				named("n-old", ago(7*day+time.Second)),
				named("n-edge", ago(7*day)),
			},
			keep: []string{"n1", "n2", "u", "n-edge"},
		},
		{
			name: "kinds bucketed separately",
			snaps: []SnapInfo{
				snap("f", ago(5*h)), {ID: "c", CreatedAt: ago(5*h + time.Minute), Kind: KindCheckpoint},
				snap("f-old", ago(5*h+2*time.Minute)),
			},
			keep: []string{"f", "c"},
		},
		{
			name:  "future timestamps count as new; ties broken by larger ID",
			snaps: []SnapInfo{snap("future", now.Add(h)), snap("t1", ago(3*h)), snap("t2", ago(3*h))},
			keep:  []string{"future", "t2"},
		},
		{
			name: "custom policy",
			snaps: []SnapInfo{
				snap("a", ago(10*time.Minute)), snap("b", ago(20*time.Minute)), // beyond KeepAll=5m, same hour 10:00
				snap("c", ago(3*h)), // beyond Hourly=2h, within Daily=2d
				snap("d", ago(3*day)),
				named("n", ago(2*day)), // beyond NamedMaxAge=1d
			},
			policy: Policy{KeepAll: 5 * time.Minute, Hourly: 2 * h, Daily: 2 * day, NamedMaxAge: day},
			keep:   []string{"a", "c"},
		},
		{name: "empty", snaps: nil, keep: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			policy := tc.policy
			if policy == (Policy{}) {
				policy = DefaultPolicy()
			}
			keep, drop := Thin(tc.snaps, now, policy)
			if !slices.Equal(keep, tc.keep) {
				t.Errorf("keep = %q, want %q", keep, tc.keep)
			}
			if len(keep)+len(drop) != len(tc.snaps) {
				t.Errorf("keep %q + drop %q do not cover the input", keep, drop)
			}
			for _, id := range drop {
				if slices.Contains(keep, id) {
					t.Errorf("%s both kept and dropped", id)
				}
			}
			// Deterministic regardless of input order.
			rev := slices.Clone(tc.snaps)
			slices.Reverse(rev)
			k2, d2 := Thin(rev, now, policy)
			if !slices.Equal(k2, keep) || !slices.Equal(d2, drop) {
				t.Errorf("input order changed the result: %q/%q vs %q/%q", k2, d2, keep, drop)
			}
		})
	}
}

// TestThinStable: thinning every 10 minutes over 9 days of snapshots taken
// every 5 minutes converges on the policy's shape.
func TestThinStable(t *testing.T) {
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	var live []SnapInfo
	now := start
	for i := 0; now.Before(start.Add(9 * 24 * time.Hour)); i++ {
		live = append(live, SnapInfo{ID: fmt.Sprintf("s%05d", i), CreatedAt: now, Kind: KindFiles})
		if i%2 == 0 {
			keep, _ := Thin(live, now, Policy{})
			live = slices.DeleteFunc(live, func(s SnapInfo) bool { return !slices.Contains(keep, s.ID) })
		}
		now = now.Add(5 * time.Minute)
	}
	// ~12 in the last hour + ~23 hourly + ~7 daily.
	if n := len(live); n < 35 || n > 46 {
		t.Errorf("%d snapshots live after 9 days", n)
	}
}
