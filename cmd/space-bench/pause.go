package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// pauseRows measures a pause with the rolling history's checkpoint on (a
// server's default) against runsc's own verbs, n samples each: how long
// the pause call takes to answer (the sandbox is frozen then) next to
// runsc pause, and how long until the pause's checkpoint is stored (the
// timeline entry ready) next to runsc pause + runsc checkpoint of the
// paused container. Run alone with `space-bench -only pause`.
func (b *bench) pauseRows(agent string, n int) error {
	tmp, err := os.MkdirTemp("", "space-bench-pause-")
	if err != nil {
		return err
	}
	b.tmp = tmp
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	raw, stop, err := b.serveMain(ctx, tmp, agent, "on")
	if err != nil {
		return err
	}
	defer stop()
	const cid = "rawpause"
	if err := raw.startSleeper(cid); err != nil {
		return err
	}
	defer raw.delete(cid)
	runsc := func(args ...string) error {
		out, err := exec.Command(b.runsc, append([]string{"--root", raw.root}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("runsc %s: %v: %s", args[0], err, out)
		}
		return nil
	}
	id, err := b.create()
	if err != nil {
		return err
	}
	answered := row{name: "pause answered (checkpoint on pause)", rawName: "runsc pause"}
	ready := row{name: "pause → its checkpoint stored (timeline entry ready)", rawName: "runsc pause + runsc checkpoint --leave-running of the paused container"}
	sample := func() (time.Duration, time.Duration, error) {
		t0 := time.Now()
		if code := b.do("POST", "/v1/sandboxes/"+id+"/pause", nil, nil); code != 200 {
			return 0, 0, fmt.Errorf("pause: HTTP %d", code)
		}
		a := time.Since(t0)
		for {
			var tl struct {
				Snapshots []struct{ Kind, Status, Error string }
			}
			if code := b.do("GET", "/v1/sandboxes/"+id+"/snapshots", nil, &tl); code != 200 || len(tl.Snapshots) == 0 {
				return 0, 0, fmt.Errorf("timeline: HTTP %d, %d entries", code, len(tl.Snapshots))
			}
			last := tl.Snapshots[len(tl.Snapshots)-1]
			if last.Status == "ready" {
				break
			}
			if last.Status == "failed" {
				return 0, 0, fmt.Errorf("the pause's checkpoint failed: %s", last.Error)
			}
			time.Sleep(2 * time.Millisecond)
		}
		r := time.Since(t0)
		if code := b.do("POST", "/v1/sandboxes/"+id+"/resume", nil, nil); code != 200 {
			return 0, 0, fmt.Errorf("resume: HTTP %d", code)
		}
		// The agent's session is back before the next sample.
		if code := b.do("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": []string{"true"}}, nil); code != 200 {
			return 0, 0, fmt.Errorf("exec after resume: HTTP %d", code)
		}
		return a, r, nil
	}
	// The first checkpoint indexes the template for file views in the
	// background (seconds of CPU): taken and left to finish first.
	if _, _, err := sample(); err != nil {
		return err
	}
	time.Sleep(15 * time.Second)
	for i := 0; i < n; i++ {
		a, r, err := sample()
		if err != nil {
			return err
		}
		answered.space = append(answered.space, a)
		ready.space = append(ready.space, r)

		img := filepath.Join(tmp, fmt.Sprintf("rawimg%d", i))
		t0 := time.Now()
		if err := runsc("pause", cid); err != nil {
			return err
		}
		answered.raw = append(answered.raw, time.Since(t0))
		if err := runsc("checkpoint", "--leave-running", "--image-path", img, cid); err != nil {
			return err
		}
		ready.raw = append(ready.raw, time.Since(t0))
		if err := runsc("resume", cid); err != nil {
			return err
		}
		os.RemoveAll(img)
	}
	b.rows = append(b.rows, answered, ready)
	b.notes = append(b.notes, fmt.Sprintf("Pause rows (`space-bench -only pause`, %d samples, checkpoint on pause as a server's default): the pause answers once the sandbox is frozen; its checkpoint is then taken of the frozen sandbox and stored in the background (writable layer and image into the chunk store), and the row after it runs to the timeline entry's ready, polled every 2 ms. Each sample resumes and runs `true` before the next.", n))
	return nil
}
