// Command space-bench measures space against the raw runtime on this
// machine and writes docs/PERF.md. Every figure is measured in the same run,
// side by side: space through its HTTP API versus runsc invoked directly on
// the same template rootfs with the same flags.
//
//	go run ./cmd/space-bench -out docs/PERF.md
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/driver/gvisor"
	"github.com/spacesandbox/space/internal/server"
	"github.com/spacesandbox/space/internal/template"
)

func main() {
	out := flag.String("out", "", "write the report (Markdown) to this file")
	cache := flag.String("cache", envOr("SPACE_CACHE", "/var/cache/space"), "cache dir (runsc, templates)")
	agent := flag.String("agent", envOr("SPACE_AGENT", "bin/space-agent"), "space-agent binary")
	runsc := flag.String("runsc", os.Getenv("SPACE_RUNSC"), "runsc binary")
	nCreate := flag.Int("creates", 20, "create samples")
	nExec := flag.Int("execs", 200, "exec samples")
	nFile := flag.Int("files", 50, "file write+read samples")
	nState := flag.Int("states", 10, "pause/resume/checkpoint/restore/fork samples")
	wsMB := flag.Int("workspace-mb", 1024, "workspace size for the files-snapshot figures")
	density := flag.Int("density", 200, "idle sandboxes for the density figure (0 skips)")
	churn := flag.Int("churn", 2000, "create→exec→destroy cycles for the churn figure (0 skips)")
	only := flag.String("only", "", "run one group of figures alone and print it, leaving -out alone: pause")
	nPause := flag.Int("pauses", 30, "samples of -only pause")
	flag.Parse()
	if *runsc == "" {
		*runsc = filepath.Join(*cache, "runsc-"+gvisor.BuildName(), "runsc")
	}
	agentAbs, _ := filepath.Abs(*agent)
	b := &bench{runsc: *runsc, cache: *cache, nState: *nState, wsMB: *wsMB, density: *density, churn: *churn}
	switch *only {
	case "":
	case "pause":
		if err := b.pauseRows(agentAbs, *nPause); err != nil {
			fmt.Fprintln(os.Stderr, "space-bench:", err)
			os.Exit(1)
		}
		fmt.Print(b.report())
		return
	default:
		fmt.Fprintf(os.Stderr, "space-bench: -only %q: the groups are: pause\n", *only)
		os.Exit(2)
	}
	if err := b.run(agentAbs, *nCreate, *nExec, *nFile); err != nil {
		fmt.Fprintln(os.Stderr, "space-bench:", err)
		os.Exit(1)
	}
	report := b.report()
	fmt.Print(report)
	if *out != "" {
		// Keep the hand-written part of the file (after the marker):
		// figures from other benchmarks and what was learned from them.
		if old, err := os.ReadFile(*out); err == nil {
			if i := strings.Index(string(old), manualMarker); i >= 0 {
				report += "\n" + string(old[i:])
			}
		}
		if err := os.WriteFile(*out, []byte(report), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "space-bench:", err)
			os.Exit(1)
		}
	}
}

// apiClient is the bench's HTTP client: like the SDKs' it keeps enough
// idle connections for every concurrent client (http.DefaultClient keeps
// two, so twenty concurrent calls would each open a new connection).
var apiClient = func() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return &http.Client{Transport: t}
}()

// manualMarker starts the hand-maintained part of docs/PERF.md.
const manualMarker = "<!-- manual: kept by make bench -->"

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

type row struct {
	name       string
	space, raw []time.Duration
	rawName    string
}

type bench struct {
	runsc, cache string
	nState, wsMB int
	density      int // idle sandboxes for the density figure
	churn        int // churn cycles
	spawnUS      int // process creation inside gVisor, µs
	notes        []string
	rows         []row
	url, key     string
	tmp          string
	dataDir      string
}

// serveMain starts the bench's own space server (b answers for it) on tmp/data with checkpointOnPause, waits
// until it answers and builds (or finds cached) the base template for the
// raw runsc side of the rows. stop deletes every sandbox of the run (they
// outlive their server by design), then stops the server.
func (b *bench) serveMain(ctx context.Context, tmp, agent, checkpointOnPause string) (*rawRunsc, func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	data := filepath.Join(tmp, "data")
	b.dataDir = data
	done := make(chan error, 1)
	go func() {
		done <- server.Run(ctx, server.Config{DataDir: data, CacheDir: b.cache, Listen: "127.0.0.1:0", RunscPath: b.runsc, AgentPath: agent, LogLevel: "warn",
			SnapshotIntervalS: -1, CheckpointOnPause: checkpointOnPause, PoolSize: -1})
	}()
	if err := b.waitReady(data, done); err != nil {
		cancel()
		return nil, nil, err
	}
	stop := func() {
		b.deleteAll()
		cancel()
		<-done
	}
	tb, err := template.NewBuilder(filepath.Join(b.cache, "templates"))
	if err != nil {
		stop()
		return nil, nil, err
	}
	tpl, err := tb.Build(ctx, template.Base(), func(string) {})
	if err != nil {
		stop()
		return nil, nil, err
	}
	return &rawRunsc{runsc: b.runsc, root: filepath.Join(tmp, "raw-root"), rootfs: tpl.Path, dir: filepath.Join(tmp, "raw")}, stop, nil
}

func (b *bench) run(agent string, nCreate, nExec, nFile int) error {
	tmp, err := os.MkdirTemp("", "space-bench-")
	if err != nil {
		return err
	}
	b.tmp = tmp
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	raw, stop, err := b.serveMain(ctx, tmp, agent, "off")
	if err != nil {
		return err
	}
	defer stop()

	// create (cold: no pool) vs runsc create+start to the first output.
	r := row{name: "create (cold, to agent ready)", rawName: "runsc run → first output"}
	var ids []string
	for i := 0; i < nCreate; i++ {
		t0 := time.Now()
		id, err := b.create()
		if err != nil {
			return err
		}
		r.space = append(r.space, time.Since(t0))
		ids = append(ids, id)
		d, err := raw.runEcho(fmt.Sprintf("rawc%d", i))
		if err != nil {
			return err
		}
		r.raw = append(r.raw, d)
	}
	b.rows = append(b.rows, r)
	for _, id := range ids[1:] {
		b.do("DELETE", "/v1/sandboxes/"+id, nil, nil)
	}
	id := ids[0]

	// exec round trip of `true`.
	cid := "rawexec"
	if err := raw.startSleeper(cid); err != nil {
		return err
	}
	defer raw.delete(cid)
	r = row{name: "exec `true` round trip", rawName: "runsc exec true"}
	for i := 0; i < nExec; i++ {
		t0 := time.Now()
		var res struct {
			ExitCode int `json:"exit_code"`
		}
		if code := b.do("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": []string{"true"}}, &res); code != 200 || res.ExitCode != 0 {
			return fmt.Errorf("exec: %d", code)
		}
		r.space = append(r.space, time.Since(t0))
		if i < nExec/4 { // runsc exec is slow; fewer samples suffice
			t0 = time.Now()
			if out, err := exec.Command(b.runsc, "--root", raw.root, "exec", cid, "true").CombinedOutput(); err != nil {
				return fmt.Errorf("runsc exec: %v: %s", err, out)
			}
			r.raw = append(r.raw, time.Since(t0))
		}
	}
	b.rows = append(b.rows, r)

	// A shell command: a bash login shell, as every E2B commands.run is.
	r = row{name: "shell command `true` round trip (bash -lc)", rawName: "runsc exec bash -lc true"}
	for i := 0; i < nExec/2; i++ {
		t0 := time.Now()
		var res struct {
			ExitCode int `json:"exit_code"`
		}
		if code := b.do("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": "true"}, &res); code != 200 || res.ExitCode != 0 {
			return fmt.Errorf("shell exec: %d", code)
		}
		r.space = append(r.space, time.Since(t0))
		if i < nExec/8 {
			t0 = time.Now()
			if out, err := exec.Command(b.runsc, "--root", raw.root, "exec", cid, "bash", "-lc", "true").CombinedOutput(); err != nil {
				return fmt.Errorf("runsc exec bash: %v: %s", err, out)
			}
			r.raw = append(r.raw, time.Since(t0))
		}
	}
	b.rows = append(b.rows, r)
	if err := b.execBreakdown(id, raw, cid, nExec); err != nil {
		return err
	}
	if err := b.stdoutThroughput(raw, cid, 3); err != nil {
		return err
	}
	if err := b.snapshotOnExecRows(id, nExec/4); err != nil { // execsnap.go
		return err
	}

	// 1 MB file write + read.
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	r = row{name: "1 MB file write+read", rawName: "runsc exec cat > f; runsc exec cat f"}
	for i := 0; i < nFile; i++ {
		t0 := time.Now()
		if err := b.putGet(id, payload); err != nil {
			return err
		}
		r.space = append(r.space, time.Since(t0))
		if i < nFile/2 {
			t0 = time.Now()
			w := exec.Command(b.runsc, "--root", raw.root, "exec", cid, "sh", "-c", "cat > /tmp/f")
			w.Stdin = bytes.NewReader(payload)
			if out, err := w.CombinedOutput(); err != nil {
				return fmt.Errorf("runsc exec write: %v: %s", err, out)
			}
			got, err := exec.Command(b.runsc, "--root", raw.root, "exec", cid, "cat", "/tmp/f").Output()
			if err != nil || len(got) != len(payload) {
				return fmt.Errorf("runsc exec read: %v (%d bytes)", err, len(got))
			}
			r.raw = append(r.raw, time.Since(t0))
		}
	}
	b.rows = append(b.rows, r)
	if err := b.stateOps(id, raw, cid); err != nil {
		return err
	}
	if err := b.warmCreates(agent, raw, 20, 4); err != nil {
		return err
	}
	if err := b.densityAndChurn(agent, b.density, b.churn); err != nil {
		return err
	}
	if err := b.qemuRows(agent); err != nil { // qemu.go; -qemu=false skips
		return err
	}
	if err := b.egressRows(); err != nil { // egress.go
		return err
	}
	if err := b.interpreterRows(agent); err != nil { // interp.go; -interpreter 0 skips
		return err
	}
	b.do("DELETE", "/v1/sandboxes/"+id, nil, nil)
	return nil
}

// stateOps measures pause/resume, checkpoint/restore and fork through the
// API against runsc's own verbs, and files snapshots of a large workspace.
func (b *bench) stateOps(id string, raw *rawRunsc, cid string) error {
	post := func(path string, body any, out any) error {
		if code := b.do("POST", path, body, out); code/100 != 2 {
			return fmt.Errorf("POST %s: HTTP %d", path, code)
		}
		return nil
	}
	timeIt := func(f func() error) (time.Duration, error) {
		t0 := time.Now()
		err := f()
		return time.Since(t0), err
	}
	runsc := func(args ...string) error {
		out, err := exec.Command(b.runsc, append([]string{"--root", raw.root}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("runsc %s: %v: %s", args[0], err, out)
		}
		return nil
	}
	pause := row{name: "pause", rawName: "runsc pause"}
	resume := row{name: "resume", rawName: "runsc resume"}
	ckpt := row{name: "checkpoint (snapshot kind=checkpoint, stored)", rawName: "runsc checkpoint --leave-running"}
	restore := row{name: "create from checkpoint (restore, to agent ready)", rawName: "runsc restore --detach"}
	fork1 := row{name: "fork ×1 (checkpoint + restore)", rawName: "runsc checkpoint + restore"}
	fork5 := row{name: "fork ×5", rawName: "runsc checkpoint + 5 restores"}
	var snapID string
	for i := 0; i < b.nState; i++ {
		d, err := timeIt(func() error { return post("/v1/sandboxes/"+id+"/pause", nil, nil) })
		if err != nil {
			return err
		}
		pause.space = append(pause.space, d)
		d, err = timeIt(func() error { return post("/v1/sandboxes/"+id+"/resume", nil, nil) })
		if err != nil {
			return err
		}
		resume.space = append(resume.space, d)
		d, _ = timeIt(func() error { return runsc("pause", cid) })
		pause.raw = append(pause.raw, d)
		d, _ = timeIt(func() error { return runsc("resume", cid) })
		resume.raw = append(resume.raw, d)

		var sn struct {
			ID       string `json:"id"`
			BytesNew int64  `json:"bytes_new"`
		}
		d, err = timeIt(func() error {
			return post("/v1/sandboxes/"+id+"/snapshots", map[string]string{"kind": "checkpoint"}, &sn)
		})
		if err != nil {
			return err
		}
		ckpt.space = append(ckpt.space, d)
		snapID = sn.ID
		img := filepath.Join(b.tmp, fmt.Sprintf("rawimg%d", i))
		d, err = timeIt(func() error { return runsc("checkpoint", "--leave-running", "--image-path", img, cid) })
		if err != nil {
			return err
		}
		ckpt.raw = append(ckpt.raw, d)

		var sb struct{ ID string }
		d, err = timeIt(func() error { return post("/v1/sandboxes", map[string]string{"snapshot": snapID}, &sb) })
		if err != nil {
			return err
		}
		restore.space = append(restore.space, d)
		b.do("DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
		rid := fmt.Sprintf("rawrestore%d", i)
		d, err = timeIt(func() error { return raw.restore(rid, img) })
		if err != nil {
			return err
		}
		restore.raw = append(restore.raw, d)
		raw.delete(rid)

		for _, f := range []struct {
			r *row
			n int
		}{{&fork1, 1}, {&fork5, 5}} {
			if i >= b.nState/2 && f.n == 5 {
				continue // fork ×5 is slow: half the samples
			}
			var out struct {
				Sandboxes []struct{ ID string } `json:"sandboxes"`
			}
			d, err = timeIt(func() error { return post("/v1/sandboxes/"+id+"/fork", map[string]int{"count": f.n}, &out) })
			if err != nil {
				return err
			}
			f.r.space = append(f.r.space, d)
			for _, k := range out.Sandboxes {
				b.do("DELETE", "/v1/sandboxes/"+k.ID, nil, nil)
			}
			fimg := filepath.Join(b.tmp, fmt.Sprintf("rawfork%d-%d", i, f.n))
			d, err = timeIt(func() error {
				if err := runsc("checkpoint", "--leave-running", "--image-path", fimg, cid); err != nil {
					return err
				}
				for k := 0; k < f.n; k++ {
					if err := raw.restore(fmt.Sprintf("rawfork%d-%d-%d", i, f.n, k), fimg); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			f.r.raw = append(f.r.raw, d)
			for k := 0; k < f.n; k++ {
				raw.delete(fmt.Sprintf("rawfork%d-%d-%d", i, f.n, k))
			}
			os.RemoveAll(fimg)
		}
		os.RemoveAll(img)
	}
	b.rows = append(b.rows, pause, resume, ckpt, restore, fork1, fork5)

	// Files snapshots of a large workspace: unchanged, then 1% changed.
	var res struct {
		ExitCode int `json:"exit_code"`
	}
	if err := post("/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": fmt.Sprintf("mkdir -p /home/user/ws && for i in $(seq 1 %d); do head -c 16777216 /dev/urandom > /home/user/ws/f$i; done", b.wsMB/16)}, &res); err != nil {
		return err
	}
	unchanged := row{name: fmt.Sprintf("files snapshot, %d MiB workspace unchanged", b.wsMB), rawName: "runsc tar rootfs-upper > /dev/null"}
	changed := row{name: fmt.Sprintf("files snapshot, %d MiB workspace, 16 MiB changed", b.wsMB), rawName: "runsc tar rootfs-upper > /dev/null"}
	var first struct {
		BytesNew   int64 `json:"bytes_new"`
		BytesTotal int64 `json:"bytes_total"`
	}
	if err := post("/v1/sandboxes/"+id+"/snapshots", map[string]string{"kind": "files"}, &first); err != nil {
		return err
	}
	var lastNewUnchanged, lastNewChanged, lastTotal int64
	for i := 0; i < 3; i++ {
		var sn struct {
			BytesNew   int64 `json:"bytes_new"`
			BytesTotal int64 `json:"bytes_total"`
		}
		d, err := timeIt(func() error { return post("/v1/sandboxes/"+id+"/snapshots", map[string]string{"kind": "files"}, &sn) })
		if err != nil {
			return err
		}
		unchanged.space = append(unchanged.space, d)
		lastNewUnchanged, lastTotal = sn.BytesNew, sn.BytesTotal
		if err := post("/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": "head -c 16777216 /dev/urandom > /home/user/ws/f1"}, &res); err != nil {
			return err
		}
		d, err = timeIt(func() error { return post("/v1/sandboxes/"+id+"/snapshots", map[string]string{"kind": "files"}, &sn) })
		if err != nil {
			return err
		}
		changed.space = append(changed.space, d)
		lastNewChanged = sn.BytesNew
		rawd, err := timeIt(func() error {
			cmd := exec.Command(b.runsc, "--root", filepath.Join(b.dataDir, "runsc"), "tar", "rootfs-upper", "--file", "/dev/null", id)
			out, err := cmd.CombinedOutput()
			if err != nil {
				return fmt.Errorf("runsc tar: %v: %s", err, out)
			}
			return nil
		})
		if err != nil {
			return err
		}
		unchanged.raw = append(unchanged.raw, rawd)
		changed.raw = append(changed.raw, rawd)
	}
	b.rows = append(b.rows, unchanged, changed)
	b.notes = append(b.notes,
		fmt.Sprintf("Stored bytes per snapshot (%d MiB workspace, %d bytes total): first files snapshot %d new; unchanged %d new; after rewriting one 16 MiB file %d new.", b.wsMB, lastTotal, first.BytesNew, lastNewUnchanged, lastNewChanged))
	return nil
}

// warmCreates measures creates served by the warm pool: a second server
// keeps `clients` sandboxes warm; each round fires that many concurrent
// creates once the pool is full. The create-and-first-exec row is set
// against as many `runsc run` started at once (before the server starts,
// so nothing of it runs meanwhile): what the same burst of agents costs
// the raw runtime.
func (b *bench) warmCreates(agent string, raw *rawRunsc, clients, rounds int) error {
	var rawBurst []time.Duration
	for round := 0; round < rounds/2; round++ {
		ds, err := raw.concurrentRuns(fmt.Sprintf("rawburst%d-", round), clients)
		if err != nil {
			return err
		}
		rawBurst = append(rawBurst, ds...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// Stop the server and wait for it (it drains its pool) before the
	// caller removes the temp dir; the deferred deletes run first.
	defer func() {
		cancel()
		<-done
	}()
	data := filepath.Join(b.tmp, "warm")
	go func() {
		done <- server.Run(ctx, server.Config{DataDir: data, CacheDir: b.cache, Listen: "127.0.0.1:0", RunscPath: b.runsc, AgentPath: agent, LogLevel: "warn",
			SnapshotIntervalS: -1, CheckpointOnPause: "off", PoolSize: clients})
	}()
	cold := &bench{url: "", tmp: b.tmp}
	if err := cold.waitReady(data, done); err != nil {
		return err
	}
	r := row{name: fmt.Sprintf("create (warm pool, %d concurrent clients)", clients), rawName: "runsc run → first output (above)"}
	re := row{name: fmt.Sprintf("warm create + first exec `true` (%d concurrent clients)", clients), rawName: fmt.Sprintf("%d concurrent runsc run → first output", clients), raw: rawBurst}
	for round := 0; round < rounds; round++ {
		deadline := time.Now().Add(3 * time.Minute)
		for cold.pooled() < clients && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		// Even rounds time the create alone, odd rounds the create and
		// the first exec in it.
		ds, es, made, err := cold.concurrentCreatesExec(clients, round%2 == 1)
		for _, id := range made {
			defer cold.do("DELETE", "/v1/sandboxes/"+id, nil, nil)
		}
		if err != nil {
			return fmt.Errorf("warm create failed: %v", err)
		}
		if round%2 == 0 {
			r.space = append(r.space, ds...)
		} else {
			re.space = append(re.space, es...)
		}
	}
	// One client at a time on a settled server, as a user arriving finds
	// it: the create and the first command right after it.
	one := row{name: "warm create + first exec `true` (one client, pool settled)", rawName: "runsc run → first output (above)"}
	for i := 0; i < max(10, rounds*2); i++ {
		cold.poolSettled(clients, 5*time.Minute)
		_, es, made, err := cold.concurrentCreatesExec(1, true)
		for _, id := range made {
			cold.do("DELETE", "/v1/sandboxes/"+id, nil, nil)
		}
		if err != nil {
			return fmt.Errorf("warm create + exec failed: %v", err)
		}
		one.space = append(one.space, es...)
	}
	for _, row := range b.rows {
		if strings.HasPrefix(row.name, "create (cold") {
			r.raw, one.raw = row.raw, row.raw
		}
	}
	b.rows = append(b.rows, r)
	if len(re.space) > 0 {
		b.rows = append(b.rows, re)
	}
	b.rows = append(b.rows, one)
	b.notes = append(b.notes, fmt.Sprintf("Warm create rows: each round starts once the pool has %d sandboxes ready (`space_pool_ready`); its %d clients already hold a kept-alive connection to the server, as SDK clients do (the Go SDK keeps up to 64), and fire their creates at once. Claimed sandboxes stay alive until the end of the bench.", clients, clients))
	b.notes = append(b.notes, fmt.Sprintf("The create + first exec row with %d clients is set against %d `runsc run` of `echo` started at once (%d rounds, before the warm pool's server starts): what the same burst of agents costs the raw runtime. Raw runs that failed were left out: %d of %d.",
		clients, clients, rounds/2, clients*(rounds/2)-len(rawBurst), clients*(rounds/2)))
	return nil
}

func (b *bench) waitReady(data string, done chan error) error {
	deadline := time.Now().Add(20 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			return fmt.Errorf("server exited: %v", err)
		default:
		}
		if b.url == "" {
			if j, err := os.ReadFile(filepath.Join(data, server.ServeFile)); err == nil {
				var v struct{ URL string }
				json.Unmarshal(j, &v)
				b.url = v.URL
				k, _ := os.ReadFile(filepath.Join(data, server.KeyFile))
				b.key = strings.TrimSpace(string(k))
			}
		}
		if b.url != "" {
			if resp, err := http.Get(b.url + "/healthz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return nil
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("server not ready")
}

func (b *bench) do(method, path string, body, out any) int {
	var rd io.Reader
	if body != nil {
		j, _ := json.Marshal(body)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, b.url+path, rd)
	req.Header.Set("Authorization", "Bearer "+b.key)
	resp, err := apiClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if out != nil {
		json.NewDecoder(resp.Body).Decode(out)
	} else {
		io.Copy(io.Discard, resp.Body)
	}
	return resp.StatusCode
}

func (b *bench) create() (string, error) {
	// Long enough for the whole run: the first sandbox serves every
	// figure after the creates.
	return b.createTimeout(3600)
}

func (b *bench) putGet(id string, payload []byte) error {
	req, _ := http.NewRequest("PUT", b.url+"/v1/sandboxes/"+id+"/files?path=/tmp/bench.bin", bytes.NewReader(payload))
	req.Header.Set("Authorization", "Bearer "+b.key)
	resp, err := apiClient.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("put: HTTP %d", resp.StatusCode)
	}
	req, _ = http.NewRequest("GET", b.url+"/v1/sandboxes/"+id+"/files?path=/tmp/bench.bin", nil)
	req.Header.Set("Authorization", "Bearer "+b.key)
	resp, err = apiClient.Do(req)
	if err != nil {
		return err
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if n != int64(len(payload)) {
		return fmt.Errorf("get: %d bytes", n)
	}
	return nil
}

// rawRunsc drives runsc directly with the flags the gVisor driver uses.
type rawRunsc struct {
	runsc, root, rootfs, dir string
}

func (r *rawRunsc) bundle(id string, args []string) (string, error) {
	dir := filepath.Join(r.dir, id)
	if err := os.MkdirAll(filepath.Join(dir, "upper"), 0o700); err != nil {
		return "", err
	}
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process":    map[string]any{"user": map[string]int{"uid": 0, "gid": 0}, "args": args, "env": []string{"PATH=/usr/bin:/bin"}, "cwd": "/"},
		"root":       map[string]any{"path": r.rootfs, "readonly": false},
		"hostname":   "raw",
		"mounts":     []map[string]any{{"destination": "/proc", "type": "proc", "source": "proc"}},
		"linux": map[string]any{
			"namespaces":  []map[string]string{{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}},
			"cgroupsPath": "/space-bench/" + id,
			"resources":   map[string]any{"memory": map[string]int64{"limit": 512 << 20}, "pids": map[string]int{"limit": 1024}},
		},
	}
	j, _ := json.Marshal(spec)
	return dir, os.WriteFile(filepath.Join(dir, "config.json"), j, 0o600)
}

func (r *rawRunsc) flags(dir string) []string {
	return []string{"--root", r.root, "--network=none", "--gofer-network-namespace=new", "--host-uds=open", "--overlay2=root:dir=" + filepath.Join(dir, "upper")}
}

// runEcho times `runsc create` + `runsc start` of echo until its output arrives.
func (r *rawRunsc) runEcho(id string) (time.Duration, error) {
	dir, err := r.bundle(id, []string{"/bin/echo", "hello"})
	if err != nil {
		return 0, err
	}
	defer r.delete(id)
	t0 := time.Now()
	cmd := exec.Command(r.runsc, append(r.flags(dir), "run", "--bundle", dir, id)...)
	out, err := cmd.Output()
	d := time.Since(t0)
	if err != nil || !bytes.Contains(out, []byte("hello")) {
		return 0, fmt.Errorf("runsc run %s: %v %q", id, err, out)
	}
	return d, nil
}

// concurrentRuns starts n runEcho at once and returns the time of each
// that succeeded. A run that fails is left out and said on stderr (in two
// of ~15 quick benches one of 40 such runs printed its output and then
// exited 137, never reproduced outside the bench); more than one in ten
// failing is an error.
func (r *rawRunsc) concurrentRuns(prefix string, n int) ([]time.Duration, error) {
	ds := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ds[i], errs[i] = r.runEcho(fmt.Sprintf("%s%d", prefix, i)) })
	}
	wg.Wait()
	var out []time.Duration
	for i, err := range errs {
		if err != nil {
			fmt.Fprintf(os.Stderr, "space-bench: a raw run of a burst left out: %v\n", err)
			continue
		}
		out = append(out, ds[i])
	}
	if len(out) < n-n/10 {
		return nil, fmt.Errorf("%d of %d concurrent runsc run failed: %w", n-len(out), n, errors.Join(errs...))
	}
	return out, nil
}

func (r *rawRunsc) startSleeper(id string) error {
	dir, err := r.bundle(id, []string{"/bin/sleep", "3600"})
	if err != nil {
		return err
	}
	// The detached sandbox keeps runsc's stdio: give it a file, not a pipe.
	logf, err := os.Create(filepath.Join(dir, "console.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(r.runsc, append(r.flags(dir), "run", "--detach", "--bundle", dir, id)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(logf.Name())
		return fmt.Errorf("runsc run --detach: %v: %s", err, b)
	}
	return nil
}

// restore starts a new container from a checkpoint image.
func (r *rawRunsc) restore(id, img string) error {
	dir, err := r.bundle(id, []string{"/bin/sleep", "3600"})
	if err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(dir, "console.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(r.runsc, append(r.flags(dir), "restore", "--detach", "--image-path", img, "--bundle", dir, id)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(logf.Name())
		return fmt.Errorf("runsc restore: %v: %s", err, b)
	}
	return nil
}

func (r *rawRunsc) delete(id string) {
	exec.Command(r.runsc, "--root", r.root, "delete", "--force", id).Run()
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }

func (b *bench) report() string {
	var w strings.Builder
	host, _ := os.Hostname()
	cpu := "unknown"
	if c, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(c), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	fmt.Fprintf(&w, "# Performance\n\n")
	fmt.Fprintf(&w, "Measured %s on %s (%d cores, %s, %s/%s), driver gvisor (runsc %s, systrap).\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), host, runtime.NumCPU(), cpu, runtime.GOOS, runtime.GOARCH, gvisor.PinnedVersion)
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(&w, "Load average when the report was written: %s (numbers from a busy 2-core machine are noisy; compare the ratios).\n", strings.Join(strings.Fields(string(la))[:3], " "))
	}
	fmt.Fprintf(&w, "Reproduce with `make bench` (runs `go run ./cmd/space-bench -out docs/PERF.md`).\n")
	fmt.Fprintf(&w, "All times in milliseconds; space is measured through its HTTP API (client → server → agent and back),\n")
	fmt.Fprintf(&w, "the raw runtime by invoking runsc directly with the same rootfs and flags, in the same run.\n\n")
	fmt.Fprintf(&w, "| operation | n | space min | space p50 | space p99 | raw runtime | raw n | raw min | raw p50 | raw p99 | p50 speed-up vs raw |\n")
	fmt.Fprintf(&w, "|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range b.rows {
		ratio := float64(pct(r.raw, .5)) / float64(pct(r.space, .5))
		fmt.Fprintf(&w, "| %s | %d | %s | %s | %s | %s | %d | %s | %s | %s | %.1f× |\n",
			r.name, len(r.space), ms(pct(r.space, 0)), ms(pct(r.space, .5)), ms(pct(r.space, .99)),
			r.rawName, len(r.raw), ms(pct(r.raw, 0)), ms(pct(r.raw, .5)), ms(pct(r.raw, .99)), ratio)
	}
	for _, n := range b.notes {
		fmt.Fprintf(&w, "\n%s\n", n)
	}
	return w.String()
}
