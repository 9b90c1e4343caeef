package sandbox

import (
	"log/slog"
	"testing"

	"github.com/spacesandbox/space/internal/agent/agenttest"
)

// The fallback for sandboxes whose agent predates GET /v1/stats reads
// /proc/meminfo with a process: the figures parse.
func TestMeminfoByProcess(t *testing.T) {
	c := agenttest.Client(t, "")
	svc := New(Config{DataDir: t.TempDir()}, nil, nil, slog.New(slog.DiscardHandler), nil)
	st, err := svc.meminfoByProcess(t.Context(), &live{agent: c})
	if err != nil {
		t.Fatal(err)
	}
	if st.MemTotal <= 0 || st.MemUsed <= 0 || st.MemUsed > st.MemTotal || st.MemCache < 0 {
		t.Errorf("meminfo: %+v", st)
	}
}
