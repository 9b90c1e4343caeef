package sandbox

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
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
