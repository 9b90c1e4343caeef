package sandbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/store"
)

// procLog records process starts and exits in the store off the exec
// path: a writer goroutine applies them in batches, one transaction each.
// The records are history (who ran what, and how it ended); nothing waits
// for them, so an exec costs no database write.
type procLog struct {
	st  *store.Store
	log *slog.Logger

	// wmu is held from taking a batch to having written it, so batches
	// reach the store in order (flush writes one too).
	wmu    sync.Mutex
	mu     sync.Mutex
	ops    []store.ProcessOp
	wake   chan struct{}
	closed bool
	done   chan struct{}
}

func newProcLog(st *store.Store, log *slog.Logger) *procLog {
	l := &procLog{st: st, log: log, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go l.run()
	return l
}

// maxProcLogBacklog bounds what waits in memory: past it, add writes the
// backlog itself (back-pressure instead of unbounded growth). A start's
// command is capped before it is added (store.CapCmd: 4 KiB), so the
// backlog holds at most ~16 MiB, not 4,096 commands of up to 1 MiB.
const maxProcLogBacklog = 4096

// procLogGather is how long the writer waits after the first op of a
// batch for more: one transaction (begin, statements, commit) costs the
// server ~0.2 ms of CPU (pprof), so one per batch instead of two per exec (its
// start and its exit) matters on a small host. A request that reads the
// records back (Commands) flushes first.
const procLogGather = 20 * time.Millisecond

func (l *procLog) add(op store.ProcessOp) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.write([]store.ProcessOp{op})
		return
	}
	l.ops = append(l.ops, op)
	full := len(l.ops) >= maxProcLogBacklog
	l.mu.Unlock()
	if full {
		l.flush()
		return
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *procLog) run() {
	defer close(l.done)
	for {
		<-l.wake
		l.mu.Lock()
		closing := l.closed
		l.mu.Unlock()
		if !closing {
			time.Sleep(procLogGather)
		}
		l.wmu.Lock()
		l.mu.Lock()
		ops, closed := l.ops, l.closed
		l.ops = nil
		l.mu.Unlock()
		if len(ops) > 0 {
			l.write(ops)
		}
		l.wmu.Unlock()
		if closed {
			return
		}
	}
}

func (l *procLog) write(ops []store.ProcessOp) {
	if err := l.st.ApplyProcessOps(context.Background(), ops); err != nil {
		l.log.Warn("process log: records lost", "count", len(ops), "err", err)
	}
}

// flush writes what is pending now, after any batch being written: a
// reader of the records (Commands) then sees every op added before.
func (l *procLog) flush() {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	ops := l.ops
	l.ops = nil
	l.mu.Unlock()
	if len(ops) > 0 {
		l.write(ops)
	}
}

// close writes what is pending and stops the writer; later ops are
// written synchronously.
func (l *procLog) close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	<-l.done
}
