package agent

import (
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// reaper collects the exit statuses of child processes.
//
// One goroutine handles SIGCHLD. In reapAll mode (the agent is PID 1 and
// inherits every orphan) it calls wait4(-1) and routes statuses by pid,
// discarding those of orphans; otherwise it waits only for the pids it was
// told about, so other children of the same program (tests, for example)
// keep their statuses. Processes are started under the reaper's lock so a
// child that exits at once is never reaped before it is registered.
type reaper struct {
	reapAll bool

	mu      sync.Mutex
	waiting map[int]chan unix.WaitStatus
	sigs    chan os.Signal
	stop    chan struct{}
	once    sync.Once
}

func newReaper(reapAll bool) *reaper {
	r := &reaper{
		reapAll: reapAll,
		waiting: map[int]chan unix.WaitStatus{},
		sigs:    make(chan os.Signal, 1),
		stop:    make(chan struct{}),
	}
	signal.Notify(r.sigs, unix.SIGCHLD)
	go r.loop()
	return r
}

func (r *reaper) close() {
	r.once.Do(func() {
		signal.Stop(r.sigs)
		close(r.stop)
	})
}

// start runs fn (which forks a child and returns its pid) with the lock held
// and registers the pid; the returned channel yields its wait status.
func (r *reaper) start(fn func() (int, error)) (int, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fn()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiting[pid] = ch
	return pid, ch, nil
}

func (r *reaper) loop() {
	for {
		select {
		case <-r.sigs:
			r.reap()
		case <-r.stop:
			return
		}
	}
}

func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reapAll {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				return
			}
			r.deliverLocked(pid, ws)
		}
	}
	for pid := range r.waiting {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		for err == unix.EINTR {
			got, err = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		}
		switch {
		case got == pid:
			r.deliverLocked(pid, ws)
		case err == unix.ECHILD:
			// Someone else reaped it; report an unknown status.
			r.deliverLocked(pid, unix.WaitStatus(255<<8))
		}
	}
}

func (r *reaper) deliverLocked(pid int, ws unix.WaitStatus) {
	if ch, ok := r.waiting[pid]; ok {
		ch <- ws
		delete(r.waiting, pid)
	}
}
