package sandbox

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/store"
)

// procLogStore is a store file with one running sandbox, sb1, and the
// time it was made.
func procLogStore(t *testing.T) (*store.Store, time.Time) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now().UTC()
	if err := st.CreateSandbox(ctx, store.Sandbox{ID: "sb1", Team: "t", Template: "base", Driver: "gvisor", State: StateRunning, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	return st, now
}

// TestProcLog: starts and exits queued off the exec path reach the store,
// in order, including those queued right before close and after it.
func TestProcLog(t *testing.T) {
	ctx := context.Background()
	st, now := procLogStore(t)
	l := newProcLog(st, slog.New(slog.DiscardHandler))
	for pid := 1; pid <= 300; pid++ {
		l.add(store.ProcessOp{Start: &store.Process{SandboxID: "sb1", PID: pid, Cmd: []string{"true"}, StartedAt: now}})
		l.add(store.ProcessOp{Exit: &store.ProcessExit{SandboxID: "sb1", PID: pid, ExitCode: pid % 7, ExitedAt: now}})
	}
	l.close()
	l.add(store.ProcessOp{Start: &store.Process{SandboxID: "sb1", PID: 301, Cmd: []string{"late"}, StartedAt: now}})
	ps, err := st.ListProcesses(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 301 {
		t.Fatalf("%d records, want 301", len(ps))
	}
	for i, p := range ps[:300] {
		if p.PID != i+1 || p.ExitCode == nil || *p.ExitCode != (i+1)%7 {
			t.Fatalf("record %d = %+v", i, p)
		}
	}
}

// TestProcLogFlush: flush writes what was added before it at once, and
// batches reach the store in order while flushes race the writer (an
// exit written before its start would be dropped).
func TestProcLogFlush(t *testing.T) {
	ctx := context.Background()
	st, now := procLogStore(t)
	l := newProcLog(st, slog.New(slog.DiscardHandler))
	defer l.close()
	for pid := 1; pid <= 200; pid++ {
		l.add(store.ProcessOp{Start: &store.Process{SandboxID: "sb1", PID: pid, Cmd: []string{"true"}, StartedAt: now}})
		if pid%3 == 0 {
			l.flush()
			if ps, _ := st.ListProcesses(ctx, "sb1"); len(ps) != pid {
				t.Fatalf("after flush %d records, want %d", len(ps), pid)
			}
		}
		l.add(store.ProcessOp{Exit: &store.ProcessExit{SandboxID: "sb1", PID: pid, ExitCode: 0, ExitedAt: now}})
		if pid%5 == 0 {
			go l.flush()
		}
	}
	l.flush()
	ps, err := st.ListProcesses(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range ps {
		if p.ExitCode == nil {
			t.Fatalf("record %d (pid %d) lost its exit", i, p.PID)
		}
	}
	if len(ps) != 200 {
		t.Fatalf("%d records, want 200", len(ps))
	}
}
