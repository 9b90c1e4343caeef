package store

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func cachedCount(d *db) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.stmts)
}

// TestStatementCache: statements run in a write transaction are prepared
// after it (the writer's one connection is free again) and reused by the
// next transaction on that connection; a query built from a filter is never
// cached; past the bound queries still run, unprepared.
func TestStatementCache(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, "")
	if err := s.CreateSandbox(ctx, newSandbox("sb1", "t1", "running")); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for i := range 3 {
		w := cachedCount(s.w)
		ops := []ProcessOp{
			{Start: &Process{SandboxID: "sb1", PID: 10 + i, Cmd: []string{"true"}, StartedAt: now}},
			{Exit: &ProcessExit{SandboxID: "sb1", PID: 10 + i, ExitCode: i, ExitedAt: now}},
		}
		if err := s.ApplyProcessOps(ctx, ops); err != nil {
			t.Fatal(err)
		}
		switch got := cachedCount(s.w); {
		case i == 0 && got != w+3:
			t.Fatalf("after the first batch the writer caches %d statements, want %d (insert, update and trim)", got, w+3)
		case i > 0 && got != w:
			t.Fatalf("batch %d prepared again: %d cached, was %d", i, got, w)
		}
	}
	ps, err := s.ListProcesses(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 {
		t.Fatalf("processes = %+v", ps)
	}
	for i, p := range ps {
		if p.PID != 10+i || p.ExitCode == nil || *p.ExitCode != i {
			t.Fatalf("process %d = %+v", i, p)
		}
	}

	r := cachedCount(s.r)
	for i := range 5 {
		f := SandboxFilter{Team: "t1", Metadata: map[string]string{}}
		for j := range i {
			f.Metadata[fmt.Sprint("k", j)] = "v"
		}
		if _, _, err := s.ListSandboxes(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	if got := cachedCount(s.r); got != r {
		t.Fatalf("ListSandboxes cached its built queries: %d statements, was %d", got, r)
	}

	// Fill the reader's cache from many goroutines; every query answers.
	var wg sync.WaitGroup
	errs := make(chan error, maxCachedStmts+10)
	for i := range maxCachedStmts + 10 {
		wg.Go(func() {
			var n int
			if err := s.r.QueryRowContext(ctx, fmt.Sprintf("SELECT %d", i)).Scan(&n); err != nil || n != i {
				errs <- fmt.Errorf("SELECT %d = %d, %v", i, n, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := cachedCount(s.r); got != maxCachedStmts {
		t.Fatalf("reader caches %d statements, want the bound %d", got, maxCachedStmts)
	}
	// A bad query still reports its error, cached or not.
	if _, err := s.w.ExecContext(ctx, "UPDATE nosuch SET x = 1"); err == nil {
		t.Fatal("a query of a missing table succeeded")
	}
}
