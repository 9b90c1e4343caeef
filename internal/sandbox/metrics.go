package sandbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the service's Prometheus instruments.
type Metrics struct {
	CreateLatency *prometheus.HistogramVec
	CreateErrors  prometheus.Counter
	ExecLatency   *prometheus.HistogramVec
	// PoolRefills counts warm sandboxes added to a pool, by how they
	// were made: "boot" (cold) or "restore" (from the pool's image).
	PoolRefills *prometheus.CounterVec
	// PoolImage counts pool image events: "built", "build_failed",
	// "restore_failed" (the pool then refills by booting), "removed".
	PoolImage *prometheus.CounterVec
	// PoolShrinks counts warm sandboxes a pool destroyed because its
	// create rate fell (it had held more than its target for a while).
	PoolShrinks *prometheus.CounterVec
	// PoolPrestarts counts the processes pools started in their warm
	// sandboxes (PoolConfig.Prestart), by template and result: "ready",
	// "timeout" (still loading when the sandbox joined the pool),
	// "exited" (before it was ready) or "failed" (not started).
	PoolPrestarts *prometheus.CounterVec
	// OOMKills counts processes the agent killed because their sandbox
	// reached its memory (driver.MemoryWatcher).
	OOMKills prometheus.Counter
	// CreatesRefused counts creates, forks and restores refused before any
	// work, by reason: "team" (its quota), "host" (memory below the
	// reserve) or "disk" (free disk below the reserve).
	CreatesRefused *prometheus.CounterVec
	// SnapshotsRefused counts snapshots (asked for, automatic, on pause)
	// refused before any work, by reason: "team" (its snapshot quota) or
	// "disk".
	SnapshotsRefused *prometheus.CounterVec
}

// NewMetrics registers the service's instruments on reg. The sandbox count
// by state is collected from the store at scrape time, so it is right after
// a restart too.
func NewMetrics(reg prometheus.Registerer, counts func(context.Context) (map[string]int, error)) *Metrics {
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	m := &Metrics{
		CreateLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "space", Name: "sandbox_create_seconds", Help: "Time to create a sandbox until its agent answers.", Buckets: buckets,
		}, []string{"driver"}),
		CreateErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "space", Name: "sandbox_create_errors_total", Help: "Sandbox creations that failed and were rolled back.",
		}),
		ExecLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "space", Name: "exec_start_seconds", Help: "Time to start a process in a sandbox.", Buckets: buckets,
		}, []string{"driver"}),
		PoolRefills: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "space", Name: "pool_refills_total", Help: "Warm sandboxes added to a pool, by method (boot or restore).",
		}, []string{"driver", "method"}),
		PoolImage: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "space", Name: "pool_image_events_total", Help: "Pool restore images built, failed to build, failed to restore, removed.",
		}, []string{"driver", "event"}),
		PoolShrinks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "space", Name: "pool_shrinks_total", Help: "Warm sandboxes destroyed because their pool's create rate fell.",
		}, []string{"driver"}),
		PoolPrestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "space", Name: "pool_prestarts_total", Help: "Processes warm pools started in their sandboxes ahead of a claim, by result (ready, timeout, exited, failed).",
		}, []string{"template", "result"}),
		OOMKills: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "space", Name: "sandbox_oom_kills_total", Help: "Processes killed because their sandbox reached its memory (the sandbox lives on).",
		}),
		CreatesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "space", Name: "sandbox_creates_refused_total", Help: "Creates, forks and restores refused by a team's quota (team), the host's memory reserve (host) or its disk reserve (disk).",
		}, []string{"reason"}),
		SnapshotsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "space", Name: "snapshots_refused_total", Help: "Snapshots refused by a team's snapshot quota (team) or the disk reserve (disk).",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.CreateLatency, m.CreateErrors, m.ExecLatency, m.PoolRefills, m.PoolImage, m.PoolShrinks, m.PoolPrestarts, m.OOMKills, m.CreatesRefused, m.SnapshotsRefused)
	if counts != nil {
		reg.MustRegister(&stateCollector{counts: counts, desc: prometheus.NewDesc("space_sandboxes", "Sandboxes by state.", []string{"state"}, nil)})
	}
	return m
}

// RegisterPoolReady exports space_pool_ready{template}: warm sandboxes
// booted and waiting to be claimed (space_sandboxes{state="pooled"} also
// counts those still booting).
func RegisterPoolReady(reg prometheus.Registerer, ready func() map[string]int) {
	reg.MustRegister(&poolReadyCollector{ready: ready, desc: prometheus.NewDesc("space_pool_ready", "Warm sandboxes ready to be claimed, by template.", []string{"template"}, nil)})
}

type poolReadyCollector struct {
	ready func() map[string]int
	desc  *prometheus.Desc
}

func (c *poolReadyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *poolReadyCollector) Collect(ch chan<- prometheus.Metric) {
	for tpl, n := range c.ready() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), tpl)
	}
}

type stateCollector struct {
	counts func(context.Context) (map[string]int, error)
	desc   *prometheus.Desc
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	counts, err := c.counts(ctx)
	if err != nil {
		// Left out of this scrape (the rest still answers); said once per
		// scrape, not silently.
		slog.Default().Warn("metrics: sandbox counts by state unavailable", "err", err)
		return
	}
	for _, st := range []string{StateCreating, StateRunning, StatePaused, StateStopping, StateStopped, StateError, StatePooled} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[st]), st)
	}
}
