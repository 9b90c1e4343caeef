package sandbox

import (
	"context"
	"errors"
	"io"
	"math"
	"time"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// Usage is a running sandbox's resource use, as its guest sees it.
type Usage struct {
	At time.Time
	agentproto.Stats
}

// Usage reports a running sandbox's CPU, memory and disk use. CPU use is
// a share of the sandbox's CPUs, measured since the previous call (or over
// 100 ms); memory is capped at the sandbox's own.
func (s *Service) Usage(ctx context.Context, c Caller, id string) (Usage, error) {
	sb, l, err := s.liveOf(ctx, c, id, StateRunning)
	if err != nil {
		return Usage{}, err
	}
	st, err := l.agent.Stats(ctx)
	if errors.Is(err, errdefs.ErrNotFound) {
		// An agent older than protocol 3 (sandboxes keep the agent they
		// were created with): memory only, read by a process.
		st, err = s.meminfoByProcess(ctx, l)
	}
	if err != nil {
		return Usage{}, err
	}
	if limit := int64(sb.MemoryMB) << 20; limit > 0 && (st.MemTotal == 0 || st.MemTotal > limit) {
		st.MemTotal = limit
	}
	st.MemUsed = min(st.MemUsed, st.MemTotal)
	if sb.CPU > 0 && st.CPUCount != sb.CPU {
		// gVisor's guest sees the host's CPUs and is held to its share by
		// a CPU quota: report use as a share of the sandbox's CPUs.
		st.CPUUsedPct = min(100, st.CPUUsedPct*float64(st.CPUCount)/float64(sb.CPU))
		st.CPUCount = sb.CPU
	}
	return Usage{At: s.now().UTC(), Stats: st}, nil
}

// meminfoByProcess reads /proc/meminfo with a process (procfs files report
// size 0, so the files API does not serve them).
func (s *Service) meminfoByProcess(ctx context.Context, l *live) (agentproto.Stats, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, evs, err := l.agent.Run(ctx, agentproto.StartRequest{Cmd: []string{"cat", "/proc/meminfo"}, TimeoutMS: 10000})
	if err != nil {
		return agentproto.Stats{}, err
	}
	defer evs.Close()
	var out []byte
	for {
		ev, err := evs.Next()
		if errors.Is(err, io.EOF) || (err == nil && ev.Type == agentproto.EventExit) {
			break
		}
		if err != nil {
			return agentproto.Stats{}, err
		}
		if ev.Type == agentproto.EventStdout {
			out = append(out, ev.Data...)
		}
	}
	mi := agentproto.ParseMeminfo(string(out))
	return agentproto.Stats{MemTotal: mi["MemTotal"], MemUsed: max(mi["MemTotal"]-mi["MemAvailable"], 0), MemCache: mi["Cached"]}, nil
}

// checkExport refuses to export the writable layer of a sandbox holding a
// file its driver cannot export without stopping it (driver.ExportLimiter:
// gVisor copies each file whole into memory). Files are looked for only
// when the layer holds more than the limit in all; an agent older than
// protocol 3 is not checked.
func (s *Service) checkExport(ctx context.Context, sb store.Sandbox, l *live) error {
	lim, ok := l.inst.(driver.ExportLimiter)
	if !ok || lim.ExportFileLimit(0) == math.MaxInt64 {
		// No limit whatever the guest uses (a runsc that streams files):
		// the agent is not asked (a pause would wait for it).
		return nil
	}
	st, err := l.agent.DiskStats(ctx, 0)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	limit := lim.ExportFileLimit(st.MemUsed)
	if st.DiskUsed <= limit {
		return nil
	}
	if st, err = l.agent.DiskStats(ctx, max(limit, 1)); err != nil {
		return err
	}
	if len(st.LargeFiles) == 0 {
		return nil
	}
	f := st.LargeFiles[0]
	return errdefs.Newf(errdefs.ErrTooLarge, "sandbox %s holds %s (%d MiB): its driver (%s) copies each file into memory to snapshot the filesystem, "+
		"and this sandbox has room for %d MiB now; delete or split the file, or give the sandbox more memory", sb.ID, f.Path, f.Size>>20, sb.Driver, limit>>20)
}
