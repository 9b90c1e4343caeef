package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/server"
	space "github.com/spacesandbox/space/sdk/go"
)

// execBreakdown splits the exec round trip into what space adds and what
// the sandbox's kernel costs: an agent round trip that starts no process
// (a file stat), and the time gVisor takes to create a process, measured
// inside the sandbox by a loop in sh (dash: bash's fork copies its larger
// address space, ~3 ms more per process in gVisor here, which an agent's
// vfork does not pay).
func (b *bench) execBreakdown(id string, raw *rawRunsc, cid string, n int) error {
	r := row{name: "agent round trip, no process (file stat)", rawName: "runsc exec stat"}
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if code := b.do("GET", "/v1/sandboxes/"+id+"/files/stat?path=/etc/hostname", nil, nil); code != 200 {
			return fmt.Errorf("stat: HTTP %d", code)
		}
		r.space = append(r.space, time.Since(t0))
		if i < n/4 {
			t0 = time.Now()
			if out, err := exec.Command(b.runsc, "--root", raw.root, "exec", cid, "stat", "/etc/hostname").CombinedOutput(); err != nil {
				return fmt.Errorf("runsc exec stat: %v: %s", err, out)
			}
			r.raw = append(r.raw, time.Since(t0))
		}
	}
	b.rows = append(b.rows, r)
	var res struct {
		Stdout   string `json:"stdout"`
		ExitCode int    `json:"exit_code"`
	}
	loop := `s=$(date +%s%N); for i in $(seq 100); do /bin/true; done; e=$(date +%s%N); echo $(( (e-s)/100000 ))`
	if code := b.do("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": []string{"/bin/sh", "-c", loop}}, &res); code != 200 || res.ExitCode != 0 {
		return fmt.Errorf("spawn loop: HTTP %d %+v", code, res)
	}
	us, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))
	b.spawnUS = us
	b.notes = append(b.notes, fmt.Sprintf("Process creation inside gVisor (systrap): a loop of 100 `/bin/true` in `sh` (dash) in the sandbox takes %.2f ms per process; "+
		"the exec round trip above is that plus the agent round trip (row \"agent round trip, no process\").", float64(us)/1000))
	return nil
}

// stdoutThroughput streams a large stdout through the API's SSE exec and
// through `runsc exec` into a pipe, from two producers: `cat` of a file
// (128 KiB writes: what the streaming path can carry) and `yes | head`
// (small writes: inside gVisor every system call costs tens of
// microseconds, so this producer alone is slow in both columns).
func (b *bench) stdoutThroughput(raw *rawRunsc, cid string, rounds int) error {
	const size = 256 << 20
	// The file sits in /tmp (a tmpfs) on both sides, so the producer only
	// copies memory. space bounds /tmp at half the sandbox's memory (raw
	// runsc's is unbounded): this figure gets a sandbox of 1 GiB.
	const file = "/tmp/stdout.txt"
	var sb struct{ ID string }
	if code := b.do("POST", "/v1/sandboxes", map[string]any{"timeout_s": 3600, "memory_mb": 1024}, &sb); code != 201 {
		return fmt.Errorf("stdout: create a 1 GiB sandbox: HTTP %d", code)
	}
	id := sb.ID
	defer b.do("DELETE", "/v1/sandboxes/"+id, nil, nil)
	gen := fmt.Sprintf("yes abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ | head -c %d", size)
	var res struct {
		ExitCode int `json:"exit_code"`
	}
	if code := b.do("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": gen + " > " + file}, &res); code != 200 || res.ExitCode != 0 {
		return fmt.Errorf("stdout: writing the file: HTTP %d, exit %d", code, res.ExitCode)
	}
	if out, err := exec.Command(b.runsc, "--root", raw.root, "exec", cid, "sh", "-c", gen+" > "+file).CombinedOutput(); err != nil {
		return fmt.Errorf("runsc exec: writing the file: %v: %s", err, out)
	}
	defer exec.Command(b.runsc, "--root", raw.root, "exec", cid, "rm", "-f", file).Run()
	mbps := func(d time.Duration) float64 { return float64(size) / (1 << 20) / d.Seconds() }
	for _, p := range []struct{ name, cmd string }{
		{"stdout 256 MiB, `cat` of a file, streamed (SSE exec)", "cat " + file},
		{"stdout 256 MiB, `yes | head`, streamed (SSE exec)", gen},
	} {
		r := row{name: p.name, rawName: "runsc exec … > pipe"}
		for i := 0; i < rounds; i++ {
			t0 := time.Now()
			n, err := b.sseBytes(id, p.cmd)
			if err != nil {
				return err
			}
			if n != size {
				return fmt.Errorf("stdout: got %d bytes, want %d", n, size)
			}
			r.space = append(r.space, time.Since(t0))
			t0 = time.Now()
			c := exec.Command(b.runsc, "--root", raw.root, "exec", cid, "sh", "-c", p.cmd)
			out, err := c.StdoutPipe()
			if err != nil {
				return err
			}
			if err := c.Start(); err != nil {
				return err
			}
			got, _ := io.Copy(io.Discard, out)
			if err := c.Wait(); err != nil || got != size {
				return fmt.Errorf("runsc exec stdout: %v (%d bytes)", err, got)
			}
			r.raw = append(r.raw, time.Since(t0))
		}
		b.rows = append(b.rows, r)
		b.notes = append(b.notes, fmt.Sprintf("%s, p50: %.0f MiB/s through space, %.0f MiB/s from `runsc exec` into a pipe.",
			p.name, mbps(pct(r.space, .5)), mbps(pct(r.raw, .5))))
	}
	return nil
}

// sseBytes runs cmd with an SSE exec, read and decoded by the Go SDK (what
// its users get), and returns how many stdout bytes arrived.
func (b *bench) sseBytes(id, cmd string) (int, error) {
	c := space.NewClient(b.url, b.key, space.WithHTTPClient(apiClient))
	s, err := c.ExecStream(context.Background(), id, space.ExecRequest{Shell: cmd})
	if err != nil {
		return 0, fmt.Errorf("sse exec: %w", err)
	}
	defer s.Close()
	n := 0
	for {
		ev, err := s.Next()
		if err != nil {
			return n, fmt.Errorf("sse exec: stream ended without exit: %w", err)
		}
		switch ev.Type {
		case space.EventStdout:
			n += len(ev.Data)
		case space.EventExit:
			if ev.ExitCode != 0 {
				return n, fmt.Errorf("sse exec: %q exited %d", cmd, ev.ExitCode)
			}
			return n, nil
		}
	}
}

// densityAndChurn starts a server with a warm pool, fills the machine with
// `idle` idle sandboxes, reports memory per idle sandbox and warm-create
// latency with all of them alive, then runs the churn load generator
// (`space bench load`) and records its summary.
func (b *bench) densityAndChurn(agent string, idle, cycles int) error {
	if idle <= 0 && cycles <= 0 {
		return nil
	}
	data := filepath.Join(b.tmp, "density")
	s, stop, err := b.serve(server.Config{DataDir: data, AgentPath: agent, PoolSize: 20})
	if err != nil {
		return err
	}
	defer stop()
	if idle > 0 {
		before := memAvailable()
		var mu sync.Mutex
		var ids []string
		var firstErr error
		var wg sync.WaitGroup
		next := make(chan struct{})
		go func() {
			for i := 0; i < idle; i++ {
				next <- struct{}{}
			}
			close(next)
		}()
		t0 := time.Now()
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range next {
					id, err := s.createTimeout(3600)
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = err
					}
					if err == nil {
						ids = append(ids, id)
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		fill := time.Since(t0)
		var extra []string
		cleanup := func() {
			for _, id := range append(ids, extra...) {
				s.do("DELETE", "/v1/sandboxes/"+id, nil, nil)
			}
		}
		if firstErr != nil {
			cleanup()
			return fmt.Errorf("density: %d of %d created: %v", len(ids), idle, firstErr)
		}
		time.Sleep(10 * time.Second) // let boots settle into idle
		used := before - memAvailable()
		pss := runscPSS(data)
		// Every idle sandbox still answers.
		for _, id := range ids {
			if code := s.do("GET", "/v1/sandboxes/"+id+"/files/stat?path=/etc/hostname", nil, nil); code != 200 {
				cleanup()
				return fmt.Errorf("density: idle sandbox %s does not answer: HTTP %d", id, code)
			}
		}
		r := row{name: fmt.Sprintf("create (warm pool, 20 concurrent clients) with %d idle sandboxes alive", len(ids)), rawName: "runsc run → first output (above)"}
		for round := 0; round < 3; round++ {
			// The pool refills at the lowest CPU share, one boot at a
			// time: with this many sandboxes alive it may take a while.
			// A pool that is not full by the deadline is measured anyway
			// (its creates go cold) and said so in the notes.
			deadline := time.Now().Add(3 * time.Minute)
			for s.pooled() < 20 && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
			}
			if n := s.pooled(); n < 20 {
				b.notes = append(b.notes, fmt.Sprintf("Density round %d: the pool had %d of 20 warm sandboxes ready after 3 minutes; the rest of the creates went cold.", round+1, n))
			}
			ds, made, err := s.concurrentCreates(20)
			extra = append(extra, made...)
			if err != nil {
				cleanup()
				return err
			}
			r.space = append(r.space, ds...)
		}
		for _, row := range b.rows {
			if strings.HasPrefix(row.name, "create (cold") {
				r.raw = row.raw
			}
		}
		b.rows = append(b.rows, r)
		cleanup()
		b.notes = append(b.notes, fmt.Sprintf("Density: %d idle `base` sandboxes (plus 20 warm) started in %s; host memory in use grew by %d MiB "+
			"(%.1f MiB per sandbox; proportional set size of their runsc processes %.1f MiB per sandbox); all of them answered afterwards.",
			len(ids), fill.Round(time.Second), used>>20, float64(used)/float64(len(ids)+20)/(1<<20), float64(pss)/float64(len(ids)+20)/(1<<20)))
	}
	if cycles > 0 {
		// Let the pool refill after the density run's sandboxes are gone.
		deadline := time.Now().Add(3 * time.Minute)
		for s.pooled() < 20 && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		space := filepath.Join(filepath.Dir(agent), "space")
		out, err := exec.Command(space, "--data", data, "bench", "load", "--concurrency", "20", "--cycles", strconv.Itoa(cycles), "--check-leaks", data).CombinedOutput()
		summary := strings.TrimSpace(string(out))
		b.notes = append(b.notes, "Churn (`space bench load --concurrency 20 --cycles "+strconv.Itoa(cycles)+" --check-leaks DIR`, warm pool of 20):\n\n```\n"+summary+"\n```")
		if err != nil {
			return fmt.Errorf("churn: %v: %s", err, summary)
		}
	}
	return nil
}

func (b *bench) createTimeout(timeoutS int) (string, error) {
	var sb struct{ ID string }
	if code := b.do("POST", "/v1/sandboxes", map[string]any{"timeout_s": timeoutS}, &sb); code != 201 {
		return "", fmt.Errorf("create: HTTP %d", code)
	}
	return sb.ID, nil
}

// concurrentCreates fires n creates at once and returns their latencies.
func (b *bench) concurrentCreates(n int) ([]time.Duration, []string, error) {
	ds, _, ids, err := b.concurrentCreatesExec(n, false)
	return ds, ids, err
}

// concurrentCreatesExec fires n creates at once; with thenExec each client
// then runs `true` in its sandbox, and the second list has the time from
// the create's start to that exec's answer (a warm create answers before
// the sandbox has its identity; the first exec waits for it).
func (b *bench) concurrentCreatesExec(n int, thenExec bool) (create, toExec []time.Duration, ids []string, err error) {
	type res struct {
		d, e time.Duration
		id   string
		err  error
	}
	// The clients have talked to the server before (as an SDK client
	// keeps its connections alive): each one's connection is open when
	// the round starts.
	var pre sync.WaitGroup
	for i := 0; i < n; i++ {
		pre.Go(func() {
			req, _ := http.NewRequest("GET", b.url+"/healthz", nil)
			if resp, err := apiClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	pre.Wait()
	out := make(chan res, n)
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		go func() {
			<-start
			t0 := time.Now()
			id, err := b.create()
			r := res{d: time.Since(t0), id: id, err: err}
			if err == nil && thenExec {
				var x struct {
					ExitCode int `json:"exit_code"`
				}
				if code := b.do("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": []string{"true"}}, &x); code != 200 || x.ExitCode != 0 {
					r.err = fmt.Errorf("first exec: HTTP %d, exit %d", code, x.ExitCode)
				}
				r.e = time.Since(t0)
			}
			out <- r
		}()
	}
	close(start)
	for i := 0; i < n; i++ {
		x := <-out
		if x.id != "" {
			ids = append(ids, x.id)
		}
		if x.err != nil {
			err = x.err
			continue
		}
		create = append(create, x.d)
		if thenExec {
			toExec = append(toExec, x.e)
		}
	}
	return create, toExec, ids, err
}

// pooled reads the number of warm sandboxes from /metrics.
func (b *bench) pooled() int {
	ready, _ := b.poolCounts()
	return ready
}

// poolCounts returns the warm sandboxes booted and ready
// (space_pool_ready) and those recorded pooled, ready or still booting
// (space_sandboxes{state="pooled"}).
func (b *bench) poolCounts() (ready, recorded int) {
	resp, err := http.Get(b.url + "/metrics")
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(l, "space_pool_ready{"); ok {
			if _, v, ok := strings.Cut(rest, "} "); ok {
				k, _ := strconv.Atoi(strings.TrimSpace(v))
				ready += k
			}
		}
		if v, ok := strings.CutPrefix(l, `space_sandboxes{state="pooled"} `); ok {
			recorded, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return ready, recorded
}

// poolSettled waits (up to limit) until the pool has at least n ready and
// no refill boot is under way.
func (b *bench) poolSettled(n int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if ready, recorded := b.poolCounts(); ready >= n && ready == recorded {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// memAvailable is the host's MemAvailable in bytes.
func memAvailable() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// runscPSS sums the proportional set size of the runsc processes (sandbox
// and gofer) of the server with data dir data.
func runscPSS(data string) int64 {
	var total int64
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cl, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.HasPrefix(string(cl), "runsc") || !strings.Contains(string(cl), data) {
			continue
		}
		sm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "smaps_rollup"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(sm), "\n") {
			if v, ok := strings.CutPrefix(l, "Pss:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}

// deleteAll deletes every sandbox the server lists (the bench's admin key
// sees them all).
func (b *bench) deleteAll() {
	var list struct {
		Sandboxes []struct{ ID string } `json:"sandboxes"`
	}
	b.do("GET", "/v1/sandboxes?limit=1000", nil, &list)
	for _, sb := range list.Sandboxes {
		b.do("DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	}
}

// serve runs a second server for one section of the bench (cfg gets the
// bench's cache, runsc, a free port and quiet settings) and returns a
// client for it and a stop function that waits for the server to exit.
func (b *bench) serve(cfg server.Config) (*bench, func(), error) {
	cfg.CacheDir, cfg.RunscPath, cfg.Listen, cfg.LogLevel = b.cache, b.runsc, "127.0.0.1:0", "warn"
	cfg.SnapshotIntervalS, cfg.CheckpointOnPause = -1, "off"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- server.Run(ctx, cfg) }()
	stop := func() {
		cancel()
		<-done
	}
	s := &bench{tmp: b.tmp}
	if err := s.waitReady(cfg.DataDir, done); err != nil {
		cancel()
		return nil, func() {}, err
	}
	return s, stop, nil
}
