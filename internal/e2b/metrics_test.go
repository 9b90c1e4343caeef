package e2b

import (
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// The metrics history keeps each tracked sandbox's last maxSamples, and a
// range returns those taken in it (both ends included), oldest first.
func TestMetricsHistory(t *testing.T) {
	m := newMetricsHistory()
	t0 := time.Unix(1_000_000, 0)
	at := func(s int) sandbox.Usage { return sandbox.Usage{At: t0.Add(time.Duration(s) * time.Second)} }
	m.add("sb-a", at(0)) // not tracked: dropped
	m.track("sb-a")
	for s := range maxSamples + 10 {
		m.add("sb-a", at(s))
	}
	got := m.between("sb-a", t0, t0.Add(time.Hour*10))
	if len(got) != maxSamples || !got[0].At.Equal(at(10).At) || !got[len(got)-1].At.Equal(at(maxSamples+9).At) {
		t.Fatalf("kept %d samples from %v to %v, want the last %d", len(got), got[0].At, got[len(got)-1].At, maxSamples)
	}
	if got := m.between("sb-a", at(20).At, at(22).At); len(got) != 3 || !got[0].At.Equal(at(20).At) {
		t.Errorf("[20 s, 22 s]: %v", got)
	}
	m.forget("sb-a")
	m.add("sb-a", at(5))
	if got := m.between("sb-a", t0, at(100).At); len(got) != 0 || len(m.ids()) != 0 {
		t.Errorf("a forgotten sandbox: %v, ids %v", got, m.ids())
	}
}

func TestMetricsRange(t *testing.T) {
	now := time.Unix(2_000_000, 0)
	for _, c := range []struct {
		query        string
		start, end   int64
		ranged, fail bool
	}{
		{query: "", start: -1, end: 2_000_000},
		{query: "start=100", start: 100, end: 2_000_000, ranged: true},
		{query: "start=100&end=200", start: 100, end: 200, ranged: true},
		{query: "end=200", start: -1, end: 200, ranged: true},
		{query: "start=3000000", start: 3_000_000, end: 2_000_000, ranged: true},
		{query: "start=200&end=100", fail: true},
		{query: "start=x", fail: true},
		{query: "end=-1", fail: true},
	} {
		start, end, ranged, err := metricsRange(httptest.NewRequest("GET", "/sandboxes/x/metrics?"+c.query, nil), now)
		if c.fail {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%q: %v, want invalid argument", c.query, err)
			}
			continue
		}
		wantStart := time.Time{}
		if c.start >= 0 {
			wantStart = time.Unix(c.start, 0)
		}
		if err != nil || !start.Equal(wantStart) || !end.Equal(time.Unix(c.end, 0)) || ranged != c.ranged {
			t.Errorf("%q: %v %v %v %v", c.query, start, end, ranged, err)
		}
	}
}
