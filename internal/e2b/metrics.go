package e2b

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// Metrics history: E2B keeps a sandbox's CPU, memory and disk samples and
// getMetrics({start, end}) returns those in the range. The facade samples
// the sandboxes it has handed out (created, connected or asked for metrics
// through it during this server's life) every metricsEvery while they run,
// and keeps the last maxSamples of each, in memory: a restart starts the
// history again.
var (
	metricsEvery = 5 * time.Second
	maxSamples   = 720 // an hour at 5 s
)

// metricsHistory holds the sampled sandboxes' samples, oldest first.
type metricsHistory struct {
	mu      sync.Mutex
	samples map[string][]sandbox.Usage
}

func newMetricsHistory() *metricsHistory {
	return &metricsHistory{samples: map[string][]sandbox.Usage{}}
}

// track starts sampling sandbox id (a no-op when it is sampled).
func (m *metricsHistory) track(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.samples[id]; !ok {
		m.samples[id] = []sandbox.Usage{}
	}
}

func (m *metricsHistory) forget(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.samples, id)
}

func (m *metricsHistory) ids() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.samples))
	for id := range m.samples {
		out = append(out, id)
	}
	return out
}

// add appends a sample of a tracked sandbox (one forgotten meanwhile
// stays forgotten).
func (m *metricsHistory) add(id string, u sandbox.Usage) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.samples[id]
	if !ok {
		return
	}
	s = append(s, u)
	if len(s) > maxSamples {
		s = s[len(s)-maxSamples:]
	}
	m.samples[id] = s
}

// between returns id's samples taken in [start, end], oldest first.
func (m *metricsHistory) between(id string, start, end time.Time) []sandbox.Usage {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []sandbox.Usage
	for _, u := range m.samples[id] {
		if !u.At.Before(start) && !u.At.After(end) {
			out = append(out, u)
		}
	}
	return out
}

// sampleMetrics samples the tracked sandboxes every metricsEvery until
// ctx ends. A sandbox that is gone is no longer tracked; one that is
// paused has no samples while it is.
func (h *Handler) sampleMetrics(ctx context.Context) {
	t := time.NewTicker(metricsEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, id := range h.metrics.ids() {
			sb, err := h.svc.Get(ctx, sandbox.Caller{Admin: true}, id)
			if errors.Is(err, errdefs.ErrNotFound) || err == nil && (sb.State == sandbox.StateStopped || sb.State == sandbox.StateStopping) {
				h.metrics.forget(id)
				continue
			}
			if err != nil || sb.State != sandbox.StateRunning {
				continue
			}
			uctx, cancel := context.WithTimeout(ctx, metricsEvery)
			u, err := h.svc.Usage(uctx, sandbox.Caller{Admin: true}, id)
			cancel()
			if err == nil {
				h.metrics.add(id, u)
			}
		}
	}
}

// metricsRange parses getMetrics' start and end (Unix seconds; either may
// be missing: from the beginning, until now) into [start, end]; ranged is
// false when neither is given. An end before start is a 400; a start after
// now without an end is an empty range.
func metricsRange(r *http.Request, now time.Time) (start, end time.Time, ranged bool, err error) {
	q := r.URL.Query()
	parse := func(name string, def time.Time) (time.Time, error) {
		v := q.Get(name)
		if v == "" {
			return def, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > 1<<40 {
			return time.Time{}, errdefs.InvalidArgument("%s: a Unix time in seconds, got %q", name, v)
		}
		ranged = true
		return time.Unix(n, 0), nil
	}
	if start, err = parse("start", time.Time{}); err != nil {
		return
	}
	given := q.Get("end") != ""
	if end, err = parse("end", now); err != nil {
		return
	}
	if given && end.Before(start) {
		err = errdefs.InvalidArgument("end is before start")
	}
	return
}

// metrics serves GET /sandboxes/{id}/metrics. With start or end, the
// sandbox's samples in that range, oldest first (the newest taken now when
// now is in it); without, one sample taken now, as before there was a
// history. A sample is the guest's CPU (a share of the sandbox's CPUs
// since the previous sample), memory and disk use (Service.Usage) while it
// runs; a paused sandbox's sample now carries its limits only.
func (h *Handler) metricsHandler(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	sb, err := h.live(r, c)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	now := time.Now().UTC()
	start, end, ranged, err := metricsRange(r, now)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.metrics.track(sb.ID)
	var samples []sandbox.Usage
	if ranged {
		// A second either side: start and end are whole seconds.
		samples = h.metrics.between(sb.ID, start, end.Add(time.Second))
	}
	if !ranged || (!now.Before(start) && !now.After(end.Add(time.Second))) {
		u := sandbox.Usage{At: now}
		u.CPUCount, u.MemTotal, u.DiskTotal = sb.CPU, int64(sb.MemoryMB)<<20, int64(diskMB(sb))<<20
		if sb.State == sandbox.StateRunning {
			if got, err := h.svc.Usage(r.Context(), c, sb.ID); err == nil {
				u = got
			} else {
				h.log.Warn("e2b metrics", "sandbox", sb.ID, "err", err)
			}
		}
		samples = append(samples, u)
	}
	out := make([]map[string]any, 0, len(samples))
	for _, u := range samples {
		out = append(out, map[string]any{
			"timestamp": u.At.Format(time.RFC3339), "timestampUnix": u.At.Unix(),
			"cpuCount": u.CPUCount, "cpuUsedPct": math.Round(u.CPUUsedPct*10) / 10,
			"memUsed": u.MemUsed, "memTotal": u.MemTotal, "memCache": u.MemCache,
			"diskUsed": u.DiskUsed, "diskTotal": u.DiskTotal,
		})
	}
	writeJSON(w, http.StatusOK, out)
}
